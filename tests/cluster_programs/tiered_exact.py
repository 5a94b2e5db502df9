"""Run by tests/test_tiered.py: a model whose tables are tiered at several memory budgets
beside the same table in memory, trained by model.fit locally or under an in-process
ParameterServerStrategy (2 parameter servers, 1 worker), at a steps_per_execution given,
on one of the training paths (PATHS).

Every group of tables (one per optimizer, and one with admission, TTL and a cap) has one
table in memory and tiered ones at budgets of 1%, 10% and 50% of the rows the stream
creates; each group's tables read the same IDs with the same seed and the model averages
them, so every table of a group gets the same gradient at every step and, if tiering is
exact, holds the same rows. The stream runs through all-new, mostly-new, drifting and
all-hot IDs. Prints every table's rows (keys, values, slots, metadata), stats, the serving
export's outputs of the tiered and in-memory models' tables, and the directories left."""

import argparse
import json
import os
import sys
import tempfile

os.environ["TF_USE_LEGACY_KERAS"] = "1"

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tf_keras as keras  # noqa: E402

import tfps  # noqa: E402

BATCH, FIELDS, STEPS = 32, 8, 40
BUDGETS = (0.01, 0.1, 0.5)
GROUPS = {"sgd": dict(optimizer=tfps.optimizers.SGD(0.3)),
          "adagrad": dict(optimizer=tfps.optimizers.Adagrad(0.3)),
          "adam": dict(optimizer=tfps.optimizers.Adam(0.05)),
          "ftrl": dict(optimizer=tfps.optimizers.Ftrl(0.3)),
          "policies": dict(optimizer=tfps.optimizers.Adagrad(0.3), admission=tfps.admission.MinCount(2),
                           eviction=tfps.eviction.TTL(steps=12), max_rows=1500)}


# The training paths: plain fit, fit with a worker cache or SynchronousTraining (under
# PSS), and fit that EarlyStopping stops and rolls back to its first epoch's snapshot.
PATHS = ("plain", "worker_cache", "synchronous", "early_stopping")
PATH_OPTIONS = {"worker_cache": dict(worker_cache_rows=64, max_staleness_steps=2)}


def callbacks_of(path, directory):
    if path == "synchronous":
        return [tfps.callbacks.SynchronousTraining()]
    if path == "early_stopping":  # loss falls, so the best "max" is the first epoch's
        return [tfps.callbacks.EarlyStopping(monitor="loss", mode="max", patience=1, restore_best_weights=True,
                                             snapshot_dir=os.path.join(directory, "snapshots"))]
    return []


def stream():
    """IDs [STEPS * BATCH, FIELDS]: a quarter of the steps each all new, mostly new (one in
    ten from 200 returning IDs), drifting (a window of 600 that moves 40 a step) and all hot
    (300 IDs)."""
    rng = np.random.default_rng(3)
    per_step = BATCH * FIELDS
    fresh = 1 << 40
    steps = []
    for step in range(STEPS):
        phase = 4 * step // STEPS
        new = np.arange(fresh, fresh + per_step)
        if phase == 0:
            keys, fresh = new, fresh + per_step
        elif phase == 1:
            keys = np.where(rng.random(per_step) < 0.1, rng.integers(0, 200, per_step), new)
            fresh += per_step
        elif phase == 2:
            keys = step * 40 + rng.integers(0, 600, per_step)
        else:
            keys = rng.integers(0, 300, per_step)
        steps.append(keys.reshape(BATCH, FIELDS))
    ids = np.concatenate(steps).astype(np.int64)
    labels = (rng.random(len(ids)) < 0.3).astype(np.float32)
    return ids, labels


def build(strategy, directory, rows, spe, path):
    """The model and its tables: {group: {"memory" | budget: layer}}."""
    tables = {}
    with strategy.scope():
        ids = keras.Input((FIELDS,), dtype=tf.int64)
        features = []
        for group, options in GROUPS.items():
            tables[group] = {}
            for budget in (None,) + BUDGETS:
                storage = None if budget is None else tfps.storage.Tiered(
                    directory, memory_rows=max(2, int(budget * rows)))
                tables[group]["memory" if budget is None else str(budget)] = tfps.keras_layers.DynamicEmbedding(
                    4, combiner="mean", seed=11, storage=storage, name=f"{group}_{budget or 'memory'}".replace(".", "_"),
                    **options, **PATH_OPTIONS.get(path, {}))
            looked_up = [layer(ids) for layer in tables[group].values()]
            features.append(keras.layers.Average()(looked_up))
        x = keras.layers.Concatenate()(features)
        model = keras.Model(ids, keras.layers.Dense(1, activation="sigmoid")(keras.layers.Dense(8)(x)))
        model.compile(optimizer=keras.optimizers.Adam(0.01), loss="binary_crossentropy", steps_per_execution=spe)
    return model, tables


def rows_of(layer):
    exported = layer.table.export()
    order = np.argsort(exported.keys.numpy(), kind="stable")
    return {f: getattr(exported, f).numpy()[order].tolist() for f in ("keys", "values", "slots", "metadata")}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=("local", "pss"), default="local")
    parser.add_argument("--steps_per_execution", type=int, default=1)
    parser.add_argument("--path", choices=PATHS, default="plain")
    args = parser.parse_args()
    ids, labels = stream()
    rows = len(np.unique(ids))
    directory = tempfile.mkdtemp(prefix="tfps_tiered_exact_")
    if args.mode == "pss":
        cluster = tfps.distribute.local_cluster(num_workers=1, num_ps=2)
        strategy = cluster.__enter__()
        data = keras.utils.experimental.DatasetCreator(
            lambda _: tf.data.Dataset.from_tensor_slices((ids, labels)).batch(BATCH))
    else:
        strategy = tf.distribute.get_strategy()
        data = tf.data.Dataset.from_tensor_slices((ids, labels)).batch(BATCH)
    model, tables = build(strategy, directory, rows, args.steps_per_execution, args.path)
    history = model.fit(data, epochs=3 if args.path == "early_stopping" else 1, steps_per_epoch=STEPS, verbose=0,
                        callbacks=callbacks_of(args.path, directory))
    out = {"rows_created": rows, "tables": {}, "epochs": len(history.history["loss"])}
    probe = tf.constant(np.unique(ids)[::7][:, None], tf.int64)
    for group, layers in tables.items():
        for name, layer in layers.items():
            stats = layer.table.stats()
            out["tables"][f"{group}/{name}"] = {
                "rows": rows_of(layer), "stats": {k: v for k, v in stats.items() if k != "shards"},
                "inference": layer(probe, training=False).numpy().tolist()}
    out["directories_in_use"] = sorted(d for d in os.listdir(directory) if d != "snapshots")
    del model, tables, layers, layer
    json.dump(out, sys.stdout)
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
