"""Run by tests/test_worker_cache.py: one worker, two PS. Trains tests/test_sparse_updates.py's
model with a worker cache (max_staleness_steps=2) through model.fit (with validation, which must
read the rows with the epoch's last cycle pushed) and through a custom loop scheduled on
the coordinator, and prints each table's rows and slots, the head, and where
the custom loop's cache holds rows before its flush: one worker, so the steps run in order
and the rows must follow the cache simulation exactly."""

import json
import os
import sys

os.environ["TF_USE_LEGACY_KERAS"] = "1"

import tensorflow as tf  # noqa: E402
import tf_keras as keras  # noqa: E402

import tfps  # noqa: E402
from tests.test_sparse_updates import KERAS_SGD, STEPS, build_model, data, mse  # noqa: E402
from tfps._ops import ops  # noqa: E402

STALENESS, CAPACITY = 2, int(sys.argv[1]) if len(sys.argv) > 1 else 1000
TRANSFER_DTYPE = sys.argv[2] if len(sys.argv) > 2 else "float32"
WORKER = "/job:worker/replica:0/task:0/device:CPU:0"


def trained(layer, head, kernel0):
    rows = layer.table.export()
    return {"keys": rows.keys.numpy().tolist(), "values": rows.values.numpy().tolist(),
            "slots": rows.slots.numpy().tolist(), "kernel": head.kernel.numpy()[:, 0].tolist(),
            "kernel0": kernel0.tolist(), "seed": layer.seed}


def casts(table):
    """[device, from, to] of each cast in a training lookup's and an update's graph: where
    the rows and gradients change dtype, so which dtype crosses to and from each PS."""
    keys = tf.constant([1, 2, 3], tf.int64)

    @tf.function
    def lookup_and_update():
        table.apply_gradients(keys, tf.ones_like(table.find_or_insert(keys)))

    graph = lookup_and_update.get_concrete_function().graph
    return sorted([op.device, op.get_attr("SrcT").name, op.get_attr("DstT").name]
                  for op in graph.get_operations() if op.type == "Cast")


def cached_rows(cache, device):
    with tf.device(device):
        return int(ops.tfps_table_size(cache._create("rows")))  # pylint: disable=protected-access


def main():
    ids, labels = data()
    out = {}
    with tfps.distribute.local_cluster(num_workers=1, num_ps=2) as strategy:
        with strategy.scope():
            model, layer, head = build_model("adagrad", worker_cache_rows=CAPACITY,
                                             max_staleness_steps=STALENESS, transfer_dtype=TRANSFER_DTYPE)
            model.compile(optimizer=KERAS_SGD["current"](), loss="mse", steps_per_execution=4)
        kernel0 = head.kernel.numpy()[:, 0].copy()
        batches = lambda _: tf.data.Dataset.from_tensor_slices((ids, labels)).repeat()  # noqa: E731
        history = model.fit(keras.utils.experimental.DatasetCreator(batches), epochs=1, steps_per_epoch=STEPS,
                            validation_data=keras.utils.experimental.DatasetCreator(batches),
                            validation_steps=STEPS, verbose=0)
        out["fit"] = trained(layer, head, kernel0)
        out["fit_validation_loss"] = history.history["val_loss"][0]
        out["evaluate_loss_after_fit"] = model.evaluate(keras.utils.experimental.DatasetCreator(batches),
                                                        steps=STEPS, verbose=0)

        coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)
        with strategy.scope():
            model, layer, head = build_model("adagrad", worker_cache_rows=CAPACITY,
                                             max_staleness_steps=STALENESS, transfer_dtype=TRANSFER_DTYPE)
            optimizer = KERAS_SGD["legacy"]()
        kernel0 = head.kernel.numpy()[:, 0].copy()

        def replica_step(x, y):
            with tf.GradientTape() as tape:
                loss = mse(y, model(x, training=True))
            variables = model.trainable_variables
            optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))

        @tf.function
        def step(x, y):
            strategy.run(replica_step, args=(x, y))

        for x, y in zip(ids, labels):
            coordinator.schedule(step, args=(tf.constant(x), tf.constant(y)))
        coordinator.join()
        out["cached_rows_before_flush"] = {
            "worker": cached_rows(layer.worker_cache, WORKER),
            "coordinator": cached_rows(layer.worker_cache, None),
            "ps": cached_rows(layer.worker_cache, layer.table.devices[0])}
        layer.flush_worker_cache(optimizer.iterations)
        out["cached_rows_after_flush"] = cached_rows(layer.worker_cache, WORKER)
        out["custom_loop"] = trained(layer, head, kernel0)
        out["casts"] = casts(layer.table)
    json.dump(out, sys.stdout)
    sys.stdout.flush()
    os._exit(0)  # in-process servers cannot be stopped; end the process without waiting


if __name__ == "__main__":
    main()
