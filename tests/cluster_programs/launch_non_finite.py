"""Run under tfps-launch by tests/test_non_finite.py: model.fit over a stream of batches that
a tf.data service hands out, each to exactly one worker, a few of which hold a NaN label or
a NaN feature (--bad). The chief writes what came of it to --out: the error fit raised (if
any), the optimizer's iterations, the table's skipped steps and clock, and the logs."""

import argparse
import json
import os
import sys

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tf_keras as keras  # noqa: E402

import tfps  # noqa: E402

BATCH = 64


def batch(index, bad):
    """Batch `index` of the stream: two IDs, three features and a label per example. A bad
    batch of an even index has a NaN label, of an odd one a NaN feature."""
    rows = tf.range(BATCH, dtype=tf.int64) + index * BATCH
    ids = tf.stack([rows % 500, (rows * 7 + 3) % 500 + 500], 1)
    features = tf.stack([tf.sin(tf.cast(rows + k, tf.float32)) for k in range(3)], 1)
    labels = tf.cast(ids[:, 0] % 3 == 0, tf.float32)
    is_bad = tf.reduce_any(tf.equal(index, bad))
    first = tf.one_hot(0, BATCH, on_value=True, off_value=False)
    labels = tf.where(is_bad & (index % 2 == 0) & first, float("nan"), labels)
    features = tf.where(is_bad & (index % 2 == 1) & first[:, None], float("nan"), features)
    return {"ids": ids, "features": features}, labels


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--policy", choices=("refuse", "skip"), required=True)
    parser.add_argument("--steps", type=int, default=60)
    # Early in the stream: a worker may hold batches it never trains when the steps end.
    parser.add_argument("--bad", default="6,17,26")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    bad = tf.constant([int(b) for b in args.bad.split(",")], tf.int64)
    strategy = tfps.distribute.strategy_from_tf_config()  # ps and worker tasks serve here
    with strategy.scope():
        ids, features = keras.Input((2,), dtype=tf.int64, name="ids"), keras.Input((3,), name="features")
        table = tfps.keras_layers.DynamicEmbedding(4, optimizer=tfps.optimizers.Adagrad(0.1),
                                                   non_finite=args.policy, name="ids_table")
        x = keras.layers.Concatenate()([keras.layers.Flatten()(table(ids)), features])
        model = keras.Model([ids, features], keras.layers.Dense(1, activation="sigmoid")(x))
        model.compile(optimizer=keras.optimizers.Adam(0.01), loss="binary_crossentropy",
                      metrics=[tfps.metrics.AUC(name="auc")])
    with tfps.data.local_data_service() as service:
        def stream(_):
            # Indices never repeat: workers read ahead of the steps that train, and a repeated
            # stream could hand a bad batch out again before the steps end.
            data = tf.data.Dataset.range(1 << 40).map(lambda i: batch(i, bad))
            return data.apply(tf.data.experimental.service.distribute(
                processing_mode="distributed_epoch", service=service, job_name="non-finite-stream"))

        error, history = None, None
        try:
            history = model.fit(keras.utils.experimental.DatasetCreator(stream), epochs=1,
                                steps_per_epoch=args.steps, verbose=0).history
        except tf.errors.InvalidArgumentError as e:
            error = e.message
    stats = table.table.stats()
    with open(args.out, "w") as f:
        json.dump({"error": error, "history": history, "iterations": int(model.optimizer.iterations.numpy()),
                   "skipped_steps": stats["skipped_steps"], "clock": stats["clock"]}, f)
    sys.stdout.flush()
    os._exit(0 if error is None else 1)  # the launcher stops the ps and worker tasks


if __name__ == "__main__":
    main()
