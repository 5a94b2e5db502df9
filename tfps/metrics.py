"""Ranking and calibration metrics for CTR training, exact enough to compare runs by.

Every metric's state is a set of sums, so under ParameterServerStrategy each worker adds
into the same variables and `result()` covers all workers' data, in `fit` and `evaluate`.
Labels may be soft: a label y in [0, 1] counts as y positive and 1 - y negative examples.
"""

import weakref

import tensorflow as tf
import tf_keras as keras
from tf_keras.src.utils import tf_utils

from tfps import arguments
from tfps import keras3_guard

_MAX_BUCKETS = 1 << 24


class _Metric(keras.metrics.Metric):
    """A tf_keras metric that a Keras 3 model, which would take it for a plain function and
    average its per-batch results, is refused by (tfps.keras3_guard)."""

    def __call__(self, *args, **kwargs):
        keras3_guard.refuse_keras3_caller(f"tfps.metrics.{type(self).__name__}")
        return super().__call__(*args, **kwargs)


def _flatten_inputs(metric_name, y_true, y_pred, sample_weight):
    """Flattens to float64 vectors (labels, predictions, weights) and checks their ranges."""
    y_pred = tf.reshape(tf.cast(y_pred, tf.float64), [-1])
    y_true = tf.reshape(tf.cast(y_true, tf.float64), [-1])
    if sample_weight is None:
        weights = tf.ones_like(y_pred)
    else:
        weights = tf.cast(sample_weight, tf.float64)
        weights = tf.reshape(tf.broadcast_to(weights, tf.shape(tf.reshape(y_pred, [-1]))) if
                             weights.shape.rank == 0 else weights, [-1])
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
# control flow, and converting them cost over a millisecond per eager call.
_straight_line = tf.autograph.experimental.do_not_convert


def _as_float_vector(x):
    """float32 rank 1, adding no op when x already is (updates run once per step)."""
    x = tf.convert_to_tensor(x)
    if x.dtype != tf.float32:
        x = tf.cast(x, tf.float32)
    return x if x.shape.rank == 1 else tf.reshape(x, [-1])


def _parts(variable):
    """The variables a (possibly partitioned) variable is made of, in row order."""
    return list(getattr(variable, "variables", [variable]))


def _sum_variable(metric, name, shape=()):
    return metric.add_weight(name=name, shape=shape, dtype=tf.float64, initializer="zeros",
                             aggregation=tf.VariableAggregation.SUM)


def _histogram_curve_area(parts, curve):
    """AUC of a histogram held in `parts` (variables of ascending bucket ranges).

    ROC: the Mann-Whitney statistic, pairs in the same bucket counting one half; 0.5 when
    either class is absent. PR: average precision (the step-wise area under the
    precision-recall curve, one step per non-empty bucket); 0 when there are no positives.
    Each part is summed by one op where it lives, from the highest buckets down.
    """
    from tfps._ops import ops
    total = positives = negatives = tf.constant(0.0, tf.float64)
    for part in reversed(parts):
        partial, positives, negatives = ops.tfps_histogram_curve_sum(
            part.handle, positives, negatives, curve=curve)
        total += partial
    if curve == "ROC":
        return tf.where((positives > 0) & (negatives > 0),
                        total / tf.maximum(positives * negatives, 1e-300), tf.constant(0.5, tf.float64))
    return tf.math.divide_no_nan(total, positives)


def _buckets_per_octave(owner, num_buckets, octaves):
    """Buckets per octave of d of a log-linear histogram (see AUC), or a ValueError naming
    the valid choices."""
    if not arguments.is_int(octaves) or not 1 <= octaves <= 125:
        raise ValueError(f"{owner}: octaves must be an int in [1, 125], got {octaves!r}")
    sides = 2 * octaves
    per_octave, remainder = divmod(num_buckets, sides) if arguments.is_int(num_buckets) else (0, 1)
    if remainder or not 1 <= per_octave <= _MAX_BUCKETS // sides or per_octave & (per_octave - 1):
        valid = [sides << k for k in range(24) if sides << k <= _MAX_BUCKETS]
        raise ValueError(
            f"{owner}: num_buckets must be 2 * octaves times a power of two, at most "
            f"2**24 (with {octaves} octaves: {', '.join(map(str, valid[:4]))}, ..., {valid[-1]}), "
            f"got {num_buckets!r}")
    return int(per_octave)


@keras.utils.register_keras_serializable(package="tfps")
class AUC(_Metric):
    """Area under the ROC or PR curve from fine prediction histograms.

    State: positive and negative weight per prediction bucket (a float64 [num_buckets, 2]
    variable). An update is one op (Tfps>HistogramAucUpdate) costing O(batch): it checks
    every input, then adds each example to its bucket under the variable's lock; under
    ParameterServerStrategy it runs on the parameter server that holds the state, and so
    does result()'s one pass over the histogram (Tfps>HistogramCurveSum), which sends
    back three scalars instead of the whole histogram.

    Buckets follow a prediction's distance d = min(p, 1 - p) to the nearer end on a
    log-linear scale: each octave of d ([1/4, 1/2), [1/8, 1/4), ...) holds
    num_buckets / (2 * octaves) equal buckets, down to d = 2^-(octaves + 1); predictions
    nearer an end share its end bucket. A bucket is thus narrower than d * 2 * octaves /
    num_buckets (d / 1024 by default), so CTR predictions around 1e-3 are ordered as
    finely, relative to their size, as those around 0.3; equal-width buckets lose most of
    their resolution there. The defaults
    (32768 buckets, 512 KiB) give results within 1e-4 of the exact AUC on well-spread
    predictions and on predictions crowded near 0. Pairs in the same bucket count one
    half. One class only gives 0.5 (ROC) or 0 (PR); all predictions equal gives 0.5 (ROC)
    and the positive rate (PR).

    Args:
      num_buckets: histogram buckets, 2 * octaves times a power of two (at most 2^24).
      curve: "ROC" or "PR" (average precision).
      name: metric name.
      octaves: halvings of d resolved below 1/2 (the default resolves d >= 2^-17).
    """

    def __init__(self, num_buckets=32768, curve="ROC", name="auc", octaves=16, dtype=None,
                 **kwargs):
        super().__init__(name=name, dtype=dtype, **kwargs)
        per_octave = _buckets_per_octave("tfps.metrics.AUC", num_buckets, octaves)
        curve = str(curve).upper()
        if curve not in ("ROC", "PR"):
            raise ValueError(f"tfps.metrics.AUC: curve must be 'ROC' or 'PR', got {curve!r}")
        self.num_buckets = num_buckets
        self.octaves = octaves
        self.buckets_per_octave = per_octave
        self.curve = curve
        self.histogram = _sum_variable(self, "histogram", [self.num_buckets, 2])

    @_straight_line
    def update_state(self, y_true, y_pred, sample_weight=None):
        from tfps._ops import ops  # the op library is loaded only by metrics that use it
        y_pred, y_true = _as_float_vector(y_pred), _as_float_vector(y_true)
        no_weights, first_rows = self._update_constants()
        if sample_weight is None:
            weights = no_weights  # the op reads "no weights" as all ones
        else:
            weights = tf.reshape(tf.broadcast_to(tf.cast(sample_weight, tf.float32),
                                                 tf.shape(y_pred)), [-1])
        updates = []
        for part, first in zip(_parts(self.histogram), first_rows):
            updates.append(ops.tfps_histogram_auc_update(
                part.handle, y_true, y_pred, weights, first,
                buckets_per_octave=self.buckets_per_octave, octaves=self.octaves,
                metric_name=f"tfps.metrics.AUC({self.name})"))
        return tf.group(updates)

    def _update_constants(self):
        """The empty weights tensor and each histogram part's first row. Eagerly they are
        made once and kept: making them took about half of an eager update (8192
        predictions: 258-320 us per update with them made each time, 142-161 us kept). In a
        graph they are constants, made afresh so that no function captures an eager tensor."""
        def make():
            firsts = [0]
            for part in _parts(self.histogram)[:-1]:  # a variable partitioner may have split it
                firsts.append(firsts[-1] + part.shape[0])
            return tf.zeros([0], tf.float32), [tf.constant(f, tf.int64) for f in firsts]
        if not tf.executing_eagerly():
            return make()
        if getattr(self, "_eager_update_constants", None) is None:
            # Set past Keras' attribute tracking, which would make the tensors a dependency
            # of the metric in every checkpoint.
            object.__setattr__(self, "_eager_update_constants", make())
        return self._eager_update_constants

    def result(self):
        return tf.cast(_histogram_curve_area(_parts(self.histogram), self.curve), self.dtype)

    def reset_state(self):
        self.histogram.assign(tf.zeros_like(self.histogram))

    def get_config(self):
        return {**super().get_config(), "num_buckets": self.num_buckets, "curve": self.curve,
                "octaves": self.octaves}


@keras.utils.register_keras_serializable(package="tfps")
class BinaryLogLoss(_Metric):
    """Weighted mean binary cross-entropy of probabilities, clipped to [eps, 1 - eps]."""

    def __init__(self, epsilon=1e-7, name="log_loss", dtype=None, **kwargs):
        super().__init__(name=name, dtype=dtype, **kwargs)
        if not 0 < epsilon < 0.5:
            raise ValueError(f"tfps.metrics.BinaryLogLoss: epsilon must be in (0, 0.5), got {epsilon!r}")
        self.epsilon = float(epsilon)
        self.total_loss = _sum_variable(self, "total_loss")
        self.total_weight = _sum_variable(self, "total_weight")

    @_straight_line
    def update_state(self, y_true, y_pred, sample_weight=None):
        y_true, y_pred, weights = _flatten_inputs(f"tfps.metrics.BinaryLogLoss({self.name})",
                                                  y_true, y_pred, sample_weight)
        p = tf.clip_by_value(y_pred, self.epsilon, 1.0 - self.epsilon)
        loss = -(y_true * tf.math.log(p) + (1.0 - y_true) * tf.math.log(1.0 - p))
        return tf.group(self.total_loss.assign_add(tf.reduce_sum(weights * loss)),
                        self.total_weight.assign_add(tf.reduce_sum(weights)))

    def result(self):
        return tf.cast(tf.math.divide_no_nan(self.total_loss, self.total_weight), self.dtype)

    def reset_state(self):
        for v in (self.total_loss, self.total_weight):
            v.assign(tf.zeros_like(v))

    def get_config(self):
        return {**super().get_config(), "epsilon": self.epsilon}


@keras.utils.register_keras_serializable(package="tfps")
class CalibrationRatio(_Metric):
    """Mean prediction divided by the observed positive rate (1.0 is calibrated; 0 when
    there are no positives)."""

    def __init__(self, name="calibration", dtype=None, **kwargs):
        super().__init__(name=name, dtype=dtype, **kwargs)
        self.predicted = _sum_variable(self, "predicted")
        self.observed = _sum_variable(self, "observed")

    @_straight_line
    def update_state(self, y_true, y_pred, sample_weight=None):
        y_true, y_pred, weights = _flatten_inputs(f"tfps.metrics.CalibrationRatio({self.name})",
                                                  y_true, y_pred, sample_weight)
        return tf.group(self.predicted.assign_add(tf.reduce_sum(weights * y_pred)),
                        self.observed.assign_add(tf.reduce_sum(weights * y_true)))

    def result(self):
        return tf.cast(tf.math.divide_no_nan(self.predicted, self.observed), self.dtype)

    def reset_state(self):
        for v in (self.predicted, self.observed):
            v.assign(tf.zeros_like(v))


def _example_weights(sample_weight, y_pred):
    """sample_weight as a float32 vector matching y_pred, or None."""
    if sample_weight is None:
        return None
    return tf.reshape(tf.broadcast_to(tf.cast(sample_weight, tf.float32), tf.shape(y_pred)), [-1])


@keras.utils.register_keras_serializable(package="tfps")
class GroupAUC(_Metric):
    """Impression-weighted mean of per-group ROC AUCs (GAUC, e.g. per user), over 64-bit
    group keys, summed over all workers.

    Each group's state is a row of a dynamic table (sharded over the parameter servers
    under ParameterServerStrategy): its positive and negative weight per prediction bucket,
    with AUC's log-linear buckets, so predictions around a 0.1% click rate are ordered as
    finely as those around 30%. An update sends the batch's examples to the parameter
    servers holding their groups (Tfps>GroupAucUpdate), which add them to the rows under
    each row's lock, so concurrent workers lose nothing; `result()` runs on each parameter
    server over its rows a chunk at a time (Tfps>GroupAucSum) and sends back two scalars.
    Groups with only one class are left out, as is usual for GAUC; with no such group the
    result is 0.5. Pairs in the same bucket count one half.

    Memory: 8 * num_buckets bytes per group seen (2 KiB at the default). Counts are
    float32: a bucket of one group counts exactly up to 2^24 examples, and past that each
    batch's count is added with a relative rounding error of at most 2^-24 of the bucket.

    Groups reach the metric in one of two ways:
    - `update_state(y_true, y_pred, sample_weight=None, groups=...)`, called directly;
    - in `compile(metrics=[gauc])`, through a `tfps.metrics.FeedGroups(gauc)` layer that the
      model's prediction passes through: `p = FeedGroups(gauc)([p, inputs["user_id"]])`.
      Keras calls a compiled metric with labels and predictions only; the layer hands it the
      batch's groups in the same step (fit, evaluate, any strategy).

    Args:
      num_buckets: prediction buckets per group, 2 * octaves times a power of two.
      name: metric name.
      octaves: halvings of d = min(p, 1 - p) resolved below 1/2, as for AUC.
    """

    def __init__(self, num_buckets=256, name="group_auc", octaves=16, dtype=None, **kwargs):
        super().__init__(name=name, dtype=dtype, **kwargs)
        self.buckets_per_octave = _buckets_per_octave("tfps.metrics.GroupAUC", num_buckets, octaves)
        self.num_buckets, self.octaves = int(num_buckets), int(octaves)
        # Keras' exact evaluation (pss_evaluation_shards) clones each metric per data shard
        # and merges the clones through `metric.weights`; a GroupAUC's state is a table, not
        # weights, so its clone adds straight into the table of the metric it clones.
        original = _live_group_aucs.get(name) if tf_utils.in_local_vars_context() else None
        if original is not None and (original.num_buckets, original.octaves) == (self.num_buckets, self.octaves):
            self.histograms = original.histograms
            return
        from tfps.sharded_table import ShardedTable  # the op library is needed only here
        from tfps import initializers, optimizers
        with tf.init_scope():
            self.histograms = ShardedTable(2 * num_buckets, optimizer=optimizers.SGD(1.0),
                                           initializer=initializers.Zeros(), name=f"{name}_histograms")
        _live_group_aucs[name] = self

    @property
    def _metric_name(self):
        return f"tfps.metrics.GroupAUC({self.name})"

    @_straight_line
    def update_state(self, y_true, y_pred, sample_weight=None, groups=None):
        from tfps._ops import ops
        from tfps.sharded_table import as_int64_keys
        if groups is None:
            groups = self._fed_groups()
        y_pred, y_true = _as_float_vector(y_pred), _as_float_vector(y_true)
        groups = tf.reshape(as_int64_keys(groups, self._metric_name + ": groups"), [-1])
        weights = _example_weights(sample_weight, y_pred)
        tensors = (y_true, y_pred) if weights is None else (y_true, y_pred, weights)
        checks = []
        if self.histograms.num_shards > 1:  # partitioning needs equal sizes; one shard's op checks them
            checks = [tf.debugging.assert_equal(tf.size(t), tf.size(groups), message=(
                f"{self._metric_name}: groups, labels, predictions and sample_weight must have "
                "one element per example")) for t in tensors]
        no_weights = tf.zeros([0], tf.float32)

        def update(table, shard_groups, labels, predictions, shard_weights=no_weights):
            return ops.tfps_group_auc_update(
                table.resource_handle, shard_groups, labels, predictions, shard_weights,
                buckets_per_octave=self.buckets_per_octave, octaves=self.octaves,
                metric_name=self._metric_name)
        with tf.control_dependencies(checks):
            return tf.group(self.histograms.per_shard(update, groups, *tensors)[0])

    def _fed_groups(self):
        groups = _groups_fed_in_this_step().get(self.name)
        if groups is None:
            raise ValueError(
                f"{self._metric_name} has no groups for this batch: call update_state(..., "
                "groups=...), or in compile(metrics=...) pass the model's prediction through "
                "tfps.metrics.FeedGroups(metric)([prediction, group_ids])")
        return groups

    def feed_groups(self, groups):
        """Groups for the next update_state without groups= in the same step (FeedGroups)."""
        _groups_fed_in_this_step()[self.name] = groups

    def result(self):
        from tfps._ops import ops
        weighted, impressions = [], []
        for table, device in zip(self.histograms.shards, self.histograms.devices):
            with tf.device(device):
                shard_weighted, shard_impressions = ops.tfps_group_auc_sum(
                    table.resource_handle, num_buckets=self.num_buckets, metric_name=self._metric_name)
            weighted.append(shard_weighted)
            impressions.append(shard_impressions)
        weighted, impressions = tf.add_n(weighted), tf.add_n(impressions)
        value = tf.where(impressions > 0, weighted / tf.maximum(impressions, 1e-300),
                         tf.constant(0.5, tf.float64))
        return tf.cast(value, self.dtype)

    def reset_state(self):
        self.histograms.clear()

    def get_config(self):
        return {**super().get_config(), "num_buckets": self.num_buckets, "octaves": self.octaves}


# The GroupAUCs made outside a metric-cloning scope, by name, for their clones (held weakly).
_live_group_aucs = weakref.WeakValueDictionary()

# The groups FeedGroups handed over, by metric name, per graph a step is traced into (held
# weakly: they go with the step's function), and for eager steps. By name, not by object, so
# the link outlives saving: a loaded model's FeedGroups and its compiled GroupAUC are new objects.
_groups_fed_by_graph = weakref.WeakKeyDictionary()
_groups_fed_eagerly = {}


def _groups_fed_in_this_step():
    if tf.executing_eagerly():
        return _groups_fed_eagerly
    return _groups_fed_by_graph.setdefault(tf.compat.v1.get_default_graph(), {})


@keras.utils.register_keras_serializable(package="tfps")
class FeedGroups(keras.layers.Layer):
    """Passes predictions through unchanged and hands each GroupAUC the batch's groups, so a
    GroupAUC works in `compile(metrics=...)`: `p = FeedGroups(gauc)([p, inputs["user_id"]])`.

    Args:
      metrics: a GroupAUC or a list of them (or their names: a GroupAUC is fed by name, so
        a saved and loaded model's FeedGroups feeds its loaded GroupAUC).
    """

    def __init__(self, metrics=(), **kwargs):
        kwargs.setdefault("autocast", False)  # predictions leave as they came
        super().__init__(**kwargs)
        metrics = list(metrics) if isinstance(metrics, (list, tuple)) else [metrics]
        for metric in metrics:
            if not isinstance(metric, (GroupAUC, str)):
                raise TypeError(f"tfps.metrics.FeedGroups feeds GroupAUC metrics (or their names), got {metric!r}")
        self.metric_names = tuple(m if isinstance(m, str) else m.name for m in metrics)

    def __call__(self, inputs, *args, **kwargs):
        keras3_guard.refuse_keras3(f"FeedGroups '{self.name}'", tf.nest.flatten(inputs))
        return super().__call__(inputs, *args, **kwargs)

    def call(self, inputs):
        if not isinstance(inputs, (list, tuple)) or len(inputs) != 2:
            raise ValueError("tfps.metrics.FeedGroups takes [predictions, groups]")
        predictions, groups = inputs
        fed = _groups_fed_in_this_step()
        for name in self.metric_names:
            fed[name] = groups
        return tf.identity(predictions)

    def get_config(self):
        return {**super().get_config(), "metrics": list(self.metric_names)}
