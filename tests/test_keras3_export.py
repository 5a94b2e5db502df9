"""A Keras 3 model with DynamicEmbedding layers exports: `model.export()` keeps every row
(loaded where tfps is imported), and tfps.export.save_for_serving, whole and of changes,
serves it exactly in a process without tfps."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import tfps
from tests.test_export import serve_without_tfps

import keras  # noqa: E402  (TensorFlow 2.16 and later, all tfps supports, depend on Keras 3)
from tfps.keras_layers.keras3 import DynamicEmbedding  # noqa: E402

assert keras.__version__.startswith("3."), keras.__version__

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def ctr_model():
    """26 fields sharing one table by column namespaces, an int64 user and a string query."""
    fields = keras.Input((26,), dtype="int64", name="fields")
    user = keras.Input((), dtype="int64", name="user")
    query = keras.Input((), dtype="string", name="query")
    shared = DynamicEmbedding(4, combiner="mean", name="fields_table", optimizer=tfps.optimizers.Adagrad(0.3))
    users = DynamicEmbedding(4, name="users", unseen="initial", optimizer=tfps.optimizers.Adagrad(0.3),
                             initializer=tfps.initializers.TruncatedNormal(0.0, 0.1))
    queries = DynamicEmbedding(4, name="queries", optimizer=tfps.optimizers.Adagrad(0.3))
    x = keras.layers.Concatenate()([shared(fields, namespace="columns"), users(user), queries(query)])
    model = keras.Model({"fields": fields, "user": user, "query": query},
                        keras.layers.Dense(1, activation="sigmoid")(x))
    model.compile(keras.optimizers.Adam(0.01), "binary_crossentropy")
    return model, (shared, users, queries)


def ctr_data(n, seed, offset=0):
    rng = np.random.default_rng(seed)
    x = {"fields": rng.integers(0, 300, (n, 26)) + offset, "user": rng.integers(0, 500, n) + offset,
         "query": np.array([f"q{i}" for i in rng.integers(0, 100, n) + offset])}
    return x, (x["user"] % 3 == 0).astype(np.float32)


def fit(model, x, y):
    # Keras 3 takes string features from tf.data, not from NumPy arrays.
    model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(256), shuffle=False, verbose=0)


def predict(model, x):
    return model.predict(tf.data.Dataset.from_tensor_slices(x).batch(256), verbose=0)


def test_model_export_keeps_every_row_for_a_process_with_tfps(tmp_path):
    model, tables = ctr_model()
    x, y = ctr_data(2048, 0)
    fit(model, x, y)
    model.export(str(tmp_path / "exported"), verbose=False)
    unseen, _ = ctr_data(256, 1, offset=10_000)  # never trained: zeros, or the initial rows
    probe = {k: np.concatenate([x[k][:256], unseen[k]]) for k in x}
    np.savez(str(tmp_path / "probe.npz"), **probe)
    code = (
        "import json, sys, numpy as np, tensorflow as tf, tfps\n"
        "m = tf.saved_model.load(sys.argv[1]); probe = dict(np.load(sys.argv[2]))\n"
        "out = m.serve({k: tf.constant(v) for k, v in probe.items()})\n"
        "json.dump({'out': out.numpy().tolist(), 'rows': sorted(int(t.size()) for t in m.tfps_tables[0].shards)"
        " + sorted(int(s.size()) for t in m.tfps_tables[1:] for s in t.shards)}, sys.stdout)\n")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "exported"), str(tmp_path / "probe.npz")],
                         capture_output=True, text=True, timeout=300, cwd=ROOT,
                         env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout)
    np.testing.assert_allclose(np.array(result["out"]), predict(model, probe), rtol=0, atol=1e-6)
    expected_rows = sorted(int(s) for s in tables[0].table.shard_sizes()) + sorted(
        int(s) for t in tables[1:] for s in t.table.shard_sizes())
    assert result["rows"] == expected_rows and expected_rows[0] > 1000


def test_model_export_refuses_ragged_and_sparse_ids_that_its_signature_would_pad(tmp_path):
    """Keras 3's export gives a ragged or sparse input a dense signature: the padding would
    be looked up as IDs. save_for_serving keeps both, and serves what predict gives."""
    history = keras.Input((None,), dtype="int64", ragged=True, name="history")
    tags = keras.Input((4,), dtype="int64", sparse=True, name="tags")
    x = keras.layers.Concatenate()([DynamicEmbedding(4, combiner="mean", name="items")(history),
                                    DynamicEmbedding(4, combiner="sum", name="tag_table")(tags)])
    model = keras.Model({"history": history, "tags": tags}, keras.layers.Dense(1)(x))
    with pytest.raises(ValueError, match=r"input\(s\) \['history', 'tags'\] dense signatures .* "
                                         r"tfps.export.save_for_serving\(model, directory\)"):
        model.export(str(tmp_path / "exported"), verbose=False)
    assert not os.path.exists(tmp_path / "exported")
    ids = tf.ragged.constant([[3, 5, 7], [], [5]], dtype=tf.int64)
    probe = {"history": ids, "tags": tf.sparse.from_dense(tf.constant([[1, 0, 2, 0], [0, 0, 0, 0], [2, 2, 0, 0]],
                                                                      tf.int64))}
    model.compile(keras.optimizers.SGD(0.1), "mse")
    model.fit(tf.data.Dataset.from_tensor_slices((probe, [1.0, 0.0, 1.0])).batch(3), shuffle=False, verbose=0)
    served = tfps.export.save_for_serving(model, str(tmp_path / "1"))
    flat = {"history_values": ids.values.numpy(), "history_row_splits": ids.row_splits.numpy(),
            "tags_indices": probe["tags"].indices.numpy(), "tags_values": probe["tags"].values.numpy(),
            "tags_dense_shape": probe["tags"].dense_shape.numpy()}
    np.testing.assert_allclose(serve_without_tfps(served["export_dir"], flat, tmp_path)[:, 0],
                               model.predict(probe, verbose=0)[:, 0], rtol=0, atol=1e-6)
    # A model without ragged or sparse inputs exports as before (the test above).


def test_save_for_serving_versions_serve_a_keras3_model_without_tfps(tmp_path):
    model, _ = ctr_model()
    x, y = ctr_data(2048, 0)
    fit(model, x, y)
    probe, _ = ctr_data(512, 2)
    whole = tfps.export.save_for_serving(model, str(tmp_path / "1"))
    np.testing.assert_allclose(serve_without_tfps(whole["export_dir"], probe, tmp_path)[:, 0],
                               predict(model, probe)[:, 0], rtol=0, atol=1e-6)
    new, new_y = ctr_data(128, 3, offset=5000)  # new IDs, and old ones trained again
    fit(model, {k: np.concatenate([x[k][:128], new[k]]) for k in x}, np.concatenate([y[:128], new_y]))
    changes = tfps.export.save_for_serving(model, str(tmp_path / "2"), changes_since=whole["export_dir"],
                                           max_layered_rows=2)
    assert sum(changes["whole_shards"].values()) == 0 and 128 < changes["rows"]["users"] < 256
    probe = {k: np.concatenate([probe[k], new[k]]) for k in probe}
    np.testing.assert_allclose(serve_without_tfps(changes["export_dir"], probe, tmp_path)[:, 0],
                               predict(model, probe)[:, 0], rtol=0, atol=1e-6)
