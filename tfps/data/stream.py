"""A synthetic stream of CTR examples whose ID population drifts, for streaming training.

Each example has `fields` categorical IDs. In each field, a window of `live_ids` IDs is
alive at a time, and it slides: `new_ids_per_example` new IDs appear per example, the
newest ones the most popular (ranks drawn log-uniformly, so an ID is drawn about 1 / (r +
1) as often at rank r), and each fades as newer ones arrive until it leaves the window and
is never drawn again. A share `one_off` of the draws are IDs seen once in the whole stream
(rare users, hashed free text). The label is a Bernoulli draw of a logistic model: a bias
plus one effect per ID (a fixed function of the ID), so an ID's row is worth learning only
if the ID comes back. Everything is a function of the example's index, computed in the
input graph: any range of the stream can be regenerated exactly, by any process.
"""

import dataclasses
import math
import uuid

import tensorflow as tf

from tfps.data import _service as service


def _mix(x):
    """SplitMix64's finalizer on uint64 (every input bit moves every output bit)."""
    x = tf.bitwise.bitwise_xor(x, tf.bitwise.right_shift(x, tf.constant(30, tf.uint64)))
    x = x * tf.constant(0xBF58476D1CE4E5B9, tf.uint64)
    x = tf.bitwise.bitwise_xor(x, tf.bitwise.right_shift(x, tf.constant(27, tf.uint64)))
    x = x * tf.constant(0x94D049BB133111EB, tf.uint64)
    return tf.bitwise.bitwise_xor(x, tf.bitwise.right_shift(x, tf.constant(31, tf.uint64)))


@dataclasses.dataclass(frozen=True)
class DriftingStream:
    fields: int = 8
    live_ids: int = 50_000
    new_ids_per_example: float = 0.02
    one_off: float = 0.15
    effect_scale: float = 0.6
    bias: float = -1.5
    seed: int = 0

    def _uniform(self, salt, index, field):
        """Uniform [0, 1) per (index, field) int64 pair and salt."""
        as_u64 = lambda t: tf.bitcast(tf.cast(t, tf.int64), tf.uint64)  # noqa: E731
        salted = tf.constant(((self.seed * 1000003 + salt) * 0x2545F4914F6CDD1D) % (1 << 64), tf.uint64)
        x = _mix(_mix(as_u64(index) + salted) + as_u64(field) * tf.constant(0x9E3779B97F4A7C15, tf.uint64))
        return tf.cast(tf.bitwise.right_shift(x, tf.constant(11, tf.uint64)), tf.float64) * 2.0 ** -53

    def _effect(self, ids, field):
        """An ID's fixed effect on the logit: uniform with standard deviation effect_scale."""
        u = self._uniform(1000, ids, field)
        return (u * 2.0 - 1.0) * (self.effect_scale * math.sqrt(3.0))

    def examples(self, indices):
        """({"ids": int64 [n, fields]}, labels float32 [n], click probabilities float32 [n])
        of the examples at `indices` (int64 [n])."""
        index = tf.cast(indices, tf.int64)[:, None]
        field = tf.range(self.fields, dtype=tf.int64)[None, :]
        base = tf.cast(tf.floor(tf.cast(index, tf.float64) * self.new_ids_per_example), tf.int64)
        rank = tf.cast(tf.floor(tf.exp(self._uniform(1, index, field) * math.log(self.live_ids))), tf.int64) - 1
        live = base + (self.live_ids - 1) - rank
        # One-off IDs live in the top half of the ID space, apart from the sliding window.
        one_off = tf.bitwise.bitwise_or(index, tf.constant(1 << 62, tf.int64))
        ids = tf.where(self._uniform(2, index, field) < self.one_off, one_off, live)
        logit = self.bias + tf.reduce_sum(self._effect(ids, field), axis=1)
        probability = tf.sigmoid(logit)
        labels = tf.cast(self._uniform(3, indices[:, None], 0)[:, 0] < probability, tf.float32)
        return {"ids": ids}, labels, tf.cast(probability, tf.float32)

    def dataset(self, first_example, batch_size, num_batches=None, data_service=None, index_feature=None):
        """Batches of (features, labels) from example `first_example` on (`num_batches` of
        them, or forever). With a tf.data service address, each batch goes to exactly one
        of the consumers (distributed_epoch), as workers under ParameterServerStrategy want.
        With `index_feature`, the features also hold each example's index under that name."""
        batches = tf.data.Dataset.range(num_batches) if num_batches is not None else tf.data.Dataset.range(1 << 62)

        def batch(b):
            indices = first_example + b * batch_size + tf.range(batch_size, dtype=tf.int64)
            features, labels, _ = self.examples(indices)
            if index_feature is not None:
                features[index_feature] = indices
            return features, labels

        dataset = batches.map(batch, num_parallel_calls=tf.data.AUTOTUNE)
        if data_service is not None:
            dataset = service.distribute(dataset, data_service, f"tfps-stream-{uuid.uuid4().hex}")
        return dataset.prefetch(tf.data.AUTOTUNE)
