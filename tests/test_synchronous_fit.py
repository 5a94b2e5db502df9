"""tfps.callbacks.SynchronousTraining: model.fit under ParameterServerStrategy with two
workers trains in synchronous steps, each the mean gradient of one batch per worker
applied once, checked against the NumPy model of tests/test_custom_loop.py. Every worker
reads the same fixed batch (tests/cluster_programs/pss_synchronous_fit.py), so a step's
gradient is that batch's whichever worker reads what, and the run equals one process
training on that batch; that each step read a batch on every worker is counted by the
metric. Without a cluster, a stand-in model checks when the callback's train function is
in place (only during a fit that has the callback, however the fit ends)."""

import os

import numpy as np
import pytest
import tensorflow as tf
import tf_keras as keras

import tfps
from tfps.keras import _synchronous_training as synchronous_training
from tests.test_custom_loop import (ROOT, assert_same_bits, assert_trained_as_numpy, run_example,
                                    run_with_workers_killed_mid_add)

PROGRAM = os.path.join(ROOT, "tests", "cluster_programs", "pss_synchronous_fit.py")
STEPS_PER_EPOCH, EPOCHS, BATCH = 10, 2, 32


def run(directory, *flags, launched=True):
    return run_example(directory, *flags, workers=2 if launched else None, program=PROGRAM)


@pytest.fixture(scope="module")
def synchronous_fit(tmp_path_factory):
    """Its last epoch in a second fit with the same callback, after compiling again."""
    return run(tmp_path_factory.mktemp("synchronous_fit"), "--refit")


def test_synchronous_fit_of_two_workers_trains_as_one_process_with_one_apply_per_step(synchronous_fit):
    out = synchronous_fit
    assert_trained_as_numpy(out)
    steps = EPOCHS * STEPS_PER_EPOCH
    assert out["clocks"] == [steps, steps]  # one apply per step
    assert out["iterations"] == STEPS_PER_EPOCH  # the second fit applied with the new optimizer
    # Each step's metric update ran on both workers (asynchronous fit reads one batch a step).
    assert out["examples_in_last_epoch"] == 2 * STEPS_PER_EPOCH * BATCH


def test_in_one_process_the_callback_leaves_fit_as_it_is(tmp_path):
    out = run(tmp_path, launched=False)
    assert_trained_as_numpy(out)
    assert out["examples_in_last_epoch"] == STEPS_PER_EPOCH * BATCH


def test_a_synchronous_fit_step_whose_worker_dies_mid_add_counts_one_batch_per_worker(tmp_path, synchronous_fit):
    """Both workers are killed while one holds between landing its table gradients and its
    dense ones (step 10 of 20); the rerun of its function reads the next batch of a worker
    and replaces the contribution, so the run ends on the unfaulted run's bits."""
    out = run_with_workers_killed_mid_add(tmp_path, PROGRAM, hold_step=STEPS_PER_EPOCH)
    assert_trained_as_numpy(out)
    assert out["iterations"] == EPOCHS * STEPS_PER_EPOCH
    assert_same_bits(out, synchronous_fit)


def test_backup_workers_apply_the_first_batch_of_each_step_and_record_the_dropped_one(tmp_path):
    """backup_workers=1 of 2: each step applies the first of the workers' batches to finish
    (distinct batches, each worker reading the stream at its own pace) and drops the
    other; the rows, slots and head equal the NumPy model fed exactly each step's applied
    batch (a dropped batch's IDs that no applied batch has keep the row their lookup made,
    untrained)."""
    out = run(tmp_path, "--backup_workers", "1")
    steps = EPOCHS * STEPS_PER_EPOCH
    assert len(out["step_ids"]) == steps and all(len(applied) == 1 for applied in out["step_ids"])
    dropped_ids = {int(key) for step in out["dropped_ids"] for batch in step for key in np.ravel(batch)}
    assert_trained_as_numpy(out, looked_up_only=dropped_ids)
    assert out["iterations"] == steps and out["clocks"] == [steps, steps]
    dropped = sum(len(d) for d in out["dropped_ids"])
    assert dropped == out["dropped_batches"] == out["logged_dropped_batches"][-1] > 0
    # A step schedules a batch on each worker not still busy with a late one, so it drops
    # at most one batch, and every batch read is applied or dropped (the metric counts both).
    assert all(len(d) <= 1 for d in out["dropped_ids"])
    assert out["examples_in_last_epoch"] > STEPS_PER_EPOCH * BATCH


class _Coordinator:
    def schedule(self, fn, args):
        return fn(*args)

    def join(self):
        pass


class _ClusterModel:
    """What the callback reads of a built, compiled model under ParameterServerStrategy."""
    name, built, train_step = "m", True, keras.Model.train_step
    optimizer, compiled_loss, compiled_metrics = object(), object(), object()
    _cluster_coordinator = _Coordinator()
    _steps_per_execution = tf.Variable(1)
    distribute_strategy = tf.distribute.get_strategy()

    def __init__(self):
        self.train_function = self.own_train_function

    def own_train_function(self, iterator):
        return "asynchronous step"


@pytest.fixture
def cluster_model(monkeypatch):
    steps = []
    monkeypatch.setattr(synchronous_training, "_synchronous_step_functions",
                        lambda model, workers: (1, [lambda it: steps.append("add")], lambda: steps.append("apply")))
    monkeypatch.setattr(synchronous_training, "task_devices", lambda job: ["worker_0"])
    return _ClusterModel(), steps


def test_fits_with_and_without_the_callback_train_as_each_asks(cluster_model):
    """The callback's train function is in place only during a fit that has the callback,
    also when the callback is used twice and after a fit that raised (which skips
    on_train_end): fit's own wrapper takes it back."""
    model, steps = cluster_model
    callback = tfps.callbacks.SynchronousTraining()
    callback.set_model(model)

    def fit(with_callback, fails=False):
        def body(self):
            if with_callback:
                callback.on_train_begin()
            result = self.train_function("iterator")
            if fails:
                raise RuntimeError("a step failed")
            if with_callback:
                callback.on_train_end()
            return result
        return synchronous_training.taking_back_after_fit(body)(model)

    assert fit(True) is None and steps == ["add", "apply"]
    assert fit(True) is None and steps == ["add", "apply"] * 2
    assert fit(False) == "asynchronous step"
    with pytest.raises(RuntimeError, match="a step failed"):
        fit(True, fails=True)
    assert steps == ["add", "apply"] * 3
    assert fit(False) == "asynchronous step"
    assert model.train_function == model.own_train_function


def test_a_model_that_overrides_train_step_is_refused(cluster_model):
    model, _ = cluster_model

    class OwnStep(_ClusterModel):
        def train_step(self, data):
            return {}
    callback = tfps.callbacks.SynchronousTraining()
    callback.set_model(OwnStep())
    with pytest.raises(ValueError, match="overrides train_step, which synchronous steps would not run"):
        callback.on_train_begin()


def test_backup_workers_must_leave_a_batch_to_apply(cluster_model):
    model, _ = cluster_model  # one worker
    with pytest.raises(ValueError, match="backup_workers must be an int >= 0"):
        tfps.callbacks.SynchronousTraining(backup_workers=-1)
    callback = tfps.callbacks.SynchronousTraining(backup_workers=1)
    callback.set_model(model)
    with pytest.raises(ValueError, match="backup_workers=1 leaves no worker's batch to apply of 1 workers"):
        callback.on_train_begin()
