"""tfps.export.save_for_serving: SavedModels that stock TensorFlow serves without tfps."""

import glob
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
import tf_keras as keras

import tfps
from tests import disk_events
from tfps._ops import ops
from tfps.keras_layers import DynamicEmbedding
from tests.cluster_run import run_cluster_program

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def serve_without_tfps(export_dir, inputs, tmp_path):
    path = str(tmp_path / "inputs.npz")
    np.savez(path, **inputs)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    env.pop("PYTHONPATH", None)
    out = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "serving_check.py"), export_dir, path],
                         capture_output=True, text=True, timeout=300, env=env, cwd=str(tmp_path))
    assert out.returncode == 0, out.stderr[-3000:]
    import json
    result = json.loads(out.stdout)
    assert not result["tfps_imported"]
    return np.array(result["outputs"][0], np.float32)


def ctr_model():
    """26 Criteo-like fields sharing one table, an int64 feature and a string feature."""
    fields = keras.Input((26,), dtype=tf.int64, name="fields")
    user = keras.Input((), dtype=tf.int64, name="user")
    query = keras.Input((), dtype=tf.string, name="query")
    shared = DynamicEmbedding(4, combiner="mean", name="fields_table")
    users = DynamicEmbedding(4, name="users", unseen="initial",
                             initializer=tfps.initializers.TruncatedNormal(0.0, 0.1))
    queries = DynamicEmbedding(4, name="queries")
    x = keras.layers.Concatenate()([shared(fields, namespace="columns"), users(user), queries(query)])
    model = keras.Model([fields, user, query], keras.layers.Dense(1, activation="sigmoid")(x))
    model.compile(optimizer="adam", loss="binary_crossentropy")
    return model


def ctr_data(n, seed, vocab=50):
    rng = np.random.default_rng(seed)
    return {"fields": rng.integers(0, vocab, (n, 26)).astype(np.int64),
            "user": rng.integers(-vocab, vocab, n).astype(np.int64),
            "query": np.array([f"q{v}" for v in rng.integers(0, vocab, n)])}


@pytest.fixture(scope="module")
def trained():
    model = ctr_model()
    data = ctr_data(2048, 0)
    model.fit(data, (data["fields"][:, 0] % 2).astype(np.float32), epochs=2, batch_size=128, verbose=0)
    return model


def test_export_serves_the_same_predictions_without_tfps(trained, tmp_path):
    report = tfps.export.save_for_serving(trained, str(tmp_path / "export"))
    assert report["rows"]["fields_table"] > 26 * 40 and report["bytes"] > 0
    test = ctr_data(256, 1, vocab=80)  # seen and unseen keys in every feature
    expected = trained.predict(test, verbose=0)
    served = serve_without_tfps(report["export_dir"], test, tmp_path)
    np.testing.assert_allclose(served, expected, atol=1e-6)
    graph = open(os.path.join(report["export_dir"], "saved_model.pb"), "rb").read()
    assert b"Tfps>" not in graph


def test_an_export_is_on_disk_before_it_is_renamed_into_place(trained, tmp_path, monkeypatch):
    events = disk_events.record(monkeypatch)
    report = tfps.export.save_for_serving(trained, str(tmp_path / "export"))
    [commit] = disk_events.renames_to(events, report["export_dir"])
    temporary = os.path.realpath(events[commit][1])
    written = {os.path.realpath(os.path.join(d, f))
               for d, _, files in os.walk(report["export_dir"]) for f in files}
    assert any(p.endswith("saved_model.pb") for p in written)
    assert {p.replace(os.path.realpath(report["export_dir"]), temporary) for p in written} <= \
        disk_events.synced_before(events, commit)
    assert events[commit + 1] == ("sync", os.path.realpath(tmp_path))


def test_a_model_saved_after_an_export_loads_and_predicts_as_before(trained, tmp_path):
    tfps.export.save_for_serving(trained, str(tmp_path / "export"))
    trained.save(str(tmp_path / "saved_model"))
    loaded = keras.models.load_model(str(tmp_path / "saved_model"))
    data = ctr_data(64, 5)
    np.testing.assert_allclose(loaded.predict(data, verbose=0), trained.predict(data, verbose=0), atol=1e-6)


def test_saved_model_cli_runs_the_export(trained, tmp_path):
    report = tfps.export.save_for_serving(trained, str(tmp_path / "export"))
    test = ctr_data(4, 2)
    expected = trained.predict(test, verbose=0)
    out_dir = tmp_path / "cli_out"
    for name, value in test.items():
        np.save(str(tmp_path / f"{name}.npy"), value.astype(object) if name == "query" else value)
    inputs = ";".join(f"{name}={tmp_path / (name + '.npy')}" for name in test)
    cli = os.path.join(os.path.dirname(sys.executable), "saved_model_cli")
    run = subprocess.run([cli, "run", "--dir", report["export_dir"], "--tag_set", "serve",
                          "--signature_def", "serving_default", "--inputs", inputs,
                          "--outdir", str(out_dir)], capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    assert run.returncode == 0, run.stderr[-3000:]
    served = np.load(glob.glob(str(out_dir / "*.npy"))[0])
    np.testing.assert_allclose(served, expected, atol=1e-6)


def test_min_count_prunes_exactly_the_rare_keys(tmp_path):
    ids = keras.Input((), dtype=tf.int64)
    layer = DynamicEmbedding(3, optimizer=tfps.optimizers.SGD(0.5))
    model = keras.Model(ids, keras.layers.Dense(1)(layer(ids)))
    model.compile(optimizer="sgd", loss="mse")
    frequent, rare = np.arange(10, dtype=np.int64), np.arange(100, 105, dtype=np.int64)
    x = np.concatenate([np.tile(frequent, 6), rare])  # each frequent key occurs 6 times
    model.fit(x, np.ones(len(x), np.float32), batch_size=5, epochs=1, shuffle=False, verbose=0)
    counts = dict(zip(*(t.numpy().tolist() for t in (layer.table.export().keys,
                                                     layer.table.export().metadata[:, 0]))))
    assert all(counts[k] == 6 for k in frequent) and all(counts[k] == 1 for k in rare)
    report = tfps.export.save_for_serving(model, str(tmp_path / "pruned"), min_count=3)
    assert report["rows"][layer.name] == len(frequent)
    probe = np.concatenate([frequent, rare, [999]])
    expected = model.predict(probe, verbose=0)
    served = serve_without_tfps(report["export_dir"], {model.inputs[0].name.split(":")[0]: probe},
                                tmp_path)
    np.testing.assert_allclose(served[:10], expected[:10], atol=1e-6)   # kept keys unchanged
    unseen_output = expected[-1]
    np.testing.assert_allclose(served[10:], np.repeat(unseen_output[None], 6, 0), atol=1e-6)
    assert not np.allclose(expected[10:15], unseen_output)  # pruning really changed them


def test_float16_values_halve_the_rows(trained, tmp_path):
    full = tfps.export.save_for_serving(trained, str(tmp_path / "f32"))
    half = tfps.export.save_for_serving(trained, str(tmp_path / "f16"), value_dtype="float16")
    assert half["rows"] == full["rows"]
    assert half["bytes"] < full["bytes"]
    test = ctr_data(64, 3)
    np.testing.assert_allclose(serve_without_tfps(half["export_dir"], test, tmp_path),
                               trained.predict(test, verbose=0), atol=2e-3)


@pytest.mark.parametrize("value_dtype", ["float32", "float16"])
def test_a_shard_written_in_slices_of_any_size_gives_the_same_rows(value_dtype, tmp_path):
    # Each stripe's rows go out in slices of at most slice_rows: 1, 3 and the default must
    # all write every picked row once, in serving order, with its values.
    from tfps.table import _stock_ops as stock_ops
    table = tfps.DynamicTable(3, optimizer="sgd")
    keys = np.unique(np.random.default_rng(5).integers(-2**62, 2**62, 3000))
    values = np.random.default_rng(6).uniform(-4, 4, (len(keys), 3)).astype(np.float32)
    table.insert(tf.constant(keys), tf.constant(values))
    table.find_or_insert(tf.constant(keys[::3]))  # these occur once: a min_count of 1 keeps them
    kept = np.sort(keys[::3])
    order = stock_ops.serving_order(tf.constant(kept)).numpy()
    by_order = np.argsort(order)
    expected_values = values[np.searchsorted(keys, kept)][by_order]
    if value_dtype == "float16":
        expected_values = expected_values.astype(np.float16)
    for slice_rows in (1, 3, 65536):
        prefix = str(tmp_path / f"slices{slice_rows}")
        rows, _ = ops.tfps_table_export_for_serving(
            table.resource_handle, prefix, hashes_key="h", values_key="v", min_count=1,
            value_dtype=value_dtype, slice_rows=slice_rows)
        assert int(rows) == len(kept)
        saved = tf.train.load_checkpoint(prefix)
        got_values = saved.get_tensor("v")
        if value_dtype == "float16":
            got_values = got_values.view(np.float16)
        np.testing.assert_array_equal(saved.get_tensor("h"), order[by_order])
        np.testing.assert_array_equal(got_values, expected_values)
    with pytest.raises(tf.errors.InvalidArgumentError, match="slice_rows must be > 0, got 0"):
        ops.tfps_table_export_for_serving(table.resource_handle, str(tmp_path / "bad"),
                                          hashes_key="h", values_key="v", slice_rows=0)


def test_missing_parent_directories_are_created(trained, tmp_path):
    report = tfps.export.save_for_serving(trained, str(tmp_path / "exports" / "ctr" / "1"))
    assert os.path.isfile(os.path.join(report["export_dir"], "saved_model.pb"))


def test_float16_refuses_rows_beyond_its_range_and_writes_nothing(tmp_path):
    ids = keras.Input((), dtype=tf.int64)
    layer = DynamicEmbedding(2, name="big_rows")
    model = keras.Model(ids, keras.layers.Dense(1)(layer(ids)))
    layer.table.insert(tf.constant([1, 2], tf.int64), tf.constant([[1.0, 2.0], [7e4, -3.0]]))
    with pytest.raises(ValueError, match=r"float16 cannot hold the rows of 'big_rows': shard 0 has a "
                                         r"value of magnitude 70000 \(key 2\)"):
        tfps.export.save_for_serving(model, str(tmp_path / "f16"), value_dtype="float16")
    assert not os.listdir(tmp_path)
    # Below 65520 a value rounds to float16's largest, 65504, and is served as that.
    layer.table.insert(tf.constant([2], tf.int64), tf.constant([[65519.0, -3.0]]))
    report = tfps.export.save_for_serving(model, str(tmp_path / "f16"), value_dtype="float16")
    saved = tf.train.load_checkpoint(os.path.join(report["export_dir"], "variables", "variables"))
    name = "frozen_rows/table0_shard0_{}/.ATTRIBUTES/VARIABLE_VALUE"
    order, values = saved.get_tensor(name.format("order")), saved.get_tensor(name.format("values"))
    from tfps.table import _stock_ops as stock_ops
    row = values.view(np.float16)[order == stock_ops.serving_order(tf.constant([2], tf.int64)).numpy()[0]]
    np.testing.assert_array_equal(row, [[65504.0, -3.0]])


def test_outputs_keep_the_model_output_names(tmp_path):
    ids = keras.Input((), dtype=tf.int64, name="ids")
    rows = DynamicEmbedding(3, name="emb")(ids)
    ctr = keras.layers.Dense(1, activation="sigmoid", name="ctr")(rows)
    cvr = keras.layers.Dense(1, activation="sigmoid", name="cvr")(rows)
    model = keras.Model(ids, [ctr, cvr])
    model(tf.constant([1, 2, 3], tf.int64), training=True)
    report = tfps.export.save_for_serving(model, str(tmp_path / "two_heads"))
    serve = tf.saved_model.load(report["export_dir"]).signatures["serving_default"]
    outputs = serve(ids=tf.constant([1, 2, 9], tf.int64))
    assert sorted(outputs) == ["ctr", "cvr"]
    expected = model.predict(np.array([1, 2, 9]), verbose=0)
    np.testing.assert_allclose(outputs["ctr"].numpy(), expected[0], atol=1e-6)
    np.testing.assert_allclose(outputs["cvr"].numpy(), expected[1], atol=1e-6)


def _multi_hot_model(kind):
    """A ragged string or sparse int64 multi-hot feature (mean / sum) beside a dense int one."""
    if kind == "ragged":
        tags = keras.Input((None,), dtype=tf.string, ragged=True, name="tags")
        pooled = DynamicEmbedding(4, combiner="mean", key_dtype=tf.string, name="tag_table")(tags)
    else:
        tags = keras.Input((6,), dtype=tf.int64, sparse=True, name="tags")
        pooled = DynamicEmbedding(4, combiner="sum", name="tag_table")(tags)
    user = keras.Input((), dtype=tf.int64, name="user")
    users = DynamicEmbedding(4, name="user_table")(user)
    out = keras.layers.Dense(1, activation="sigmoid", name="ctr")(keras.layers.Concatenate()([pooled, users]))
    return keras.Model({"tags": tags, "user": user}, out)


@pytest.mark.parametrize("kind", ["ragged", "sparse"])
def test_ragged_and_sparse_inputs_are_served_exactly_without_padding(kind, tmp_path):
    rng = np.random.default_rng(4)
    lengths = rng.integers(0, 6, 64)  # empty rows too
    model = _multi_hot_model(kind)
    if kind == "ragged":
        values = rng.choice(np.array([b"a", b"b", b"c", b"d", b"e"], object), lengths.sum())
        tags = tf.RaggedTensor.from_row_lengths(values, lengths)
        served_inputs = {"tags_values": values.astype("S"), "tags_row_splits": tags.row_splits.numpy()}
    else:
        indices = np.array([[r, c] for r, n in enumerate(lengths) for c in range(n)], np.int64).reshape(-1, 2)
        values = rng.integers(0, 20, len(indices)).astype(np.int64)
        tags = tf.SparseTensor(indices, values, [64, 6])
        served_inputs = {"tags_indices": indices, "tags_values": values,
                         "tags_dense_shape": np.array([64, 6], np.int64)}
    user = rng.integers(0, 10, 64).astype(np.int64)
    model.compile("adam", "binary_crossentropy")
    model.fit({"tags": tags, "user": user}, (user % 2).astype(np.float32), batch_size=64, epochs=3, verbose=0)
    expected = model.predict({"tags": tags, "user": user}, batch_size=64, verbose=0)
    report = tfps.export.save_for_serving(model, str(tmp_path / kind))
    served = serve_without_tfps(report["export_dir"], {**served_inputs, "user": user}, tmp_path)
    np.testing.assert_allclose(served, expected, atol=1e-6)
    # The mean really depends on the row lengths: padding a row would change it.
    if kind == "ragged":
        assert np.ptp(expected) > 1e-3


def test_bad_exports_fail_clearly_and_never_leave_a_partial_export(trained, tmp_path, monkeypatch):
    existing = tmp_path / "existing"
    existing.mkdir()
    with pytest.raises(FileExistsError, match="already exists"):
        tfps.export.save_for_serving(trained, str(existing))
    plain = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    with pytest.raises(ValueError, match="no tfps DynamicEmbedding layer"):
        tfps.export.save_for_serving(plain, str(tmp_path / "plain"))
    with pytest.raises(PermissionError, match="cannot write into"):
        tfps.export.save_for_serving(trained, "/proc/tfps_export")
    for value_dtype in ("int8", "float8", object()):  # float8: no such numpy type
        with pytest.raises(ValueError, match="value_dtype must be float32 or float16"):
            tfps.export.save_for_serving(trained, str(tmp_path / "bf16"), value_dtype=value_dtype)
    for bad, message in ((dict(export_dir=123), "export_dir must be a path"),
                         (dict(changes_since=123), "changes_since must be a path"),
                         (dict(model=None), "model must be a Keras model holding tfps DynamicEmbedding"),
                         (dict(model=trained.layers[1]), "model must be a Keras model holding tfps DynamicEmbedding")):
        arguments = {"model": trained, "export_dir": str(tmp_path / "typed"), **bad}
        with pytest.raises(ValueError, match=message):
            tfps.export.save_for_serving(arguments.pop("model"), arguments.pop("export_dir"), **arguments)
    assert not os.path.exists(tmp_path / "typed")
    for min_count in (2.5, 0, -1, True):
        with pytest.raises(ValueError, match="min_count must be a positive int"):
            tfps.export.save_for_serving(trained, str(tmp_path / "pruned"), min_count=min_count)

    def failing_save(*args, **kwargs):
        os.makedirs(args[1], exist_ok=True)
        open(os.path.join(args[1], "half_written"), "w").close()
        raise OSError("disk full")

    monkeypatch.setattr(tf.saved_model, "save", failing_save)
    with pytest.raises(OSError, match="disk full"):
        tfps.export.save_for_serving(trained, str(tmp_path / "broken"))
    assert not (tmp_path / "broken").exists()
    assert not [p for p in os.listdir(tmp_path) if "tmp" in p]


def test_export_of_a_model_trained_under_parameter_server_strategy(tmp_path):
    out = run_cluster_program("pss_export.py", str(tmp_path))
    assert min(out["shard_sizes"]) > 0
    inputs = dict(np.load(str(tmp_path / "inputs.npz")))
    served = serve_without_tfps(out["export_dir"], inputs, tmp_path)
    np.testing.assert_allclose(served, np.load(str(tmp_path / "expected.npy")), atol=1e-6)
    assert out["rows"]["ids"] == sum(out["shard_sizes"])
    # Retrieval: each PS wrote its shard; the whole export, then it and the changes after
    # it, equal the table's own export at each moment.
    assert [s["kind"] for s in out["retrieval_1"]["shards"]] == ["whole", "whole"]
    assert [s["kind"] for s in out["retrieval_2"]["shards"]] == ["changes", "changes"]
    assert sum(s["removed"] for s in out["retrieval_2"]["shards"]) == 3
    for version, directories in (("1", ["1"]), ("2", ["1", "2"])):
        keys, vectors = tfps.export.load_for_retrieval(*(str(tmp_path / "retrieval" / d) for d in directories))
        table = np.load(str(tmp_path / f"table_{version}.npz"))
        order = np.argsort(table["keys"])
        np.testing.assert_array_equal(keys, table["keys"][order])
        np.testing.assert_array_equal(vectors, table["values"][order])
    changed = sum(s["rows"] for s in out["retrieval_2"]["shards"])
    assert 0 < changed < len(keys)
    # An export of changes, its rows written by each PS, serves as the model predicts.
    assert out["changes"]["whole_shards"] == {"ids": 0, "tag_table": 0}
    assert 0 < out["changes"]["rows"]["ids"] < sum(out["shard_sizes"])
    # The 3 keys removed before the retrieval export, unless trained again since, and 5 after.
    assert 5 <= out["changes"]["removed"]["ids"] <= 8
    served = serve_without_tfps(out["changes"]["export_dir"], inputs, tmp_path)
    np.testing.assert_allclose(served, np.load(str(tmp_path / "expected_changes.npy")), atol=1e-6)


@pytest.mark.parametrize("num_shards", [1, 2, 3, 7])
def test_serving_routes_keys_to_frozen_shards_as_training_does(num_shards, tmp_path):
    from tfps.table import _stock_ops as stock_ops
    keys = np.concatenate([np.random.default_rng(0).integers(-(1 << 63), (1 << 63) - 1, 5000, dtype=np.int64),
                           [0, -1, -(1 << 63), (1 << 63) - 1]]).astype(np.int64)
    np.testing.assert_array_equal(stock_ops.shard_of(tf.constant(keys), num_shards).numpy(),
                                  tfps.keys.shard_of(tf.constant(keys), num_shards).numpy())
    table = tfps.ShardedTable(3, devices=["/cpu:0"] * num_shards)
    table.insert(keys, np.arange(len(keys) * 3, dtype=np.float32).reshape(-1, 3))
    layer = type("Layer", (), {"table": table, "name": "t"})()
    frozen, prefixes, variables = tfps.export.freeze(layer, str(tmp_path), "t")
    # The shards' bundles hold the rows the stand-ins get in a loaded SavedModel.
    for i, prefix in enumerate(prefixes):
        for part in ("order", "values"):
            key = f"frozen_rows/t_shard{i}_{part}/.ATTRIBUTES/VARIABLE_VALUE"
            variables[f"t_shard{i}_{part}"].assign(tf.train.load_checkpoint(prefix).get_tensor(key))
    assert [shard.num_rows for shard in frozen.shards] == table.shard_sizes()
    rows, exists = frozen.find(tf.constant(np.append(keys, 12345)))
    np.testing.assert_array_equal(rows.numpy()[:-1], table.find(keys).numpy())
    assert exists.numpy()[:-1].all() and not exists.numpy()[-1]


def test_a_weighted_ragged_feature_is_served_exactly_without_tfps(tmp_path):
    """Per-ID weights (a ragged input beside the IDs) reach the served mean as in training."""
    rng = np.random.default_rng(6)
    lengths = rng.integers(0, 5, 64)  # empty rows too
    ids_in = keras.Input((None,), dtype=tf.int64, ragged=True, name="items")
    weights_in = keras.Input((None,), dtype=tf.float32, ragged=True, name="item_weights")
    pooled = DynamicEmbedding(4, combiner="mean", name="item_table")(ids_in, weights=weights_in)
    model = keras.Model({"items": ids_in, "item_weights": weights_in}, keras.layers.Dense(1, name="ctr")(pooled))
    ids = tf.RaggedTensor.from_row_lengths(rng.integers(0, 30, lengths.sum()).astype(np.int64), lengths)
    weights = tf.RaggedTensor.from_row_lengths(rng.uniform(0.1, 3.0, lengths.sum()).astype(np.float32), lengths)
    model.compile("adam", "mse")
    model.fit({"items": ids, "item_weights": weights}, rng.normal(size=64).astype(np.float32), batch_size=64,
              epochs=3, verbose=0)
    expected = model.predict({"items": ids, "item_weights": weights}, batch_size=64, verbose=0)
    unweighted = model.predict({"items": ids, "item_weights": tf.ones_like(weights)}, batch_size=64, verbose=0)
    assert np.abs(expected - unweighted).max() > 1e-3  # the weights change the output
    report = tfps.export.save_for_serving(model, str(tmp_path / "weighted"))
    served = serve_without_tfps(report["export_dir"], {
        "items_values": ids.values.numpy(), "items_row_splits": ids.row_splits.numpy(),
        "item_weights_values": weights.values.numpy(), "item_weights_row_splits": weights.row_splits.numpy()},
        tmp_path)
    np.testing.assert_allclose(served, expected, atol=1e-6)
