"""Run by tests/test_dynamic_embedding_pss.py: 2 workers feed their own disjoint IDs and,
in every batch, the same hot IDs (-1 .. -HOT), so their updates contend for the same rows;
prints every key of the table with its value and update count, as JSON.

Each worker's dataset starts from an unseeded random tag (different per worker) and walks
IDs tag * 2^20 + j, OWN_PER_BATCH a batch, followed by the hot IDs. The loss is the mean of
the summed embedding, so every update of a row subtracts exactly learning_rate / BATCH from
each element, whichever worker's step it was."""

import json
import os
import sys

os.environ["TF_USE_LEGACY_KERAS"] = "1"

import tensorflow as tf  # noqa: E402
import tf_keras as keras  # noqa: E402

import tfps  # noqa: E402

IDS_PER_WORKER, OWN_PER_BATCH, HOT, LEARNING_RATE, SEED, DIM = 400, 40, 10, 0.5, 11, 4
BATCH = OWN_PER_BATCH + HOT


def dataset_fn(_):
    tag = tf.data.Dataset.random().take(1).map(lambda r: tf.math.floormod(r, 1 << 40) + 1)
    ids = tag.flat_map(lambda t: tf.data.Dataset.range(IDS_PER_WORKER).map(lambda j: t * (1 << 20) + j))
    hot = -tf.range(1, HOT + 1, dtype=tf.int64)
    batches = ids.batch(OWN_PER_BATCH).map(lambda own: tf.concat([own, hot], 0))
    return batches.map(lambda b: (b, tf.zeros_like(b, tf.float32))).repeat()


def main():
    with tfps.distribute.local_cluster(num_workers=2, num_ps=2) as strategy:
        with strategy.scope():
            ids = keras.Input(shape=(), dtype=tf.int64)
            embedding = tfps.keras_layers.DynamicEmbedding(
                DIM, optimizer=tfps.optimizers.SGD(LEARNING_RATE), seed=SEED)
            total = keras.layers.Lambda(lambda e: tf.reduce_sum(e, -1, keepdims=True))(embedding(ids))
            model = keras.Model(ids, total)
            model.compile(optimizer=keras.optimizers.legacy.SGD(0.1), loss=lambda y, p: p,
                          steps_per_execution=2)
        model.fit(keras.utils.experimental.DatasetCreator(dataset_fn), epochs=1, steps_per_epoch=24,
                  verbose=0)
        rows = embedding.table.export()
        out = {"keys": rows.keys.numpy().tolist(), "values": rows.values.numpy().tolist(),
               "counts": rows.metadata.numpy()[:, 0].tolist(), "shard_sizes": embedding.table.shard_sizes(),
               "batch": BATCH, "learning_rate": LEARNING_RATE, "seed": SEED, "dim": DIM,
               "ids_per_worker": IDS_PER_WORKER, "hot": HOT, "steps": 24}
    json.dump(out, sys.stdout)
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
