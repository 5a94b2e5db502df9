"""BinaryLogLoss and CalibrationRatio: weighted sums over every worker's examples."""

import tensorflow as tf
import tf_keras as keras

from tfps.metrics import base


@keras.utils.register_keras_serializable(package="tfps")
class BinaryLogLoss(base.Metric):
    """Weighted mean binary cross-entropy of probabilities, clipped to [eps, 1 - eps]."""

    def __init__(self, epsilon=1e-7, name="log_loss", dtype=None, **kwargs):
        super().__init__(name=name, dtype=dtype, **kwargs)
        if not 0 < epsilon < 0.5:
            raise ValueError(f"tfps.metrics.BinaryLogLoss: epsilon must be in (0, 0.5), got {epsilon!r}")
        self.epsilon = float(epsilon)
        self.total_loss = base.sum_variable(self, "total_loss")
        self.total_weight = base.sum_variable(self, "total_weight")

    @base.straight_line
    def update_state(self, y_true, y_pred, sample_weight=None):
        y_true, y_pred, weights = base.flatten_inputs(f"tfps.metrics.BinaryLogLoss({self.name})",
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
class CalibrationRatio(base.Metric):
    """Mean prediction divided by the observed positive rate (1.0 is calibrated; 0 when
    there are no positives)."""

    def __init__(self, name="calibration", dtype=None, **kwargs):
        super().__init__(name=name, dtype=dtype, **kwargs)
        self.predicted = base.sum_variable(self, "predicted")
        self.observed = base.sum_variable(self, "observed")

    @base.straight_line
    def update_state(self, y_true, y_pred, sample_weight=None):
        y_true, y_pred, weights = base.flatten_inputs(f"tfps.metrics.CalibrationRatio({self.name})",
                                                  y_true, y_pred, sample_weight)
        return tf.group(self.predicted.assign_add(tf.reduce_sum(weights * y_pred)),
                        self.observed.assign_add(tf.reduce_sum(weights * y_true)))

    def result(self):
        return tf.cast(tf.math.divide_no_nan(self.predicted, self.observed), self.dtype)

    def reset_state(self):
        for v in (self.predicted, self.observed):
            v.assign(tf.zeros_like(v))
