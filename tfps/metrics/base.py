"""What tfps's metrics share: the tf_keras Metric base that refuses a Keras 3 caller, input
flattening and range checks, summing variables, and the log-linear histogram's bucket
layout and curve area (AUC, GroupAUC)."""

import tensorflow as tf
import tf_keras as keras

from tfps import _arguments as arguments
from tfps.keras import _keras3_guard as keras3_guard
from tfps._ops import ops

MAX_BUCKETS = 1 << 24


class Metric(keras.metrics.Metric):
    """A tf_keras metric that a Keras 3 model, which would take it for a plain function and
    average its per-batch results, is refused by (tfps.keras3_guard)."""

    def __call__(self, *args, **kwargs):
        keras3_guard.refuse_keras3_caller(f"tfps.metrics.{type(self).__name__}")
        return super().__call__(*args, **kwargs)


def flatten_inputs(metric_name, y_true, y_pred, sample_weight):
    """Flattens to float64 vectors (labels, predictions, weights) and checks their ranges."""
    weights = example_weights(metric_name, sample_weight, y_pred, tf.float64)
    y_pred = tf.reshape(tf.cast(y_pred, tf.float64), [-1])
    y_true = tf.reshape(tf.cast(y_true, tf.float64), [-1])
    if weights is None:
        weights = tf.ones_like(y_pred)
    checks = [
        tf.debugging.assert_equal(
            tf.size(y_true), tf.size(y_pred),
            message=f"{metric_name}: labels and predictions must have the same number of elements"),
        tf.debugging.assert_equal(
            tf.size(weights), tf.size(y_pred),
            message=f"{metric_name}: sample_weight must match predictions in size"),
        tf.debugging.Assert(
            tf.reduce_all((y_pred >= 0.0) & (y_pred <= 1.0)),
            [f"{metric_name}: predictions must be probabilities in [0, 1] (NaN is rejected); "
             "min and max seen:", tf.reduce_min(y_pred), tf.reduce_max(y_pred)]),
        tf.debugging.Assert(
            tf.reduce_all((y_true >= 0.0) & (y_true <= 1.0)),
            [f"{metric_name}: labels must be in [0, 1]; min and max seen:",
             tf.reduce_min(y_true), tf.reduce_max(y_true)]),
        tf.debugging.Assert(
            tf.reduce_all(weights >= 0.0),
            [f"{metric_name}: sample_weight must be >= 0; min seen:", tf.reduce_min(weights)]),
    ]
    with tf.control_dependencies(checks):
        return tf.identity(y_true), tf.identity(y_pred), tf.identity(weights)


# Keras runs update_state through AutoGraph; these updates have no tensor-dependent Python
# control flow, and converting them would add to every eager call.
straight_line = tf.autograph.experimental.do_not_convert


def as_float_vector(x):
    """float32 rank 1, adding no op when x already is (updates run once per step)."""
    x = tf.convert_to_tensor(x)
    if x.dtype != tf.float32:
        x = tf.cast(x, tf.float32)
    return x if x.shape.rank == 1 else tf.reshape(x, [-1])


def parts(variable):
    """The variables a (possibly partitioned) variable is made of, in row order."""
    return list(getattr(variable, "variables", [variable]))


def sum_variable(metric, name, shape=()):
    return metric.add_weight(name=name, shape=shape, dtype=tf.float64, initializer="zeros",
                             aggregation=tf.VariableAggregation.SUM)


def histogram_curve_area(parts, curve):
    """AUC of a histogram held in `parts` (variables of ascending bucket ranges).

    ROC: the Mann-Whitney statistic, pairs in the same bucket counting one half; 0.5 when
    either class is absent. PR: average precision (the step-wise area under the
    precision-recall curve, one step per non-empty bucket); 0 when there are no positives.
    Each part is summed by one op where it lives, from the highest buckets down.
    """
    total = positives = negatives = tf.constant(0.0, tf.float64)
    for part in reversed(parts):
        partial, positives, negatives = ops.tfps_histogram_curve_sum(
            part.handle, positives, negatives, curve=curve)
        total += partial
    if curve == "ROC":
        return tf.where((positives > 0) & (negatives > 0),
                        total / tf.maximum(positives * negatives, 1e-300), tf.constant(0.5, tf.float64))
    return tf.math.divide_no_nan(total, positives)


def buckets_per_octave(owner, num_buckets, octaves):
    """Buckets per octave of d of a log-linear histogram (see AUC), or a ValueError naming
    the valid choices."""
    if not arguments.is_int(octaves) or not 1 <= octaves <= 125:
        raise ValueError(f"{owner}: octaves must be an int in [1, 125], got {octaves!r}")
    sides = 2 * octaves
    per_octave, remainder = divmod(num_buckets, sides) if arguments.is_int(num_buckets) else (0, 1)
    if remainder or not 1 <= per_octave <= MAX_BUCKETS // sides or per_octave & (per_octave - 1):
        valid = [sides << k for k in range(24) if sides << k <= MAX_BUCKETS]
        raise ValueError(
            f"{owner}: num_buckets must be 2 * octaves times a power of two, at most "
            f"2**24 (with {octaves} octaves: {', '.join(map(str, valid[:4]))}, ..., {valid[-1]}), "
            f"got {num_buckets!r}")
    return int(per_octave)


def example_weights(metric_name, sample_weight, y_pred, dtype=tf.float32):
    """sample_weight as a `dtype` vector, one weight per element of y_pred (as given, before
    flattening), or None. As for Keras' metrics, a weight is a scalar, one per example
    ([batch] or [batch, 1], whichever rank the predictions have) or one per prediction.
    Keras' weighted_metrics pass [batch, 1] weights for [batch] or [batch, 1] outputs."""
    if sample_weight is None:
        return None
    weights, y_pred = tf.cast(sample_weight, dtype), tf.convert_to_tensor(y_pred)
    given, rank, pred_rank = weights.shape, weights.shape.rank, y_pred.shape.rank
    if rank is not None and pred_rank is not None:
        if 0 < rank == pred_rank - 1:
            weights = tf.expand_dims(weights, -1)
        elif rank == pred_rank + 1 and weights.shape[-1] == 1:
            weights = tf.squeeze(weights, -1)
        try:
            tf.broadcast_static_shape(weights.shape, y_pred.shape)
        except ValueError:
            raise ValueError(f"{metric_name}: sample_weight of shape {given} "
                             f"does not match predictions of shape {y_pred.shape}: give one weight "
                             "per example or per prediction") from None
    return tf.reshape(tf.broadcast_to(weights, tf.shape(y_pred)), [-1])
