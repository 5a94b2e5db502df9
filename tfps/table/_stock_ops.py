"""The key, routing and initial-value functions of the table written in stock TensorFlow
ops, for graphs that must run without the tfps op library (SavedModels for serving). They
compute exactly what custom_ops/core/hashing.h computes."""

import numpy as np
import tensorflow as tf

_U64 = tf.uint64
_GOLDEN = 0x9E3779B97F4A7C15


def _c(value):
    return tf.constant(value & 0xFFFFFFFFFFFFFFFF, _U64)


def mix64(x):
    """MurmurHash3 fmix64 of a uint64 tensor (wrapping arithmetic)."""
    x = tf.bitwise.bitwise_xor(x, tf.bitwise.right_shift(x, _c(33)))
    x = x * _c(0xFF51AFD7ED558CCD)
    x = tf.bitwise.bitwise_xor(x, tf.bitwise.right_shift(x, _c(33)))
    x = x * _c(0xC4CEB9FE1A85EC53)
    return tf.bitwise.bitwise_xor(x, tf.bitwise.right_shift(x, _c(33)))


def shard_of(keys, num_shards):
    """As the Tfps>ShardOf op: int32 shard of each int64 key."""
    h = mix64(tf.bitwise.bitwise_xor(tf.bitcast(keys, _U64), _c(0x6A09E667F3BCC909)))
    shard = tf.bitwise.right_shift(tf.bitwise.right_shift(h, _c(32)) * _c(num_shards), _c(32))
    return tf.cast(shard, tf.int32)


def partition_by_shard(keys, shard, num_shards):
    """(positions in `keys` [n] of each shard's keys, each shard's keys), for int32 `shard`
    [n] of each key: what a sharded table sends each shard, and where its answers go back."""
    positions = tf.dynamic_partition(tf.range(tf.size(keys)), shard, num_shards)
    return positions, tf.dynamic_partition(keys, shard, num_shards)


def serving_order(keys):
    """As Tfps>TableExportForServing orders rows: int64 TableHash of each int64 key with its
    top bit flipped, so int64 order is the hash's unsigned order. TableHash is a bijection,
    so equal orders mean equal keys."""
    h = mix64(tf.bitwise.bitwise_xor(tf.bitcast(keys, _U64), _c(0x2545F4914F6CDD1D)))
    return tf.bitcast(tf.bitwise.bitwise_xor(h, _c(1 << 63)), tf.int64)


def namespaced_keys(ids, namespaces):
    """As the Tfps>NamespacedKeys op: int64 keys of int32/int64/uint64 IDs."""
    if ids.dtype == tf.uint64:
        ids = tf.bitcast(ids, tf.int64)
    ids = tf.cast(ids, tf.int64)
    namespaces = tf.broadcast_to(tf.cast(namespaces, tf.int64), tf.shape(ids))
    key = tf.bitcast(ids, _U64)
    ns = tf.bitcast(namespaces, _U64)
    salt = mix64(ns * _c(_GOLDEN) + _c(0x7F4A7C15))
    mixed = tf.bitcast(mix64(tf.bitwise.bitwise_xor(key, salt)), tf.int64)
    return tf.where(tf.equal(namespaces, 0), ids, mixed)


def _key_stream(keys, seed):
    seed_mix = mix64(_c((seed & 0xFFFFFFFFFFFFFFFF) ^ _GOLDEN))
    return mix64(tf.bitcast(keys, _U64) + seed_mix)


def _mix32(h):
    mask = _c(0xFFFFFFFF)
    h = tf.bitwise.bitwise_xor(h, tf.bitwise.right_shift(h, _c(16)))
    h = (h * _c(0x85EBCA6B)) & mask
    h = tf.bitwise.bitwise_xor(h, tf.bitwise.right_shift(h, _c(13)))
    h = (h * _c(0xC2B2AE35)) & mask
    return tf.bitwise.bitwise_xor(h, tf.bitwise.right_shift(h, _c(16)))


def initial_rows(keys, dim, seed, initializer):
    """Initial vectors [n, dim] of int64 keys [n], as the table computes them.

    Truncated normal tries 8 draws per element (the table up to 64); the chance that an
    element needs more is about 2e-11.
    """
    n = tf.shape(keys)[0]
    kind = initializer.op_name
    if kind == "zeros":
        return tf.zeros([n, dim], tf.float32)
    stream = _key_stream(keys, seed)[:, None]  # [n, 1]
    i = tf.cast(tf.range(dim, dtype=tf.int64), _U64)[None, :]  # [1, dim]
    if kind == "uniform":
        low, high = initializer.op_params()
        lo32 = stream & _c(0xFFFFFFFF)
        hi32 = tf.bitwise.right_shift(stream, _c(32))
        bits = _mix32(tf.bitwise.bitwise_xor((lo32 + i * _c(0x9E3779B9)) & _c(0xFFFFFFFF), hi32))
        unit = tf.cast(tf.bitwise.right_shift(bits, _c(8)), tf.float32) * (1.0 / 16777216.0)
        span = tf.constant(high, tf.float32) - tf.constant(low, tf.float32)
        return tf.constant(low, tf.float32) + span * unit
    # The table holds its parameters as float32.
    mean, stddev = (float(np.float32(v)) for v in initializer.op_params())
    value = tf.fill([n, dim], tf.constant(mean, tf.float32))
    done = tf.zeros([n, dim], tf.bool)
    for attempt in range(8):
        counter = tf.bitwise.left_shift(i, _c(7)) | _c(attempt << 1)

        def unit_open(c):
            bits = mix64(stream + (c + _c(1)) * _c(_GOLDEN))
            return (tf.cast(tf.bitwise.right_shift(bits, _c(11)), tf.float64) + 0.5) * (1.0 / 9007199254740992.0)

        u1, u2 = unit_open(counter), unit_open(counter | _c(1))
        z = tf.sqrt(-2.0 * tf.math.log(u1)) * tf.cos(6.283185307179586 * u2)
        accept = (~done) & (z >= -2.0) & (z <= 2.0)
        value = tf.where(accept, tf.cast(mean + stddev * z, tf.float32), value)
        done = done | accept
    return value
