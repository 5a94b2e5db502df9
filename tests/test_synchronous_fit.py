"""tfps.callbacks.SynchronousTraining: model.fit under ParameterServerStrategy with two
workers trains in synchronous steps, each the mean gradient of one batch per worker
applied once, checked against the NumPy model of tests/test_custom_loop.py. Every worker
reads the same fixed batch (tests/cluster_programs/pss_synchronous_fit.py), so a step's
gradient is that batch's whichever worker reads what, and the run equals one process
training on that batch; that each step read a batch on every worker is counted by the
metric."""

import json
import os
import subprocess
import sys

import pytest

from tests.test_custom_loop import ROOT, assert_same_bits, assert_trained_as_numpy, run_with_workers_killed_mid_add

PROGRAM = os.path.join(ROOT, "tests", "cluster_programs", "pss_synchronous_fit.py")
STEPS_PER_EPOCH, EPOCHS, BATCH = 10, 2, 32


def run(directory, *flags, launched=True):
    rows_out = directory / "rows.json"
    command = [PROGRAM, "--rows_out", str(rows_out), *flags]
    if launched:
        command = ["-m", "tfps.launch", "--num_ps", "2", "--num_workers", "2", "--log_dir",
                   str(directory / "logs"), *command]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=ROOT)
    env.pop("TF_CONFIG", None)
    done = subprocess.run([sys.executable, *command], capture_output=True, text=True, timeout=300, env=env,
                          cwd=str(directory))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return json.loads(rows_out.read_text())


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
