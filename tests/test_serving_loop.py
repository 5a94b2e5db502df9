"""tfps.callbacks.ExportForServing and the serving loop of examples/serve_stream.py."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
import tf_keras as keras

import tfps
from tfps.keras_layers import DynamicEmbedding
from tests.cluster_run import run_cluster_program
from tests.test_export import serve_without_tfps

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def ctr_model():
    ids = keras.Input((3,), dtype=tf.int64, name="ids")
    embedded = DynamicEmbedding(4, name="ids_table", optimizer=tfps.optimizers.Adagrad(0.3))(ids)
    model = keras.Model(ids, keras.layers.Dense(1, activation="sigmoid")(keras.layers.Flatten()(embedded)))
    model.compile(optimizer="adam", loss="binary_crossentropy")
    return model


class PredictAtEachExport(keras.callbacks.Callback):
    """Right after each export (the callback before it in fit's list), the model's
    predictions for `probe`: what that version must serve."""

    def __init__(self, exporter, probe):
        super().__init__()
        self.exporter, self.probe, self.predictions = exporter, probe, []

    def on_train_batch_end(self, batch, logs=None):
        if len(self.exporter.exports) > len(self.predictions):
            self.predictions.append(self.model.predict(self.probe, verbose=0))


def test_each_version_serves_the_model_as_it_was_at_its_export(tmp_path):
    model = ctr_model()
    rng = np.random.default_rng(0)
    # Every batch brings new IDs, so every version has rows to add.
    x = (np.arange(6 * 64 * 3).reshape(-1, 3) // 2).astype(np.int64)
    y = rng.integers(0, 2, (len(x), 1)).astype(np.float32)
    probe = np.concatenate([x[::7], [[-5, -6, -7]]])
    exporter = tfps.callbacks.ExportForServing(tmp_path / "base", every_seconds=1e-6, max_layered_rows=10)
    recorder = PredictAtEachExport(exporter, probe)
    model.fit(x, y, batch_size=64, epochs=1, verbose=0, shuffle=False, callbacks=[exporter, recorder])
    # One version per batch; none more at the end, when no step ran after the last.
    versions = sorted(os.listdir(tmp_path / "base"))
    assert len(versions) == 6 == len(exporter.exports) == len(recorder.predictions)
    assert [r["version"] for r in exporter.exports] == [int(v) for v in versions]
    assert [sum(r["whole_shards"].values()) for r in exporter.exports] == [1, 0, 0, 0, 0, 0]
    for report, expected in zip(exporter.exports, recorder.predictions):
        served = tf.saved_model.load(report["export_dir"]).signatures["serving_default"](ids=tf.constant(probe))
        np.testing.assert_allclose(next(iter(served.values())).numpy(), expected, atol=1e-6)
    np.testing.assert_allclose(serve_without_tfps(exporter.exports[-1]["export_dir"], {"ids": probe}, tmp_path),
                               recorder.predictions[-1], atol=1e-6)


def test_the_first_version_waits_its_interval_and_the_end_of_training_writes_one(tmp_path):
    model = ctr_model()
    x = np.arange(4 * 32 * 3).reshape(-1, 3).astype(np.int64)
    exporter = tfps.callbacks.ExportForServing(tmp_path / "base", every_seconds=3600)
    model.fit(x, np.ones((len(x), 1), np.float32), batch_size=32, verbose=0, callbacks=[exporter])
    assert len(exporter.exports) == 1 and exporter.exports[0]["rows"] == {model.layers[1].name: len(x.ravel())}
    served = tf.saved_model.load(exporter.exports[0]["export_dir"]).signatures["serving_default"]
    np.testing.assert_allclose(next(iter(served(ids=tf.constant(x)).values())).numpy(),
                               model.predict(x, verbose=0), atol=1e-6)


def test_old_versions_go_and_the_last_can_be_whole(tmp_path):
    model = ctr_model()
    x = np.arange(4 * 32 * 3).reshape(-1, 3).astype(np.int64)
    exporter = tfps.callbacks.ExportForServing(str(tmp_path / "base"), every_seconds=1e-6, keep_versions=2,
                                               whole_at_end=True, max_layered_rows=10)
    model.fit(x, np.ones((len(x), 1), np.float32), batch_size=32, verbose=0, callbacks=[exporter])
    assert len(exporter.exports) == 5 and sum(exporter.exports[-1]["whole_shards"].values()) == 1
    assert sorted(os.listdir(tmp_path / "base")) == [str(r["version"]) for r in exporter.exports[-2:]]
    # The version before the last reuses rows of deleted versions: it still loads whole.
    served = tf.saved_model.load(exporter.exports[-2]["export_dir"]).signatures["serving_default"]
    assert next(iter(served(ids=tf.constant(x[:4])).values())).shape == (4, 1)


def test_under_parameter_server_strategy_each_version_holds_every_step_queued_before_it(tmp_path):
    out = run_cluster_program("pss_export_versions.py", str(tmp_path))
    blocks = out["steps"] // out["steps_per_execution"]
    assert len(out["versions"]) == len(out["reads"]) == blocks  # none more at the end: no step since
    for block, read in enumerate(out["reads"], start=1):
        steps = block * out["steps_per_execution"]
        assert read["steps_queued"] == steps
        assert read["clocks"] == [steps, steps]  # every queued step applied on both shards
        examples = np.arange(steps * 32)
        assert read["keys"] == sorted(np.concatenate([examples, examples + 100000]).tolist())
    # The first version already holds the first block's rows (256), not an empty table.
    assert out["versions"][0]["rows"] == {"ids_table": 4 * 32 * 2}


@pytest.mark.parametrize("args, message", [
    (dict(base_dir=3), "base_dir must be a path"),
    (dict(base_dir="b", every_seconds=0), "every_seconds must be a number > 0"),
    (dict(base_dir="b", max_layered_rows=0.5), "max_layered_rows must be a number >= 1"),
    (dict(base_dir="b", keep_versions=0), "keep_versions must be a positive int"),
    (dict(base_dir="b", max_change_layers=0), "max_change_layers must be a positive int"),
    (dict(base_dir="b", min_count=0), "min_count must be a positive int"),
    (dict(base_dir="b", value_dtype="bfloat16"), "value_dtype must be float32 or float16"),
    (dict(base_dir="b", value_dtype="float8"), "value_dtype must be float32 or float16"),
])
def test_bad_arguments_are_refused(args, message):
    with pytest.raises(ValueError, match=message):
        tfps.callbacks.ExportForServing(**args)


def test_the_serving_loop_serves_every_trained_new_id_from_a_process_without_tfps(tmp_path):
    env = dict(os.environ, PYTHONPATH=ROOT)
    run = subprocess.run(
        [sys.executable, os.path.join(ROOT, "examples", "serve_stream.py"), "--examples", "400000",
         "--chunk", "200000", "--export_every_seconds", "3", "--probes", "200", "--out_dir", str(tmp_path),
         "--json"], capture_output=True, text=True, timeout=900, env=env, cwd=str(tmp_path))
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    line = [l for l in run.stdout.splitlines() if l.startswith("SERVE_STREAM ")][-1]
    summary = json.loads(line[len("SERVE_STREAM "):])
    assert summary["probes"] > 150 and summary["probes_never_served"] == 0
    assert summary["versions"] >= 2 and summary["versions_loaded"] >= 2
    served = json.load(open(tmp_path / "served.json"))
    assert not served["tfps_imported"]
    # The workers' record of trained batches holds one batch per step, none twice, and
    # misses only batches near the end (prefetched by a worker when training ended); no
    # probe was served before a batch holding it trained.
    firsts = np.loadtxt(tmp_path / "trained_batches.txt", ndmin=2)[:, 0].astype(np.int64)
    steps = summary["examples"] // 1024
    assert len(firsts) == len(np.unique(firsts)) == steps
    assert np.setdiff1d(np.arange(steps) * 1024, firsts).min(initial=steps * 1024) >= (steps - 20) * 1024
    assert summary["probes_served_before_training"] == 0
    assert summary["latency_min_s"] >= 0
