"""AUC: ROC or PR area from a log-linear histogram of predictions, summed over workers."""

import tensorflow as tf
import tf_keras as keras

from tfps._ops import ops
from tfps.metrics import base


@keras.utils.register_keras_serializable(package="tfps")
class AUC(base.Metric):
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
        per_octave = base.buckets_per_octave("tfps.metrics.AUC", num_buckets, octaves)
        curve = str(curve).upper()
        if curve not in ("ROC", "PR"):
            raise ValueError(f"tfps.metrics.AUC: curve must be 'ROC' or 'PR', got {curve!r}")
        self.num_buckets = num_buckets
        self.octaves = octaves
        self.buckets_per_octave = per_octave
        self.curve = curve
        self.histogram = base.sum_variable(self, "histogram", [self.num_buckets, 2])

    @base.straight_line
    def update_state(self, y_true, y_pred, sample_weight=None):
        weights = base.example_weights(f"tfps.metrics.AUC({self.name})", sample_weight, y_pred)
        y_pred, y_true = base.as_float_vector(y_pred), base.as_float_vector(y_true)
        no_weights, first_rows = self._update_constants()
        if weights is None:
            weights = no_weights  # the op reads "no weights" as all ones
        updates = []
        for part, first in zip(base.parts(self.histogram), first_rows):
            updates.append(ops.tfps_histogram_auc_update(
                part.handle, y_true, y_pred, weights, first,
                buckets_per_octave=self.buckets_per_octave, octaves=self.octaves,
                metric_name=f"tfps.metrics.AUC({self.name})"))
        return tf.group(updates)

    def _update_constants(self):
        """The empty weights tensor and each histogram part's first row. Eagerly they are
        made once and kept: making them is a large part of a small eager update. In a
        graph they are constants, made afresh so that no function captures an eager tensor."""
        def make():
            firsts = [0]
            for part in base.parts(self.histogram)[:-1]:  # a variable partitioner may have split it
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
        return tf.cast(base.histogram_curve_area(base.parts(self.histogram), self.curve), self.dtype)

    def reset_state(self):
        self.histogram.assign(tf.zeros_like(self.histogram))

    def get_config(self):
        return {**super().get_config(), "num_buckets": self.num_buckets, "curve": self.curve,
                "octaves": self.octaves}
