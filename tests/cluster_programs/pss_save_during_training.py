"""Run by tests/test_save_chains.py: checkpoints written by the chief while 2 workers keep
applying known gradients to an SGD and an Adam table sharded over 2 parameter servers.

Every worker closure applies to each of KEYS keys, ROUNDS times, the same gradient
(gradient(key, i) below), so each row passes through a known sequence of states; the
chief writes a checkpoint of both tables each time the SGD table's clock (its applies, on
the busier shard) passes another SAVE_EVERY applies, until the closures are done. Prints the checkpoint paths and the run's constants as JSON; the test restores each
and checks every row against the states it passed through."""

import json
import os
import sys
import threading
import time

os.environ["TF_USE_LEGACY_KERAS"] = "1"

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tfps  # noqa: E402
from tfps.table.sharded_table import ShardedTable  # noqa: E402

KEYS, DIM, ROUNDS, CLOSURES, LEARNING_RATE, SAVE_EVERY, MAX_SAVES = 1000, 4, 10, 60, 0.01, 50, 11
WAIT_S = 120  # the longest a save waits for its clock


def gradient(keys):
    """A fixed gradient per key and element, none of them 0."""
    i = np.arange(DIM)[None, :]
    magnitude = 0.5 + ((keys[:, None] * 3 + i) % 7) * 0.25
    return np.where((keys[:, None] + i) % 2 == 0, magnitude, -magnitude).astype(np.float32)


def make_tables():
    zeros = tfps.initializers.Zeros()
    return {"sgd": ShardedTable(DIM, optimizer=tfps.optimizers.SGD(LEARNING_RATE), initializer=zeros, name="sgd"),
            "adam": ShardedTable(DIM, optimizer=tfps.optimizers.Adam(LEARNING_RATE), initializer=zeros,
                                 name="adam")}


def main(directory):
    keys_np = np.arange(KEYS, dtype=np.int64) * 7919  # spread over both shards
    with tfps.distribute.local_cluster(num_workers=2, num_ps=2) as strategy:
        coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)
        with strategy.scope():
            tables = make_tables()
        keys, gradients = tf.constant(keys_np), tf.constant(gradient(keys_np))

        @tf.function
        def train():
            for _ in tf.range(ROUNDS):
                for table in tables.values():
                    table.apply_gradients(keys, gradients)

        for _ in range(CLOSURES):
            coordinator.schedule(train)
        checkpoint = tf.train.Checkpoint(**tables)
        saves = []
        while not coordinator.done() and len(saves) < MAX_SAVES:
            target, deadline = (len(saves) + 1) * SAVE_EVERY, time.monotonic() + WAIT_S
            while (tables["sgd"].stats()["clock"] < target and not coordinator.done()
                   and time.monotonic() < deadline):
                threading.Event().wait(0.005)
            saves.append(checkpoint.write(os.path.join(directory, f"during-{len(saves)}")))
        coordinator.join()
        saves.append(checkpoint.write(os.path.join(directory, "after")))
    print(json.dumps({"saves": saves, "keys": KEYS, "dim": DIM, "updates": ROUNDS * CLOSURES,
                      "learning_rate": LEARNING_RATE}))
    sys.stdout.flush()
    os._exit(0)  # in-process servers cannot be stopped; end the process without waiting


if __name__ == "__main__":
    main(sys.argv[1])
