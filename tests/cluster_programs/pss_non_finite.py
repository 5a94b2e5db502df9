"""Run by tests/test_non_finite.py: one batch with a NaN label under an in-process
ParameterServerStrategy (`--num_ps` parameter servers, 2 workers), in each optimizer path
of a model with tables: model.fit with a current and a legacy tf_keras optimizer, with a
worker cache, with SynchronousTraining, and a custom loop with a GradientAccumulator; each
once with non_finite="refuse" and once with "skip". Every path first trains good steps,
then is handed the bad batch; prints, per path and policy, every row (value, slots,
metadata) of both tables, the dense variables and iterations before and after the bad
batch, the error (if any), the skipped-step counts, and the rows after more good steps."""

import argparse
import json
import os
import sys

os.environ["TF_USE_LEGACY_KERAS"] = "1"

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tf_keras as keras  # noqa: E402

import tfps  # noqa: E402

BATCH, NUM_IDS = 32, 400
PATHS = ("current", "legacy", "worker_cache", "synchronous", "accumulator")


def batches(start, count, nan_label=False):
    """`count` batches of examples start.. (two ID fields, a label only the IDs tell); with
    nan_label, the first example's label is NaN."""
    r = np.arange(start, start + count * BATCH)
    ids = np.stack([r % NUM_IDS, (r * 7 + 3) % NUM_IDS + NUM_IDS], 1).astype(np.int64)
    labels = ((ids[:, 0] * 7919) % 10 < 4).astype(np.float32)
    if nan_label:
        labels[0] = np.nan
    return ids, labels


def dataset_of(ids, labels):
    return lambda _: tf.data.Dataset.from_tensor_slices((ids, labels)).batch(BATCH).repeat()


def build(strategy, path, policy):
    with strategy.scope():
        cache = dict(worker_cache_rows=64, max_staleness_steps=1) if path == "worker_cache" else {}
        tables = [tfps.keras_layers.DynamicEmbedding(
            4, optimizer=tfps.optimizers.Adagrad(0.2), non_finite=policy, name=f"{name}_{path}_{policy}",
            **cache) for name in ("a", "b")]
        ids = keras.Input((2,), dtype=tf.int64)
        x = keras.layers.Concatenate()([keras.layers.Flatten()(tables[0](ids[:, :1])),
                                        keras.layers.Flatten()(tables[1](ids[:, 1:]))])
        model = keras.Model(ids, keras.layers.Dense(1, activation="sigmoid")(keras.layers.Dense(4)(x)))
        optimizer = keras.optimizers.legacy.Adam(0.01) if path == "legacy" else keras.optimizers.Adam(0.01)
        model.compile(optimizer=optimizer, loss="binary_crossentropy", steps_per_execution=1)
    return model, tables


def custom_loop(strategy, model):
    """A step function of the accumulator path: a batch added, then applied."""
    with strategy.scope():
        accumulator = tfps.GradientAccumulator(model.trainable_variables, shared_by_workers=True,
                                               contributions=1)
    loss_fn = keras.losses.BinaryCrossentropy(reduction="sum")

    @tf.function
    def step(ids, labels):
        def replica(ids, labels):
            with tf.GradientTape() as tape:
                loss = loss_fn(labels[:, None], model(ids, training=True)) / BATCH
            accumulator.add(tape.gradient(loss, model.trainable_variables), contribution=0)
            accumulator.apply_to(model.optimizer)
        strategy.run(replica, args=(ids, labels))

    return step


def train(strategy, coordinator, model, path, step_fn, ids, labels):
    if path == "accumulator":  # one step at a time: each adds the accumulator's one contribution
        for i in range(0, len(ids), BATCH):
            coordinator.schedule(step_fn, args=(tf.constant(ids[i:i + BATCH]), tf.constant(labels[i:i + BATCH])))
            coordinator.join()
        return
    callbacks = [tfps.callbacks.SynchronousTraining()] if path == "synchronous" else []
    model.fit(keras.utils.experimental.DatasetCreator(dataset_of(ids, labels)), epochs=1,
              steps_per_epoch=len(ids) // BATCH, verbose=0, callbacks=callbacks)


def state(model, tables):
    rows = []
    for table in tables:
        exported = table.table.export()
        rows.append({f: getattr(exported, f).numpy().tolist() for f in ("keys", "values", "slots", "metadata")})
    dense = [w.numpy().tolist() for w in model.trainable_variables if "table_proxy" not in w.name]
    return {"rows": rows, "dense": dense, "iterations": int(model.optimizer.iterations.numpy()),
            "clocks": [t.table.clocks().numpy().tolist() for t in tables],
            "skipped": [t.table.stats()["skipped_steps"] for t in tables]}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--num_ps", type=int, default=2)
    parser.add_argument("--paths", default=",".join(PATHS))
    args = parser.parse_args()
    out = {}
    with tfps.distribute.local_cluster(num_workers=2, num_ps=args.num_ps) as strategy:
        coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
        for path in args.paths.split(","):
            for policy in ("refuse", "skip"):
                model, tables = build(strategy, path, policy)
                step_fn = custom_loop(strategy, model) if path == "accumulator" else None
                train(strategy, coordinator, model, path, step_fn, *batches(0, 6))
                before = state(model, tables)
                bad_ids, bad_labels = batches(6 * BATCH, 1, nan_label=True)
                error = None
                try:
                    train(strategy, coordinator, model, path, step_fn, bad_ids, bad_labels)
                except tf.errors.InvalidArgumentError as e:
                    error = e.message
                after = state(model, tables)
                # Each worker's copy of a dataset holds the bad batch: a synchronous step reads both.
                result = {"before": before, "after": after, "error": error, "bad_ids": bad_ids.tolist(),
                          "bad_reads": 2 if path == "synchronous" else 1, "seeds": [t.seed for t in tables]}
                if policy == "skip":
                    train(strategy, coordinator, model, path, step_fn, *batches(7 * BATCH, 2))
                    result["later"] = state(model, tables)
                out[f"{path}/{policy}"] = result
    json.dump(out, sys.stdout)
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
