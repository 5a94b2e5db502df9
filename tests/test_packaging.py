"""tfps as users install it: an sdist built from this checkout, the wheel pip builds from
that sdist (what `pip install tfps-*.tar.gz` does: so the sdist alone carries every source
and build file), installed with plain pip into a virtual environment of its own (no
packages of this machine's Python), imported from outside the checkout, and its
tfps-launch entry point run. The wheel's objects may come from the object cache the
checkout's build filled (build_config.compile_in_parallel): a hit needs the same compiler,
command and preprocessed text, so the sdist must still carry every source and header."""

import os
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROGRAM = textwrap.dedent("""
    import json, os
    os.environ["TF_USE_LEGACY_KERAS"] = "1"
    import numpy as np, tfps
    assert not tfps.__file__.startswith(%r), tfps.__file__
    strategy = tfps.distribute.strategy_from_tf_config()
    with strategy.scope():
        table = tfps.ShardedTable(4)
    keys = np.arange(100, dtype=np.int64)
    table.find_or_insert(keys)
    table.apply_gradients(keys, np.ones((100, 4), np.float32))
    print(json.dumps({"rows": int(table.size()), "devices": table.devices}), flush=True)
    os._exit(0)
""" % ROOT)


def run(command, cwd, timeout=1200, env=None):
    out = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=timeout,
                         env=dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1", **(env or {})))
    assert out.returncode == 0, f"{command} failed:\n{out.stdout[-2000:]}\n{out.stderr[-4000:]}"
    return out.stdout


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """(wheel path, sdist path): the sdist built from the checkout, the wheel from the sdist."""
    dist = tmp_path_factory.mktemp("dist")
    run([sys.executable, "setup.py", "-q", "sdist", "-d", str(dist)], cwd=ROOT)
    sdist = [f for f in os.listdir(dist) if f.endswith(".tar.gz")]
    assert len(sdist) == 1, os.listdir(dist)
    sdist = os.path.join(dist, sdist[0])
    run([sys.executable, "-m", "pip", "wheel", "-q", "--no-build-isolation", "--no-deps", "-w", str(dist), sdist],
        cwd=str(dist))
    wheel = [f for f in os.listdir(dist) if f.endswith(".whl")]
    assert len(wheel) == 1, os.listdir(dist)
    return os.path.join(dist, wheel[0]), sdist


def check_installed(venv, cwd):
    python = os.path.join(venv, "bin", "python")
    script = os.path.join(cwd, "program.py")
    with open(script, "w") as f:
        f.write(PROGRAM)
    env = {"TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": ""}
    local = run([python, script], cwd=cwd, env=env)
    assert '"rows": 100' in local
    launched = run([os.path.join(venv, "bin", "tfps-launch"), "--num_ps", "2", "--num_workers", "1",
                    "--log_dir", os.path.join(cwd, "logs"), script], cwd=cwd, env=env, timeout=600)
    assert '"rows": 100' in launched and "/job:ps/replica:0/task:1" in launched


def test_the_wheel_built_from_the_sdist_installs_with_plain_pip_and_runs_outside_the_checkout(tmp_path, built):
    wheel, _ = built
    venv = str(tmp_path / "venv")
    run([sys.executable, "-m", "venv", venv], cwd=str(tmp_path))
    # Not byte-compiled at install: most of TensorFlow's modules are never imported here.
    pip = [os.path.join(venv, "bin", "python"), "-m", "pip", "install", "-q", "--no-compile"]
    run(pip + [wheel], cwd=str(tmp_path))  # its dependencies, tf_keras included, come with it
    requires = run([os.path.join(venv, "bin", "python"), "-m", "pip", "show", "tfps"], cwd=str(tmp_path))
    assert "tf-keras" in requires and "tensorboard" in requires and "tensorflow" in requires
    check_installed(venv, str(tmp_path))
