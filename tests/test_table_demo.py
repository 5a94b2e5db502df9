"""examples/table_demo.py: its step pushes the loss gradient (a NumPy oracle of one step),
and the demo runs to the end."""

import importlib.util
import os
import subprocess
import sys

import numpy as np
import tensorflow as tf

import tfps
from tests.reference import RowOptimizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEMO = os.path.join(ROOT, "examples", "table_demo.py")


def load_demo():
    spec = importlib.util.spec_from_file_location("table_demo", DEMO)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_one_step_applies_adagrad_to_the_loss_gradient_of_each_unique_row():
    dim = 4
    table = tfps.DynamicTable(dim, optimizer=tfps.optimizers.Adagrad(0.2),
                              initializer=tfps.initializers.RandomUniform(-0.5, 0.5), seed=3)
    readout = np.array([0.5, -1.0, 0.25, 2.0], np.float32)
    ids = np.array([5, 9, 5, -2, 9, 9], np.int64)
    labels = np.array([1, 0, 0, 1, 1, 0], np.float32)
    unique = np.unique(ids)
    start = table.find(unique).numpy().astype(np.float64)
    load_demo().make_train_step(table, tf.constant(readout))(tf.constant(ids), tf.constant(labels),
                                                             tf.constant(1, tf.int64))
    rows = dict(zip(unique.tolist(), start))
    gradients = {k: np.zeros(dim) for k in rows}
    for key, label in zip(ids.tolist(), labels):
        logit = rows[key] @ readout
        gradients[key] += (1 / (1 + np.exp(-logit)) - label) * readout / len(ids)
    oracle = RowOptimizer("adagrad", dim, 0.2)
    expected = [oracle.apply(rows[k], oracle.initial_slots(), gradients[k], 1)[0] for k in unique.tolist()]
    np.testing.assert_allclose(table.find(unique).numpy(), expected, rtol=1e-5, atol=1e-6)


def test_the_demo_runs_and_restores_its_checkpoint():
    out = subprocess.run([sys.executable, DEMO, "--steps", "20", "--batch", "512"], capture_output=True,
                         text=True, timeout=300, env=dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2"))
    assert out.returncode == 0, out.stderr[-3000:]
    assert "rows identical: True" in out.stdout
