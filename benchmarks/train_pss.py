"""DLRM-like training under ParameterServerStrategy: tfps DynamicEmbedding against stock
tf_keras Hashing(2^20) + Embedding over a partitioned variable.

    python benchmarks/train_pss.py [--steps 500] [--repeats 3]

Synthetic Criteo-shaped data (13 dense features, 26 categorical fields with power-law IDs
over the 64-bit space, a label the IDs predict), in-process cluster of 2 workers and 2 PS,
batch 1024, steps_per_execution 10. Each model trains in its own process; examples/s is
measured on an epoch after a warm-up epoch, AUC by evaluate() on fresh batches. Both models
train once per seed (data, dense initial values and table initial values follow the seed)
and are compared seed by seed.
"""

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples"))
import common  # noqa: E402

BATCH, FIELDS, DENSE, DIM, HASH_BINS = 1024, 26, 13, 16, 1 << 20
LEARNING_RATE = 0.2  # the same for the tfps table, the stock embedding and dense layers
GOLDEN = 0x9E3779B97F4A7C15 - (1 << 64)


def criteo_like(seed=None):
    """Infinite batches of (dense [B, 13], ids [B, 26] int64) and labels [B]."""
    import tensorflow as tf

    def batch(r):
        u = tf.random.stateless_uniform([BATCH, FIELDS + DENSE + 1], seed=tf.stack([r, r // 7 + 1]))
        ranks = tf.cast(tf.floor(tf.exp(u[:, :FIELDS] * tf.math.log(5e3))), tf.int64)  # Zipf-like
        field = tf.range(FIELDS, dtype=tf.int64)
        ids = (ranks * 31 + field) * GOLDEN  # spread over the 64-bit space
        effect = tf.sin(tf.cast(ranks, tf.float32) * 12.9898 + tf.cast(field, tf.float32) * 78.233)
        dense = -tf.math.log(1.0 - 0.999 * u[:, FIELDS:FIELDS + DENSE])
        logit = 2.5 * tf.reduce_sum(effect[:, :4], 1) + 0.3 * (dense[:, 0] - 1.0) - 0.8
        label = tf.cast(u[:, -1] < tf.sigmoid(logit), tf.float32)
        return {"dense_features": dense, "categorical_ids": ids}, label

    return tf.data.Dataset.random(seed=seed).map(batch).prefetch(2)


def build_model(kind, strategy, seed):
    import tensorflow as tf
    import tf_keras as keras
    import tfps
    from train_ctr import dlrm_towers
    with strategy.scope():
        dense_in = keras.Input((DENSE,), name="dense_features")
        ids_in = keras.Input((FIELDS,), dtype=tf.int64, name="categorical_ids")
        if kind == "tfps":
            emb = tfps.keras_layers.DynamicEmbedding(DIM, optimizer=tfps.optimizers.Adagrad(LEARNING_RATE),
                                                     seed=seed)(ids_in, namespace="columns")
        else:
            hashed = keras.layers.Hashing(HASH_BINS)(ids_in)
            emb = keras.layers.Embedding(HASH_BINS, DIM)(hashed)
        model = keras.Model([dense_in, ids_in], dlrm_towers(dense_in, emb, DIM))  # the example's model
        model.compile(optimizer=keras.optimizers.legacy.Adagrad(LEARNING_RATE), loss="binary_crossentropy",
                      metrics=[tfps.metrics.AUC(name="auc")], steps_per_execution=10)
    return model


def embedding_partitioner(shape, dtype):
    """Splits the stock embedding table over the 2 PS and nothing else: partitioned dense
    layers would start from other initial values (each part is initialized on its own)
    than the tfps model's, and that alone moved AUC by about 0.01."""
    del dtype
    return [2] + [1] * (len(shape) - 1) if shape[0] >= HASH_BINS else [1] * len(shape)


def run_one(kind, steps, seed):
    """One model trained on the data of `seed`, its dense layers (and the stock embedding)
    initialized from `seed`, and the tfps table's initial values drawn with `seed`."""
    import tensorflow as tf
    import tf_keras as keras
    import tfps
    keras.utils.set_random_seed(seed)
    partitioner = embedding_partitioner if kind == "stock" else None
    with tfps.distribute.local_cluster(num_workers=2, num_ps=2, variable_partitioner=partitioner) as strategy:
        model = build_model(kind, strategy, seed)
        # Each worker reads its own stream, the same for both models.
        data = keras.utils.experimental.DatasetCreator(
            lambda context: criteo_like(seed=1000 * seed + context.input_pipeline_id))
        model.fit(data, epochs=1, steps_per_epoch=20, verbose=0)  # warm-up: tracing, first inserts
        start = time.perf_counter()
        history = model.fit(data, epochs=1, steps_per_epoch=steps, verbose=0)
        seconds = time.perf_counter() - start
        evaluation = model.evaluate(keras.utils.experimental.DatasetCreator(lambda _: criteo_like(seed=77)),
                                    steps=30, return_dict=True, verbose=0)
    common.emit({"model": kind, "steps": steps, "batch": BATCH, "seconds": round(seconds, 2),
                 "examples_per_s": round(steps * BATCH / seconds), "train_loss": history.history["loss"][-1],
                 "eval_auc": evaluation["auc"], "eval_loss": evaluation["loss"]})
    sys.stdout.flush()
    os._exit(0)


def run_in_child(kind, steps, seed):
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--model", kind, "--steps",
                          str(steps), "--seed", str(seed)], capture_output=True, text=True, timeout=3000)
    if out.returncode != 0:
        sys.stderr.write(out.stderr[-3000:])
        raise SystemExit(f"{kind} run with seed {seed} failed")
    return json.loads([line for line in out.stdout.splitlines() if line.startswith("{")][-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--repeats", type=int, default=3,
                        help="seeds to train both models with; AUC differs between seeds by more "
                        "than between the models, so they are compared seed by seed")
    parser.add_argument("--model", choices=["tfps", "stock"])
    parser.add_argument("--seed", type=int, default=0, help="the first seed")
    args = parser.parse_args()
    if args.model:
        return run_one(args.model, args.steps, args.seed)
    common.emit({"machine": common.machine()})
    speed_ratios, auc_differences = [], []
    for seed in range(args.seed, args.seed + args.repeats):
        ours, stock = (run_in_child(kind, args.steps, seed) for kind in ("tfps", "stock"))
        for record in (ours, stock):
            common.emit({"seed": seed, **record})
        speed_ratios.append(ours["examples_per_s"] / stock["examples_per_s"])
        auc_differences.append(ours["eval_auc"] - stock["eval_auc"])
    speed = float(np.mean(speed_ratios))
    common.emit({"summary": "examples/s >= 1.0x stock Hashing+Embedding", "mean_ratio": round(speed, 3),
                 "ratios": [round(r, 3) for r in speed_ratios], "met": speed >= 1.0})
    difference = float(np.mean(auc_differences))
    standard_error = float(np.std(auc_differences, ddof=1) / np.sqrt(len(auc_differences))) \
        if len(auc_differences) > 1 else None
    common.emit({"summary": "AUC no lower than stock (mean over seeds of tfps - stock)",
                 "mean_difference": round(difference, 5), "standard_error": standard_error,
                 "differences": [round(d, 5) for d in auc_differences], "met": difference >= 0})


if __name__ == "__main__":
    main()
