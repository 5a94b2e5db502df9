"""Run by tests/test_bazel_build.py in its own process: loads the Bazel-built op library
(no tfps import, so its ops are registered once) and prints a table op's output as JSON."""

import json
import sys

import tensorflow as tf

ops = tf.load_op_library(sys.argv[1])
table = ops.tfps_table_create(dim=4, optimizer="sgd", learning_rate=0.5, initializer="uniform",
                              initializer_params=[-1.0, 1.0], seed=9, shared_name="bazel_check")
keys = tf.constant([0, -1, 12345, 2 ** 63 - 1], tf.int64)
initial, _ = ops.tfps_table_find_or_insert(table, keys, tf.zeros([0], tf.int64), dim=4)
ops.tfps_table_apply_gradients(table, keys, tf.ones([4, 4]), tf.constant(1, tf.int64), -1.0, dim=4)
values, exists = ops.tfps_table_find(table, keys, dim=4)
json.dump({"initial": initial.numpy().tolist(), "values": values.numpy().tolist(),
           "exists": exists.numpy().tolist()}, sys.stdout)
