"""Run by tests/test_export.py: trains under ParameterServerStrategy (2 workers, 2 PS),
exports with save_for_serving and stores test inputs and model.predict outputs."""

import json
import os
import sys

os.environ["TF_USE_LEGACY_KERAS"] = "1"

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tf_keras as keras  # noqa: E402

import tfps  # noqa: E402


def dataset_fn(_):
    def example(r):
        ids = tf.stack([tf.math.floormod(r, 500), tf.math.floormod(r // 500, 300)])
        return ids, tf.cast(tf.math.floormod(r, 5) < 2, tf.float32)
    return tf.data.Dataset.random(seed=1).map(example).batch(64).repeat()


def main(directory):
    with tfps.distribute.local_cluster(num_workers=2, num_ps=2) as strategy:
        with strategy.scope():
            ids = keras.Input((2,), dtype=tf.int64, name="ids_in")
            embedding = tfps.keras_layers.DynamicEmbedding(4, combiner="sum", name="ids")
            model = keras.Model(ids, keras.layers.Dense(1, activation="sigmoid")(
                embedding(ids, namespace="columns")))
            model.compile(optimizer="adam", loss="binary_crossentropy", steps_per_execution=5)
        model.fit(keras.utils.experimental.DatasetCreator(dataset_fn), epochs=1, steps_per_epoch=20, verbose=0)
        report = tfps.export.save_for_serving(model, os.path.join(directory, "export"))
        test = np.random.default_rng(0).integers(0, 700, (128, 2)).astype(np.int64)
        np.savez(os.path.join(directory, "inputs.npz"), ids_in=test)
        np.save(os.path.join(directory, "expected.npy"), model.predict(test, verbose=0))
        report["shard_sizes"] = embedding.table.shard_sizes()
    json.dump(report, sys.stdout)
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1])
