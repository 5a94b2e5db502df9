"""A DynamicEmbedding's worker cache (GEO-style): with max_staleness_steps=0 training is
exactly uncached training; with k > 0 rows, slots and the head follow a NumPy simulation of
the cache (rows pulled once per cycle of k + 1 steps, gradients of cached rows summed and
pushed at the cycle's end, the rest pushed every step), in every execution mode."""

import numpy as np
import pytest
import tf_keras as keras

import tfps
from tests.cluster_run import run_cluster_program
from tests.reference import RowOptimizer, initial_row
from tests.test_sparse_updates import (DIM, HEAD_LR, KERAS_SGD, MODES, TABLE_OPTIMIZERS, VOCAB,
                                       build_model, check_against_oracle, data, train)


def cached_training_oracle(optimizer_name, ids, labels, kernel, seed, staleness, capacity,
                           copy_rate_scale=1, transfer=None):
    """Rows, slots and the head's kernel after the batches, simulating each step's cache as
    the module docstring of tfps.table._worker_cache describes it (the copies trained at
    copy_rate_scale times the table's rate). Float64. With `transfer` (a rounding
    function), pulled rows and pushed gradients pass through it (a table's transfer_dtype)."""
    transfer = transfer or (lambda x: x)
    _, hp = TABLE_OPTIMIZERS[optimizer_name]
    hp = dict(hp)
    rate = hp.pop("lr")
    row_optimizer = RowOptimizer(optimizer_name, DIM, rate, **hp)
    copy_optimizer = RowOptimizer(optimizer_name, DIM, rate * copy_rate_scale, **hp)
    rows = {int(k): initial_row(int(k), DIM, seed, "uniform", -0.05, 0.05).astype(np.float64)
            for k in VOCAB}
    slots = {k: row_optimizer.initial_slots() for k in rows}
    steps = {k: 0 for k in rows}
    kernel, bias = kernel.astype(np.float64).copy(), 0.0
    cache, sums = {}, {}

    def push(gradients):
        for k, g in gradients.items():
            steps[k] += 1
            rows[k], slots[k] = row_optimizer.apply(rows[k], slots[k], transfer(g), steps[k])

    for step, (batch_ids, y) in enumerate(zip(ids, labels), start=1):
        read = {}
        for k in dict.fromkeys(int(k) for k in batch_ids.reshape(-1)):  # first-seen order
            if k in cache:
                read[k] = cache[k][0]
            else:
                read[k] = transfer(rows[k]).copy()
                if len(cache) < capacity:
                    cache[k] = [read[k], row_optimizer.initial_slots(), 0]
        summed = np.stack([sum(read[int(k)] for k in example) for example in batch_ids])
        residual = 2.0 * (summed @ kernel + bias - y) / len(y)
        gradients = {}
        for example, r in zip(batch_ids, residual):
            for k in example:
                gradients[int(k)] = gradients.get(int(k), 0.0) + r * kernel
        direct = {}
        for k, g in gradients.items():
            if k in cache:
                sums[k] = sums.get(k, 0.0) + g
                copy, copy_slots, copy_steps = cache[k]
                cache[k] = [*copy_optimizer.apply(copy, copy_slots, g, copy_steps + 1), copy_steps + 1]
            else:
                direct[k] = g
        if step % (staleness + 1) == 0:
            direct.update(sums)
            cache, sums = {}, {}
        push(direct)
        kernel -= HEAD_LR * (summed.T @ residual)
        bias -= HEAD_LR * residual.sum()
    push(sums)  # the flush at the end of training
    return rows, slots, kernel


def assert_follows_simulation(keys, values, slots, expected_rows, expected_slots):
    """The exported rows and slots (in the table's order) against the simulation's."""
    order = np.argsort(keys)
    keys = np.asarray(keys)[order]
    np.testing.assert_array_equal(keys, np.sort(VOCAB))
    np.testing.assert_allclose(np.asarray(values)[order], np.stack([expected_rows[int(k)] for k in keys]),
                               rtol=2e-4, atol=2e-6)
    np.testing.assert_allclose(np.asarray(slots)[order], np.stack([expected_slots[int(k)] for k in keys]),
                               rtol=2e-4, atol=2e-6)


def assert_table_follows_simulation(layer, expected_rows, expected_slots):
    exported = layer.table.export()
    assert_follows_simulation(exported.keys.numpy(), exported.values.numpy(), exported.slots.numpy(),
                              expected_rows, expected_slots)


def train_cached(mode, family, optimizer_name, staleness, capacity, copy_rate_scale=1):
    ids, labels = data()
    model, layer, head = build_model(optimizer_name, worker_cache_rows=capacity,
                                     max_staleness_steps=staleness)
    assert layer.worker_cache.copy_rate_scale == 1  # one worker: this process
    layer.worker_cache.copy_rate_scale = copy_rate_scale  # as if it were one of several
    kernel0 = head.kernel.numpy()[:, 0].copy()
    train(mode, model, KERAS_SGD[family](), ids, labels)
    if not mode.startswith("fit"):  # fit flushes at the epoch's end
        layer.flush_worker_cache()
    return layer, head, ids, labels, kernel0


@pytest.mark.parametrize("family", ["current", "legacy"])
@pytest.mark.parametrize("mode", MODES)
def test_without_staleness_a_cached_table_trains_exactly_as_an_uncached_one(mode, family):
    layer, head, ids, labels, kernel0 = train_cached(mode, family, "adagrad", 0, 1000)
    check_against_oracle(layer, head, "adagrad", ids, labels, kernel0)


@pytest.mark.parametrize("capacity", [1000, 5], ids=["all-cached", "overflowing"])
@pytest.mark.parametrize("family", ["current", "legacy"])
@pytest.mark.parametrize("mode", MODES)
def test_stale_rows_and_summed_pushes_follow_the_cache_simulation(mode, family, capacity):
    staleness = 2
    layer, head, ids, labels, kernel0 = train_cached(mode, family, "adagrad", staleness, capacity)
    rows, slots, kernel = cached_training_oracle("adagrad", ids, labels, kernel0, layer.seed,
                                                 staleness, capacity)
    assert_table_follows_simulation(layer, rows, slots)
    np.testing.assert_allclose(head.kernel.numpy()[:, 0], kernel, rtol=2e-4, atol=2e-6)
    # The simulation is not uncached training in disguise: staleness changes the rows.
    fresh = cached_training_oracle("adagrad", ids, labels, kernel0, layer.seed, 0, capacity)[0]
    assert max(np.abs(fresh[k] - rows[k]).max() for k in rows) > 1e-3


@pytest.mark.parametrize("mode", ["eager", "fit_spe10"])
def test_with_several_workers_the_copies_train_at_their_number_times_the_rate(mode):
    staleness, capacity, workers = 2, 1000, 3
    layer, head, ids, labels, kernel0 = train_cached(mode, "current", "adagrad", staleness, capacity, workers)
    rows, slots, kernel = cached_training_oracle("adagrad", ids, labels, kernel0, layer.seed,
                                                 staleness, capacity, workers)
    assert_table_follows_simulation(layer, rows, slots)
    np.testing.assert_allclose(head.kernel.numpy()[:, 0], kernel, rtol=2e-4, atol=2e-6)
    at_one_rate = cached_training_oracle("adagrad", ids, labels, kernel0, layer.seed, staleness, capacity)[0]
    assert max(np.abs(at_one_rate[k] - rows[k]).max() for k in rows) > 1e-3


@pytest.mark.parametrize("family", ["current", "legacy"])
def test_under_mixed_precision_the_cache_trains_the_unscaled_gradient(family):
    ids, labels = data()
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model, layer, head = build_model("adagrad", worker_cache_rows=1000, max_staleness_steps=2)
        kernel0 = head.kernel.numpy()[:, 0].astype(np.float32)
        # A fixed loss scale: a dynamic one skips the first steps (their scaled gradients
        # overflow float16), which the simulation does not.
        optimizer = keras.mixed_precision.LossScaleOptimizer(KERAS_SGD[family](), dynamic=False,
                                                             initial_scale=256)
        train("fit", model, optimizer, ids, labels)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    rows, slots, kernel = cached_training_oracle("adagrad", ids, labels, kernel0, layer.seed, 2, 1000)
    exported = layer.table.export()
    order = np.argsort(exported.keys.numpy())
    np.testing.assert_array_equal(exported.keys.numpy()[order], np.sort(VOCAB))
    expected = np.stack([rows[int(k)] for k in np.sort(VOCAB)])
    expected_slots = np.stack([slots[int(k)] for k in np.sort(VOCAB)])
    # float16 activations round the gradients: close to the float64 simulation, not equal;
    # a gradient left scaled by 256 would be far off.
    np.testing.assert_allclose(exported.values.numpy()[order], expected, rtol=0, atol=2e-3 * np.abs(expected).max())
    np.testing.assert_allclose(exported.slots.numpy()[order], expected_slots, rtol=0,
                               atol=1e-3 * np.abs(expected_slots).max())
    np.testing.assert_allclose(head.kernel.numpy()[:, 0], kernel, rtol=0, atol=1e-3)


@pytest.mark.parametrize("optimizer_name", ["sgd", "adam", "ftrl", "rmsprop"])
def test_each_table_optimizer_applies_the_pushed_sums(optimizer_name):
    layer, head, ids, labels, kernel0 = train_cached("fit_spe10", "current", optimizer_name, 3, 1000)
    rows, slots, _ = cached_training_oracle(optimizer_name, ids, labels, kernel0, layer.seed, 3, 1000)
    assert_table_follows_simulation(layer, rows, slots)


def test_fit_pushes_the_caches_before_the_users_epoch_end_callbacks():
    ids, labels = data()
    model, layer, _ = build_model("sgd", worker_cache_rows=1000, max_staleness_steps=100)
    seen = []

    class RowsAtEpochEnd(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            seen.append(layer.table.find(np.sort(VOCAB)).numpy())

    model.compile(optimizer=KERAS_SGD["current"](), loss="mse")
    model.fit(ids.reshape(-1, ids.shape[-1]), labels.reshape(-1), batch_size=ids.shape[1],
              shuffle=False, verbose=0, callbacks=[RowsAtEpochEnd()])
    initial = np.stack([initial_row(int(k), DIM, layer.seed, "uniform", -0.05, 0.05) for k in np.sort(VOCAB)])
    # 20 steps inside one cycle of 101: without the flush, no row would have moved.
    assert np.abs(seen[0] - initial).max(axis=1).min() > 1e-3
    np.testing.assert_array_equal(seen[0], layer.table.find(np.sort(VOCAB)).numpy())


def test_validation_inside_fit_reads_the_rows_with_the_epochs_last_cycle_pushed():
    ids, labels = data()
    x, y = ids.reshape(-1, ids.shape[-1]), labels.reshape(-1)
    losses = {}
    for cache in (None, 1000):
        model, _, _ = build_model("sgd", worker_cache_rows=cache, max_staleness_steps=cache and 100)
        model.compile(optimizer=KERAS_SGD["current"](), loss="mse")
        history = model.fit(x, y, batch_size=ids.shape[1], shuffle=False, verbose=0, validation_data=(x, y))
        losses[cache] = (history.history["val_loss"][0], model.evaluate(x, y, verbose=0))
    # 20 steps inside one cycle of 101: without a push before validation, it would read
    # the rows as initialized. With one worker and SGD the pushed sum is the 20 steps.
    assert losses[1000][0] == pytest.approx(losses[1000][1], rel=1e-6)
    assert losses[1000][0] == pytest.approx(losses[None][0], rel=1e-6)


def test_a_flush_skips_a_worker_that_is_gone_and_pushes_the_others(caplog):
    ids, labels = data()
    model, layer, _ = build_model("sgd", worker_cache_rows=1000, max_staleness_steps=100)
    train("function", model, KERAS_SGD["current"](), ids, labels)
    before = layer.table.find(np.sort(VOCAB)).numpy()
    # A worker killed and restarting is not a device the coordinator knows at that moment.
    layer.worker_cache._devices = ["/job:worker/replica:0/task:7/device:CPU:0", None]  # pylint: disable=protected-access
    layer.flush_worker_cache()
    assert "was not pushed" in caplog.text and "task:7" in caplog.text
    assert np.abs(layer.table.find(np.sort(VOCAB)).numpy() - before).max(axis=1).min() > 1e-4


@pytest.mark.parametrize("kwargs, message", [
    (dict(worker_cache_rows=10), "needs max_staleness_steps"),
    (dict(max_staleness_steps=2), "needs worker_cache_rows"),
    (dict(worker_cache_rows=0, max_staleness_steps=2), "worker_cache_rows"),
    (dict(worker_cache_rows=10, max_staleness_steps=-1), "max_staleness_steps must be an int >= 0"),
    (dict(worker_cache_rows=10, max_staleness_steps=1.5), "max_staleness_steps must be an int >= 0"),
    (dict(worker_cache_rows=10, max_staleness_steps=2,
          eviction=tfps.eviction.DecayedFrequency(0.9, 0.5)), "scores rows by their occurrences"),
    (dict(worker_cache_rows=10, max_staleness_steps=2, max_rows=100, eviction=tfps.eviction.LFU()),
     "scores rows by their occurrences"),
    (dict(worker_cache_rows=10, max_staleness_steps=4, eviction=tfps.eviction.TTL(steps=5)),
     "give a longer TTL"),
])
def test_bad_cache_arguments_are_refused_naming_the_problem(kwargs, message):
    with pytest.raises(ValueError, match=message):
        tfps.keras_layers.DynamicEmbedding(4, **kwargs)


def test_the_cache_round_trips_through_the_layer_config():
    layer = tfps.keras_layers.DynamicEmbedding(4, worker_cache_rows=64, max_staleness_steps=3)
    copy = tfps.keras_layers.DynamicEmbedding.from_config(layer.get_config())
    assert (copy.worker_cache_rows, copy.max_staleness_steps) == (64, 3)
    assert copy.worker_cache is not None


@pytest.mark.parametrize("capacity", [1000, 5], ids=["all-cached", "overflowing"])
def test_under_parameter_server_strategy_each_worker_caches_in_its_own_memory(capacity):
    out = run_cluster_program("pss_worker_cache.py", str(capacity))
    for run in ("fit", "custom_loop"):
        trained = out[run]
        rows, slots, kernel = cached_training_oracle(
            "adagrad", *data(), np.array(trained["kernel0"]), trained["seed"], 2, capacity)
        assert_follows_simulation(trained["keys"], trained["values"], trained["slots"], rows, slots)
        np.testing.assert_allclose(trained["kernel"], kernel, rtol=2e-4, atol=2e-6)
    assert out["fit_validation_loss"] == pytest.approx(out["evaluate_loss_after_fit"], rel=1e-6)
    # 20 steps in cycles of 3: the last two steps' rows wait on the worker, nowhere else.
    held = out["cached_rows_before_flush"]
    assert 0 < held["worker"] <= capacity
    assert held["coordinator"] == 0 and held["ps"] == 0
    assert out["cached_rows_after_flush"] == 0
