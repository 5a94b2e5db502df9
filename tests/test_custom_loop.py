"""examples/custom_loop.py, a ClusterCoordinator training loop, trains the rows, their
Adagrad slots and the dense head exactly as a NumPy model of the same steps does: under
tfps-launch with one worker (whose steps run in order) and two parameter servers, and in
one process without TF_CONFIG."""

import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

from benchmarks.faults import launch_processes
from tests.event_pipe import EventPipe
from tests.reference import RowOptimizer, initial_row

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(ROOT, "examples", "custom_loop.py")
SYNC_WORKER_FAULT = os.path.join(ROOT, "tests", "cluster_programs", "sync_worker_fault.py")
PSS_ACCUMULATION = os.path.join(ROOT, "tests", "cluster_programs", "pss_accumulation.py")
FIELDS, VOCAB = 3, 500  # the example's
STEPS = 40


def example_ids(index):
    """The example's recipe of IDs, in NumPy."""
    index = np.asarray(index, np.int64)[:, None]
    fields = np.arange(FIELDS, dtype=np.int64)[None, :]
    return (index * 2654435761 + fields * 40503 + (index // 7) * fields) % VOCAB


def numpy_training(out):
    """Rows, Adagrad slots, kernel and bias after out["steps"] steps of: logit = (sum of the
    fields' rows) . kernel + bias, binary cross-entropy averaged over the batch, Adagrad on
    each distinct ID's summed row gradient, SGD on the head. Float64. With out["step_ids"],
each step's batch is the IDs of the batches it applied (backup workers), one after another."""
    dim, batch = out["dim"], out["batch_size"]
    adagrad = RowOptimizer("adagrad", dim, out["table_lr"])
    rows, slots = {}, {}
    kernel, bias = np.asarray(out["kernel_start"], np.float64), 0.0
    for step in range(out["steps"]):
        first = 0 if out.get("examples") == "fixed" else step * batch  # fixed: the same batch each step
        ids = (np.concatenate([np.asarray(b, np.int64) for b in out["step_ids"][step]]) if "step_ids" in out
               else example_ids(np.arange(first, first + batch)))
        batch = len(ids)
        labels = (np.sum((ids * 37) % 11 - 5, 1) > 0).astype(np.float64)
        for key in np.unique(ids):
            if int(key) not in rows:
                rows[int(key)] = initial_row(int(key), dim, out["seed"], "uniform", -0.05, 0.05).astype(np.float64)
                slots[int(key)] = adagrad.initial_slots()
        summed = np.stack([sum(rows[int(k)] for k in example) for example in ids])
        logit_gradient = (1 / (1 + np.exp(-(summed @ kernel + bias))) - labels) / batch
        row_gradients = {}
        for example, g in zip(ids, logit_gradient):
            for key in example:
                row_gradients[int(key)] = row_gradients.get(int(key), 0.0) + g * kernel
        for key, gradient in row_gradients.items():
            rows[key], slots[key] = adagrad.apply(rows[key], slots[key], gradient, step + 1)
        kernel = kernel - out["dense_lr"] * (summed.T @ logit_gradient)
        bias -= out["dense_lr"] * logit_gradient.sum()
    return rows, slots, kernel, bias


def run_example(tmp_path, *flags, workers=None, program=EXAMPLE):
    """Runs the example, or another `program` writing what its --rows_out does (under
    tfps-launch with `workers` workers and 2 parameter servers, or in this process's way
    without TF_CONFIG); returns what --rows_out wrote."""
    rows_out = tmp_path / "rows.json"
    steps = ["--steps", str(STEPS)] if program == EXAMPLE else []
    command = [program, *steps, "--rows_out", str(rows_out), *flags]
    if workers:
        command = ["-m", "tfps.launch", "--num_ps", "2", "--num_workers", str(workers),
                   "--log_dir", str(tmp_path / "logs"), *command]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=ROOT)
    env.pop("TF_CONFIG", None)
    run = subprocess.run([sys.executable, *command], capture_output=True, text=True, timeout=300,
                         env=env, cwd=str(tmp_path))
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    return json.loads(rows_out.read_text())


def assert_trained_as_numpy(out, looked_up_only=()):
    """`looked_up_only`: keys that may hold a row never trained (looked up by a dropped
    batch of backup workers), which must be its initial row."""
    rows, slots, kernel, bias = numpy_training(out)
    got_rows = dict(zip(out["keys"], np.asarray(out["values"])))
    got_slots = dict(zip(out["keys"], np.asarray(out["slots"])))
    untrained = set(got_rows) - set(rows)
    assert untrained <= set(looked_up_only)
    for key in untrained:
        np.testing.assert_array_equal(got_rows[key], initial_row(key, out["dim"], out["seed"], "uniform", -0.05, 0.05))
        rows[key], slots[key] = got_rows[key], RowOptimizer("adagrad", out["dim"], 1.0).initial_slots()
    assert sorted(out["keys"]) == sorted(rows)
    moved = max(np.abs(rows[k] - initial_row(k, out["dim"], out["seed"], "uniform", -0.05, 0.05)).max()
                for k in rows)
    assert moved > 100 * 1e-5  # the rows trained, far beyond the tolerance below
    for key in rows:
        np.testing.assert_allclose(got_rows[key], rows[key], rtol=1e-4, atol=1e-5, err_msg=str(key))
        np.testing.assert_allclose(got_slots[key].reshape(slots[key].shape), slots[key], rtol=1e-4,
                                   err_msg=str(key))
    np.testing.assert_allclose(out["kernel"], kernel, rtol=1e-4, atol=1e-6)
    assert out["bias"] == pytest.approx(bias, rel=1e-4, abs=1e-6)


@pytest.mark.parametrize("launched", [True, False], ids=["tfps-launch", "local"])
def test_the_custom_loop_trains_rows_slots_and_head_as_numpy_does(tmp_path, launched):
    assert_trained_as_numpy(run_example(tmp_path, workers=1 if launched else None))


def test_synchronous_steps_of_two_workers_train_as_one_process_with_their_global_batch(tmp_path):
    """--sync: each step's two worker batches of 32 are summed and applied once, so the
    result is exactly one process's training with batches of 64, whichever worker runs
    which batch and in whatever order (asynchronous steps would read rows the other
    worker's step had already moved)."""
    out = run_example(tmp_path, "--sync", "--batch_size", "32", workers=2)
    assert out["batch_size"] == 64
    assert_trained_as_numpy(out)


def test_micro_batches_accumulated_on_one_worker_train_as_their_whole_batch(tmp_path):
    """The default GradientAccumulator in a function scheduled on the one worker of a
    cluster (its slices live on the parameter servers; capturing them once crashed the
    worker): two micro-batches of 32 a step train as one process with batches of 64."""
    rows_out = tmp_path / "rows.json"
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=ROOT)
    env.pop("TF_CONFIG", None)
    run = subprocess.run([sys.executable, "-m", "tfps.launch", "--num_ps", "2", "--num_workers", "1",
                          "--log_dir", str(tmp_path / "logs"), PSS_ACCUMULATION, "--steps", str(STEPS),
                          "--rows_out", str(rows_out)],
                         capture_output=True, text=True, timeout=300, env=env, cwd=str(tmp_path))
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    out = json.loads(rows_out.read_text())
    assert out["batch_size"] == 64
    assert_trained_as_numpy(out)


def run_with_workers_killed_mid_add(tmp_path, program, *flags, hold_step):
    """Runs `program` under tfps-launch (2 workers, 2 parameter servers) with the hold of
    tests/cluster_programs/sync_worker_fault.py at step `hold_step`, kills both workers
    once one holds, and returns what --rows_out wrote after the run ended well."""
    hold_dir = tmp_path / "hold"
    hold_dir.mkdir()
    events = EventPipe(str(hold_dir / "events"))
    rows_out = tmp_path / "rows.json"
    launch_id = f"sync-fault-{os.getpid()}-{tmp_path.name}"
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=ROOT, TFPS_TEST_HOLD_DIR=str(hold_dir),
               TFPS_TEST_HOLD_STEP=str(hold_step), TFPS_LAUNCH_ID=launch_id)
    env.pop("TF_CONFIG", None)
    launcher = subprocess.Popen(
        [sys.executable, "-m", "tfps.launch", "--num_ps", "2", "--num_workers", "2",
         "--log_dir", str(tmp_path / "logs"), program, "--rows_out", str(rows_out), *flags],
        env=env, cwd=str(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        events.wait_for(lambda seen: "held" in seen, 240, "a worker held mid-add", launcher)
        workers = {name: pid for name, pid in launch_processes(launch_id).items() if name.startswith("worker")}
        assert len(workers) == 2, workers
        for pid in workers.values():
            os.kill(pid, signal.SIGKILL)
        _, stderr = launcher.communicate(timeout=300)
    finally:
        events.close()
        if launcher.poll() is None:
            launcher.kill()
    assert launcher.returncode == 0, stderr[-3000:]
    assert "restart" in stderr, stderr[-3000:]  # the launcher restarted the killed workers
    return json.loads(rows_out.read_text())


def assert_same_bits(out, plain):
    """Two runs' rows, slots and head are equal bit for bit."""
    assert sorted(plain["keys"]) == sorted(out["keys"])
    for part in ("values", "slots"):
        by_key = dict(zip(plain["keys"], plain[part]))
        assert all(by_key[key] == row for key, row in zip(out["keys"], out[part])), part
    assert plain["kernel"] == out["kernel"] and plain["bias"] == out["bias"]


def test_a_synchronous_step_whose_worker_dies_mid_add_counts_every_batch_once(tmp_path):
    """A worker is killed when its batch's table gradients have landed on the parameter
    servers and its dense ones have not (tests/cluster_programs/sync_worker_fault.py holds it
    there); tfps-launch restarts it and the coordinator runs the function again. The run
    must still train exactly as one process with the global batch: the rerun replaces what
    the first attempt landed (summed instead, those rows would take that batch's gradient
    twice)."""
    out = run_with_workers_killed_mid_add(tmp_path, SYNC_WORKER_FAULT, "--steps", str(STEPS), "--sync",
                                          "--batch_size", "32", hold_step=STEPS // 2)
    assert out["batch_size"] == 64
    assert_trained_as_numpy(out)
    # A step's contributions are summed in their order, so a run without the fault ends on
    # the same bits: what ran twice left no trace.
    (tmp_path / "without_fault").mkdir()
    assert_same_bits(out, run_example(tmp_path / "without_fault", "--sync", "--batch_size", "32", workers=2))
