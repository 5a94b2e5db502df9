"""tfps-launch runs a plain TF_CONFIG program as a local cluster and cleans up after it."""

import os
import re
import signal
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROGRAM = os.path.join(ROOT, "tests", "cluster_programs", "tf_config_program.py")


def launch(tmp_path, *program_args, extra=()):
    logs = tmp_path / "logs"
    pids = tmp_path / "pids"
    pids.mkdir(exist_ok=True)
    cmd = [sys.executable, "-m", "tfps.launch", "--num_ps", "1", "--num_workers", "2", "--log_dir",
           str(logs), *extra, PROGRAM, "--pid_dir", str(pids), *program_args]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=ROOT)
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            cwd=ROOT), logs, pids


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split()[2] != "Z"


def task_pids(pids):
    return {p.stem: int(p.read_text()) for p in pids.glob("*.pid") if p.read_text()}


def wait_for(condition, seconds, what):
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def test_runs_a_tf_config_program_to_completion_and_propagates_its_exit_code(tmp_path):
    proc, logs, pids = launch(tmp_path, "--steps", "10", "--exit_code", "3")
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 3, err[-3000:]
    assert "chief done: total=10" in out  # the chief's output is streamed
    for name in ("chief_0", "worker_0", "worker_1", "ps_0"):
        assert (logs / f"{name}.log").exists()
    assert "chief done" in (logs / "chief_0.log").read_text()
    started = task_pids(pids)
    assert set(started) == {"chief_0", "worker_0", "worker_1", "ps_0"}
    wait_for(lambda: not any(alive(p) for p in started.values()), 30, "every task to end")


def test_a_killed_worker_is_restarted_and_the_run_completes(tmp_path):
    proc, logs, pids = launch(tmp_path, "--steps", "60", "--step_seconds", "0.25")
    wait_for(lambda: len(task_pids(pids)) == 4, 120, "the cluster to start")
    os.kill(task_pids(pids)["worker_0"], signal.SIGKILL)
    out, err = proc.communicate(timeout=400)
    assert proc.returncode == 0, err[-3000:]
    # The coordinator re-runs a closure whose worker died; if the kill landed after the
    # closure's assign_add reached the PS, that step counts twice (at-least-once delivery).
    total = int(re.search(r"chief done: total=(\d+)", out).group(1))
    assert total in (60, 61), out[-2000:]
    restart = (logs / "launcher.log").read_text()
    assert "worker_0 exited with code -9; restarting it" in restart


def test_sigterm_stops_every_task(tmp_path):
    proc, logs, pids = launch(tmp_path, "--steps", "1000", "--step_seconds", "0.2")
    wait_for(lambda: len(task_pids(pids)) == 4, 120, "the cluster to start")
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=120)
    assert proc.returncode == 130
    started = task_pids(pids)
    wait_for(lambda: not any(alive(p) for p in started.values()), 30, "every task to end")
