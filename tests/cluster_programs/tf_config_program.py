"""A plain TF_CONFIG parameter-server program that knows nothing of tfps, for the launcher
tests: ps and worker tasks serve; the chief runs `--steps` coordinator steps that add to a
PS variable, prints the total and exits with `--exit_code`. Each task writes a line
"<type>_<index> <pid>" to the FIFO `--pid_pipe`. With `--hold_at N` the chief stops after
N steps, writes "chief_0:holding <pid>" there and waits for SIGUSR1, so a test can act on a
running cluster at a known point."""

import argparse
import json
import os
import signal
import sys

# Blocked before TensorFlow starts any thread (threads inherit the mask), so a SIGUSR1
# sent before the chief holds stays pending instead of killing the process.
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})

import tensorflow as tf  # noqa: E402


def announce(pid_pipe, name):
    """Writes "<name> <pid>" to the FIFO, if there is one."""
    if pid_pipe:
        with open(pid_pipe, "w") as pipe:  # one short write: atomic on a FIFO
            pipe.write(f"{name} {os.getpid()}\n")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--hold_at", type=int, default=-1)
    parser.add_argument("--hold_seconds", type=float, default=300.0)
    parser.add_argument("--exit_code", type=int, default=0)
    parser.add_argument("--pid_pipe")
    args = parser.parse_args()
    config = json.loads(os.environ["TF_CONFIG"])
    task = config["task"]
    announce(args.pid_pipe, f"{task['type']}_{task['index']}")
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

    for i in range(args.steps):
        if i == args.hold_at:
            announce(args.pid_pipe, "chief_0:holding")
            if signal.sigtimedwait({signal.SIGUSR1}, args.hold_seconds) is None:
                sys.exit(f"chief: no SIGUSR1 within {args.hold_seconds} s of holding")
        coordinator.schedule(step)
    coordinator.join()
    print(f"chief done: total={total.numpy():.0f}", flush=True)
    sys.stdout.flush()
    os._exit(args.exit_code)


if __name__ == "__main__":
    main()
