"""Synchronous steps for tf_keras `fit` under ParameterServerStrategy.

fit schedules each step on whichever worker is free and applies it there, so workers train
asynchronously. With the SynchronousTraining callback, each step of fit schedules one
function per worker instead, which takes the next batch of its worker's data, computes
its gradient (of the loss over the number of workers, so the step's gradient is the mean
over every worker's batch) and sets it as its numbered contribution of a
GradientAccumulator shared by the workers; the chief joins them and applies their sum
with the model's optimizer once. A function that the coordinator runs again after its
worker failed replaces its contribution, so each step counts one batch per contribution.
The callback swaps fit's train function at the start of training and restores it at the
end; in one process, fit's steps already run in order, and it changes nothing.
"""

import tensorflow as tf
import tf_keras as keras
from tf_keras.src.engine import data_adapter

from tfps.keras._accumulation import GradientAccumulator
from tfps.table.sharded_table import task_devices


class SynchronousTraining(keras.callbacks.Callback):
    """Makes `fit` under ParameterServerStrategy train synchronously.

        model.fit(data, epochs=..., steps_per_epoch=...,
                  callbacks=[tfps.callbacks.SynchronousTraining()])

    Each step, every worker computes the gradient of its next batch from the same rows and
    variables; the sum is applied once, so N workers with batches of B train as one
    process with batches of N x B (the loss of each batch is divided by N: batches of
    equal size). A step waits for its slowest worker; steps_per_execution steps run per
    call of fit's train function, each joined and applied before the next. Metrics are
    updated by every batch, as in asynchronous fit. A worker that fails mid-step makes the
    coordinator run its function again on another worker, which reads that worker's next
    batch; the step still counts one batch per worker. Tables with a worker cache are
    refused (a worker's copies are refreshed by its own applies). The model must be built
    before fit (its variables are known when training starts).
    """

    def __init__(self):
        super().__init__()
        self._steps = None  # ((model and what compile gave it), workers, contribution functions, apply)
        self._fit_train_function = None
        self._active = False

    def on_train_begin(self, logs=None):
        model = self.model
        coordinator = getattr(model, "_cluster_coordinator", None)
        if coordinator is None:
            return  # one process: fit's steps run in order already
        if not model.built:
            raise ValueError(f"SynchronousTraining: model '{model.name}' is not built; build it "
                             "(call it on a batch, or give its Input) before fit, so the "
                             "gradients it sums are known when training starts")
        # A compile since the last fit brings a new optimizer, loss and metrics, which the
        # step functions capture when they are traced.
        compiled = (model, model.optimizer, model.compiled_loss, model.compiled_metrics)
        if self._steps is None or any(a is not b for a, b in zip(self._steps[0], compiled)):
            with model.distribute_strategy.scope():
                self._steps = (compiled, *_synchronous_step_functions(model, len(task_devices("worker"))))
        if model.train_function is not self._train_function:
            self._fit_train_function = model.train_function
            model.train_function = self._train_function
        self._active = True

    def on_train_end(self, logs=None):
        self._active = False
        if self.model.train_function is self._train_function and self._fit_train_function is not None:
            self.model.train_function = self._fit_train_function

    def _train_function(self, iterator):
        if not self._active:  # a fit without this callback after one that ended in an error
            return self._fit_train_function(iterator)
        (model, *_), workers, add_batch, apply_sum = self._steps
        coordinator = model._cluster_coordinator  # pylint: disable=protected-access
        logs = None
        for _ in range(int(model._steps_per_execution.numpy())):  # pylint: disable=protected-access
            logs = [coordinator.schedule(add_batch[i], args=(iterator,)) for i in range(workers)][-1]
            coordinator.join()  # every worker's gradient of this step is in the sum
            apply_sum()  # here: a scheduled apply would run again if its worker failed
        return logs


def _synchronous_step_functions(model, workers):
    """([a tf.function per contribution that adds the gradient of its worker's next batch
    and returns the metrics], a tf.function that applies the sum)."""
    accumulator = GradientAccumulator(model.trainable_variables, shared_by_workers=True, contributions=workers)
    strategy = model.distribute_strategy

    def add_batch(data, contribution):
        x, y, sample_weight = data_adapter.unpack_x_y_sample_weight(data)
        with tf.GradientTape() as tape:
            y_pred = model(x, training=True)
            loss = model.compute_loss(x, y, y_pred, sample_weight)
            share = loss / workers  # the step's loss is the mean over every worker's batch
        model._validate_target_and_loss(y, loss)  # pylint: disable=protected-access
        # The model's variables as the replica reads them (they are what the tape watched).
        accumulator.add(tape.gradient(share, model.trainable_variables), contribution=contribution)
        return model.compute_metrics(x, y, y_pred, sample_weight)

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
