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

from absl import logging

import tensorflow as tf
import tf_keras as keras
from tf_keras.src.engine import data_adapter

from tfps import _arguments as arguments
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

    With `backup_workers=b` (0 < b < N), each step schedules a batch on every worker free
    of an earlier step's and applies the gradients of the first N - b batches to finish;
    the rest are dropped: their gradients are never applied (a late one lands in its own
    contribution, which the next step that uses it replaces), and the step does not wait
    for them. Each batch's loss is then divided by N - b, so a step's gradient is the mean
    over the batches it applies. A dropped batch is read from its worker's data and lost to
    training (its metrics are still counted, as every batch's are). `dropped_batches`
    counts them, fit's logs carry it at each epoch's end (`dropped_batches`, cumulative
    over the fit), and each epoch logs it. With `batch_key=fn`, fn(x, y) (a tensor traced
    into each step) names each batch, and `steps` records, per step applied, the keys of
    the batches applied and dropped: {"applied": [...], "dropped": [...]} (the dropped
    ones' keys are complete when fit ends, which waits for them).
    """

    def __init__(self, backup_workers=0, batch_key=None):
        super().__init__()
        if not arguments.is_int(backup_workers) or backup_workers < 0:
            raise ValueError(f"SynchronousTraining: backup_workers must be an int >= 0, got {backup_workers!r}")
        if batch_key is not None and not callable(batch_key):
            raise ValueError(f"SynchronousTraining: batch_key must be a function of (x, y), got {batch_key!r}")
        self.backup_workers = int(backup_workers)
        self.batch_key = batch_key
        self.dropped_batches = 0  # over the current (or last) fit
        self.steps = []  # with batch_key: per step applied, the keys of its applied and dropped batches
        self._steps = None  # ((model and what compile gave it), workers, contribution functions, apply)
        self._backup = None  # the backup workers' train function's state during a fit
        self._dropped_at_epoch_start = 0

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
        workers = len(task_devices("worker"))
        if self.backup_workers >= workers:
            raise ValueError(f"SynchronousTraining: backup_workers={self.backup_workers} leaves no "
                             f"worker's batch to apply of {workers} workers; it must be below {workers}")
        by_slot = bool(self.backup_workers) or self.batch_key is not None
        if self._backup is not None:  # of a fit that raised: its late batches still hold their slots
            try:
                self._backup.finish()
            except Exception:  # pylint: disable=broad-except
                pass  # that fit's error, already raised
            self._backup = None
        compiled += (by_slot,)
        if self._steps is None or any(a is not b for a, b in zip(self._steps[0], compiled)):
            with model.distribute_strategy.scope():
                backup = dict(backup_workers=self.backup_workers, batch_key=self.batch_key) if by_slot else {}
                self._steps = (compiled, *_synchronous_step_functions(model, workers, **backup))
        _, workers, add_batch, apply_sum = self._steps
        take_back(model)  # one installed by an earlier fit with another instance
        self.dropped_batches, self.steps, self._dropped_at_epoch_start = 0, [], 0
        if by_slot:
            self._backup = _BackupWorkers(self, model._cluster_coordinator, workers,  # pylint: disable=protected-access
                                          add_batch, apply_sum)
            train_function = self._backup.train_function(model)
        else:
            train_function = _train_function(model, workers, add_batch, apply_sum)
        _INSTALLED[model] = (train_function, model.train_function)
        model.train_function = _INSTALLED[model][0]

    def on_epoch_begin(self, epoch, logs=None):
        self._dropped_at_epoch_start = self.dropped_batches

    def on_epoch_end(self, epoch, logs=None):
        if self._backup is None:
            return
        if logs is not None:
            logs["dropped_batches"] = self.dropped_batches
        logging.info("tfps SynchronousTraining: epoch %d dropped %d batches of late workers "
                     "(backup_workers=%d; %d in this fit)", epoch + 1,
                     self.dropped_batches - self._dropped_at_epoch_start, self.backup_workers,
                     self.dropped_batches)

    def on_train_end(self, logs=None):
        take_back(self.model)
        if self._backup is not None:
            self._backup.finish()
            self._backup = None


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


class _BackupWorkers:
    """Steps that apply the first N - b batches to finish. Each contribution (a slot of the
    accumulator) is held by at most one scheduled function: a function of an earlier step
    that is still running (a late worker's) keeps its slot until it is done, so a step
    schedules one function per free slot (the workers free of a late batch), which each
    idle worker takes, and no two functions ever write one slot at once. The step applies
    the first N - b of its functions to finish (the chosen slots) and drops the others."""

    def __init__(self, callback, coordinator, workers, add_batch, apply_sum):
        self._callback, self._coordinator, self._workers = callback, coordinator, workers
        self._add_batch, self._apply_sum = add_batch, apply_sum
        self._late = {}  # slot: remote value of a dropped function not known to be done
        self._dropped_keys = []  # (record of its step, remote value) to read when fit ends

    def train_function(self, model):
        def train_function(iterator):
            logs = None
            for _ in range(int(model._steps_per_execution.numpy())):  # pylint: disable=protected-access
                logs = self._step(iterator)
            return logs
        return train_function

    def _step(self, iterator):
        callback, need = self._callback, self._workers - self._callback.backup_workers
        self._late = {slot: value for slot, value in self._late.items() if not _done(value)}
        scheduled = [(slot, self._coordinator.schedule(self._add_batch[slot], args=(iterator,)))
                     for slot in range(self._workers) if slot not in self._late]
        finished = []  # slots, in the order they were seen done
        while len(finished) < need:
            waiting = [(slot, value) for slot, value in scheduled if slot not in finished]
            finished += [slot for slot, value in waiting if _done(value)]
            if len(finished) < need:
                waiting[0][1]._status_available_event.wait(0.002)  # pylint: disable=protected-access
        values = dict(scheduled)
        chosen = [(slot, values[slot]) for slot in finished[:need]]
        for _, value in chosen:
            if value._get_error() is not None:  # pylint: disable=protected-access
                value.fetch()  # raises it
        chosen_slots = {slot for slot, _ in chosen}
        self._apply_sum(tf.constant([slot in chosen_slots for slot in range(self._workers)]))
        dropped = [(slot, value) for slot, value in scheduled if slot not in chosen_slots]
        callback.dropped_batches += len(dropped)
        self._late.update(dropped)
        if callback.batch_key is None:
            return chosen[-1][1]  # fit fetches the metrics when it needs them
        results = [value.fetch() for _, value in chosen]
        record = {"applied": [_python(key) for _, key in results], "dropped": []}
        callback.steps.append(record)
        self._dropped_keys.extend((record, value) for _, value in dropped)
        return results[-1][0]

    def finish(self):
        """Waits for the dropped functions still running, and records their batches' keys."""
        self._coordinator.join()
        for record, value in self._dropped_keys:
            record["dropped"].append(_python(value.fetch()[1]))
        self._late, self._dropped_keys = {}, []


def _done(remote_value):
    return remote_value._status_available_event.is_set()  # pylint: disable=protected-access


def _python(value):
    value = getattr(value, "numpy", lambda: value)()
    return value.tolist() if hasattr(value, "tolist") else value


def _synchronous_step_functions(model, workers, backup_workers=0, batch_key=None):
    """([a tf.function per contribution that adds the gradient of its worker's next batch
    and returns the metrics (with batch_key, (metrics, the batch's key))], a tf.function
    that applies the sum (with backup workers, of the contributions it is given, a bool
    per contribution))."""
    applied_per_step = workers - backup_workers
    keyed = batch_key is not None
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
            share = loss / applied_per_step  # the step's loss is the mean over its applied batches
        model._validate_target_and_loss(y, loss)  # pylint: disable=protected-access
        # The model's variables as the replica reads them (they are what the tape watched).
        gradients = tape.gradient(share, model.trainable_variables)
        accumulator.add(gradients, contribution=contribution)
        # Its metrics too, so that the step's refusal is what fails, or its skip leaves them.
        metrics = step_metrics.metrics_if(model, non_finite.all_finite(gradients) if gated else None, lambda: (
            update_loss_trackers(), step_metrics.update_compiled_metrics(model, x, y, y_pred, sample_weight)))
        if not keyed:
            return metrics
        return metrics, tf.identity(batch_key(x, y))

    def contribution_function(contribution):
        @tf.function
        def add_next_batch(iterator):
            return strategy.run(add_batch, args=(next(iterator), contribution))
        return add_next_batch

    def apply_in_replica_context(chosen=None):
        with tf.control_dependencies([accumulator.apply_to(model.optimizer, chosen)]):
            model._train_counter.assign_add(1)  # pylint: disable=protected-access

    @tf.function
    def apply_sum(*chosen):
        # fit runs in the strategy's scope, where an optimizer cannot apply; on the chief,
        # strategy.run calls it in a replica context (its ops run on the parameter servers).
        # The strategy warns of a run not scheduled on a worker, which is what this is.
        extended = strategy.extended
        allowed = getattr(extended, "_allow_run_without_coordinator", False)
        extended._allow_run_without_coordinator = True  # pylint: disable=protected-access
        try:
            strategy.run(apply_in_replica_context, args=chosen)
        finally:
            extended._allow_run_without_coordinator = allowed  # pylint: disable=protected-access

    return workers, [contribution_function(i) for i in range(workers)], apply_sum
