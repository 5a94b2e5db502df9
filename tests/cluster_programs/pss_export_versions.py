"""Run by tests/test_serving_loop.py: trains under ParameterServerStrategy (1 worker, 2 PS)
with ExportForServing writing a version after every block of steps fit queues, and right
after each export reads the table's clocks (its steps applied) and its rows; prints those
beside each version's report."""

import json
import os
import sys

os.environ["TF_USE_LEGACY_KERAS"] = "1"

import tensorflow as tf  # noqa: E402
import tf_keras as keras  # noqa: E402

import tfps  # noqa: E402

STEPS_PER_EXECUTION, STEPS = 4, 12


class ReadAfterEachExport(keras.callbacks.Callback):
    """After the exporter (the callback before it), the table's clocks and rows."""

    def __init__(self, exporter, layer):
        super().__init__()
        self.exporter, self.layer, self.reads = exporter, layer, []
        self._supports_tf_logs = True  # a batch hook under ParameterServerStrategy

    def on_train_batch_end(self, batch, logs=None):
        if len(self.exporter.exports) > len(self.reads):
            rows = self.layer.table.export()
            self.reads.append({"steps_queued": batch + 1, "clocks": [int(c) for c in self.layer.table.clocks()],
                               "keys": sorted(rows.keys.numpy().tolist())})


def dataset_fn(_):
    def example(r):
        return tf.stack([r, r + 100000]), tf.cast(r % 3 == 0, tf.float32)
    # Every example brings new IDs, so every step adds rows.
    return tf.data.Dataset.range(1 << 40).map(example).batch(32)


def main(directory):
    with tfps.distribute.local_cluster(num_workers=1, num_ps=2) as strategy:
        with strategy.scope():
            ids = keras.Input((2,), dtype=tf.int64, name="ids")
            layer = tfps.keras_layers.DynamicEmbedding(4, combiner="sum", name="ids_table")
            model = keras.Model(ids, keras.layers.Dense(1, activation="sigmoid")(layer(ids)))
            model.compile(optimizer="adam", loss="binary_crossentropy", steps_per_execution=STEPS_PER_EXECUTION)
        exporter = tfps.callbacks.ExportForServing(os.path.join(directory, "base"), every_seconds=1e-6,
                                                   max_layered_rows=100)
        reader = ReadAfterEachExport(exporter, layer)
        model.fit(keras.utils.experimental.DatasetCreator(dataset_fn), epochs=1, steps_per_epoch=STEPS,
                  verbose=0, callbacks=[exporter, reader])
        versions = []
        for report in exporter.exports:
            frozen = tf.saved_model.load(report["export_dir"])
            probe = tf.constant([[0, 100000]], tf.int64)
            versions.append({"rows": report["rows"], "served": float(
                next(iter(frozen.signatures["serving_default"](ids=probe).values())).numpy().ravel()[0])})
    json.dump({"reads": reader.reads, "versions": versions, "steps_per_execution": STEPS_PER_EXECUTION,
               "steps": STEPS}, sys.stdout)
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1])
