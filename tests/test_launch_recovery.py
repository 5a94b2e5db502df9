"""A parameter server hung (SIGSTOP) in the middle of fit under tfps-launch: the launcher
finds it silent for --hang_timeout seconds, kills it and restarts the cluster, fit resumes
from IncrementalBackup's last backup with every row of it restored exactly, and the run
completes. A SIGKILLed parameter server is tests/test_faults.py's "ps" round, which checks
the same restore, steps lost and terminal."""

import os
import signal
import subprocess
import sys

import numpy as np

from tests.event_pipe import EventPipe

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROGRAM = os.path.join(ROOT, "tests", "cluster_programs", "ps_loss_resume.py")
SAVE_EVERY, STEPS_PER_EXECUTION, STEPS_PER_EPOCH = 10, 5, 20


def test_a_hung_parameter_server_is_killed_and_costs_at_most_one_backup_interval(tmp_path):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=ROOT)
    logs = tmp_path / "logs"
    events = EventPipe(str(tmp_path / "events"), value=int)
    os.mkfifo(tmp_path / "release")
    launcher = subprocess.Popen(
        [sys.executable, "-m", "tfps.launch", "--num_ps", "2", "--num_workers", "1", "--max_restarts", "1",
         "--hang_timeout", "6", "--log_dir", str(logs), PROGRAM, str(tmp_path)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=str(tmp_path))
    try:
        # The chief holds after two backups (a whole one, then one of changes) and a step
        # block past the second, so there is something to lose.
        events.wait_for(lambda seen: "holding_0" in seen, 300, "the chief to hold", launcher)
        os.kill(events.values["ps_1"], signal.SIGSTOP)
        with open(tmp_path / "release", "w") as release:
            release.write("go\n")
        out, err = launcher.communicate(timeout=600)
    finally:
        if launcher.poll() is None:
            launcher.kill()
        events.close()
    assert launcher.returncode == 0, err[-4000:]
    # The chief's errors about the lost server stay in its log: the terminal shows the
    # launcher's one line about it, not a traceback.
    assert "Traceback" not in out
    assert "restarting the whole cluster" in err and "chief's errors about it are in" in err
    launcher_log = (logs / "launcher.log").read_text()
    assert "ps_1 exited with code -9" in launcher_log
    assert "ps_1 has not answered for" in launcher_log
    assert (tmp_path / "done-1.json").exists() and not (tmp_path / "done-0.json").exists()
    last = np.load(tmp_path / f"backup-0-{events.values['backup_0']}.npz")
    restored = np.load(tmp_path / "restored-1.npz")
    for name in ("keys", "values", "slots", "metadata"):
        np.testing.assert_array_equal(restored[name], last[name], err_msg=name)
    assert len(last["keys"]) > 1000
    # Steps the first run finished after its last backup were lost, at most one interval.
    lost = events.values["holding_0"] - (int(last["epoch"]) * STEPS_PER_EPOCH + int(last["batch"]))
    print(f"steps lost to the parameter server's death: {lost}")
    assert 0 < lost <= SAVE_EVERY + STEPS_PER_EXECUTION
