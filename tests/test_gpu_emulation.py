"""The GPU table's kernels, run on CPU threads by the CUDA host emulation, against the CPU
table: every operation and optimizer, growth, removes, export/import, the clock, refusals,
repeated keys, concurrent callers and error statuses (custom_ops/core/gpu/tests). No GPU or
CUDA toolkit needed, so it runs in every CI run; also under ThreadSanitizer."""

import os
import re
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("build", ["plain", "thread"])
def test_emulated_gpu_table_matches_the_cpu_table(tmp_path, build):
    """plain: -O2, full-size batches; thread: ThreadSanitizer, smaller batches."""
    cxx = os.environ.get("CXX", "g++")
    assert shutil.which(cxx), f"{cxx} is needed to build the emulated GPU table harness"
    args = ["bash", os.path.join(ROOT, "custom_ops", "core", "gpu", "run_emulated.sh")]
    if build == "thread":
        args.append("--tsan")
    run = subprocess.run(args, capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, OUT_DIR=str(tmp_path)))
    output = run.stdout + run.stderr
    counts = re.search(r"(\d+) passed, (\d+) failed", run.stdout)
    assert run.returncode == 0, output[-6000:]
    assert counts and int(counts.group(1)) > 1000 and counts.group(2) == "0", output[-6000:]
    assert "WARNING: ThreadSanitizer" not in output, output[-6000:]
