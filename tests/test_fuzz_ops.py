"""Every tfps op under hostile inputs (wrong ranks and dtypes, mismatched lengths, empty,
huge and negative sizes, NaN, bad attributes), called eagerly, where shape functions do not
run: each call must succeed or raise a clean error, never abort the process or hang.

The cases run in a child process, which announces each case before running it; a child
that dies is restarted after the case it was running, which is reported as a crash."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CASES = r'''
import numpy as np
import tensorflow as tf
from tfps._ops import ops

table = ops.tfps_table_create(dim=2, optimizer="adagrad", learning_rate=0.1,
                              optimizer_params=[0.1, 1e-7], initializer="zeros",
                              shared_name="fuzz_table")
hist = tf.Variable(tf.zeros([8, 2], tf.float64))
I64, F32 = tf.int64, tf.float32
keys2 = tf.constant([1, 2], I64)
rows2 = tf.ones([2, 2])
big = 1 << 62
nan = float("nan")
scalar_key = tf.constant(5, I64)
groups = ops.tfps_table_create(dim=16, optimizer="sgd", learning_rate=1.0, optimizer_params=[],
                               initializer="zeros", shared_name="fuzz_groups")
group_scale = dict(buckets_per_octave=2, octaves=2)
CASES = [
    # find / find_or_insert
    lambda: ops.tfps_table_find(table, tf.zeros([0], I64), dim=2),
    lambda: ops.tfps_table_find(table, scalar_key, dim=2),
    lambda: ops.tfps_table_find(table, tf.zeros([2, 0, 3], I64), dim=2),
    lambda: ops.tfps_table_find(table, keys2, dim=3),
    lambda: ops.tfps_table_find_or_insert(table, tf.zeros([3, 4], I64), tf.zeros([0], I64), dim=2),
    lambda: ops.tfps_table_find_or_insert(keys2, keys2, tf.zeros([0], I64), dim=2),
    lambda: ops.tfps_table_find(hist.handle, keys2, dim=2),
    # apply_gradients
    lambda: ops.tfps_table_apply_gradients(table, keys2, tf.ones([3, 2]), 0, -1.0, dim=2),
    lambda: ops.tfps_table_apply_gradients(table, keys2, tf.ones([2]), 0, -1.0, dim=2),
    lambda: ops.tfps_table_apply_gradients(table, scalar_key, tf.ones([1, 2]), 0, -1.0, dim=2),
    lambda: ops.tfps_table_apply_gradients(table, keys2, tf.fill([2, 2], nan), 0, -1.0, dim=2),
    lambda: ops.tfps_table_apply_gradients(table, keys2, rows2, tf.constant([1, 2], I64), -1.0, dim=2),
    lambda: ops.tfps_table_apply_gradients(table, keys2, rows2, -5, -1.0, dim=2),
    lambda: ops.tfps_table_apply_gradients(table, keys2, rows2, big, -1.0, dim=2),
    lambda: ops.tfps_table_apply_gradients(table, tf.zeros([0], I64), tf.zeros([0, 2]), 0, -1.0, dim=2),
    # insert / remove / import
    lambda: ops.tfps_table_insert(table, keys2, tf.ones([2, 3]), dim=2),
    lambda: ops.tfps_table_insert(table, tf.zeros([2, 2], I64), rows2, dim=2),
    lambda: ops.tfps_table_insert(table, keys2, tf.fill([2, 2], float("inf")), dim=2),
    lambda: ops.tfps_table_remove(table, tf.zeros([2, 2], I64)),
    lambda: ops.tfps_table_remove(table, scalar_key),
    lambda: ops.tfps_table_import(table, keys2, rows2, tf.ones([2, 1, 2]), tf.zeros([2, 2], I64), dim=2, num_slots=1),
    lambda: ops.tfps_table_import(table, keys2, rows2, tf.ones([2, 2, 2]), tf.zeros([2, 3], I64), dim=2, num_slots=1),
    lambda: ops.tfps_table_import(table, keys2, rows2, tf.ones([2, 1, 2]), tf.zeros([2, 3], I64), dim=2, num_slots=2),
    lambda: ops.tfps_table_import(table, keys2, rows2, tf.fill([2, 1, 2], nan), tf.zeros([2, 3], I64), dim=2, num_slots=1),
    lambda: ops.tfps_table_import(table, keys2, rows2, tf.ones([2, 1, 2]), tf.fill([2, 3], tf.constant(-big, I64)), dim=2, num_slots=1),
    # export
    lambda: ops.tfps_table_export(table, -1, 10, dim=2, num_slots=1),
    lambda: ops.tfps_table_export(table, 0, 0, dim=2, num_slots=1),
    lambda: ops.tfps_table_export(table, 0, -3, dim=2, num_slots=1),
    lambda: ops.tfps_table_export(table, 0, big, dim=2, num_slots=1),
    lambda: ops.tfps_table_export(table, big, 10, dim=2, num_slots=1),
    lambda: ops.tfps_table_export(table, tf.constant([0, 1], I64), 10, dim=2, num_slots=1),
    lambda: ops.tfps_table_export(table, 0, tf.constant([[5]], I64), dim=2, num_slots=1),
    lambda: ops.tfps_table_export(table, 0, 10, dim=2, num_slots=3),
    # size / clear on something that is not a table
    lambda: ops.tfps_table_size(hist.handle),
    lambda: ops.tfps_table_clear(hist.handle),
    # create
    lambda: ops.tfps_table_create(dim=0, optimizer="sgd", learning_rate=0.1, initializer="zeros"),
    lambda: ops.tfps_table_create(dim=2, optimizer="sgd", learning_rate=nan, initializer="zeros"),
    lambda: ops.tfps_table_create(dim=1 << 40, optimizer="sgd", learning_rate=0.1, initializer="zeros"),
    lambda: ops.tfps_table_create(dim=2, optimizer="adam", learning_rate=0.1, optimizer_params=[0.9],
                                  initializer="zeros"),
    lambda: ops.tfps_table_create(dim=2, optimizer="sgd", learning_rate=0.1, initializer="uniform",
                                  initializer_params=[nan, nan]),
    # checkpoint ops
    lambda: ops.tfps_table_save(table, "", 0, 1, 1),
    lambda: ops.tfps_table_save(table, "/proc/tfps_no_such_dir/x/y", 0, 1, 1),  # cannot be made
    lambda: ops.tfps_table_save(table, tf.constant(["a", "b"]), 0, 1, 1),
    lambda: ops.tfps_table_save(table, "/tmp/fuzz_rows", 3, 2, 1),
    lambda: ops.tfps_table_save(table, "/tmp/fuzz_rows", 0, 0, 1),
    lambda: ops.tfps_table_save(table, "/tmp/fuzz_rows", 0, 1, 1, max_chunk_bytes=-1),
    lambda: ops.tfps_row_files_check(table, ["/nonexistent"], [1], dim=2, num_slots=1, optimizer="adagrad"),
    lambda: ops.tfps_row_files_check(table, ["/etc/hostname"], [-1], dim=2, num_slots=1, optimizer="adagrad"),
    lambda: ops.tfps_row_files_check(table, ["a", "b"], [1], dim=2, num_slots=1, optimizer="adagrad"),
    lambda: ops.tfps_row_files_check(table, "a", 1, dim=2, num_slots=1, optimizer="adagrad"),
    lambda: ops.tfps_table_restore(table, ["/nonexistent"], [1], 0, 1),
    lambda: ops.tfps_table_restore(table, ["/etc/hostname"], [1], 0, 1),
    lambda: ops.tfps_table_restore(table, [], [], 0, 1),
    lambda: ops.tfps_table_restore(table, ["/tmp/fuzz_rows"], [-1], -1, 1),
    lambda: ops.tfps_table_restore(table, ["/tmp/fuzz_rows"], [-1], 0, tf.constant(big, I64)),
    # key ops
    lambda: ops.tfps_namespaced_keys(keys2, tf.constant([1, 2, 3], I64)),
    lambda: ops.tfps_namespaced_keys(tf.zeros([0], I64), tf.zeros([0], I64)),
    lambda: ops.tfps_namespaced_keys(tf.zeros([2, 3], I64), tf.constant(1, I64)),
    lambda: ops.tfps_shard_of(keys2, num_shards=0),
    lambda: ops.tfps_shard_of(tf.zeros([0], I64), num_shards=1 << 40),
    lambda: ops.tfps_shard_of(scalar_key, num_shards=3),
    lambda: ops.tfps_unique_keys(tf.zeros([0], I64)),
    lambda: ops.tfps_unique_keys(scalar_key),
    lambda: ops.tfps_unique_keys(tf.zeros([2, 3], I64)),
    lambda: ops.tfps_sum_by_key(keys2, tf.ones([3, 2])),
    lambda: ops.tfps_sum_by_key(keys2, tf.ones([2])),
    lambda: ops.tfps_sum_by_key(scalar_key, tf.ones([1, 2])),
    lambda: ops.tfps_sum_by_key(tf.zeros([0], I64), tf.zeros([0, 4])),
    lambda: ops.tfps_sum_by_key(keys2, tf.zeros([2, 0])),
    lambda: ops.tfps_sum_by_key(keys2, tf.fill([2, 2], nan)),
    # metric ops
    lambda: ops.tfps_histogram_auc_update(hist.handle, [1.0, 0.0], [0.5], tf.zeros([0]), 0,
                                          buckets_per_octave=2, octaves=2, metric_name="m"),
    lambda: ops.tfps_histogram_auc_update(hist.handle, [1.0], [nan], tf.zeros([0]), 0,
                                          buckets_per_octave=2, octaves=2, metric_name="m"),
    lambda: ops.tfps_histogram_auc_update(hist.handle, [1.0], [0.5], tf.ones([3]), 0,
                                          buckets_per_octave=2, octaves=2, metric_name="m"),
    lambda: ops.tfps_histogram_auc_update(hist.handle, [1.0], [0.5], tf.zeros([0]), -7,
                                          buckets_per_octave=2, octaves=2, metric_name="m"),
    lambda: ops.tfps_histogram_auc_update(hist.handle, [1.0], [0.5], tf.zeros([0]), big,
                                          buckets_per_octave=2, octaves=2, metric_name="m"),
    lambda: ops.tfps_histogram_auc_update(hist.handle, tf.ones([2, 2]), tf.ones([2, 2]) * 0.5, tf.zeros([0]),
                                          0, buckets_per_octave=2, octaves=2, metric_name="m"),
    lambda: ops.tfps_histogram_auc_update(keys2, [1.0], [0.5], tf.zeros([0]), 0,
                                          buckets_per_octave=2, octaves=2, metric_name="m"),
    lambda: ops.tfps_histogram_curve_sum(table, 0.0, 0.0, curve="ROC"),
    # GroupAUC ops
    lambda: ops.tfps_group_auc_update(groups, keys2, [1.0], [0.5, 0.5], tf.zeros([0]), **group_scale),
    lambda: ops.tfps_group_auc_update(groups, keys2, [1.0, 0.0], [0.5, nan], tf.zeros([0]), **group_scale),
    lambda: ops.tfps_group_auc_update(table, keys2, [1.0, 0.0], [0.5, 0.5], tf.zeros([0]), **group_scale),
    lambda: ops.tfps_group_auc_update(hist.handle, keys2, [1.0, 0.0], [0.5, 0.5], tf.zeros([0]), **group_scale),
    lambda: ops.tfps_group_auc_update(groups, tf.zeros([2, 1], I64), [1.0, 0.0], [0.5, 0.5], tf.zeros([0]),
                                      **group_scale),
    lambda: ops.tfps_group_auc_update(groups, keys2, [1.0, 0.0], [0.5, 0.5], tf.constant([1.0, -1.0]),
                                      **group_scale),
    lambda: ops.tfps_group_auc_update(groups, keys2, [1.0, 0.0], [0.5, 0.5], tf.zeros([0]),
                                      buckets_per_octave=3, octaves=2),
    lambda: ops.tfps_group_auc_update(groups, tf.zeros([0], I64), tf.zeros([0]), tf.zeros([0]), tf.zeros([0]),
                                      **group_scale),
    lambda: ops.tfps_group_auc_sum(table, num_buckets=8),
    lambda: ops.tfps_group_auc_sum(hist.handle, num_buckets=8),
    lambda: ops.tfps_group_auc_sum(groups, num_buckets=-8),
    lambda: ops.tfps_group_auc_sum(groups, num_buckets=8),
    # the table's clock
    lambda: ops.tfps_table_set_clock(table, -1),
    lambda: ops.tfps_table_set_clock(table, tf.constant([1, 2], I64)),
    lambda: ops.tfps_table_clock(hist.handle),
    lambda: ops.tfps_table_clock(table),
    # a learning rate per call
    lambda: ops.tfps_table_apply_gradients(table, keys2, rows2, 0, nan, dim=2),
    lambda: ops.tfps_table_apply_gradients(table, keys2, rows2, 0, tf.ones([2]), dim=2),
    lambda: ops.tfps_table_apply_gradients(table, keys2, rows2, 0, float("inf"), dim=2),
    lambda: ops.tfps_table_apply_gradients(table, keys2, rows2, 0, 0.5, dim=2),
    # occurrences of a find_or_insert
    lambda: ops.tfps_table_find_or_insert(table, keys2, tf.constant([1, -2], I64), dim=2),
    lambda: ops.tfps_table_find_or_insert(table, keys2, tf.constant([1, 2, 3], I64), dim=2),
    lambda: ops.tfps_table_find_or_insert(table, keys2, tf.constant([big, big], I64), dim=2),
    lambda: ops.tfps_table_stats(hist.handle),
    lambda: ops.tfps_table_stats(table),
]

def policy_table(**attrs):
    return ops.tfps_table_create(dim=2, optimizer="sgd", learning_rate=0.1, initializer="zeros", **attrs)

admitting = policy_table(admission="min_count", min_count=3, sketch_bytes=4096, eviction="ttl",
                         ttl_steps=2, max_rows=64, shared_name="fuzz_policies")
POLICY_CASES = [
    # eviction on demand, policies at creation (bad values must be refused)
    lambda: ops.tfps_table_evict(hist.handle),
    lambda: policy_table(admission="min_count", min_count=0),
    lambda: policy_table(admission="probability", admission_probability=0.0),
    lambda: policy_table(admission="probability", admission_probability=nan),
    lambda: policy_table(admission="min_count", min_count=2, sketch_bytes=-1),
    lambda: policy_table(eviction="ttl"),
    lambda: policy_table(eviction="ttl", ttl_steps=3, ttl_seconds=1.0),
    lambda: policy_table(eviction="ttl", ttl_seconds=float("inf")),
    lambda: policy_table(eviction="decayed_frequency", decay=0.0, threshold=1.0),
    lambda: policy_table(eviction="decayed_frequency", decay=0.9, threshold=nan),
    lambda: policy_table(max_rows=-1),
    lambda: ops.tfps_table_find_or_insert(admitting, tf.constant(np.arange(-1000, 1000), I64),
                                          tf.fill([2000], tf.constant(big, I64)), dim=2),
    lambda: ops.tfps_table_evict(admitting),
    lambda: ops.tfps_table_import(table, keys2, rows2, tf.ones([2, 1, 2]), tf.zeros([2, 4], I64), dim=2, num_slots=1),
    lambda: ops.tfps_table_import(table, keys2, rows2, tf.ones([2, 1, 2]), tf.zeros([2, 5], I64), dim=2, num_slots=1),
    # a save id that is not a scalar, serving exports of bad prefixes and names
    lambda: ops.tfps_table_save(table, "/tmp/fuzz_rows", 0, 1, [1, 2]),
    lambda: ops.tfps_table_export_for_serving(table, ["a", "b"], hashes_key="h", values_key="v"),
    lambda: ops.tfps_table_export_for_serving(table, "/tmp/fuzz_export", hashes_key="", values_key="v"),
    lambda: ops.tfps_table_export_for_serving(table, "/tmp/fuzz_export", hashes_key="h", values_key="h"),
    lambda: ops.tfps_table_export_for_serving(hist.handle, "/tmp/fuzz_export", hashes_key="h", values_key="v"),
    lambda: ops.tfps_table_export_for_serving(table, "/nonexistent_dir/x/y", hashes_key="h", values_key="v"),
    lambda: ops.tfps_table_export_changes_for_serving(table, "/tmp/fuzz_changes", [1, 2], hashes_key="h",
                                                      values_key="v", removed_key="r", chain="c"),
    lambda: ops.tfps_table_export_changes_for_serving(table, "/tmp/fuzz_changes", 1, hashes_key="h",
                                                      values_key="v", removed_key="v", chain="c"),
    lambda: ops.tfps_table_export_changes_for_serving(table, "/tmp/fuzz_changes", 1, hashes_key="h",
                                                      values_key="v", removed_key="r", chain=""),
    lambda: ops.tfps_table_export_changes_for_serving(hist.handle, "/tmp/fuzz_changes", 1, hashes_key="h",
                                                      values_key="v", removed_key="r", chain="c"),
    # reachability checks: bad shapes, addresses and timeouts (never a wait: timeout 0)
    lambda: ops.tfps_check_reachable("localhost:1", timeout_seconds=0.0, what="w"),
    lambda: ops.tfps_check_reachable([["localhost:1"]], timeout_seconds=0.0, what="w"),
    lambda: ops.tfps_check_reachable(tf.zeros([0], tf.string), timeout_seconds=0.0, what="w"),
    lambda: ops.tfps_check_reachable(["", ":", "host:", ":80", "[::1]", "a:b:c", "grpc://", "x" * 100000],
                                     timeout_seconds=0.0, what="w"),
    lambda: ops.tfps_check_reachable(["localhost:99999999999"], timeout_seconds=0.0, what="w"),
    lambda: ops.tfps_check_reachable(["localhost:1"], timeout_seconds=-1.0, what="w"),
    lambda: ops.tfps_check_reachable(["localhost:1"], timeout_seconds=nan, what="w"),
]
CASES += POLICY_CASES
'''

RUNNER = CASES + r'''
import sys
start = int(sys.argv[1])
for i in range(start, len(CASES)):
    print(f"case {i}", flush=True)
    try:
        CASES[i]()
        print(f"ok {i}", flush=True)
    except (tf.errors.OpError, ValueError, TypeError) as e:
        print(f"error {i} {type(e).__name__}", flush=True)
print("done", len(CASES), flush=True)
'''


def test_no_op_crashes_or_hangs_on_hostile_inputs():
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=ROOT)
    crashed, outcomes, start = [], {}, 0
    while True:
        try:
            out = subprocess.run([sys.executable, "-c", RUNNER, str(start)], capture_output=True, text=True,
                                 timeout=120, env=env)
            lines, finished = out.stdout.split("\n"), out.returncode == 0
        except subprocess.TimeoutExpired as e:
            lines, finished = (e.stdout or b"").decode().split("\n"), False
        for line in lines:
            words = line.split()
            if words and words[0] in ("ok", "error"):
                outcomes[int(words[1])] = words[0]
        if finished and any(line.startswith("done") for line in lines):
            break
        started = [int(line.split()[1]) for line in lines if line.startswith("case ")]
        assert started, f"the runner failed before any case:\n{out.stderr[-3000:]}"
        crashed.append(started[-1])
        start = started[-1] + 1
    assert not crashed, f"cases that aborted or hung the process: {crashed}"
    total = int([line for line in lines if line.startswith("done")][0].split()[1])
    assert sorted(outcomes) == list(range(total))
    # Every case's outcome, pinned: "e" refused with an error (wrong by construction: bad
    # shapes, dims, slot widths, handles, files, policies, ids), "o" accepted (valid edge
    # inputs: empty batches, a scalar key, a negative step meaning the clock, saturating
    # steps and metadata, cursors past the end, an empty update, a group sum, a clock read,
    # a rate, saturating counts under admission, an evict, 4 metadata columns, an empty
    # batch of keys to number or sum, zero-width or NaN values to sum, no address to reach).
    expected = ("oooeoeeeeeeeoooeeeeeeeeeoeeeooeeeeeeeeeeeeeeeeeeeeeeeeeeooeeooeeeeeoooeeeeeoeeeeeeeeeoeeeoeeeoeeeo"
                "eeoeoeeeeeeeeeeeoooeeeeeeeeeee" "eeoeeee")
    got = "".join("o" if outcomes[i] == "ok" else "e" for i in range(total))
    assert len(got) == len(expected)
    assert got == expected, [(i, outcomes[i]) for i in range(total) if got[i] != expected[i]]
