"""Runs a program from tests/cluster_programs in its own process (one cluster per process)
and returns the JSON it prints."""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_cluster_program(name, *args, timeout=600):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", TF_USE_LEGACY_KERAS="1",
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    path = os.path.join(ROOT, "tests", "cluster_programs", name)
    out = subprocess.run([sys.executable, path, *args], capture_output=True, text=True,
                         timeout=timeout, env=env, cwd=ROOT)
    assert out.returncode == 0, f"{name} failed ({out.returncode}):\n{out.stderr[-4000:]}"
    return json.loads(out.stdout)
