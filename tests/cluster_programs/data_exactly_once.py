"""Run by tests/test_data.py: 2 workers of an in-process ParameterServerStrategy cluster
read one epoch of Criteo files through tf.data service; every line carries its number in
its first integer feature, and the lines each worker consumed are counted in a PS
variable. Prints the per-line counts as JSON."""

import json
import os
import sys

os.environ["TF_USE_LEGACY_KERAS"] = "1"

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tfps  # noqa: E402


def main(directory, num_lines):
    files = sorted(os.path.join(directory, f) for f in os.listdir(directory) if f.endswith(".tsv"))
    with tfps.distribute.local_cluster(num_workers=2, num_ps=1) as strategy, \
            tfps.data.local_data_service(num_workers=2) as service:
        coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
        with strategy.scope():
            counts = tf.Variable(tf.zeros([num_lines], tf.float64))
            consumers = tf.Variable(tf.zeros([2], tf.float64))

        def dataset_fn():
            return tfps.data.criteo_dataset(files, 32, data_service=service)

        iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))

        @tf.function
        def consume(it):
            features, _ = next(it)
            line = tf.cast(tf.round(tf.math.expm1(features["dense_features"][:, 0])), tf.int64)
            counts.scatter_add(tf.IndexedSlices(tf.ones_like(line, tf.float64), line))

        steps = num_lines // 32 + 8  # more than an epoch: the surplus steps hit its end
        for _ in range(steps):
            coordinator.schedule(consume, args=(iterator,))
        try:
            coordinator.join()
        except (tf.errors.OutOfRangeError, StopIteration):
            pass
        result = counts.numpy()
    json.dump({"counts": result.tolist()}, sys.stdout)
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
