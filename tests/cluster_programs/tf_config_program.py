"""A plain TF_CONFIG parameter-server program that knows nothing of tfps, for the launcher
tests: ps and worker tasks serve; the chief runs `--steps` coordinator steps that add to a
PS variable, prints the total and exits with `--exit_code`. Each task writes its pid to
PID_DIR/<type>_<index>.pid."""

import argparse
import json
import os
import sys
import time

import tensorflow as tf


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--step_seconds", type=float, default=0.0)
    parser.add_argument("--exit_code", type=int, default=0)
    parser.add_argument("--pid_dir")
    args = parser.parse_args()
    config = json.loads(os.environ["TF_CONFIG"])
    task = config["task"]
    if args.pid_dir:
        with open(os.path.join(args.pid_dir, f"{task['type']}_{task['index']}.pid"), "w") as f:
            f.write(str(os.getpid()))
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    if task["type"] in ("ps", "worker"):
        server_config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=8)
        tf.distribute.Server(resolver.cluster_spec(), job_name=task["type"], task_index=task["index"],
                             protocol="grpc", config=server_config, start=True).join()
        return
    strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    with strategy.scope():
        total = tf.Variable(0.0)

    @tf.function
    def step():
        total.assign_add(1.0)
        return total.read_value()

    for _ in range(args.steps):
        coordinator.schedule(step)
        if args.step_seconds:
            time.sleep(args.step_seconds)  # stretches the run so a test can kill a worker
    coordinator.join()
    print(f"chief done: total={total.numpy():.0f}", flush=True)
    sys.stdout.flush()
    os._exit(args.exit_code)


if __name__ == "__main__":
    main()
