"""Synchronous steps for tf_keras `fit` under ParameterServerStrategy.

fit schedules each step on whichever worker is free and applies it there, so workers train
asynchronously. With the SynchronousTraining callback, each step of fit schedules one
function per worker instead, which takes the next batch of its worker's data, computes
its gradient (of the loss over the number of workers, so the step's gradient is the mean
over every worker's batch) and sets it as its numbered contribution of a
GradientAccumulator shared by the workers; the chief joins them and applies their sum
with the model's optimizer once. A function that the coordinator runs again after its
worker failed replaces its contribution, so each step counts one batch per contribution.
The callback swaps fit's train function at the start of training, and it is put back
when fit ends (a wrapper of Model.fit, since a fit that raises skips on_train_end); in
one process, fit's steps already run in order, and it changes nothing.
"""

import functools
import weakref

import tensorflow as tf
import tf_keras as keras
from tf_keras.src.engine import data_adapter

from tfps.keras import _non_finite as non_finite
from tfps.keras import _step_metrics as step_metrics
from tfps.keras._accumulation import GradientAccumulator
from tfps.table.sharded_table import task_devices


# Each model whose fit a SynchronousTraining callback switched: (the synchronous train
# function it installed, fit's own that it replaced).
_INSTALLED = weakref.WeakKeyDictionary()


class SynchronousTraining(keras.callbacks.Callback):
    """Makes `fit` under ParameterServerStrategy train synchronously.

        model.fit(data, epochs=..., steps_per_epoch=...,
                  callbacks=[tfps.callbacks.SynchronousTraining()])

    Each step schedules one function per worker; each takes the next batch of the worker
    that runs it and computes its gradient from the same rows and variables, and the sum
    is applied once, so N workers with batches of B train as one process with batches of
    N x B. Each batch's loss is divided by N, which makes the step's loss the mean over
    the global batch for a mean-reduced loss (Keras' default) and batches of equal size.
    A step waits for its slowest worker; steps_per_execution steps run per call of fit's
    train function, each joined and applied before the next. Metrics are updated by every
    batch, as in asynchronous fit. A worker that fails mid-step makes the coordinator run
    its function again on another worker, which reads that worker's next batch; the step
    still counts one batch per contribution (the metrics may count the lost attempt's
    batch too). The step is the default one (forward, compiled loss, gradient, metrics):
    a model that overrides train_step is refused, as are tables with a worker cache (a
    worker's copies are refreshed by its own applies). The model must be built before
    fit. fit's own train function is back when fit ends, however it ends.
    """

    def __init__(self):
        super().__init__()
        self._steps = None  # ((model and what compile gave it), workers, contribution functions, apply)

    def on_train_begin(self, logs=None):
        model = self.model
        if getattr(model, "_cluster_coordinator", None) is None:
            return  # one process: fit's steps run in order already
        if not model.built:
            raise ValueError(f"SynchronousTraining: model '{model.name}' is not built; build it "
                             "(call it on a batch, or give its Input) before fit, so the "
                             "gradients it sums are known when training starts")
        if type(model).train_step is not keras.Model.train_step:
            raise ValueError(f"SynchronousTraining: model '{model.name}' overrides train_step, which "
                             "synchronous steps would not run: they take each batch's default "
                             "forward, compiled loss and gradient; train it asynchronously or in a "
                             "custom loop with tfps.GradientAccumulator(contributions=...)")
        # A compile since the last fit brings a new optimizer, loss and metrics, which the
        # step functions capture when they are traced.
        compiled = (model, model.optimizer, model.compiled_loss, model.compiled_metrics)
        if self._steps is None or any(a is not b for a, b in zip(self._steps[0], compiled)):
            with model.distribute_strategy.scope():
                self._steps = (compiled, *_synchronous_step_functions(model, len(task_devices("worker"))))
        _, workers, add_batch, apply_sum = self._steps
        take_back(model)  # one installed by an earlier fit with another instance
        _INSTALLED[model] = (_train_function(model, workers, add_batch, apply_sum), model.train_function)
        model.train_function = _INSTALLED[model][0]

    def on_train_end(self, logs=None):
        take_back(self.model)


def take_back(model):
    """Puts fit's own train function back if a SynchronousTraining callback switched it."""
    synchronous, own = _INSTALLED.pop(model, (None, None))
    if synchronous is not None and model.train_function is synchronous:
        model.train_function = own


def taking_back_after_fit(original):
    """Wraps Model.fit: a fit that raises skips on_train_end, and a later fit without the
    callback would still train synchronously; so fit's own train function comes back here
    however fit ends."""

    @functools.wraps(original)
    def fit(self, *args, **kwargs):
        try:
            return original(self, *args, **kwargs)
        finally:
            take_back(self)

    return fit


def _train_function(model, workers, add_batch, apply_sum):
    coordinator = model._cluster_coordinator  # pylint: disable=protected-access

    def train_function(iterator):
        logs = None
        for _ in range(int(model._steps_per_execution.numpy())):  # pylint: disable=protected-access
            logs = [coordinator.schedule(add_batch[i], args=(iterator,)) for i in range(workers)][-1]
            coordinator.join()  # every worker's gradient of this step is in the sum
            apply_sum()  # here: a scheduled apply would run again if its worker failed
        return logs
    return train_function


def _synchronous_step_functions(model, workers):
    """([a tf.function per contribution that adds the gradient of its worker's next batch
    and returns the metrics], a tf.function that applies the sum)."""
    accumulator = GradientAccumulator(model.trainable_variables, shared_by_workers=True, contributions=workers)
    strategy = model.distribute_strategy

    skipping, gated = step_metrics.skips(model), step_metrics.has_tables(model)

    def add_batch(data, contribution):
        x, y, sample_weight = data_adapter.unpack_x_y_sample_weight(data)
        with tf.GradientTape() as tape:
            y_pred = model(x, training=True)
            # A batch whose gradient is not finite makes its step refused or skipped.
            with step_metrics.deferred_loss_trackers(model, y_pred, defer=skipping) as update_loss_trackers:
                loss = model.compute_loss(x, y, y_pred, sample_weight)
            share = loss / workers  # the step's loss is the mean over every worker's batch
        model._validate_target_and_loss(y, loss)  # pylint: disable=protected-access
        # The model's variables as the replica reads them (they are what the tape watched).
        gradients = tape.gradient(share, model.trainable_variables)
        accumulator.add(gradients, contribution=contribution)
        # Its metrics too, so that the step's refusal is what fails, or its skip leaves them.
        return step_metrics.metrics_if(model, non_finite.all_finite(gradients) if gated else None, lambda: (
            update_loss_trackers(), step_metrics.update_compiled_metrics(model, x, y, y_pred, sample_weight)))

    def contribution_function(contribution):
        @tf.function
        def add_next_batch(iterator):
            return strategy.run(add_batch, args=(next(iterator), contribution))
        return add_next_batch

    def apply_in_replica_context():
        with tf.control_dependencies([accumulator.apply_to(model.optimizer)]):
            model._train_counter.assign_add(1)  # pylint: disable=protected-access

    @tf.function
    def apply_sum():
        # fit runs in the strategy's scope, where an optimizer cannot apply; on the chief,
        # strategy.run calls it in a replica context (its ops run on the parameter servers).
        # The strategy warns of a run not scheduled on a worker, which is what this is.
        extended = strategy.extended
        allowed = getattr(extended, "_allow_run_without_coordinator", False)
        extended._allow_run_without_coordinator = True  # pylint: disable=protected-access
        try:
            strategy.run(apply_in_replica_context)
        finally:
            extended._allow_run_without_coordinator = allowed  # pylint: disable=protected-access

    return workers, [contribution_function(i) for i in range(workers)], apply_sum
