"""A TF_CONFIG program without TensorFlow for the launcher tests of tasks that end on their
own: every parameter server and worker prints its name and exits 0 (writing its pid to
`--ended_file` first), except that workers exit with `--worker_exit_code` when given. The
chief waits until every other task has written its pid and exited, at most
`--chief_deadline` seconds (as a chief whose steps have no worker left to run them would
wait, until the launcher stops it), then prints "chief done"."""

import argparse
import json
import os
import select
import signal
import time

parser = argparse.ArgumentParser()
parser.add_argument("--ended_file", required=True)
parser.add_argument("--worker_exit_code", type=int, default=0)
parser.add_argument("--chief_deadline", type=float, default=60.0)
args = parser.parse_args()
config = json.loads(os.environ["TF_CONFIG"])
task = config["task"]
name = f"{task['type']}_{task['index']}"
print(f"{name} started", flush=True)


def ended_pids():
    try:
        with open(args.ended_file) as f:
            return [int(pid) for pid in f.read().split()]
    except FileNotFoundError:
        return []


def exited(pid):
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        return bool(select.select([fd], [], [], 0)[0])  # readable once the process exits
    finally:
        os.close(fd)


if task["type"] == "chief":
    others = sum(len(config["cluster"][job]) for job in ("ps", "worker"))
    deadline = time.monotonic() + args.chief_deadline
    # SIGTERM (the launcher stopping the cluster) ends the wait at once.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    while time.monotonic() < deadline:
        pids = ended_pids()
        if len(pids) == others and all(exited(pid) for pid in pids):
            print("chief done", flush=True)
            break
        if signal.sigtimedwait({signal.SIGTERM}, 0.05) is not None:
            raise SystemExit(143)
else:
    code = args.worker_exit_code if task["type"] == "worker" else 0
    if code == 0:
        with open(args.ended_file, "a") as f:  # one short append: atomic
            f.write(f"{os.getpid()}\n")
    raise SystemExit(code)
