"""Run under tfps-launch (chief, one worker, two parameter servers, each its own process)
by tests/test_admission_eviction.py: fits the model of tests/test_sparse_updates.py with
MinCount admission over the skewed batches of tests/test_admission_eviction.py, in order
(one worker), and the chief writes the head's initial kernel, the trained kernel and the
table's rows to DIR/result.npz.

Usage: launch_admission.py DIR"""

import os
import sys

os.environ["TF_USE_LEGACY_KERAS"] = "1"

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tf_keras as keras  # noqa: E402

import tfps  # noqa: E402
from tests.test_admission_eviction import MIN_COUNT, skewed_data, sorted_export  # noqa: E402
from tests.test_sparse_updates import BATCH, FIELDS, KERAS_SGD, STEPS, build_model  # noqa: E402


def main(directory):
    strategy = tfps.distribute.strategy_from_tf_config()  # the worker and PS tasks serve here
    ids, labels = skewed_data()

    def dataset_fn(_):
        return tf.data.Dataset.from_tensor_slices((ids.reshape(-1, FIELDS), labels.reshape(-1))).batch(BATCH).repeat()

    with strategy.scope():
        model, layer, head = build_model("adagrad", admission=tfps.admission.MinCount(MIN_COUNT, sketch_bytes=0))
        model.compile(optimizer=KERAS_SGD["current"](), loss="mse")
    kernel0 = head.kernel.numpy()[:, 0].copy()
    model.fit(keras.utils.experimental.DatasetCreator(dataset_fn), epochs=1, steps_per_epoch=STEPS, verbose=0)
    rows = sorted_export(layer.table)
    np.savez(os.path.join(directory, "result.npz"), kernel0=kernel0, kernel=head.kernel.numpy()[:, 0],
             seed=layer.seed, shards=layer.table.num_shards, **rows)


if __name__ == "__main__":
    main(sys.argv[1])
