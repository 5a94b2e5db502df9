"""A TF_CONFIG program without TensorFlow for the launcher tests of an evaluator task: ps
and worker tasks serve until the launcher stops them. The chief and the evaluator meet at
the FIFO `--meet`.

Without --evaluator_fails, the chief tells the evaluator it wrote its last checkpoint and
exits 0; the evaluator then evaluates for `--evaluation_seconds` (so it ends after the
chief) and writes "evaluated" to `--evaluated_file`, or, stopped by the launcher first,
exits 143. With it, the evaluator fails at once, and the chief exits 0 once it is gone."""

import argparse
import json
import os
import signal

parser = argparse.ArgumentParser()
parser.add_argument("--meet", required=True)
parser.add_argument("--evaluated_file", required=True)
parser.add_argument("--evaluation_seconds", type=float, default=2.0)
parser.add_argument("--evaluator_fails", action="store_true")
args = parser.parse_args()
task_type = json.loads(os.environ["TF_CONFIG"])["task"]["type"]
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})

if task_type in ("ps", "worker"):
    signal.sigtimedwait({signal.SIGTERM}, 600)
elif task_type == "chief":
    if args.evaluator_fails:
        with open(args.meet) as meet:  # end of file: the evaluator is gone
            meet.read()
    else:
        with open(args.meet, "w") as meet:
            meet.write("last checkpoint written\n")
    print("chief done", flush=True)
elif args.evaluator_fails:
    meet = open(args.meet, "w")
    raise RuntimeError("no checkpoint directory")
else:
    with open(args.meet) as meet:
        meet.read()
    # An evaluation that takes its time, unless the launcher stops it (SIGTERM).
    if signal.sigtimedwait({signal.SIGTERM}, args.evaluation_seconds) is not None:
        raise SystemExit(143)
    with open(args.evaluated_file, "w") as f:
        f.write("evaluated\n")
