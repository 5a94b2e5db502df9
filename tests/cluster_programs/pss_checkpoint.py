"""Run by tests/test_dynamic_embedding_pss.py. `save DIR` trains under 2 PS tasks with a
Keras ModelCheckpoint(save_weights_only=True) and writes every table row to DIR/rows.npz;
`restore DIR` builds the same model under 3 PS tasks, loads the weights and compares every
key's value, slots and metadata with the saved rows. `backup DIR` first tries
BackupAndRestore(save_freq=5) (refused), then trains with BackupAndRestore until a simulated
preemption, empties the tables, resumes, and compares the restored rows with those of the
last backup. Prints JSON."""

import json
import os
import sys

os.environ["TF_USE_LEGACY_KERAS"] = "1"

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tf_keras as keras  # noqa: E402

import tfps  # noqa: E402
from tests.table_rows import sorted_rows  # noqa: E402


def dataset_fn(_):
    def example(r):
        return tf.stack([tf.math.floormod(r, 3000), tf.math.floormod(r // 3000, 500)]), \
            tf.cast(tf.math.floormod(r, 7) < 3, tf.float32)
    return tf.data.Dataset.random(seed=3).map(example).batch(64).repeat()


def build(strategy):
    with strategy.scope():
        ids = keras.Input(shape=(2,), dtype=tf.int64)
        embedding = tfps.keras_layers.DynamicEmbedding(
            4, combiner="mean", optimizer=tfps.optimizers.Adagrad(0.2), name="ids")
        model = keras.Model(ids, keras.layers.Dense(1, activation="sigmoid")(embedding(ids, namespace="columns")))
        model.compile(optimizer=keras.optimizers.legacy.Adagrad(0.05), loss="binary_crossentropy",
                      steps_per_execution=5)
    return model, embedding


def backup_and_resume(model, embedding, directory):
    snapshots = {}

    class Preempt(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            snapshots[epoch] = sorted_rows(embedding.table)
            if epoch == 1:
                raise RuntimeError("simulated preemption")

    class Restored(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            snapshots["restored"] = sorted_rows(embedding.table)

    data = keras.utils.experimental.DatasetCreator(dataset_fn)
    # tf_keras would run none of a step-counting BackupAndRestore's hooks here: refused.
    every_5_steps = os.path.join(directory, "every_5_steps")
    try:
        model.fit(data, epochs=1, steps_per_epoch=10, verbose=0,
                  callbacks=[keras.callbacks.BackupAndRestore(every_5_steps, save_freq=5)])
        refusal = None
    except ValueError as e:
        refusal = str(e)
    refused_untrained = int(model.optimizer.iterations.numpy()) == 0 and int(embedding.table.size()) == 0
    backup = keras.callbacks.BackupAndRestore(os.path.join(directory, "backup"))
    try:
        model.fit(data, epochs=4, steps_per_epoch=10, verbose=0, callbacks=[backup, Preempt()])
    except RuntimeError as e:
        assert "simulated preemption" in str(e)
    embedding.table.clear()
    model.fit(data, epochs=4, steps_per_epoch=10, verbose=0, callbacks=[backup, Restored()])
    saved, restored = snapshots[1], snapshots["restored"]
    return {"shard_sizes": embedding.table.shard_sizes(), "num_keys": int(len(saved["keys"])),
            "step_backup_refusal": refusal, "refused_untrained": refused_untrained,
            **{f"{name}_equal": bool(np.array_equal(saved[name], restored[name])) for name in saved}}


def main(mode, directory):
    num_ps = 2 if mode in ("save", "backup") else 3
    with tfps.distribute.local_cluster(num_workers=2, num_ps=num_ps) as strategy:
        model, embedding = build(strategy)
        weights = os.path.join(directory, "weights")
        if mode == "backup":
            out = backup_and_resume(model, embedding, directory)
        elif mode == "save":
            model.fit(keras.utils.experimental.DatasetCreator(dataset_fn), epochs=2, steps_per_epoch=20,
                      verbose=0, callbacks=[keras.callbacks.ModelCheckpoint(weights, save_weights_only=True)])
            np.savez(os.path.join(directory, "rows.npz"), **sorted_rows(embedding.table))
            out = {"shard_sizes": embedding.table.shard_sizes()}
        else:
            model.load_weights(weights)
            saved = np.load(os.path.join(directory, "rows.npz"))
            restored = sorted_rows(embedding.table)
            out = {"shard_sizes": embedding.table.shard_sizes(),
                   "keys_equal": bool(np.array_equal(saved["keys"], restored["keys"])),
                   "num_keys": int(len(saved["keys"]))}
            for name in ("values", "slots", "metadata"):
                out[f"{name}_equal"] = bool(np.array_equal(saved[name], restored[name]))
    json.dump(out, sys.stdout)
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
