"""Ranking and calibration metrics for CTR training, exact enough to compare runs by.

Every metric's state is a set of sums, so under ParameterServerStrategy each worker adds
into the same variables and `result()` covers all workers' data, in `fit` and `evaluate`.
Labels may be soft: a label y in [0, 1] counts as y positive and 1 - y negative examples.
"""

import tensorflow as tf
import tf_keras as keras

from tfps import arguments

_MAX_BUCKETS = 1 << 24


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


class AUC(keras.metrics.Metric):
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
        if not arguments.is_int(octaves) or not 1 <= octaves <= 125:
            raise ValueError(f"tfps.metrics.AUC: octaves must be an int in [1, 125], got {octaves!r}")
        sides = 2 * octaves
        per_octave, remainder = divmod(num_buckets, sides) if arguments.is_int(num_buckets) else (0, 1)
        if remainder or not 1 <= per_octave <= _MAX_BUCKETS // sides or per_octave & (per_octave - 1):
            valid = [sides << k for k in range(24) if sides << k <= _MAX_BUCKETS]
            raise ValueError(
                "tfps.metrics.AUC: num_buckets must be 2 * octaves times a power of two, at most "
                f"2**24 (with {octaves} octaves: {', '.join(map(str, valid[:4]))}, ..., {valid[-1]}), "
                f"got {num_buckets!r}")
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


class BinaryLogLoss(keras.metrics.Metric):
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


class CalibrationRatio(keras.metrics.Metric):
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


def _batched_roc_auc(positives, negatives):
    """ROC AUC per row of [groups, buckets] histograms (ascending score), ties counting half."""
    pos = tf.reverse(positives, [1])
    neg = tf.reverse(negatives, [1])
    pos_above = tf.cumsum(pos, axis=1, exclusive=True)
    wins = tf.reduce_sum(neg * (pos_above + 0.5 * pos), axis=1)
    return tf.math.divide_no_nan(wins, tf.reduce_sum(pos, 1) * tf.reduce_sum(neg, 1))


class GroupAUC(keras.metrics.Metric):
    """Impression-weighted mean of per-group ROC AUCs (e.g. per user), over 64-bit group keys.

    Each group's state is a row of a dynamic table (sharded over the parameter servers
    under ParameterServerStrategy) holding its positive and negative weight per prediction
    bucket; rows are added to atomically by the table (SGD with learning rate 1 and the
    negated counts as gradient), so concurrent workers never lose an update. Groups with only one class are left out, as is usual for GAUC; with no such
    group the result is 0.5. Memory: 8 * num_buckets bytes per group seen.

    Call `update_state(y_true, y_pred, sample_weight=None, groups=...)` with int64 groups
    of the same size as the predictions.

    Args:
      num_buckets: prediction buckets per group; pairs in the same bucket count one half.
    """

    def __init__(self, num_buckets=256, name="group_auc", dtype=None, **kwargs):
        super().__init__(name=name, dtype=dtype, **kwargs)
        if not arguments.is_int(num_buckets) or num_buckets < 2:
            raise ValueError(f"tfps.metrics.GroupAUC: num_buckets must be an int >= 2, got {num_buckets!r}")
        from tfps.sharded_table import ShardedTable  # the op library is needed only here
        from tfps import initializers, optimizers
        self.num_buckets = num_buckets
        with tf.init_scope():
            self.histograms = ShardedTable(2 * num_buckets, optimizer=optimizers.SGD(1.0),
                                           initializer=initializers.Zeros(), name=f"{name}_histograms")

    @_straight_line
    def update_state(self, y_true, y_pred, sample_weight=None, groups=None):
        if groups is None:
            raise ValueError("tfps.metrics.GroupAUC.update_state needs groups= (one int64 key "
                             "per prediction, e.g. the user ID)")
        y_true, y_pred, weights = _flatten_inputs(f"tfps.metrics.GroupAUC({self.name})", y_true,
                                                  y_pred, sample_weight)
        groups = tf.reshape(groups, [-1])
        if groups.dtype not in (tf.int64, tf.int32, tf.uint64):
            raise TypeError(f"tfps.metrics.GroupAUC: groups must be integer keys, got {groups.dtype.name}")
        groups = tf.cast(groups, tf.int64) if groups.dtype == tf.int32 else groups
        tf.debugging.assert_equal(tf.size(groups), tf.size(y_pred), message=(
            "tfps.metrics.GroupAUC: groups must have one key per prediction"))
        unique, row = tf.unique(groups, out_idx=tf.int64)
        bucket = tf.minimum(tf.cast(tf.floor(y_pred * self.num_buckets), tf.int64), self.num_buckets - 1)
        indices = tf.concat([tf.stack([row, bucket], 1),
                             tf.stack([row, bucket + self.num_buckets], 1)], 0)
        counts = tf.concat([weights * y_true, weights * (1.0 - y_true)], 0)
        delta = tf.scatter_nd(indices, tf.cast(counts, tf.float32),
                              tf.stack([tf.size(unique, out_type=tf.int64), 2 * self.num_buckets]))
        return self.histograms.apply_gradients(unique, -delta)

    def result(self):
        rows = tf.cast(self.histograms.export().values, tf.float64)
        positives, negatives = rows[:, :self.num_buckets], rows[:, self.num_buckets:]
        pos_total, neg_total = tf.reduce_sum(positives, 1), tf.reduce_sum(negatives, 1)
        both = (pos_total > 0) & (neg_total > 0)
        impressions = tf.where(both, pos_total + neg_total, 0.0)
        auc = _batched_roc_auc(positives, negatives)
        value = tf.where(tf.reduce_sum(impressions) > 0,
                         tf.math.divide_no_nan(tf.reduce_sum(impressions * auc), tf.reduce_sum(impressions)),
                         tf.constant(0.5, tf.float64))
        return tf.cast(value, self.dtype)

    def reset_state(self):
        self.histograms.clear()

    def get_config(self):
        return {**super().get_config(), "num_buckets": self.num_buckets}
