"""Run by tests/test_export.py: trains under ParameterServerStrategy (2 workers, 2 PS) a
model of two int64 fields sharing a table and a ragged string multi-hot feature (mean),
exports with save_for_serving and stores test inputs (the ragged one as values and
row_splits, as the serving signature takes it) and model.predict outputs. Then exports the
ID table for retrieval, whole, trains on, and exports its changes, storing the table's own
export after each beside them. Last, trains on, removes rows and writes an export of
changes following the first SavedModel, storing model.predict outputs for it."""

import json
import os
import sys

os.environ["TF_USE_LEGACY_KERAS"] = "1"

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tf_keras as keras  # noqa: E402

import tfps  # noqa: E402


TAGS = tf.constant(["news", "sport", "music", "film", "games", "food", "travel"])


def tags_of(r):
    """0 to 3 tags per example."""
    count = tf.math.floormod(r // 7, 4)
    return tf.gather(TAGS, tf.math.floormod(r + tf.range(count), 7))


def dataset_fn(_):
    def example(r):
        ids = tf.stack([tf.math.floormod(r, 500), tf.math.floormod(r // 500, 300)])
        label = tf.cast(tf.math.floormod(r, 5) < 2, tf.float32)
        return {"ids_in": ids, "tags": tags_of(r)}, label
    return tf.data.Dataset.random(seed=1).map(example).ragged_batch(64).repeat()


def main(directory):
    with tfps.distribute.local_cluster(num_workers=2, num_ps=2) as strategy:
        with strategy.scope():
            ids = keras.Input((2,), dtype=tf.int64, name="ids_in")
            tags = keras.Input((None,), dtype=tf.string, ragged=True, name="tags")
            embedding = tfps.keras_layers.DynamicEmbedding(4, combiner="sum", name="ids")
            tag_table = tfps.keras_layers.DynamicEmbedding(4, combiner="mean", key_dtype=tf.string,
                                                           name="tag_table")
            both = keras.layers.Concatenate()([embedding(ids, namespace="columns"), tag_table(tags)])
            model = keras.Model({"ids_in": ids, "tags": tags},
                                keras.layers.Dense(1, activation="sigmoid")(both))
            model.compile(optimizer="adam", loss="binary_crossentropy", steps_per_execution=5)
        model.fit(keras.utils.experimental.DatasetCreator(dataset_fn), epochs=1, steps_per_epoch=20, verbose=0)
        report = tfps.export.save_for_serving(model, os.path.join(directory, "export"))
        test = np.random.default_rng(0).integers(0, 700, (128, 2)).astype(np.int64)
        test_tags = tf.ragged.stack([tags_of(tf.constant(r, tf.int64)) for r in range(128)])
        np.savez(os.path.join(directory, "inputs.npz"), ids_in=test,
                 tags_values=test_tags.flat_values.numpy().astype("S"),
                 tags_row_splits=test_tags.row_splits.numpy().astype(np.int64))
        np.save(os.path.join(directory, "expected.npy"),
                model.predict({"ids_in": test, "tags": test_tags}, batch_size=128, verbose=0))
        report["shard_sizes"] = embedding.table.shard_sizes()
        for version, changes_only in (("1", False), ("2", True)):
            if changes_only:
                model.fit(keras.utils.experimental.DatasetCreator(dataset_fn), epochs=1, steps_per_epoch=5,
                          verbose=0)
                embedding.table.remove(embedding.table.export().keys[:3])  # removals reach the changes
            report[f"retrieval_{version}"] = tfps.export.save_for_retrieval(
                embedding, os.path.join(directory, "retrieval", version), changes_only=changes_only)
            rows = embedding.table.export()
            np.savez(os.path.join(directory, f"table_{version}.npz"), keys=rows.keys.numpy(),
                     values=rows.values.numpy())
        model.fit(keras.utils.experimental.DatasetCreator(dataset_fn), epochs=1, steps_per_epoch=5, verbose=0)
        embedding.table.remove(embedding.table.export().keys[3:8])
        report["changes"] = tfps.export.save_for_serving(model, os.path.join(directory, "export_changes"),
                                                         changes_since=report["export_dir"], max_layered_rows=4)
        np.save(os.path.join(directory, "expected_changes.npy"),
                model.predict({"ids_in": test, "tags": test_tags}, batch_size=128, verbose=0))
    json.dump(report, sys.stdout)
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1])
