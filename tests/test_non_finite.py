"""An optimizer step with a NaN or Inf gradient is applied whole or not at all: refused with
an error naming it (the default), or skipped and counted (non_finite="skip"), in every
optimizer path, eagerly and in tf.function, in one process and under
ParameterServerStrategy. The reference is the same training without the bad batch."""

import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
import tf_keras as keras

import tfps
from tests.cluster_run import ROOT, run_cluster_program

DIM, BATCH = 4, 16


def table_state(layer):
    rows = layer.table.export()
    return {int(k): (v, s, m) for k, v, s, m in zip(rows.keys.numpy(), rows.values.numpy(),
                                                    rows.slots.numpy(), rows.metadata.numpy())}


def initial_rows(layer, keys):
    """Rows and slots a table of the layer's configuration gives `keys` when it first sees them."""
    reference = tfps.DynamicTable(layer.dim, optimizer=layer.optimizer, seed=layer.seed)
    reference.find_or_insert(np.array(keys, np.int64))
    return table_state(type("Layer", (), {"table": reference})())


def assert_unchanged_but_for_the_lookups(layer, before, after, looked_up):
    """Every row there before keeps its value and slots bit for bit (its count grows by its
    occurrences in the step's lookups); the rows the lookups added hold their initial value
    and slots; there is no other row."""
    occurrences = dict(zip(*np.unique(np.asarray(looked_up), return_counts=True)))
    for key, (value, slots, metadata) in before.items():
        np.testing.assert_array_equal(after[key][0], value)
        np.testing.assert_array_equal(after[key][1], slots)
        assert after[key][2][0] == metadata[0] + occurrences.get(key, 0)
    added = sorted(set(after) - set(before))
    assert added == sorted(set(occurrences) - set(before))
    initial = initial_rows(layer, added)
    for key in added:
        np.testing.assert_array_equal(after[key][0], initial[key][0])
        np.testing.assert_array_equal(after[key][1], initial[key][1])


# --- a custom loop in one process: two tables, one of which gets the NaN -------------------

def custom_loop(kind, policy):
    """(layers a and b, dense, optimizer, step(scale)): the loss gives table b and the dense
    layer a gradient times `scale`, table a a finite one."""
    if kind == "keras3":
        import keras as keras3
        from tfps.keras_layers.keras3 import DynamicEmbedding
        dense, optimizer = keras3.layers.Dense(1), keras3.optimizers.SGD(0.1)
    else:
        DynamicEmbedding = tfps.keras_layers.DynamicEmbedding
        dense = keras.layers.Dense(1)
        optimizer = keras.optimizers.legacy.Adagrad(0.1) if kind == "legacy" else keras.optimizers.Adagrad(0.1)
    a, b = (DynamicEmbedding(DIM, optimizer=tfps.optimizers.Adagrad(0.1), name=name, non_finite=policy)
            for name in ("a", "b"))
    ids = tf.constant([[1, 2], [3, 4]], tf.int64)

    def step(scale):
        with tf.GradientTape() as tape:
            x = tf.concat([tf.reshape(a(ids), [2, -1]), tf.reshape(b(ids), [2, -1]) * scale], 1)
            loss = tf.reduce_sum(dense(x)) + tf.reduce_sum(a(ids + 10))
        variables = dense.trainable_variables + a.trainable_variables + b.trainable_variables
        optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))

    return a, b, dense, optimizer, step


@pytest.mark.parametrize("kind", ["current", "legacy", "keras3"])
@pytest.mark.parametrize("traced", [False, True], ids=["eager", "function"])
@pytest.mark.parametrize("policy", ["refuse", "skip"])
def test_a_step_with_one_nan_table_gradient_changes_no_table_and_no_variable(kind, traced, policy):
    a, b, dense, optimizer, step = custom_loop(kind, policy)
    if traced:
        step = tf.function(step)
    step(tf.constant(1.0))
    before = [table_state(a), table_state(b), [w.numpy() for w in dense.weights], int(optimizer.iterations)]
    if policy == "refuse":
        with pytest.raises(tf.errors.InvalidArgumentError) as raised:
            step(tf.constant(np.nan, tf.float32))
        message = raised.value.message
        assert "tfps: optimizer step 2 has a non-finite gradient (NaN or Inf) of " in message
        assert "DynamicEmbedding b" in message and "DynamicEmbedding a," not in message
        assert "none of its updates ran" in message
    else:
        step(tf.constant(np.nan, tf.float32))
    for layer, rows, looked_up in ((a, before[0], [1, 2, 3, 4, 11, 12, 13, 14]), (b, before[1], [1, 2, 3, 4])):
        assert_unchanged_but_for_the_lookups(layer, rows, table_state(layer), looked_up)
        assert layer.table.stats()["skipped_steps"] == (1 if policy == "skip" else 0)
        assert int(layer.table.clocks()[0]) == 1
    for weight, value in zip(dense.weights, before[2]):
        np.testing.assert_array_equal(weight.numpy(), value)
    assert int(optimizer.iterations) == 1  # Keras 3's too
    step(tf.constant(1.0))  # training goes on
    assert int(optimizer.iterations) == 2 and int(b.table.clocks()[0]) == 2


def test_non_finite_takes_refuse_or_skip_and_round_trips_in_the_config():
    layer = tfps.keras_layers.DynamicEmbedding(DIM, non_finite="skip")
    assert layer.get_config()["non_finite"] == "skip"
    assert tfps.keras_layers.DynamicEmbedding.from_config(layer.get_config()).non_finite == "skip"
    assert tfps.keras_layers.DynamicEmbedding(DIM).non_finite == "refuse"
    with pytest.raises(ValueError, match=r"non_finite must be 'refuse' or 'skip'.*got 'ignore'"):
        tfps.keras_layers.DynamicEmbedding(DIM, non_finite="ignore")


def test_a_model_whose_tables_disagree_refuses():
    a = tfps.keras_layers.DynamicEmbedding(DIM, name="skipping", non_finite="skip")
    refusing = tfps.keras_layers.DynamicEmbedding(DIM, name="refusing")
    optimizer = keras.optimizers.SGD(0.1)
    ids = tf.constant([1, 2], tf.int64)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(a(ids)) + tf.reduce_sum(refusing(ids)) * np.nan
    variables = a.trainable_variables + refusing.trainable_variables
    with pytest.raises(tf.errors.InvalidArgumentError, match="DynamicEmbedding refusing"):
        optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
    assert a.table.stats()["skipped_steps"] == 0 and int(a.table.clocks()[0]) == 0


# --- fit in one process: with the bad batches skipped, it trains as without them ---------

def fit_data(bad):
    """Eight good batches of two IDs, three dense features and a label; with `bad`, batch 3
    of new IDs with a NaN label and a copy of batch 4 with a NaN feature go in before it."""
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 50, size=(8 * BATCH, 2)).astype(np.int64)
    features = rng.normal(size=(8 * BATCH, 3)).astype(np.float32)
    labels = (ids[:, 0] % 3 == 0).astype(np.float32)
    if not bad:
        return ids, features, labels
    nan_label = (1000 + np.arange(2 * BATCH).reshape(BATCH, 2), features[:BATCH], labels[:BATCH].copy())
    nan_label[2][0] = np.nan
    nan_feature = (ids[4 * BATCH:5 * BATCH], features[4 * BATCH:5 * BATCH].copy(), labels[4 * BATCH:5 * BATCH])
    nan_feature[1][2, 1] = np.nan
    parts = [(ids[:3 * BATCH], features[:3 * BATCH], labels[:3 * BATCH]), nan_label,
             (ids[3 * BATCH:4 * BATCH], features[3 * BATCH:4 * BATCH], labels[3 * BATCH:4 * BATCH]), nan_feature,
             (ids[4 * BATCH:], features[4 * BATCH:], labels[4 * BATCH:])]
    return tuple(np.concatenate([part[i] for part in parts]) for i in range(3))


def fit(kind, policy, data, steps_per_execution):
    keras_module = keras
    if kind == "keras3":
        import keras as keras_module
        from tfps.keras_layers.keras3 import DynamicEmbedding
        metrics = ["auc"]
    else:
        DynamicEmbedding = tfps.keras_layers.DynamicEmbedding
        metrics = [tfps.metrics.AUC(name="auc")]
    keras_module.utils.set_random_seed(1)
    embedding = DynamicEmbedding(DIM, optimizer=tfps.optimizers.Adam(0.05), name="e", non_finite=policy)
    ids, features = keras_module.Input((2,), dtype="int64"), keras_module.Input((3,))
    x = keras_module.layers.Concatenate()([keras_module.layers.Flatten()(embedding(ids)), features])
    model = keras_module.Model([ids, features], keras_module.layers.Dense(1, activation="sigmoid")(x))
    optimizer = keras.optimizers.legacy.Adam(0.01) if kind == "legacy" else keras_module.optimizers.Adam(0.01)
    model.compile(optimizer=optimizer, loss="binary_crossentropy", metrics=metrics,
                  steps_per_execution=steps_per_execution)
    history, error = None, None
    try:
        history = model.fit([data[0], data[1]], data[2], batch_size=BATCH, epochs=1, shuffle=False, verbose=0).history
    except tf.errors.InvalidArgumentError as e:
        error = e.message
    return model, embedding, history, error


@pytest.mark.parametrize("kind", ["current", "legacy", "keras3"])
@pytest.mark.parametrize("steps_per_execution", [1, 4])
def test_fit_that_skips_the_bad_batches_trains_as_fit_without_them(kind, steps_per_execution):
    clean, clean_table, clean_history, _ = fit(kind, "skip", fit_data(False), steps_per_execution)
    model, table, history, error = fit(kind, "skip", fit_data(True), steps_per_execution)
    assert error is None
    assert table.table.stats()["skipped_steps"] == 2
    assert int(model.optimizer.iterations) == int(clean.optimizer.iterations) == 8
    # The metrics leave the skipped batches out too: the same logs.
    assert history == clean_history
    for got, want in zip(model.get_weights(), clean.get_weights()):
        np.testing.assert_array_equal(got, want)
    # Every row trained equals the clean run's; the NaN-label batch's new IDs hold their
    # initial rows (its lookup added them before the gradient was known).
    want = table_state(clean_table)
    assert_unchanged_but_for_the_lookups(
        table, want, table_state(table), list(fit_data(True)[0][3 * BATCH:4 * BATCH].ravel())
        + list(fit_data(True)[0][5 * BATCH:6 * BATCH].ravel()))


@pytest.mark.parametrize("kind", ["current", "keras3"])
@pytest.mark.parametrize("steps_per_execution", [1, 4])
def test_fit_that_refuses_stops_at_the_bad_batch_with_the_steps_before_it_applied(kind, steps_per_execution):
    data = fit_data(True)
    model, table, _, error = fit(kind, "refuse", data, steps_per_execution)
    assert "optimizer step 4 has a non-finite gradient" in error
    assert int(model.optimizer.iterations) == 3 and table.table.stats()["skipped_steps"] == 0
    first = tuple(part[:3 * BATCH] for part in data)
    reference, reference_table, _, _ = fit(kind, "refuse", first, steps_per_execution=1)
    for got, want in zip(model.get_weights(), reference.get_weights()):
        np.testing.assert_array_equal(got, want)
    assert_unchanged_but_for_the_lookups(table, table_state(reference_table), table_state(table),
                                         list(data[0][3 * BATCH:4 * BATCH].ravel()))


# --- under ParameterServerStrategy ---------------------------------------------------------

@pytest.mark.parametrize("num_ps, paths", [
    (2, "current,legacy,worker_cache,synchronous,accumulator"), (3, "current,synchronous")])
def test_under_parameter_servers_every_path_applies_the_step_whole_or_not_at_all(num_ps, paths):
    out = run_cluster_program("pss_non_finite.py", "--num_ps", str(num_ps), "--paths", paths)
    assert sorted(out) == sorted(f"{p}/{policy}" for p in paths.split(",") for policy in ("refuse", "skip"))
    for name, result in out.items():
        path, policy = name.split("/")
        before, after = result["before"], result["after"]
        if policy == "refuse":
            assert "optimizer step 7 has a non-finite gradient (NaN or Inf) of DynamicEmbedding" in result["error"], name
            assert after["skipped"] == [0, 0]
        else:
            assert result["error"] is None and after["skipped"] == [1, 1], name
        assert after["iterations"] == before["iterations"] == 6, name
        assert after["clocks"] == before["clocks"], name
        assert after["dense"] == before["dense"], name
        bad_ids = np.array(result["bad_ids"])
        for column, (rows_before, rows_after) in enumerate(zip(before["rows"], after["rows"])):
            layer = type("Layer", (), {"dim": DIM, "optimizer": tfps.optimizers.Adagrad(0.2),
                                       "seed": result["seeds"][column]})()
            assert_unchanged_but_for_the_lookups(layer, rows_of(rows_before), rows_of(rows_after),
                                                 list(bad_ids[:, column]) * result["bad_reads"])
        if policy == "skip":  # training goes on
            assert result["later"]["iterations"] == 8 and result["later"]["skipped"] == [1, 1]
            assert all(c > before["clocks"][0][0] for c in result["later"]["clocks"][0]), name


def rows_of(exported):
    return {k: (np.array(v, np.float32), np.array(s, np.float32), np.array(m)) for k, v, s, m in zip(
        exported["keys"], exported["values"], exported["slots"], exported["metadata"])}


@pytest.mark.parametrize("policy", ["skip", "refuse"])
def test_under_tfps_launch_a_stream_with_nan_labels_and_features_is_skipped_or_stopped(tmp_path, policy):
    """Separate processes, batches handed out by a tf.data service (each to one worker);
    batches 6 and 26 have a NaN label, batch 17 a NaN feature."""
    import json
    out = tmp_path / "out.json"
    launched = subprocess.run(
        [sys.executable, "-m", "tfps.launch", "--num_ps", "2", "--num_workers", "2", "--log_dir",
         str(tmp_path / "logs"), os.path.join(ROOT, "tests", "cluster_programs", "launch_non_finite.py"),
         "--policy", policy, "--steps", "60", "--bad", "6,17,26", "--out", str(out)],
        capture_output=True, text=True, timeout=600, cwd=str(tmp_path),
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=ROOT))
    result = json.loads(out.read_text())
    if policy == "skip":
        assert launched.returncode == 0, launched.stderr[-3000:]
        assert result["error"] is None
        # Each bad batch is one skipped step; the others trained, and the logs are finite.
        assert result["skipped_steps"] == 3
        assert result["iterations"] == result["clock"] == 57
        assert np.isfinite(result["history"]["loss"][0]) and np.isfinite(result["history"]["auc"][0])
        logged = "".join(open(tmp_path / "logs" / f"worker_{i}.log").read() for i in range(2))
        assert logged.count("tfps: skipped optimizer step") == 3
    else:
        # The job stops with the chief's error, at the first bad batch (the second is 17).
        assert launched.returncode == 1
        assert "restart" not in (tmp_path / "logs" / "launcher.log").read_text()
        assert "has a non-finite gradient (NaN or Inf) of DynamicEmbedding ids_table" in result["error"]
        step = int(result["error"].split("optimizer step ")[1].split()[0])
        assert step < 17 and result["iterations"] < 17  # the steps of both workers race a little
        assert result["skipped_steps"] == 0
