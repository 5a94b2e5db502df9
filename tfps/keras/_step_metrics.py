"""A training step's metrics follow what became of its optimizer step (tfps.keras._non_finite).

In fit, a model with tables updates its compiled metrics after the step's finiteness check,
so a refused step fails with its refusal rather than a metric's complaint of a NaN label.
Where the tables skip non-finite steps, the loss trackers and compiled metrics are updated
only when the step was applied: a skipped batch leaves fit's logs as it leaves the model
(tfps's metrics would refuse its NaN labels or predictions). In synchronous steps each
worker leaves its own batch out when that batch's gradient is not finite.
"""

import contextlib
import functools

import tensorflow as tf

from tfps.keras import _non_finite as non_finite


def _policies(model):
    from tfps.keras_layers._table_lookup import table_layers
    return {layer.non_finite for layer in table_layers(model)}


def skips(model):
    """Whether `model`'s table layers skip non-finite steps (every one says "skip")."""
    return _policies(model) == {"skip"}


def has_tables(model):
    return bool(_policies(model))


class _Recorder:
    """Stands in for a loss tracker: records its updates to make later."""

    def __init__(self, metric, calls):
        self._metric, self._calls = metric, calls

    def update_state(self, *args, **kwargs):
        self._calls.append((self._metric, args, kwargs))


@contextlib.contextmanager
def deferred_loss_trackers(model, y_pred, defer=True):
    """Within it (with `defer`), compiled_loss computes the loss without updating its
    trackers (the loss means fit logs); yields a function that makes those updates."""
    container = getattr(model, "compiled_loss", None)
    calls = []
    if not defer or container is None or not hasattr(container, "_total_loss_mean"):
        yield lambda: None
        return
    if not container._built:  # pylint: disable=protected-access
        container.build(y_pred)
    saved = container._total_loss_mean, container._per_output_metrics  # pylint: disable=protected-access
    container._total_loss_mean = _Recorder(saved[0], calls)  # pylint: disable=protected-access
    container._per_output_metrics = [  # pylint: disable=protected-access
        None if m is None else _Recorder(m, calls) for m in saved[1]]
    try:
        yield lambda: [metric.update_state(*args, **kwargs) for metric, args, kwargs in calls]
    finally:
        container._total_loss_mean, container._per_output_metrics = saved  # pylint: disable=protected-access


def metrics_if(model, applied, update):
    """Runs `update()` (a step's metric updates) if `applied` (None: always; an op: after it,
    which fails a refused step first), and returns the model's metrics after it."""
    if isinstance(applied, tf.Operation):
        with tf.control_dependencies([applied]):
            update()
    elif applied is None or (tf.executing_eagerly() and bool(applied)):
        update()
    elif not tf.executing_eagerly():
        def updated():
            with tf.control_dependencies([op for op in tf.nest.flatten(update()) if op is not None]):
                return tf.constant(True)
        done = tf.cond(applied, updated, lambda: tf.constant(False))
        with tf.control_dependencies([done]):
            return model.get_metrics_result()
    return model.get_metrics_result()


def table_train_step(original):
    """Wraps tf_keras' Model.train_step: for a model with tables, the default step (forward,
    compiled loss, optimizer, compiled metrics) whose metrics update after the step's
    finiteness check (so a refused step fails with its refusal, not a metric's complaint of
    a NaN label), and, where the tables skip non-finite steps, whose loss trackers and
    metrics a skipped step leaves untouched."""
    from tf_keras.src.engine import data_adapter

    @functools.wraps(original)
    def train_step(self, data):
        if not has_tables(self):
            return original(self, data)
        x, y, sample_weight = data_adapter.unpack_x_y_sample_weight(data)
        with tf.GradientTape() as tape:
            y_pred = self(x, training=True)
            with deferred_loss_trackers(self, y_pred, defer=skips(self)) as update_loss_trackers:
                loss = self.compute_loss(x, y, y_pred, sample_weight)
        self._validate_target_and_loss(y, loss)  # pylint: disable=protected-access
        non_finite.take_outcome()  # one left by an eager step outside fit is not this step's
        self.optimizer.minimize(loss, self.trainable_variables, tape=tape)
        return metrics_if(self, non_finite.take_outcome(), lambda: (
            update_loss_trackers(), update_compiled_metrics(self, x, y, y_pred, sample_weight)))

    return train_step


def update_compiled_metrics(model, x, y, y_pred, sample_weight):
    """tf_keras' compute_metrics without reading the results, which under
    ParameterServerStrategy needs a merge_call that a tf.cond cannot hold (metrics_if reads
    them after). A compute_metrics of the model's own runs as it is."""
    import tf_keras
    if type(model).compute_metrics is not tf_keras.Model.compute_metrics:
        return model.compute_metrics(x, y, y_pred, sample_weight)
    return model.compiled_metrics.update_state(y, y_pred, sample_weight)


def keras3_table_train_step(original):
    """The same for Keras 3's TensorFlow trainer: its metrics update after the finiteness
    check, and where the tables skip, its loss tracker and compiled metrics only when the
    step was applied."""
    from keras.src import tree
    from keras.src.losses import loss as loss_module
    from keras.src.trainers.data_adapters import data_adapter_utils

    @functools.wraps(original)
    def train_step(self, data):
        if not has_tables(self) or not self.trainable_weights:
            return original(self, data)
        x, y, sample_weight = data_adapter_utils.unpack_x_y_sample_weight(data)
        with tf.GradientTape() as tape:
            y_pred = self(x, training=True) if self._call_has_training_arg else self(x)  # pylint: disable=protected-access
            loss = self._compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight,  # pylint: disable=protected-access
                                      training=True)
            tracked = loss_module.unscale_loss_for_distribution(loss)
            examples = tf.shape(next(i for i in tree.flatten(x) if i is not None))[0]
            if not skips(self):
                self._loss_tracker.update_state(tracked, sample_weight=examples)  # pylint: disable=protected-access
            if self.optimizer is not None:
                loss = self.optimizer.scale_loss(loss)
        non_finite.take_outcome()  # one left by an eager step outside fit is not this step's
        self.optimizer.apply_gradients(zip(tape.gradient(loss, self.trainable_weights), self.trainable_weights))
        return metrics_if(self, non_finite.take_outcome(), lambda: (
            self._loss_tracker.update_state(tracked, sample_weight=examples) if skips(self) else None,  # pylint: disable=protected-access
            self.compute_metrics(x, y, y_pred, sample_weight=sample_weight)))

    return train_step
