"""Feature IDs to 64-bit table keys, a batch's distinct keys, and keys to parameter-server
shards."""

import numpy as np
import tensorflow as tf

from tfps._ops import ops

ID_DTYPES = (tf.int32, tf.int64, tf.uint64, tf.string)


def fingerprint64(strings):
    """Stable 64-bit fingerprints (FarmHash64) of a string tensor of any shape, as int64."""
    flat = tf.reshape(strings, [-1])
    keys = tf.bitcast(tf.fingerprint(flat, method="farmhash64"), tf.int64)
    return tf.reshape(keys, tf.shape(strings))


def ids_to_keys(ids, namespace=0, owner="tfps", stock_ops=False):
    """int64 table keys of int32/int64/uint64/string IDs, mixed with a feature namespace.

    namespace: an int, or an int64 tensor of one namespace per ID. Namespace 0 keeps
    integer IDs as they are; any other maps them by a bijection of its own, so features
    sharing a table never collide. stock_ops: compute with stock TensorFlow ops only (for
    graphs served without tfps), giving the same keys.
    """
    if ids.dtype not in ID_DTYPES:
        raise TypeError(f"{owner}: IDs must be int32, int64, uint64 or string, got {ids.dtype.name}"
                        + ("; cast float IDs to integers explicitly (per-ID weights go to the "
                           "layer's weights=, beside the IDs)" if ids.dtype.is_floating else ""))
    if ids.dtype == tf.string:
        ids = fingerprint64(ids)
    if ids.dtype == tf.int64 and isinstance(namespace, int) and namespace == 0:
        return ids
    if stock_ops:
        from tfps.table import _stock_ops as stock
        return stock.namespaced_keys(ids, namespace)
    return ops.tfps_namespaced_keys(ids, tf.cast(namespace, tf.int64))


def unique_keys(keys, stock_ops=False):
    """(distinct keys in order of first occurrence, each key's position among them, each
    distinct key's count), all int64: tf.unique_with_counts of int64 keys [m], which
    the tfps op computes in one pass. stock_ops: with TensorFlow's op (graphs served
    without tfps)."""
    if stock_ops:
        return tf.unique_with_counts(keys, out_idx=tf.int64)
    return ops.tfps_unique_keys(keys)


def sum_by_key(keys, values):
    """(distinct keys [n] in order of first occurrence, float32 values [m, d] summed per
    key [n, d]): tf.unique with tf.math.unsorted_segment_sum, bit for bit, in one pass of
    the tfps op. Values of another dtype go through TensorFlow's ops."""
    if values.dtype != tf.float32:
        keys, position = tf.unique(keys, out_idx=tf.int64)
        return keys, tf.math.unsorted_segment_sum(values, position, tf.size(keys, tf.int64))
    return ops.tfps_sum_by_key(keys, values)


def shard_of(keys, num_shards):
    """int32 shard index of each int64 key."""
    return ops.tfps_shard_of(keys, num_shards=int(num_shards))


def mix64_numpy(x):
    """MurmurHash3 fmix64 of an integer array (as uint64), for data generators."""
    x = np.asarray(x).astype(np.uint64)
    with np.errstate(over="ignore"):
        x ^= x >> np.uint64(33)
        x *= np.uint64(0xFF51AFD7ED558CCD)
        x ^= x >> np.uint64(33)
        x *= np.uint64(0xC4CEB9FE1A85EC53)
        x ^= x >> np.uint64(33)
    return x
