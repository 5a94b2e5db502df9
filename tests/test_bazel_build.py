"""The Bazel build: same sources as the pip build, builds offline, and its library works."""

import json
import os
import re
import shutil
import subprocess
import sys

import numpy as np

import build_config
from tests import reference
from tests.required_tools import skip_without_tool

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def bazel_sources():
    with open(os.path.join(ROOT, "custom_ops", "BUILD")) as f:
        return {"custom_ops/" + s for s in re.findall(r'"([\w/.-]+\.cc)"', f.read())}


def test_bazel_and_pip_builds_list_the_same_sources():
    cpu = set(build_config.CORE_SOURCES + build_config.OP_SOURCES + build_config.CORE_TEST_SOURCES +
              build_config.GPU_KERNEL_SOURCES)
    cuda = set(build_config.CUDA_SOURCES)
    listed = bazel_sources()
    assert {s for s in listed if not s.endswith(".cu.cc")} == cpu
    assert {s for s in listed if s.endswith(".cu.cc")} == cuda
    on_disk = {os.path.relpath(os.path.join(d, f), ROOT)
               for d, _, files in os.walk(os.path.join(ROOT, "custom_ops")) for f in files
               if f.endswith(".cc")}
    assert on_disk == cpu | cuda | set(build_config.CUDA_TEST_SOURCES + build_config.HARNESS_ONLY_SOURCES), \
        "a C++ or CUDA source is in neither build, or listed but missing"


def test_bazel_and_pip_builds_use_the_same_compile_flags():
    with open(os.path.join(ROOT, "custom_ops", "build_defs.bzl")) as f:
        block = re.search(r"TFPS_COPTS = \[(.*?)\]", f.read(), re.S).group(1)
    assert re.findall(r'"([^"]+)"', block) == build_config.CXXFLAGS


BAZEL_CACHE_LIMIT_BYTES = 1 << 30  # about a hundred builds of this tree


def bazel_disk_cache():
    """Where Bazel keeps its action outputs between runs, as the pip build keeps objects:
    $TFPS_BAZEL_CACHE, by default ~/.cache/tfps/bazel. Emptied whole once it passes
    BAZEL_CACHE_LIMIT_BYTES: Bazel's own disk cache never shrinks."""
    path = build_config.cache_dir("TFPS_BAZEL_CACHE", "bazel")
    if path and os.path.isdir(path):
        size = sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)
        if size > BAZEL_CACHE_LIMIT_BYTES:
            shutil.rmtree(path)
    return path


def environment_python():
    """This environment's python3, whichever name ran the test, so that `python` and
    `python3` give Bazel's actions (whose keys hold it) one environment and the disk cache
    one entry. Not the resolved link: a virtual environment's python3 links to the base
    interpreter, which lacks the environment's packages."""
    named = os.path.join(sys.prefix, "bin", "python3")
    return named if os.path.exists(named) else os.path.abspath(sys.executable)


@skip_without_tool("bazel", "scripts/test.sh installs Debian's bazel-bootstrap")
def test_bazel_builds_a_library_that_tensorflow_loads_and_runs(tmp_path):
    env = dict(os.environ, PYTHON_BIN_PATH=environment_python())
    # Bazel's tree for this run lives under tmp_path and goes when the test ends, with no
    # convenience links left in the checkout: a tree per checkout (each of CI's clones)
    # would stay behind in ~/.cache/bazel, over a GiB of sandboxes each.
    startup = ["bazel", f"--output_base={tmp_path / 'bazel'}"]
    cache = bazel_disk_cache()
    options = ["--symlink_prefix=/"] + ([f"--disk_cache={cache}"] if cache else [])
    # What --config=cuda adds to //:tfps_ops is analysed, not run: its two rules run nvcc
    # on gpu_table.cu.cc and scripts/build_gpu_ops.py, which tests/test_cuda_compiles.py
    # and tests/test_gpu_kernels.py run with the same flags.
    targets = [["build", "//:tfps_ops"], ["test", "//:core_tests"],
               ["build", "--nobuild", "//custom_ops:gpu_table_cuda", "//custom_ops:gpu_ops_cuda"]]

    def bazel(command, *arguments):
        return subprocess.run([*startup, command, *options, *arguments], cwd=ROOT, capture_output=True,
                              text=True, timeout=1500, env=env)

    try:
        for command, *arguments in targets:
            run = bazel(command, *arguments)
            assert run.returncode == 0, run.stderr[-4000:]
        info = bazel("info", "bazel-bin")
        assert info.returncode == 0, info.stderr[-4000:]
        bin_dir = info.stdout.strip()
        check_library(os.path.join(bin_dir, "custom_ops", "_tfps_ops.so"))
    finally:
        subprocess.run([*startup, "clean", "--expunge"], cwd=ROOT, capture_output=True, timeout=300, env=env)


def check_library(library):
    check = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "bazel_op_check.py"), library],
                           capture_output=True, text=True, timeout=300,
                           env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    assert check.returncode == 0, check.stderr[-3000:]
    out = json.loads(check.stdout)
    keys = [0, -1, 12345, 2 ** 63 - 1]
    expected = np.stack([reference.initial_row(k, 4, 9, "uniform", -1.0, 1.0) for k in keys])
    np.testing.assert_array_equal(np.array(out["initial"], np.float32), expected)
    np.testing.assert_array_equal(np.array(out["values"], np.float32), expected - np.float32(0.5))
    assert all(out["exists"])
