"""A TF_CONFIG program without TensorFlow for the launcher tests of tasks that end on their
own: every task prints its name and exits 0, except that workers exit with
`--worker_exit_code` when given, and the chief then waits `--chief_waits` seconds (as a
chief whose steps have no worker left to run them would wait) before it prints "chief done"."""

import argparse
import json
import os
import time

parser = argparse.ArgumentParser()
parser.add_argument("--worker_exit_code", type=int, default=0)
parser.add_argument("--chief_waits", type=float, default=0.5)
args = parser.parse_args()
task = json.loads(os.environ["TF_CONFIG"])["task"]
name = f"{task['type']}_{task['index']}"
print(f"{name} started", flush=True)
if task["type"] == "worker":
    raise SystemExit(args.worker_exit_code)
if task["type"] == "chief":
    time.sleep(args.chief_waits)  # the parameter servers and workers end first
    print("chief done", flush=True)
