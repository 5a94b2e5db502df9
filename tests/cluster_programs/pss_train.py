"""Run by tests/test_dynamic_embedding_pss.py: a DynamicEmbedding model trained with
model.fit under an in-process ParameterServerStrategy (2 workers, 2 PS); prints JSON."""

import json
import os
import sys

os.environ["TF_USE_LEGACY_KERAS"] = "1"

import tensorflow as tf  # noqa: E402
import tf_keras as keras  # noqa: E402

import tfps  # noqa: E402

NUM_IDS, BATCH = 2000, 256
SCRAMBLE = 0x9E3779B97F4A7C15 - (1 << 64)  # as a signed int64


def example(r):
    rank = tf.math.floormod(r, NUM_IDS)
    ids = rank * SCRAMBLE  # IDs spread over the 64-bit space
    label = tf.cast(tf.math.floormod(rank * 7919, 10) < 3, tf.float32)  # only the ID tells
    return ids, label


def dataset_fn(_):
    return tf.data.Dataset.random().map(example).batch(BATCH).repeat()


def main():
    with tfps.distribute.local_cluster(num_workers=2, num_ps=2) as strategy:
        with strategy.scope():
            ids = keras.Input(shape=(), dtype=tf.int64)
            embedding = tfps.keras_layers.DynamicEmbedding(8, optimizer=tfps.optimizers.Adagrad(0.3))
            output = keras.layers.Dense(1, activation="sigmoid")(embedding(ids))
            model = keras.Model(ids, output)
            cached = tfps.keras_layers.DynamicEmbedding(8, worker_cache_rows=64, max_staleness_steps=3)
            try:  # its sums would be shared by both workers' steps
                tfps.GradientAccumulator(model.trainable_variables)
                accumulator_refusal = None
            except ValueError as e:
                accumulator_refusal = str(e)
            model.compile(optimizer=keras.optimizers.legacy.Adagrad(0.1), loss="binary_crossentropy",
                          metrics=[tfps.metrics.AUC(name="auc")], steps_per_execution=10)
        history = model.fit(keras.utils.experimental.DatasetCreator(dataset_fn), epochs=3,
                            steps_per_epoch=60, verbose=0)
        evaluation = model.evaluate(keras.utils.experimental.DatasetCreator(dataset_fn), steps=20,
                                    return_dict=True, verbose=0)
        shard_sizes = embedding.table.shard_sizes()
        devices = [t.resource_handle.device for t in embedding.table.shards]
    json.dump({"history": history.history, "evaluation": evaluation, "shard_sizes": shard_sizes,
               "table_devices": devices, "cache_copy_rate_scale": cached.worker_cache.copy_rate_scale,
               "accumulator_refusal": accumulator_refusal},
              sys.stdout)
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
