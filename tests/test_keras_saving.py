"""Keras' own save and load paths with DynamicEmbedding: every row, slot and metadata of
every table comes back (and trains on), or the path refuses or warns, never drops rows."""

import os
import subprocess
import sys
import warnings

import numpy as np
import pytest
import tensorflow as tf
import tf_keras as keras

import tfps
from tfps.keras_layers import DynamicEmbedding
from tests.auc_reference import exact_group_auc, log_linear_buckets

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
X = {"user": np.arange(96, dtype=np.int64) % 40, "item": (np.arange(96, dtype=np.int64) * 7) % 50}
Y = ((X["user"] + X["item"]) % 3 == 0).astype(np.float32)


def two_table_model():
    user = keras.Input((), dtype=tf.int64, name="user")
    item = keras.Input((), dtype=tf.int64, name="item")
    users = DynamicEmbedding(4, optimizer=tfps.optimizers.Adam(0.05), name="users")(user)
    items = DynamicEmbedding(4, optimizer="adagrad", name="items")(item)
    hidden = keras.layers.Dense(4, activation="relu")(keras.layers.Concatenate()([users, items]))
    model = keras.Model({"user": user, "item": item}, keras.layers.Dense(1, activation="sigmoid")(hidden))
    model.compile(keras.optimizers.Adam(0.01), "binary_crossentropy")
    return model


@pytest.fixture()
def trained():
    model = two_table_model()
    model.fit(X, Y, batch_size=32, epochs=2, shuffle=False, verbose=0)
    return model


def table_state(model):
    """Each table's rows sorted by key: {layer: (keys, values, slots, metadata)} as NumPy."""
    state = {}
    for layer in model.layers:
        if isinstance(layer, DynamicEmbedding):
            rows = layer.table.export()
            order = np.argsort(rows.keys.numpy())
            state[layer.name] = tuple(np.asarray(t)[order] for t in rows)
    return state


def assert_same_tables(a, b):
    assert a.keys() == b.keys() and a
    for name in a:
        for got, want in zip(a[name], b[name]):
            np.testing.assert_array_equal(got, want)


def assert_trains_on_like(model, loaded, same_keras_optimizer_state):
    """One more step of each from the same state gives the same rows (the tables'
    optimizers and clocks came back), and the same predictions where Keras restored its
    own optimizer's state too (not from a SavedModel directory, stock layers alike)."""
    model.fit(X, Y, batch_size=96, epochs=1, shuffle=False, verbose=0)
    loaded.fit(X, Y, batch_size=96, epochs=1, shuffle=False, verbose=0)
    assert_same_tables(table_state(loaded), table_state(model))
    if same_keras_optimizer_state:
        np.testing.assert_allclose(loaded.predict(X, verbose=0), model.predict(X, verbose=0), atol=1e-6)


@pytest.mark.parametrize("path", ["model.keras", "saved_model_dir"])
def test_model_save_and_load_model_restore_every_row_and_train_on(trained, tmp_path, path):
    trained.save(str(tmp_path / path))
    loaded = keras.models.load_model(str(tmp_path / path))  # no custom_objects: registered
    assert [type(layer).__name__ for layer in loaded.layers].count("DynamicEmbedding") == 2
    assert_same_tables(table_state(loaded), table_state(trained))
    np.testing.assert_allclose(loaded.predict(X, verbose=0), trained.predict(X, verbose=0), atol=1e-6)
    assert_trains_on_like(trained, loaded, same_keras_optimizer_state=path.endswith(".keras"))


def test_weights_in_the_keras_format_carry_the_rows(trained, tmp_path):
    trained.save_weights(str(tmp_path / "m.weights.h5"))
    fresh = two_table_model()
    fresh.load_weights(str(tmp_path / "m.weights.h5"))
    assert_same_tables(table_state(fresh), table_state(trained))


def revived_tables(obj, path="", seen=None):
    """{path: ShardedTable} of every table a loaded SavedModel object holds."""
    from tfps.table.sharded_table import ShardedTable
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return {}
    seen.add(id(obj))
    found = {path: obj} if isinstance(obj, ShardedTable) else {}
    for name, child in obj._trackable_children(save_type="savedmodel").items():
        found.update(revived_tables(child, f"{path}/{name}", seen))
    return found


def test_tf_saved_model_save_and_load_serve_and_hold_the_trained_rows(trained, tmp_path):
    tf.saved_model.save(trained, str(tmp_path / "sm"))
    loaded = tf.saved_model.load(str(tmp_path / "sm"))
    inputs = {k: tf.constant(v) for k, v in X.items()}
    np.testing.assert_allclose(loaded(inputs).numpy(), trained.predict(X, verbose=0), atol=1e-6)
    tables = revived_tables(loaded)
    assert len(tables) == 2
    expected = table_state(trained)
    for table in tables.values():
        rows = table.export()
        order = np.argsort(rows.keys.numpy())
        got = tuple(np.asarray(t)[order] for t in rows)
        name = "users" if table.num_slots == 2 else "items"  # Adam has two slots, Adagrad one
        for got_field, want_field in zip(got, expected[name]):
            np.testing.assert_array_equal(got_field, want_field)


def test_a_saved_model_loaded_without_tfps_names_it(trained, tmp_path):
    trained.save(str(tmp_path / "sm"))
    code = ("import sys, tensorflow as tf\n"
            "try:\n    tf.saved_model.load(sys.argv[1])\n"
            "except Exception as e:\n    print(repr(e)[:2000]); sys.exit(3)\n")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    env.pop("PYTHONPATH", None)
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "sm")], capture_output=True, text=True,
                         timeout=300, env=env, cwd=str(tmp_path))
    assert out.returncode == 3, out.stdout + out.stderr[-2000:]
    assert "Tfps>" in out.stdout or "tfps" in out.stdout


@pytest.mark.parametrize("save", [lambda m, p: m.save(p + ".h5"), lambda m, p: m.save_weights(p + ".h5"),
                                  lambda m, p: m.save_weights(p + ".weights", save_format="h5")])
def test_hdf5_saving_refuses_a_model_with_tables_and_writes_nothing(trained, tmp_path, save):
    before = set(os.listdir(tmp_path))
    with pytest.raises(ValueError, match=r"HDF5 .* cannot hold the rows of the dynamic tables of users, items"):
        save(trained, str(tmp_path / "m"))
    assert set(os.listdir(tmp_path)) == before


def test_hdf5_saving_of_a_model_without_tables_still_works(tmp_path):
    model = keras.Sequential([keras.layers.Dense(1, input_shape=(2,))])
    model.save_weights(str(tmp_path / "w.h5"))
    assert os.path.getsize(tmp_path / "w.h5") > 0


def test_get_and_set_weights_warn_that_the_tables_are_not_included(trained):
    with pytest.warns(UserWarning, match=r"get_weights returns the variables only, not the rows of the dynamic tables of users, items"):
        weights = trained.get_weights()
    with pytest.warns(UserWarning, match=r"set_weights sets the variables only"):
        trained.set_weights(weights)
    model = keras.Sequential([keras.layers.Dense(1, input_shape=(2,))])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model.set_weights(model.get_weights())


def test_tfps_objects_are_registered_keras_serializables():
    for obj, name in ((DynamicEmbedding, "tfps>DynamicEmbedding"), (tfps.metrics.AUC, "tfps>AUC"),
                      (tfps.metrics.GroupAUC, "tfps>GroupAUC"), (tfps.metrics.FeedGroups, "tfps>FeedGroups"),
                      (tfps.metrics.BinaryLogLoss, "tfps>BinaryLogLoss"),
                      (tfps.metrics.CalibrationRatio, "tfps>CalibrationRatio")):
        assert keras.saving.get_registered_name(obj) == name
        assert keras.saving.get_registered_object(name) is obj
    layer = DynamicEmbedding(3, combiner="sqrtn", optimizer=tfps.optimizers.Ftrl(0.2, l1_regularization_strength=0.1),
                             initializer=tfps.initializers.TruncatedNormal(0.0, 0.3), key_dtype=tf.uint64,
                             seed=7, unseen="initial", name="e")
    clone = keras.layers.deserialize(keras.layers.serialize(layer))
    assert type(clone) is DynamicEmbedding and clone.get_config() == layer.get_config()
    assert clone.optimizer == layer.optimizer and clone.initializer == layer.initializer


def test_summary_lists_each_table_with_its_dim_rows_and_shards(trained):
    lines = []
    trained.summary(print_fn=lines.append)
    tables = lines[lines.index("Dynamic tables (rows live on the parameter servers, not in the counts above):") + 1:]
    users, items = (trained.get_layer(name).table.size().numpy() for name in ("users", "items"))
    assert (users, items) == (40, 50)
    assert tables == [f"  users: dim 4, 40 rows in 1 shard, optimizer Adam(learning_rate=0.05, beta_1=0.9, "
                      "beta_2=0.999, epsilon=1e-07)",
                      "  items: dim 4, 50 rows in 1 shard, optimizer Adagrad(learning_rate=0.001, "
                      "initial_accumulator_value=0.1, epsilon=1e-07)"]


@pytest.mark.parametrize("path", ["model.keras", "saved_model_dir"])
def test_a_loaded_model_still_feeds_its_group_auc(tmp_path, path):
    """FeedGroups links to its GroupAUC by name, so the loaded model's copies find each other."""
    user = keras.Input((), dtype=tf.int64, name="user")
    item = keras.Input((), dtype=tf.int64, name="item")
    tables = {"optimizer": tfps.optimizers.Adam(0.05)}
    rows = keras.layers.Concatenate()([DynamicEmbedding(4, name="users", **tables)(user),
                                       DynamicEmbedding(4, name="items", **tables)(item)])
    prediction = keras.layers.Dense(1, activation="sigmoid")(rows)
    group_auc = tfps.metrics.GroupAUC(name="gauc")
    model = keras.Model({"user": user, "item": item}, tfps.metrics.FeedGroups(group_auc)([prediction, user]))
    model.compile(keras.optimizers.Adam(0.05), "binary_crossentropy", metrics=[group_auc])
    x = {"user": np.arange(512, dtype=np.int64) % 8, "item": (np.arange(512, dtype=np.int64) * 7) % 50}
    y = (x["item"] % 3 == 0).astype(np.float32)  # every user sees clicks and skips
    model.fit(x, y, batch_size=64, epochs=3, shuffle=False, verbose=0)
    expected = model.evaluate(x, y, batch_size=64, verbose=0, return_dict=True)["gauc"]
    # The metric's own buckets, from the model's predictions. The tables train at a rate
    # that moves their rows: at the table optimizer's default (Adagrad, 0.001) predictions
    # hardly moved, a user's could share one bucket and the metric read 0.5.
    predictions = model.predict(x, batch_size=64, verbose=0)[:, 0]
    bucketed = log_linear_buckets(predictions, group_auc.buckets_per_octave, group_auc.octaves)
    assert expected == pytest.approx(exact_group_auc(x["user"], y, bucketed), abs=1e-6)
    assert expected > 0.9
    model.save(str(tmp_path / path))
    loaded = keras.models.load_model(str(tmp_path / path))
    assert loaded.evaluate(x, y, batch_size=64, verbose=0, return_dict=True)["gauc"] == pytest.approx(expected, abs=1e-9)
    history = loaded.fit(x, y, batch_size=64, epochs=1, shuffle=False, verbose=0).history
    assert history["gauc"][0] > 0.9  # fed: a GroupAUC without groups would read 0.5
