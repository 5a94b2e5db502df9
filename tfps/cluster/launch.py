"""tfps-launch: run a TF_CONFIG training program as a local parameter-server cluster.

    tfps-launch (--num_ps 2 --num_workers 2 | --hosts FILE) [--evaluator [--evaluator_wait S]] [--log_dir DIR] SCRIPT [ARGS...]

Starts a chief, the workers, the parameter servers (and an evaluator) as local processes
on free 127.0.0.1 ports, each with its own TF_CONFIG, all running SCRIPT with ARGS. Each
task logs to DIR/<type>_<index>.log; the chief's output is also streamed here. The
launcher exits with the chief's exit code; when the chief ends, or on Ctrl-C or SIGTERM,
every other task is stopped. A worker that crashes while the chief runs is restarted
(ParameterServerStrategy tolerates losing a worker). A parameter server that dies, or a
chief killed by a signal, restarts the whole cluster (--max_restarts times), and the
program resumes from its latest backup. A task that stops answering (a hung or stopped
process: its server leaves a status call unanswered, or its process is stopped) for
--hang_timeout seconds (default 30) is killed and then treated as a task that died. Every
restart is logged. An evaluator that fails is reported, not restarted (a restart of the
whole cluster starts it again); after the chief ends, the evaluator has --evaluator_wait
seconds to finish before it is stopped. With --hosts FILE the tasks run where the file says
(tfps/cluster/_hosts_file.py: each task's address and the command that runs it on its host),
the same addresses in every restart, instead of on 127.0.0.1.
"""

import argparse
import collections
import concurrent.futures
import ctypes
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid

from tfps.cluster._hosts_file import read_hosts
from tfps.cluster._ports import free_ports
from tfps.cluster._task_health import HangWatch

STOP_GRACE_SECONDS = 10
# The chief's output reaches the terminal this late, so that when a task is lost the
# errors the chief prints about it (kept in its log) can be held back.
STREAM_DELAY_SECONDS = 1.0
# Output from this long before a loss was noticed counts as about the loss: the launcher
# polls every 0.2 s, and the chief hears of a dead server within milliseconds.
LOSS_MARGIN_SECONDS = 0.5


def cluster_spec(num_workers, num_ps):
    ports = free_ports(1 + num_workers + num_ps)
    addresses = [f"127.0.0.1:{p}" for p in ports]
    return {"chief": addresses[:1], "worker": addresses[1:1 + num_workers],
            "ps": addresses[1 + num_workers:]}


class Task:
    """One process of the cluster, with its own log file."""

    def __init__(self, task_type, index, cluster, command, log_dir, stream_to=None, env=None):
        self.task_type, self.index = task_type, index
        self.name = f"{task_type}_{index}"
        self.env = dict(os.environ, **(env or {}), TF_CONFIG=json.dumps(
            {"cluster": cluster, "task": {"type": task_type, "index": index}}))
        self.command = command
        self.log_path = os.path.join(log_dir, f"{self.name}.log")
        self.stream_to = stream_to
        self.process = None
        self.restarts = 0
        self.quiet_after = None  # monotonic time after which streamed output is held back

    def start(self):
        log = open(self.log_path, "ab")
        stdout = subprocess.PIPE if self.stream_to is not None else log
        # A session of its own, so stopping the task stops everything it started; and the
        # task dies with the launcher, even a launcher killed by SIGKILL or the OOM killer.
        self.process = subprocess.Popen(self.command, env=self.env, stdout=stdout,
                                        stderr=subprocess.STDOUT, start_new_session=True,
                                        preexec_fn=_die_with_parent)
        self.tee = None
        if self.stream_to is not None:
            self.tee = threading.Thread(target=self._tee, args=(log,), daemon=True)
            self.tee.start()
        else:
            log.close()

    def _tee(self, log):
        """Every line to the log at once, and to the stream STREAM_DELAY_SECONDS later,
        unless it came after quiet_after."""
        held = collections.deque()

        def release(until):
            while held and held[0][0] <= until:
                stamp, text = held.popleft()
                if self.quiet_after is None or stamp < self.quiet_after:
                    self.stream_to.write(text)
                    self.stream_to.flush()
        lines = iter(self.process.stdout.readline, b"")
        reader = concurrent.futures.ThreadPoolExecutor(1)
        pending = reader.submit(next, lines, b"")
        while True:
            try:
                line = pending.result(timeout=STREAM_DELAY_SECONDS / 4)
            except concurrent.futures.TimeoutError:
                release(time.monotonic() - STREAM_DELAY_SECONDS)
                continue
            if not line:
                break
            log.write(line)
            log.flush()
            held.append((time.monotonic(), line.decode(errors="replace")))
            release(time.monotonic() - STREAM_DELAY_SECONDS)
            pending = reader.submit(next, lines, b"")
        release(float("inf"))
        reader.shutdown()
        log.close()

    def hold_output_after(self, moment):
        """Output after `moment` (time.monotonic) stays in the log, off the stream."""
        self.quiet_after = moment if self.quiet_after is None else min(self.quiet_after, moment)

    def poll(self):
        return self.process.poll() if self.process else None

    def kill(self):
        """SIGKILLs every process of the task's session (a stopped process takes no other
        signal); poll() then reports it killed."""
        if self.process is not None:
            _signal_group(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def stop(self):
        """Stops every process of the task's session, also when the task itself has
        exited and left children behind, and passes on the rest of its output."""
        if self.process is None:
            return
        group = self.process.pid
        if _signal_group(group, signal.SIGTERM) and not _wait_for_group(group, STOP_GRACE_SECONDS):
            _signal_group(group, signal.SIGKILL)
        self.process.wait()
        if self.tee is not None:
            self.tee.join(timeout=STOP_GRACE_SECONDS)


def _signal_group(group, sig):
    """Sends sig to a process group; False if no process of it is left."""
    try:
        os.killpg(group, sig)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:  # only zombies are left, which the kernel reports this way
        return False


def _group_members(group):
    """Pids of the live (not zombie) processes of a process group."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()  # after the command name
        except OSError:
            continue  # gone meanwhile
        if fields[0] != "Z" and int(fields[2]) == group:
            members.append(int(entry))
    return members


def _wait_for_group(group, seconds):
    """Waits until no live process of the group is left, or `seconds` pass; True if none is."""
    deadline = time.monotonic() + seconds
    while True:
        left = deadline - time.monotonic()
        fds = []
        for pid in _group_members(group):
            try:
                fds.append(os.pidfd_open(pid))
            except ProcessLookupError:
                pass
        try:
            if not fds:
                return True
            if left <= 0:
                return False
            select.select(fds, [], [], left)  # wakes when any of them exits
        finally:
            for fd in fds:
                os.close(fd)


_PR_SET_PDEATHSIG = 1


def _die_with_parent():
    """In the child before exec: ask the kernel for SIGKILL when the launcher dies."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() == 1:  # the launcher died before prctl took effect
        os._exit(1)


def program_command(script, args):
    if script.endswith(".py"):
        return [sys.executable, "-u", script, *args]
    if os.path.isfile(script) and not os.access(script, os.X_OK):
        return [sys.executable, "-u", script, *args]
    return [script, *args]


def launch(num_ps, num_workers, script, args, log_dir=None, evaluator=False, out=sys.stdout,
           max_worker_restarts=3, max_restarts=3, hang_timeout=30.0, evaluator_wait=600.0, hosts=None):
    """Runs the cluster until the chief exits; returns the chief's exit code.

    A worker that fails is restarted on its own (up to max_worker_restarts times); a
    parameter server that dies, or a chief killed by a signal, ends the cluster, and the
    whole cluster starts again on fresh ports (up to max_restarts times), so a program that
    backs up its state (BackupAndRestore, tfps.callbacks.IncrementalBackup) resumes from
    its latest backup. Each task sees the number of cluster restarts so far in
    TFPS_CLUSTER_RESTARTS, and an id of this launch, the same in every restart, in
    TFPS_LAUNCH_ID (a program keeps its backups in a directory of its launch's own with it).
    A task silent for `hang_timeout` seconds (tfps.cluster._task_health; 0: never) is killed, and
    then handled as a task that died. An evaluator (`evaluator=True`) that fails is reported
    and not restarted; after the chief ends, it has up to `evaluator_wait` seconds to
    evaluate the last checkpoint and exit before it is stopped. `hosts` (read_hosts's (cluster,
    exec prefixes)) runs each task at its address through its prefix, num_ps and num_workers
    being the cluster's.
    """
    if hosts is not None:
        num_ps, num_workers = len(hosts[0]["ps"]), len(hosts[0]["worker"])
        if evaluator and "evaluator_0" not in hosts[1]:
            raise SystemExit("tfps-launch: --evaluator with --hosts needs an \"evaluator\" entry in the hosts file")
    if num_ps < 1 or num_workers < 1:
        raise SystemExit(f"tfps-launch: need --num_ps >= 1 and --num_workers >= 1, got {num_ps} and {num_workers}")
    if not hang_timeout >= 0:
        raise SystemExit(f"tfps-launch: need --hang_timeout >= 0, got {hang_timeout}")
    if not evaluator_wait >= 0:
        raise SystemExit(f"tfps-launch: need --evaluator_wait >= 0, got {evaluator_wait}")
    if max_restarts < 0 or max_worker_restarts < 0:
        raise SystemExit(f"tfps-launch: need --max_restarts >= 0 and --max_worker_restarts >= 0, got "
                         f"{max_restarts} and {max_worker_restarts}")
    log_dir = log_dir or tempfile.mkdtemp(prefix="tfps-launch-")
    try:
        os.makedirs(log_dir, exist_ok=True)
    except OSError as e:
        raise SystemExit(f"tfps-launch: cannot make the log directory --log_dir {log_dir}: {e.strerror}")
    launcher_log = open(os.path.join(log_dir, "launcher.log"), "a")

    def note(message):
        line = f"tfps-launch: {message}"
        launcher_log.write(line + "\n")
        launcher_log.flush()
        print(line, file=sys.stderr, flush=True)

    launch_id = os.environ.get("TFPS_LAUNCH_ID") or uuid.uuid4().hex[:12]
    stopping = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stopping.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        for restart in range(max_restarts + 1):
            cluster = hosts[0] if hosts is not None else cluster_spec(num_workers, num_ps)
            note(f"cluster {json.dumps(cluster)}; logs in {log_dir}")
            code, lost = _run_cluster(cluster, program_command(script, args), log_dir,
                                      evaluator_wait if evaluator else None, out,
                                      max_worker_restarts, restart, stopping, note, launch_id,
                                      hang_timeout, hosts[1] if hosts is not None else {})
            if lost is None:
                return code
            if restart == max_restarts:
                note(f"{lost}; no cluster restarts left (--max_restarts {max_restarts}), giving up")
                return code if code else 1
            note(f"{lost}; restarting the whole cluster (restart {restart + 1} of {max_restarts}); the "
                 f"chief's errors about it are in {os.path.join(log_dir, 'chief_0.log')}")
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        launcher_log.close()


def _lost_with_chief(code, others):
    """What the cluster lost when the chief ended with `code`, or None if it just ended:
    a chief killed by a signal, or one that failed after a parameter server died (the
    chief sees that as UnavailableError), calls for a restart; a program's own error
    does not, since it would fail again."""
    if code < 0:
        return f"the chief was killed by signal {-code}"
    dead = [t.name for t in others if t.task_type == "ps" and t.poll() not in (None, 0)]
    if code != 0 and dead:
        return f"{', '.join(dead)} died and the chief exited with code {code}"
    return None


def _awaited_evaluator(others, returned, seconds, stopping, note):
    """After the chief's success: the evaluator's evaluation of the last checkpoint, which
    the chief wrote just before it ended, is what a sidecar evaluation is run for. False
    when a Ctrl-C or SIGTERM came first."""
    evaluator = next((t for t in others if t.task_type == "evaluator" and t not in returned), None)
    if evaluator is None:
        return True
    if evaluator.poll() is None:
        note(f"the chief ended; waiting up to {seconds:g} s for {evaluator.name} to finish "
             f"(--evaluator_wait)")
        deadline = time.monotonic() + seconds
        while evaluator.poll() is None and time.monotonic() < deadline and not stopping.is_set():
            stopping.wait(0.2)
        if stopping.is_set():
            return False
        if evaluator.poll() is None:
            note(f"{evaluator.name} did not finish within --evaluator_wait {seconds:g} s; stopping it")
            return True
    code = evaluator.poll()
    if code:
        note(f"{evaluator.name} exited with code {code}{_log_end(evaluator, code)}")
    return True


def _log_end(task, code):
    """For a task that exited with an error of its own (not a signal): the last line of its
    log, where a Python program's traceback ends with the error."""
    if code is None or code <= 0:
        return ""
    try:
        with open(task.log_path, "rb") as f:
            f.seek(max(0, os.path.getsize(task.log_path) - 4096))
            lines = [line.strip() for line in f.read().decode(errors="replace").splitlines() if line.strip()]
    except OSError:
        return ""
    return f" (the end of {task.name}.log: {lines[-1][:300]})" if lines else ""


def _run_cluster(cluster, command, log_dir, evaluator_wait, out, max_worker_restarts, restart,
                 stopping, note, launch_id, hang_timeout, prefixes):
    """Runs one cluster (with an evaluator unless evaluator_wait is None), each task's
    command after its prefix in `prefixes`, if any; returns (exit code, None) when the chief
    ends it or it is interrupted, or (the chief's exit code or None, what was lost) when it
    must restart."""
    env = {"TFPS_CLUSTER_RESTARTS": str(restart), "TFPS_LAUNCH_ID": launch_id}

    def task(task_type, index, **kwargs):
        return Task(task_type, index, cluster, prefixes.get(f"{task_type}_{index}", []) + command, log_dir,
                    env=env, **kwargs)
    others = [task("ps", i) for i in range(len(cluster["ps"]))]
    others += [task("worker", i) for i in range(len(cluster["worker"]))]
    if evaluator_wait is not None:
        others.append(task("evaluator", 0))
    chief = task("chief", 0, stream_to=out)
    addresses = {f"{job}_{i}": address for job in ("ps", "worker")
                 for i, address in enumerate(cluster[job])}
    watch = None
    returned = set()  # tasks that exited and will not start again, already reported
    try:
        for task in others + [chief]:
            task.start()
        # For a signal or a profiler aimed at one task.
        note(f"task pids {json.dumps({task.name: task.process.pid for task in others + [chief]})}")
        if hang_timeout > 0:
            watch = HangWatch(others + [chief], addresses, hang_timeout)
        while not stopping.is_set():
            for task, silent in watch.hung() if watch else []:
                if task.task_type != "worker":  # a worker is restarted alone: the run goes on
                    chief.hold_output_after(time.monotonic())
                note(f"{task.name} has not answered for {silent:.0f} s (hung or stopped); killing it")
                task.kill()
                watch.forget(task)
            # Parameter servers first: a chief that failed because one died is a lost
            # parameter server, and what it printed since is about that.
            for task in others:
                code = task.poll()
                if task.task_type == "ps" and code == 0 and task not in returned:
                    # Restarting would only repeat it: the chief's end decides the run's.
                    returned.add(task)
                    note(f"{task.name} exited with code 0; a parameter server's program normally "
                         f"serves until the cluster stops (as tfps.distribute.strategy_from_tf_config() "
                         f"does), so the chief's steps may find it gone")
                elif task.task_type == "ps" and code:
                    chief.hold_output_after(time.monotonic() - LOSS_MARGIN_SECONDS)
                    return None, f"{task.name} exited with code {code}{_log_end(task, code)}"
                elif task.task_type == "evaluator" and code and task not in returned:
                    # Training goes on without it; restarting would fail the same way.
                    returned.add(task)
                    note(f"{task.name} exited with code {code}{_log_end(task, code)}; training goes "
                         f"on without evaluations")
            code = chief.poll()
            if code is not None:
                lost = _lost_with_chief(code, others)
                if lost is not None:
                    chief.hold_output_after(time.monotonic() - LOSS_MARGIN_SECONDS)
                elif code == 0 and not _awaited_evaluator(others, returned, evaluator_wait, stopping, note):
                    break  # interrupted while waiting
                return code, lost
            workers = [task for task in others if task.task_type == "worker"]
            for task in workers:
                code = task.poll()
                if code is None or code == 0 or task in returned:
                    continue
                if task.restarts >= max_worker_restarts:
                    returned.add(task)
                    note(f"{task.name} exited with code {code}{_log_end(task, code)}; no restarts of it "
                         f"left (--max_worker_restarts {max_worker_restarts})")
                    continue
                task.restarts += 1
                note(f"{task.name} exited with code {code}{_log_end(task, code)}; restarting it "
                     f"(restart {task.restarts} of {max_worker_restarts})")
                task.start()
                note(f"{task.name} restarted as pid {task.process.pid}")
                if watch:
                    watch.forget(task)
            if all(task.poll() is not None for task in workers) and returned & set(workers):
                # The chief's steps would wait for a worker forever.
                note("no worker is left to run the chief's steps; stopping the cluster")
                return 1, None
            stopping.wait(0.2)  # wakes at once on Ctrl-C or SIGTERM
        note("interrupted; stopping every task")
        return 130, None
    finally:
        if watch:
            watch.close()
        for task in others + [chief]:
            task.stop()


def argument_parser():
    # No abbreviations: the program's own flags follow its name, and one that starts like
    # a launcher flag (--eval, --max) would otherwise be taken for it or refused.
    parser = argparse.ArgumentParser(prog="tfps-launch", description=__doc__.splitlines()[0],
                                     allow_abbrev=False)
    parser.add_argument("--num_ps", type=int, help="parameter servers (required without --hosts)")
    parser.add_argument("--num_workers", type=int, help="workers (required without --hosts)")
    parser.add_argument("--hosts", help="a JSON file of each task's address and the command that runs it "
                                        "on its host (tfps/cluster/_hosts_file.py), instead of local "
                                        "processes on 127.0.0.1")
    parser.add_argument("--evaluator", action="store_true",
                        help="start an evaluator task too (TF_CONFIG task type \"evaluator\"), "
                             "running the same program: sidecar evaluation of the chief's "
                             "checkpoints, as examples/train_ctr.py does")
    parser.add_argument("--log_dir")
    parser.add_argument("--max_worker_restarts", type=int, default=3,
                        help="times each worker restarts on its own after it fails")
    parser.add_argument("--max_restarts", type=int, default=3,
                        help="times the whole cluster restarts after a parameter server dies or "
                             "the chief fails")
    parser.add_argument("--hang_timeout", type=float, default=30.0,
                        help="seconds a task may leave its status check unanswered (or stay "
                             "stopped) before it is killed and restarted; 0: never")
    parser.add_argument("--evaluator_wait", type=float, default=600.0,
                        help="with --evaluator: seconds the evaluator may run after the chief "
                             "ends, to evaluate the last checkpoint, before it is stopped")
    parser.add_argument("script", help="the program every task runs (a .py file or an executable)")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="the program's own arguments (optional)")
    return parser


def main(argv=None):
    parser = argument_parser()
    opts = parser.parse_args(argv)
    if not os.path.isfile(opts.script):
        parser.error(f"{opts.script} is not a file" if os.path.exists(opts.script)
                     else f"{opts.script} does not exist")
    hosts = read_hosts(opts.hosts) if opts.hosts else None
    if hosts is not None:
        given = {"--num_ps": (opts.num_ps, len(hosts[0]["ps"])),
                 "--num_workers": (opts.num_workers, len(hosts[0]["worker"]))}
        for flag, (number, listed) in given.items():
            if number is not None and number != listed:
                parser.error(f"{flag} {number}, but --hosts {opts.hosts} lists {listed}")
    elif opts.num_ps is None or opts.num_workers is None:
        parser.error("--num_ps and --num_workers are required (or --hosts)")
    sys.exit(launch(opts.num_ps, opts.num_workers, opts.script, opts.args, opts.log_dir,
                    opts.evaluator, max_worker_restarts=opts.max_worker_restarts,
                    max_restarts=opts.max_restarts, hang_timeout=opts.hang_timeout,
                    evaluator_wait=opts.evaluator_wait, hosts=hosts))


if __name__ == "__main__":
    main()
