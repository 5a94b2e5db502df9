"""Run under tfps-launch by tests/test_launch_recovery.py: trains with IncrementalBackup
while the test SIGKILLs a parameter server. Every task writes "<task> <pid>" to the FIFO
DIR/events. After each backup the chief writes the rows it saved to
DIR/backup-<run>-<n>.npz (with the epoch and batch) and then "backup_<run> <n>" to the
FIFO; after each step block it writes "step_<run> <global step>". In the first run, after
the first step block past its second backup, it writes "holding_0 <step>" and waits (5
minutes at most) until the test writes a line to the FIFO DIR/release. After a cluster
restart it writes the rows it restored to DIR/restored-<run>.npz; a run that completes fit
writes DIR/done-<run>.json.

Usage: ps_loss_resume.py DIR"""

import json
import os
import select
import sys

os.environ["TF_USE_LEGACY_KERAS"] = "1"

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tf_keras as keras  # noqa: E402

import tfps  # noqa: E402
from tests.table_rows import sorted_rows  # noqa: E402

SAVE_EVERY, STEPS_PER_EXECUTION, EPOCHS, STEPS_PER_EPOCH = 10, 5, 6, 20


def dataset_fn(_):
    def example(r):
        ids = tf.stack([tf.math.floormod(r, 5000), tf.math.floormod(r // 5000, 700)])
        return ids, tf.cast(tf.math.floormod(r, 7) < 3, tf.float32)
    return tf.data.Dataset.random(seed=5).map(example).batch(64).repeat()


def main(directory):
    task = tfps.distribute.tf_config()["task"]
    run = int(os.environ.get("TFPS_CLUSTER_RESTARTS", "0"))

    def event(name, value):
        with open(os.path.join(directory, "events"), "w") as f:  # short writes: atomic on a FIFO
            f.write(f"{name} {value}\n")

    event(f"{task['type']}_{task['index']}", os.getpid())
    strategy = tfps.distribute.strategy_from_tf_config()
    with strategy.scope():
        ids = keras.Input(shape=(2,), dtype=tf.int64)
        layer = tfps.keras_layers.DynamicEmbedding(4, combiner="sum", optimizer=tfps.optimizers.Adagrad(0.1))
        model = keras.Model(ids, keras.layers.Dense(1, activation="sigmoid")(layer(ids, namespace="columns")))
        model.compile(optimizer=keras.optimizers.legacy.Adagrad(0.05), loss="binary_crossentropy",
                      steps_per_execution=STEPS_PER_EXECUTION)
    backup_dir = os.path.join(directory, "backup")
    chain_file = os.path.join(backup_dir, "chief", "chain.json")
    seen = {"chain": None, "backups": 0, "epoch": 0, "held": run > 0}

    def hold(step):
        """Waits for the test's line on DIR/release, at most 5 minutes."""
        # Read-write: the open does not wait for the test, and the FIFO never reads as ended.
        release = os.open(os.path.join(directory, "release"), os.O_RDWR)
        event("holding_0", step)
        select.select([release], [], [], 300)
        os.close(release)

    class Record(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self._supports_tf_logs = True  # allows batch hooks under ParameterServerStrategy

        def on_train_begin(self, logs=None):
            if run > 0:
                np.savez(os.path.join(directory, f"restored-{run}.npz"), **sorted_rows(layer.table))

        def on_epoch_begin(self, epoch, logs=None):
            seen["epoch"] = epoch

        def on_train_batch_end(self, batch, logs=None):
            step = seen["epoch"] * STEPS_PER_EPOCH + batch
            chain = open(chain_file).read() if os.path.exists(chain_file) else None
            if chain != seen["chain"]:
                seen["chain"] = chain
                np.savez(os.path.join(directory, f"backup-{run}-{seen['backups']}.npz"),
                         epoch=seen["epoch"], batch=batch, **sorted_rows(layer.table))
                event(f"backup_{run}", seen["backups"])
                seen["backups"] += 1
            elif seen["backups"] >= 2 and not seen["held"]:
                seen["held"] = True
                hold(step)
            event(f"step_{run}", step)

    model.fit(keras.utils.experimental.DatasetCreator(dataset_fn), epochs=EPOCHS,
              steps_per_epoch=STEPS_PER_EPOCH, verbose=0,
              callbacks=[tfps.callbacks.IncrementalBackup(backup_dir, save_freq=SAVE_EVERY, full_every=3),
                         Record()])
    with open(os.path.join(directory, f"done-{run}.json"), "w") as f:
        json.dump({"run": run, "rows": int(layer.table.size())}, f)
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1])
