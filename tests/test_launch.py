"""tfps-launch runs a plain TF_CONFIG program as a local cluster and cleans up after it."""

import json
import os
import re
import select
import signal
import subprocess
import sys
import time

from tests.event_pipe import EventPipe

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROGRAM = os.path.join(ROOT, "tests", "cluster_programs", "tf_config_program.py")
TASKS = {"chief_0", "worker_0", "worker_1", "ps_0"}


def TaskPids(path):  # noqa: N802  (reads like the class it stands for)
    """The "<task> <pid>" lines every task writes to a FIFO when it starts."""
    return EventPipe(path, value=int)


def launch(tmp_path, *program_args, launcher_args=()):
    logs = tmp_path / "logs"
    pids = TaskPids(str(tmp_path / "pids.fifo"))
    cmd = [sys.executable, "-m", "tfps.launch", "--num_ps", "1", "--num_workers", "2", "--log_dir",
           str(logs), *launcher_args, PROGRAM, "--pid_pipe", str(tmp_path / "pids.fifo"), *program_args]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=ROOT)
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            cwd=ROOT), logs, pids


def wait_until_all_exit(pids, seconds):
    """Waits on each process's pidfd, which becomes readable when the process exits."""
    deadline = time.monotonic() + seconds
    for name, pid in pids.items():
        try:
            pidfd = os.pidfd_open(pid)
        except ProcessLookupError:
            continue  # already gone
        try:
            left = max(0.0, deadline - time.monotonic())
            assert select.select([pidfd], [], [], left)[0], f"{name} (pid {pid}) still runs"
        finally:
            os.close(pidfd)


def test_runs_a_tf_config_program_to_completion_and_propagates_its_exit_code(tmp_path):
    proc, logs, pids = launch(tmp_path, "--steps", "10", "--exit_code", "3")
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 3, err[-3000:]
    assert "chief done: total=10" in out  # the chief's output is streamed
    for name in TASKS:
        assert (logs / f"{name}.log").exists()
    assert "chief done" in (logs / "chief_0.log").read_text()
    pids.wait_for(lambda started: set(started) == TASKS, 10, "every task's pid")
    wait_until_all_exit(pids.values, 30)
    pids.close()


def test_a_killed_worker_is_restarted_and_the_run_completes(tmp_path):
    proc, logs, pids = launch(tmp_path, "--steps", "60", "--hold_at", "30")
    # A task has started when it writes its pid, but the chief may still be connecting to the
    # cluster then, and a worker killed before it connects fails the connection itself.
    pids.wait_for(lambda started: set(started) >= TASKS | {"chief_0:holding"}, 300,
                  "the chief to hold at step 30")
    killed = pids.values["worker_0"]
    started = dict(pids.values)
    os.kill(killed, signal.SIGKILL)
    # Released only once the launcher has started a new worker_0: a chief let go at once can
    # finish its steps on worker_1 before the launcher's next look at its tasks.
    pids.wait_for(lambda started: started["worker_0"] != killed, 120, "worker_0 to restart")
    os.kill(pids.values["chief_0"], signal.SIGUSR1)  # the chief goes on with steps 30..59
    out, err = proc.communicate(timeout=400)
    assert proc.returncode == 0, err[-3000:]
    # The coordinator re-runs a closure whose worker died; if the kill landed after the
    # closure's assign_add reached the PS, that step counts twice (at-least-once delivery).
    total = int(re.search(r"chief done: total=(\d+)", out).group(1))
    assert total in (60, 61), out[-2000:]
    restart = (logs / "launcher.log").read_text()
    assert "worker_0 exited with code -9; restarting it" in restart
    # The launcher names each task's pid, as the task itself reports it.
    named = json.loads(re.search(r"task pids (\{.*\})", restart).group(1))
    assert named == {name: started[name] for name in TASKS}
    assert f"worker_0 restarted as pid {pids.values['worker_0']}" in restart
    assert pids.values["worker_0"] != killed
    pids.close()


def test_a_stopped_worker_is_restarted_and_the_chiefs_output_still_reaches_the_terminal(tmp_path):
    """A hung worker is killed and restarted alone; the chief's output after it is the
    run's, not a lost task's, so the launcher streams it (it held it back for good)."""
    proc, logs, pids = launch(tmp_path, "--steps", "40", "--hold_at", "20", launcher_args=("--hang_timeout", "5"))
    pids.wait_for(lambda started: set(started) >= TASKS | {"chief_0:holding"}, 300,
                  "the chief to hold at step 20")
    stopped = pids.values["worker_0"]
    os.kill(stopped, signal.SIGSTOP)
    pids.wait_for(lambda started: started["worker_0"] != stopped, 120, "worker_0 to restart")
    os.kill(pids.values["chief_0"], signal.SIGUSR1)
    out, err = proc.communicate(timeout=400)
    assert proc.returncode == 0, err[-3000:]
    assert "worker_0 has not answered for" in (logs / "launcher.log").read_text()
    assert re.search(r"chief done: total=4[01]", out), out[-2000:]
    pids.close()


def test_sigterm_stops_every_task(tmp_path):
    proc, logs, pids = launch(tmp_path, "--steps", "1000", "--hold_at", "10")
    pids.wait_for(lambda started: set(started) >= TASKS, 120, "the cluster to start")
    # The launcher's own process never loads TensorFlow (its tasks do): its import would
    # delay every task's start.
    with open(f"/proc/{proc.pid}/maps") as f:
        assert "libtensorflow" not in f.read()
    with open(f"/proc/{pids.values['ps_0']}/maps") as f:
        assert "libtensorflow" in f.read()
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=120)
    assert proc.returncode == 130
    wait_until_all_exit(pids.values, 30)
    pids.close()


SPAWNING = os.path.join(ROOT, "tests", "cluster_programs", "spawning_program.py")


def launch_spawning(tmp_path, *args):
    pids = TaskPids(str(tmp_path / "pids.fifo"))
    proc = subprocess.Popen([sys.executable, "-m", "tfps.launch", "--num_ps", "1", "--num_workers", "2",
                             "--log_dir", str(tmp_path / "logs"), SPAWNING, pids.path, *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONPATH=ROOT))
    return proc, pids


def test_the_launcher_leaves_no_process_behind_and_passes_on_the_chiefs_last_line(tmp_path):
    proc, pids = launch_spawning(tmp_path)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-2000:]
    assert out.rstrip().endswith("line 299")
    # 4 tasks and their children, the chief's child outliving the chief
    pids.wait_for(lambda started: len(started) == 8, 10, "every task's and child's pid")
    wait_until_all_exit(pids.values, 15)
    pids.close()


def test_tasks_die_with_a_launcher_killed_by_sigkill(tmp_path):
    proc, pids = launch_spawning(tmp_path, "--hold")
    pids.wait_for(lambda started: len(started) == 8, 60, "the tasks to start", proc)
    proc.kill()
    proc.communicate(timeout=30)
    wait_until_all_exit({name: pid for name, pid in pids.values.items() if not name.endswith("_child")}, 15)
    pids.close()


def test_bad_flags_are_refused_naming_them_before_any_task_starts(tmp_path):
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    cases = [
        (["--max_restarts", "-1", PROGRAM], "need --max_restarts >= 0 and --max_worker_restarts >= 0, got -1 and 3"),
        (["--max_worker_restarts", "-2", PROGRAM], "got 3 and -2"),
        (["--evaluator_wait", "-1", PROGRAM], "need --evaluator_wait >= 0, got -1.0"),
        (["--evaluator_wait", "nan", PROGRAM], "need --evaluator_wait >= 0, got nan"),
        (["--log_dir", str(a_file / "logs"), PROGRAM], f"cannot make the log directory --log_dir {a_file}/logs"),
        ([str(tmp_path)], f"{tmp_path} is not a file"),
        ([str(tmp_path / "missing.py")], "missing.py does not exist"),
    ]
    # --hosts files (tfps/cluster/_hosts_file.py): not JSON, a task missing, counts that
    # disagree with the flags; and neither the counts nor --hosts.
    hosts = {name: tmp_path / f"{name}.json" for name in ("garbled", "no_ps", "two_ps")}
    hosts["garbled"].write_text("{")
    task = {"address": "10.0.0.1:2222", "exec": []}
    hosts["no_ps"].write_text(json.dumps({"chief": [task], "worker": [task]}))
    hosts["two_ps"].write_text(json.dumps({"chief": [task], "worker": [task], "ps": [task, task]}))
    cases += [
        (["--hosts", str(hosts["garbled"]), PROGRAM], f"--hosts {hosts['garbled']}: cannot read it as JSON"),
        (["--hosts", str(hosts["no_ps"]), PROGRAM], "needs one chief, at least one worker and one ps"),
        (["--hosts", str(hosts["two_ps"]), PROGRAM], f"--num_ps 1, but --hosts {hosts['two_ps']} lists 2"),
    ]
    counts = ["--num_ps", "1", "--num_workers", "1"]
    for args, message in cases + [(["--num_ps", "1", PROGRAM], "--num_ps and --num_workers are required (or --hosts)")]:
        run = subprocess.run([sys.executable, "-m", "tfps.launch", *(counts if args[0] != "--num_ps" else []),
                              *args], capture_output=True, text=True, timeout=60, cwd=ROOT,
                             env=dict(os.environ, PYTHONPATH=ROOT))
        assert run.returncode != 0 and message in run.stderr, (args, run.stderr[-2000:])
        assert "Traceback" not in run.stderr and "cluster" not in run.stderr, (args, run.stderr[-2000:])


EXITING = os.path.join(ROOT, "tests", "cluster_programs", "exiting_program.py")


def launch_exiting(tmp_path, flags=(), program=EXITING, program_args=()):
    """Runs `program` (TensorFlow-free: these tests take seconds) under tfps-launch; returns
    the run and the launcher's log."""
    if program == EXITING:
        program_args = ["--ended_file", str(tmp_path / "ended"), *program_args]
    run = subprocess.run([sys.executable, "-m", "tfps.launch", "--num_ps", "1", "--num_workers", "2",
                          "--log_dir", str(tmp_path / "logs"), *flags, program, *program_args],
                         capture_output=True, text=True, timeout=120, cwd=ROOT,
                         env=dict(os.environ, PYTHONPATH=ROOT))
    return run, (tmp_path / "logs" / "launcher.log").read_text()


def test_the_programs_own_flags_pass_through_even_where_they_start_like_the_launchers():
    from tfps.cluster import launch
    opts = launch.argument_parser().parse_args(
        ["--num_ps", "1", "--num_workers", "1", PROGRAM, "--eval", "1", "--e", "--max", "2", "--log_dir", "x"])
    assert opts.script == PROGRAM and opts.args == ["--eval", "1", "--e", "--max", "2", "--log_dir", "x"]
    assert opts.log_dir is None and not opts.evaluator


def test_workers_out_of_restarts_end_the_run_instead_of_leaving_the_chief_waiting(tmp_path):
    run, said = launch_exiting(tmp_path, ["--max_worker_restarts", "1"],
                               program_args=["--worker_exit_code", "5", "--chief_deadline", "600"])
    assert run.returncode == 1, run.stderr[-2000:]
    for worker in ("worker_0", "worker_1"):
        exited = f"{worker} exited with code 5 (the end of {worker}.log: {worker} started)"
        assert f"{exited}; restarting it (restart 1 of 1)" in said
        assert f"{exited}; no restarts of it left (--max_worker_restarts 1)" in said
    assert "no worker is left to run the chief's steps; stopping the cluster" in said
    assert "chief done" not in run.stdout  # stopped, not waited for


def test_tasks_that_all_return_0_end_the_run_once_with_the_chiefs_exit_code(tmp_path):
    run, said = launch_exiting(tmp_path)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.count("chief done") == 1  # no restart ran the program again
    assert "ps_0 exited with code 0; a parameter server's program normally serves" in said
    assert "restart" not in said


def test_a_parameter_server_that_fails_is_reported_with_the_end_of_its_log(tmp_path):
    broken = tmp_path / "broken.py"
    broken.write_text("import json, os\n"
                      "if json.loads(os.environ['TF_CONFIG'])['task']['type'] == 'ps':\n"
                      "    raise RuntimeError('no table for this shard')\n"
                      "import signal\n"
                      "signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})\n"
                      "signal.sigtimedwait({signal.SIGTERM}, 600)  # until the launcher stops it\n")
    run, said = launch_exiting(tmp_path, ["--max_restarts", "1"], program=str(broken))
    assert run.returncode == 1, run.stderr[-2000:]
    assert ("ps_0 exited with code 1 (the end of ps_0.log: RuntimeError: no table for this shard); "
            "restarting the whole cluster (restart 1 of 1)") in said
    assert "RuntimeError: no table for this shard); no cluster restarts left" in said


EVALUATING = os.path.join(ROOT, "tests", "cluster_programs", "evaluator_program.py")


def launch_with_evaluator(tmp_path, flags=(), program_args=()):
    os.mkfifo(tmp_path / "meet")
    return launch_exiting(tmp_path, ["--evaluator", *flags], program=EVALUATING, program_args=[
        "--meet", str(tmp_path / "meet"), "--evaluated_file", str(tmp_path / "evaluated"), *program_args])


def test_the_evaluator_finishes_its_last_evaluation_after_the_chief_ends(tmp_path):
    run, said = launch_with_evaluator(tmp_path)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "the chief ended; waiting up to 600 s for evaluator_0 to finish (--evaluator_wait)" in said
    assert (tmp_path / "evaluated").read_text() == "evaluated\n"
    assert "did not finish" not in said and "exited with code" not in said


def test_an_evaluator_that_outlasts_evaluator_wait_is_stopped(tmp_path):
    run, said = launch_with_evaluator(tmp_path, ["--evaluator_wait", "1"],
                                      ["--evaluation_seconds", "600"])
    assert run.returncode == 0, run.stderr[-2000:]
    assert "evaluator_0 did not finish within --evaluator_wait 1 s; stopping it" in said
    assert not (tmp_path / "evaluated").exists()


def test_an_evaluator_that_fails_is_reported_and_training_ends_as_the_chief_does(tmp_path):
    run, said = launch_with_evaluator(tmp_path, program_args=["--evaluator_fails"])
    assert run.returncode == 0, run.stderr[-2000:]
    assert "chief done" in run.stdout
    assert ("evaluator_0 exited with code 1 (the end of evaluator_0.log: RuntimeError: no checkpoint "
            "directory)") in said
    assert "restart" not in said and "waiting up to" not in said


def test_ctrl_c_while_the_launcher_waits_for_the_evaluator_stops_everything_as_interrupted(tmp_path):
    os.mkfifo(tmp_path / "meet")
    proc = subprocess.Popen(
        [sys.executable, "-m", "tfps.launch", "--num_ps", "1", "--num_workers", "1", "--evaluator",
         "--log_dir", str(tmp_path / "logs"), EVALUATING, "--meet", str(tmp_path / "meet"),
         "--evaluated_file", str(tmp_path / "evaluated"), "--evaluation_seconds", "600"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=ROOT))
    for line in proc.stderr:  # the launcher's notes
        if "waiting up to 600 s for evaluator_0" in line:
            proc.send_signal(signal.SIGINT)
            break
    proc.communicate(timeout=60)
    said = (tmp_path / "logs" / "launcher.log").read_text()
    assert proc.returncode == 130, said
    assert "interrupted; stopping every task" in said and "did not finish" not in said
    assert not (tmp_path / "evaluated").exists()


def test_a_task_whose_server_answered_and_then_is_unreachable_counts_as_silent(monkeypatch):
    """A host cut off from the network: its server's calls first time out, then (once the
    launcher's host forgets its hardware address) fail at once as unreachable, which must
    not reset its silence; a server that never answered yet is still starting."""
    from tfps.cluster import _task_health

    class Task:
        def __init__(self, name):
            self.name, self.process = name, type("Process", (), {"pid": os.getpid()})()

        def poll(self):
            return None
    replies = {"10.0.0.1:1": iter([True, False, None]), "10.0.0.2:1": iter([None])}
    probes = {"10.0.0.1:1": 0, "10.0.0.2:1": 0}

    def answers(address):
        probes[address] += 1
        return next(replies[address], None)

    def after_probes(n):
        """Waits (with a deadline) until each address has been probed n more times."""
        wanted = {address: count + n for address, count in probes.items()}
        deadline = time.monotonic() + 10
        while any(probes[a] < wanted[a] for a in wanted) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert all(probes[a] >= wanted[a] for a in wanted), probes
    monkeypatch.setattr(_task_health, "answers", answers)
    cut, starting = Task("ps_0"), Task("ps_1")
    watch = _task_health.HangWatch([cut, starting], {"ps_0": "10.0.0.1:1", "ps_1": "10.0.0.2:1"}, 0.3, every=0.05)
    try:
        deadline = time.monotonic() + 10
        while not watch.hung() and time.monotonic() < deadline:
            time.sleep(0.01)
        after_probes(8)  # longer than the deadline again: the one never answering stays unhung
        assert [task.name for task, _ in watch.hung()] == ["ps_0"]
        watch.forget(cut)  # restarted: its server has not answered since
        replies["10.0.0.1:1"] = iter([])
        after_probes(12)
        assert watch.hung() == []
    finally:
        watch.close()
