"""tfps-launch: run a TF_CONFIG training program as a local parameter-server cluster.

    tfps-launch --num_ps 2 --num_workers 2 [--evaluator] [--log_dir DIR] SCRIPT [ARGS...]

Starts a chief, the workers, the parameter servers (and an evaluator) as local processes
on free 127.0.0.1 ports, each with its own TF_CONFIG, all running SCRIPT with ARGS. Each
task logs to DIR/<type>_<index>.log; the chief's output is also streamed here. The
launcher exits with the chief's exit code; when the chief ends, or on Ctrl-C or SIGTERM,
every other task is stopped. A worker that crashes while the chief runs is restarted
(ParameterServerStrategy tolerates losing a worker), and the restart is logged.
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading

from tfps.distribute import free_ports

STOP_GRACE_SECONDS = 10


def cluster_spec(num_workers, num_ps):
    ports = free_ports(1 + num_workers + num_ps)
    addresses = [f"127.0.0.1:{p}" for p in ports]
    return {"chief": addresses[:1], "worker": addresses[1:1 + num_workers],
            "ps": addresses[1 + num_workers:]}


class Task:
    """One process of the cluster, with its own log file."""

    def __init__(self, task_type, index, cluster, command, log_dir, stream_to=None):
        self.task_type, self.index = task_type, index
        self.name = f"{task_type}_{index}"
        self.env = dict(os.environ, TF_CONFIG=json.dumps(
            {"cluster": cluster, "task": {"type": task_type, "index": index}}))
        self.command = command
        self.log_path = os.path.join(log_dir, f"{self.name}.log")
        self.stream_to = stream_to
        self.process = None
        self.restarts = 0

    def start(self):
        log = open(self.log_path, "ab")
        stdout = subprocess.PIPE if self.stream_to is not None else log
        # A session of its own, so stopping the task stops everything it started.
        self.process = subprocess.Popen(self.command, env=self.env, stdout=stdout,
                                        stderr=subprocess.STDOUT, start_new_session=True)
        if self.stream_to is not None:
            threading.Thread(target=self._tee, args=(log,), daemon=True).start()
        else:
            log.close()

    def _tee(self, log):
        for line in iter(self.process.stdout.readline, b""):
            log.write(line)
            log.flush()
            self.stream_to.write(line.decode(errors="replace"))
            self.stream_to.flush()
        log.close()

    def poll(self):
        return self.process.poll() if self.process else None

    def stop(self):
        if self.process is None or self.process.poll() is not None:
            return
        try:
            os.killpg(self.process.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        try:
            self.process.wait(timeout=STOP_GRACE_SECONDS)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.process.wait()


def program_command(script, args):
    if script.endswith(".py"):
        return [sys.executable, "-u", script, *args]
    if os.path.isfile(script) and not os.access(script, os.X_OK):
        return [sys.executable, "-u", script, *args]
    return [script, *args]


def launch(num_ps, num_workers, script, args, log_dir=None, evaluator=False, out=sys.stdout,
           max_worker_restarts=3):
    """Runs the cluster until the chief exits; returns the chief's exit code."""
    if num_ps < 1 or num_workers < 1:
        raise SystemExit(f"tfps-launch: need --num_ps >= 1 and --num_workers >= 1, got {num_ps} and {num_workers}")
    log_dir = log_dir or tempfile.mkdtemp(prefix="tfps-launch-")
    os.makedirs(log_dir, exist_ok=True)
    cluster = cluster_spec(num_workers, num_ps)
    command = program_command(script, args)
    others = [Task("ps", i, cluster, command, log_dir) for i in range(num_ps)]
    others += [Task("worker", i, cluster, command, log_dir) for i in range(num_workers)]
    if evaluator:
        others.append(Task("evaluator", 0, cluster, command, log_dir))
    chief = Task("chief", 0, cluster, command, log_dir, stream_to=out)
    launcher_log = open(os.path.join(log_dir, "launcher.log"), "a")

    def note(message):
        line = f"tfps-launch: {message}"
        launcher_log.write(line + "\n")
        launcher_log.flush()
        print(line, file=sys.stderr, flush=True)

    stopping = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stopping.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    note(f"cluster {json.dumps(cluster)}; logs in {log_dir}")
    try:
        for task in others + [chief]:
            task.start()
        while not stopping.is_set():
            code = chief.poll()
            if code is not None:
                break
            for task in others:
                code = task.poll()
                if code is None or task.task_type != "worker":
                    continue
                if task.restarts >= max_worker_restarts:
                    continue
                task.restarts += 1
                note(f"{task.name} exited with code {code}; restarting it "
                     f"(restart {task.restarts} of {max_worker_restarts})")
                task.start()
            stopping.wait(0.2)  # wakes at once on Ctrl-C or SIGTERM
        if stopping.is_set():
            note("interrupted; stopping every task")
            chief.stop()
            return 130
        return chief.poll()
    finally:
        for task in others + [chief]:
            task.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        launcher_log.close()


def main(argv=None):
    parser = argparse.ArgumentParser(prog="tfps-launch", description=__doc__.splitlines()[0])
    parser.add_argument("--num_ps", type=int, required=True)
    parser.add_argument("--num_workers", type=int, required=True)
    parser.add_argument("--evaluator", action="store_true")
    parser.add_argument("--log_dir")
    parser.add_argument("--max_worker_restarts", type=int, default=3)
    parser.add_argument("script")
    parser.add_argument("args", nargs=argparse.REMAINDER)
    opts = parser.parse_args(argv)
    if not os.path.exists(opts.script):
        parser.error(f"{opts.script} does not exist")
    sys.exit(launch(opts.num_ps, opts.num_workers, opts.script, opts.args, opts.log_dir,
                    opts.evaluator, max_worker_restarts=opts.max_worker_restarts))


if __name__ == "__main__":
    main()
