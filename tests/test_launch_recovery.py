"""A parameter server SIGKILLed in the middle of fit under tfps-launch: the launcher
restarts the cluster, fit resumes from IncrementalBackup's last backup with every row of it
restored exactly, and the run completes."""

import glob
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROGRAM = os.path.join(ROOT, "tests", "cluster_programs", "ps_loss_resume.py")
SAVE_EVERY, STEPS_PER_EXECUTION, STEPS_PER_EPOCH = 10, 5, 20


def wait_for(condition, seconds, what, process):
    deadline = time.monotonic() + seconds
    while not condition():
        assert process.poll() is None, f"the launcher exited ({process.returncode}) before {what}: " + \
            process.communicate()[1][-3000:]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def test_a_killed_parameter_server_costs_at_most_one_backup_interval(tmp_path):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=ROOT)
    logs = tmp_path / "logs"
    launcher = subprocess.Popen(
        [sys.executable, "-m", "tfps.launch", "--num_ps", "2", "--num_workers", "1", "--max_restarts", "1",
         "--log_dir", str(logs), PROGRAM, str(tmp_path)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=str(tmp_path))
    try:
        # Two backups: the first is whole, the second holds changes only.
        wait_for(lambda: len(glob.glob(str(tmp_path / "backup-0-*.npz"))) >= 2, 300, "two backups",
                 launcher)
        # ... and training has gone on past the second one, so there is something to lose.
        wait_for(lambda: step_of(progress(tmp_path)) > step_of(backup_step(tmp_path, 1)), 300,
                 "steps after the second backup", launcher)
        os.kill(int((tmp_path / "ps_1.pid").read_text()), signal.SIGKILL)
        out, err = launcher.communicate(timeout=600)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert launcher.returncode == 0, err[-4000:]
    assert "ps_1 exited with code -9" in (logs / "launcher.log").read_text()
    assert (tmp_path / "done-1.json").exists() and not (tmp_path / "done-0.json").exists()
    backups = sorted(glob.glob(str(tmp_path / "backup-0-*.npz")), key=lambda p: int(p.rsplit("-", 1)[1][:-4]))
    last = np.load(backups[-1])
    restored = np.load(tmp_path / "restored-1.npz")
    for name in ("keys", "values", "slots", "metadata"):
        np.testing.assert_array_equal(restored[name], last[name], err_msg=name)
    assert len(last["keys"]) > 1000
    # Steps the first run finished after its last backup were lost, at most one interval.
    lost = step_of(progress(tmp_path)) - step_of((int(last["epoch"]), int(last["batch"])))
    print(f"steps lost to the parameter server's death: {lost}")
    assert 0 < lost <= SAVE_EVERY + STEPS_PER_EXECUTION


def progress(directory):
    """(epoch, batch) of the last step the first run finished."""
    try:
        state = json.loads((directory / "progress-0.json").read_text())
    except (OSError, ValueError):
        return (0, -1)
    return state["epoch"], state["batch"]


def backup_step(directory, n):
    backup = np.load(directory / f"backup-0-{n}.npz")
    return int(backup["epoch"]), int(backup["batch"])


def step_of(epoch_and_batch):
    epoch, batch = epoch_and_batch
    return epoch * STEPS_PER_EPOCH + batch
