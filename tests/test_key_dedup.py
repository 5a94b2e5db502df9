"""The worker's per-step key ops, tfps.keys.unique_keys and sum_by_key, against NumPy and
against the TensorFlow ops they stand in for (tf.unique_with_counts; tf.unique with
unsorted_segment_sum, bit for bit), on the key patterns users bring; and those keys routed
to a sharded table's shards with their counts and gradients."""

import numpy as np
import pytest
import tensorflow as tf

import tfps
from tfps.table import keys as keys_lib

INT64_MIN, INT64_MAX = np.iinfo(np.int64).min, np.iinfo(np.int64).max


def patterns():
    rng = np.random.default_rng(7)
    zipf = rng.zipf(1.2, 50_000)
    return {
        "empty": np.zeros([0], np.int64),
        "one": np.array([42], np.int64),
        "all_the_same": np.full(10_000, -1, np.int64),
        "all_distinct": rng.permutation(30_000).astype(np.int64),
        "extremes": np.array([0, -1, INT64_MIN, INT64_MAX, 0, INT64_MIN, 1, INT64_MAX, -1], np.int64),
        # equal in their low 40 bits: a hash that kept only low bits would pile them up
        "high_bits_only": (rng.integers(0, 1 << 20, 20_000) << 40).astype(np.int64),
        "power_law": keys_lib.mix64_numpy(zipf).view(np.int64),
        "sequential_repeated": np.tile(np.arange(5_000, dtype=np.int64), 7),
    }


def numpy_unique_first_occurrence(keys):
    """(distinct keys in order of first occurrence, positions, counts) by NumPy's sort."""
    values, first, inverse, counts = np.unique(keys, return_index=True, return_inverse=True,
                                               return_counts=True)
    order = np.argsort(first, kind="stable")  # sorted order -> first-occurrence order
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order))
    return values[order], rank[inverse.reshape(-1)], counts[order]


@pytest.mark.parametrize("name", sorted(patterns()))
def test_unique_keys_number_keys_in_order_of_first_occurrence(name):
    keys = patterns()[name]
    unique, index, counts = (t.numpy() for t in keys_lib.unique_keys(tf.constant(keys)))
    expected = numpy_unique_first_occurrence(keys)
    np.testing.assert_array_equal(unique, expected[0])
    np.testing.assert_array_equal(index, expected[1])
    np.testing.assert_array_equal(counts, expected[2])
    np.testing.assert_array_equal(unique[index], keys)  # every key maps back to itself
    stock = tf.unique_with_counts(tf.constant(keys), out_idx=tf.int64)
    for ours, theirs in zip((unique, index, counts), stock):
        np.testing.assert_array_equal(ours, theirs.numpy())


@pytest.mark.parametrize("name", sorted(patterns()))
@pytest.mark.parametrize("dim", [1, 16, 33])
def test_sum_by_key_sums_each_keys_rows_as_tensorflow_does(name, dim):
    keys = patterns()[name]
    rng = np.random.default_rng(dim)
    values = rng.normal(size=(len(keys), dim)).astype(np.float32)
    unique, sums = (t.numpy() for t in keys_lib.sum_by_key(tf.constant(keys), tf.constant(values)))
    expected_unique, position, _ = numpy_unique_first_occurrence(keys)
    np.testing.assert_array_equal(unique, expected_unique)
    exact = np.zeros((len(expected_unique), dim))
    np.add.at(exact, position, values.astype(np.float64))
    np.testing.assert_allclose(sums, exact, rtol=1e-5, atol=1e-4 * np.sqrt(max(1, len(keys))))
    stock_unique, stock_position = tf.unique(tf.constant(keys), out_idx=tf.int64)
    stock_sums = tf.math.unsorted_segment_sum(tf.constant(values), stock_position,
                                              tf.size(stock_unique, tf.int64)).numpy()
    np.testing.assert_array_equal(sums.view(np.int32), stock_sums.view(np.int32))


def test_sum_by_key_of_other_dtypes_goes_through_tensorflow():
    keys = tf.constant([3, 1, 3], tf.int64)
    values = tf.constant([[1.0], [2.0], [4.0]], tf.float16)
    unique, sums = keys_lib.sum_by_key(keys, values)
    assert sums.dtype == tf.float16
    np.testing.assert_array_equal(unique.numpy(), [3, 1])
    np.testing.assert_array_equal(sums.numpy(), [[5.0], [2.0]])


def test_bad_shapes_are_refused_naming_the_op():
    with pytest.raises(tf.errors.InvalidArgumentError, match="Tfps>SumByKey: keys must be"):
        keys_lib.sum_by_key(tf.constant([1, 2], tf.int64), tf.ones([3, 2]))
    with pytest.raises(tf.errors.InvalidArgumentError, match="Tfps>UniqueKeys: keys must be a vector"):
        keys_lib.unique_keys(tf.zeros([2, 2], tf.int64))


def test_batches_larger_than_the_kept_slots_then_small_ones_stay_exact():
    rng = np.random.default_rng(3)
    for m in (700_000, 50, 300_000, 7):  # above and below the slots a thread keeps
        keys = rng.integers(-(1 << 40), 1 << 40, size=m, dtype=np.int64) // 3
        unique, index, counts = (t.numpy() for t in keys_lib.unique_keys(tf.constant(keys)))
        expected = numpy_unique_first_occurrence(keys)
        np.testing.assert_array_equal(unique, expected[0])
        np.testing.assert_array_equal(index, expected[1])
        np.testing.assert_array_equal(counts, expected[2])


@pytest.mark.parametrize("name", sorted(set(patterns()) - {"empty"}))
def test_a_sharded_table_routes_each_keys_count_and_gradient_to_its_own_row(name, run):
    """Each key's count and gradient must reach its own row on its shard, as NumPy says."""
    keys = patterns()[name]
    unique, _, counts = numpy_unique_first_occurrence(keys)
    gradients = np.random.default_rng(len(keys)).normal(size=(len(unique), 3)).astype(np.float32)
    table = tfps.ShardedTable(3, optimizer=tfps.optimizers.SGD(1.0), initializer="zeros",
                              devices=["/cpu:0"] * 3)

    def step(unique_keys, occurrences, grads):
        rows = table.find_or_insert(unique_keys, occurrences)
        with tf.control_dependencies([rows]):
            applied = table.apply_gradients(unique_keys, grads)
        with tf.control_dependencies([applied]):
            return tf.identity(rows)

    rows = run(step, tf.constant(unique), tf.constant(counts), tf.constant(gradients))
    np.testing.assert_array_equal(rows, np.zeros_like(gradients))
    exported = table.export()
    order = np.argsort(exported.keys.numpy())
    expected = np.argsort(unique)
    np.testing.assert_array_equal(exported.keys.numpy()[order], unique[expected])
    np.testing.assert_array_equal(exported.values.numpy()[order], -gradients[expected])
    np.testing.assert_array_equal(exported.metadata.numpy()[order, 0], counts[expected])
