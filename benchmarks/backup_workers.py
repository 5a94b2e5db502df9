"""Backup workers in synchronous fit (tfps.callbacks.SynchronousTraining(backup_workers=b))
against a straggler: a cluster of 3 workers and 1 parameter server under tfps-launch,
one worker slowed 3x by SIGSTOP/SIGCONT cycles on its process (run --run_ms, stopped
twice as long), and synchronous examples/s (examples of the batches applied per second)
with and without backup workers, with and without the slow worker, all in one run:

    python benchmarks/backup_workers.py [--steps_per_epoch 40 --epochs 3 --batch_size 256]

Prints one JSON line per configuration and one with the ratios: sync_b1_slow over
sync_b1 (the target: >= 0.8) and over sync_b0 (plain synchronous training without a slow
worker), and sync_b0_slow over sync_b0 (a step waits for the slow worker). The first
epoch (tracing, start-up) is left out of each figure. The model is examples/custom_loop.py's.
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "examples"))

WORKERS = 3


def child(args):
    """The chief's program: fit synchronously, print the measured epochs' figures."""
    import custom_loop
    import tensorflow as tf
    import tf_keras as keras

    import tfps

    args.dim, args.table_lr, args.dense_lr, args.seed = 8, 0.3, 0.5, 11
    strategy = tfps.distribute.strategy_from_tf_config()
    with strategy.scope():
        model, _, _ = custom_loop.build(args)
        model.compile(optimizer=keras.optimizers.SGD(args.dense_lr),
                      loss=keras.losses.BinaryCrossentropy(from_logits=True))
    def dataset_fn(_):
        # Examples at random, unseeded: each worker's copy of the dataset reads its own (as each
        # would its own files); identical streams put the workers in lockstep on the same batches.
        return (tf.data.Dataset.random().map(lambda i: tf.abs(i) % (1 << 40)).batch(args.batch_size)
                .map(lambda index: (custom_loop.example_ids(index),
                                    custom_loop.example_labels(custom_loop.example_ids(index)))))
    data = keras.utils.experimental.DatasetCreator(dataset_fn)

    times = []

    class EpochTimes(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            times.append(time.perf_counter())

        def on_epoch_end(self, epoch, logs=None):
            times[-1] = time.perf_counter() - times[-1]

    synchronous = tfps.callbacks.SynchronousTraining(backup_workers=args.backup_workers)
    model.fit(data, epochs=args.epochs, steps_per_epoch=args.steps_per_epoch, verbose=0,
              callbacks=[synchronous, EpochTimes()])
    seconds = sum(times[1:])
    steps = (args.epochs - 1) * args.steps_per_epoch
    applied = steps * (WORKERS - args.backup_workers) * args.batch_size
    print("RESULT " + json.dumps({
        "backup_workers": args.backup_workers, "steps_per_s": round(steps / seconds, 2),
        "examples_per_s": round(applied / seconds, 1), "dropped_batches": synchronous.dropped_batches,
        "seconds": round(seconds, 2)}), flush=True)


def slow_down(launch_id, run_ms, stop, tfps_benchmarks):
    """SIGSTOP/SIGCONT cycles on worker 1's process: runs run_ms, stopped 2 x run_ms."""
    pid = None
    while pid is None and not stop.is_set():
        pid = tfps_benchmarks.launch_processes(launch_id).get("worker_1")
        stop.wait(0.1)  # the worker's process is not started yet
    while not stop.is_set():
        try:
            os.kill(pid, signal.SIGSTOP)
            stop.wait(2 * run_ms / 1000)
            os.kill(pid, signal.SIGCONT)
            stop.wait(run_ms / 1000)
        except ProcessLookupError:
            return
    try:
        os.kill(pid, signal.SIGCONT)
    except ProcessLookupError:
        pass


def configuration(args, backup_workers, slow, log_dir):
    from benchmarks import faults
    launch_id = f"backup-workers-{os.getpid()}-{backup_workers}-{int(slow)}"
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", TF_USE_LEGACY_KERAS="1", PYTHONPATH=ROOT,
               TFPS_LAUNCH_ID=launch_id)
    env.pop("TF_CONFIG", None)
    command = [sys.executable, "-m", "tfps.launch", "--num_ps", "1", "--num_workers", str(WORKERS),
               "--log_dir", os.path.join(log_dir, f"b{backup_workers}{'_slow' if slow else ''}"),
               os.path.abspath(__file__), "--child", "--backup_workers", str(backup_workers),
               "--steps_per_epoch", str(args.steps_per_epoch), "--epochs", str(args.epochs),
               "--batch_size", str(args.batch_size)]
    stop = threading.Event()
    slower = threading.Thread(target=slow_down, args=(launch_id, args.run_ms, stop, faults)) if slow else None
    launcher = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if slower:
        slower.start()
    try:
        out, _ = launcher.communicate(timeout=600)
    finally:
        stop.set()
        if slower:
            slower.join()
    lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
    if launcher.returncode != 0 or not lines:
        raise SystemExit(f"configuration b={backup_workers} slow={slow} failed:\n{out[-3000:]}")
    return json.loads(lines[-1][len("RESULT "):])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--backup_workers", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--steps_per_epoch", type=int, default=40)
    parser.add_argument("--epochs", type=int, default=3, help="the first is left out of the figures")
    parser.add_argument("--batch_size", type=int, default=256, help="per worker")
    parser.add_argument("--run_ms", type=float, default=50, help="the slow worker runs this long, "
                        "then is stopped twice as long")
    parser.add_argument("--log_dir", default="/tmp/tfps_backup_workers_logs")
    args = parser.parse_args()
    if args.child:
        return child(args)
    results = {}
    for name, backup_workers, slow in [("sync_b0", 0, False), ("sync_b1", 1, False),
                                       ("sync_b0_slow", 0, True), ("sync_b1_slow", 1, True)]:
        results[name] = configuration(args, backup_workers, slow, args.log_dir)
        print(json.dumps({"configuration": name, "workers": WORKERS, "slow_worker": "3x" if slow else None,
                          **results[name]}), flush=True)
    speed = {name: result["examples_per_s"] for name, result in results.items()}
    print(json.dumps({
        "sync_b1_slow_over_sync_b1": round(speed["sync_b1_slow"] / speed["sync_b1"], 3),
        "sync_b1_slow_over_sync_b0": round(speed["sync_b1_slow"] / speed["sync_b0"], 3),
        "sync_b0_slow_over_sync_b0": round(speed["sync_b0_slow"] / speed["sync_b0"], 3),
        "target": "sync_b1_slow_over_sync_b1 >= 0.8"}), flush=True)


if __name__ == "__main__":
    main()
