"""DynamicTable ops against NumPy references, eagerly and in tf.function."""

import numpy as np
import pytest
import tensorflow as tf
import tf_keras as keras

import tfps
from tests import reference

EDGE_KEYS = np.array([0, -1, np.iinfo(np.int64).min, np.iinfo(np.int64).max, 1, 0x80, 0xFE],
                     np.int64)


def random_keys(n, seed=0):
    return np.random.default_rng(seed).integers(np.iinfo(np.int64).min, np.iinfo(np.int64).max,
                                                size=n, dtype=np.int64)


@pytest.mark.parametrize("kind,params,initializer", [
    ("uniform", (-0.3, 0.7), tfps.initializers.RandomUniform(-0.3, 0.7)),
    ("truncated_normal", (0.1, 0.5), tfps.initializers.TruncatedNormal(0.1, 0.5)),
    ("zeros", (0.0, 0.0), tfps.initializers.Zeros()),
])
def test_missing_keys_read_their_deterministic_initial_value(run, kind, params, initializer):
    table = tfps.DynamicTable(6, initializer=initializer, seed=1234)
    keys = np.concatenate([EDGE_KEYS, random_keys(40)])
    values, exists = run(lambda k: table.find(k, return_exists=True), tf.constant(keys))
    expected = np.stack([reference.initial_row(int(k), 6, 1234, kind, *params) for k in keys])
    np.testing.assert_array_max_ulp(values, expected, maxulp=1)
    assert not exists.any()
    assert int(table.size()) == 0
    # The same key in another table with the same seed gets the same vector; another seed not.
    same = tfps.DynamicTable(6, initializer=initializer, seed=1234)
    np.testing.assert_array_equal(same.find_or_insert(keys).numpy(), values)
    if kind != "zeros":
        other = tfps.DynamicTable(6, initializer=initializer, seed=1235)
        assert not np.allclose(other.find(keys).numpy(), values)


def test_find_or_insert_inserts_and_find_reads_back(run):
    table = tfps.DynamicTable(3, seed=5)
    keys = np.array([[7, 8], [7, -1]], np.int64)  # any shape, duplicates allowed
    inserted = run(table.find_or_insert, tf.constant(keys))
    assert inserted.shape == (2, 2, 3)
    np.testing.assert_array_equal(inserted[0, 0], inserted[1, 0])
    assert int(table.size()) == 3
    values, exists = run(lambda k: table.find(k, return_exists=True), tf.constant(keys))
    np.testing.assert_array_equal(values, inserted)
    assert exists.all()


def test_uint64_and_int64_views_of_a_key_are_the_same_key():
    table = tfps.DynamicTable(2, seed=9)
    table.insert(tf.constant([-1, np.iinfo(np.int64).min], tf.int64), [[1.0, 2.0], [3.0, 4.0]])
    as_uint = tf.constant([2 ** 64 - 1, 2 ** 63], tf.uint64)
    values, exists = table.find(as_uint, return_exists=True)
    np.testing.assert_array_equal(values.numpy(), [[1.0, 2.0], [3.0, 4.0]])
    assert exists.numpy().all()


def test_int32_keys_are_widened():
    table = tfps.DynamicTable(2)
    table.insert([5], [[1.0, 1.0]])
    np.testing.assert_array_equal(table.find(tf.constant([5], tf.int32)).numpy(), [[1.0, 1.0]])


OPTIMIZERS = [
    ("sgd", tfps.optimizers.SGD(0.3), {}),
    ("adagrad", tfps.optimizers.Adagrad(0.2, initial_accumulator_value=0.5, epsilon=1e-6),
     {"initial_accumulator_value": 0.5, "epsilon": 1e-6}),
    ("adam", tfps.optimizers.Adam(0.05, beta_1=0.8, beta_2=0.95, epsilon=1e-5),
     {"beta_1": 0.8, "beta_2": 0.95, "epsilon": 1e-5}),
    ("ftrl", tfps.optimizers.Ftrl(0.4, initial_accumulator_value=0.2,
                                  l1_regularization_strength=0.01,
                                  l2_regularization_strength=0.02),
     {"initial_accumulator_value": 0.2, "l1": 0.01, "l2": 0.02, "lr_power": -0.5}),
    ("ftrl", tfps.optimizers.Ftrl(0.4, learning_rate_power=-0.7, beta=0.3),
     {"lr_power": -0.7, "l2": 0.3 / (2 * 0.4)}),
    # L1 as large as the gradients: many coordinates exactly 0 (FTRL's other branch).
    ("ftrl", tfps.optimizers.Ftrl(0.4, l1_regularization_strength=1.0, l2_regularization_strength=0.02),
     {"l1": 1.0, "l2": 0.02, "lr_power": -0.5}),
    ("rmsprop", tfps.optimizers.RMSprop(0.05), {}),
    ("rmsprop", tfps.optimizers.RMSprop(0.05, rho=0.8, momentum=0.5, epsilon=1e-4),
     {"rho": 0.8, "momentum": 0.5, "epsilon": 1e-4}),
]


@pytest.mark.parametrize("name,optimizer,hp", OPTIMIZERS)
def test_optimizer_math_over_steps_with_repeated_keys(run, name, optimizer, hp):
    dim, seed = 4, 77
    table = tfps.DynamicTable(dim, optimizer=optimizer, seed=seed,
                              initializer=tfps.initializers.RandomUniform(-1, 1))
    ref = reference.RowOptimizer(name, dim, optimizer.learning_rate, **hp)
    rows, steps = {}, {}
    rng = np.random.default_rng(3)
    universe = np.concatenate([EDGE_KEYS[:4], random_keys(6, seed=1)])
    apply = lambda k, g, s: table.apply_gradients(k, g, step=s)  # noqa: E731
    for step in range(1, 7):
        # Keys recur across steps and within a call: a repeated key is updated once per
        # occurrence, in input order.
        keys = rng.choice(universe, size=5, replace=False)
        keys = np.concatenate([keys, keys[:2]])
        grads = rng.normal(size=(len(keys), dim)).astype(np.float32)
        run(apply, tf.constant(keys), tf.constant(grads), tf.constant(step, tf.int64))
        for k, g in zip(keys, grads):
            k = int(k)
            if k not in rows:
                rows[k] = (reference.initial_row(k, dim, seed, "uniform", -1, 1).astype(np.float64),
                           ref.initial_slots())
            steps[k] = steps.get(k, 0) + 1
            rows[k] = ref.apply(rows[k][0], rows[k][1], g.astype(np.float64), steps[k])
    exported = table.export()
    by_key = {int(k): i for i, k in enumerate(exported.keys.numpy())}
    assert set(by_key) == set(rows)
    for k, (value, slots) in rows.items():
        i = by_key[k]
        np.testing.assert_allclose(exported.values.numpy()[i], value, rtol=2e-5, atol=2e-6)
        np.testing.assert_allclose(exported.slots.numpy()[i], slots, rtol=2e-5, atol=2e-6)
        count, _, opt_step, _ = exported.metadata.numpy()[i]
        assert count == 0  # applies do not count occurrences; training lookups do
        assert opt_step == (steps[k] if name == "adam" else 0)
    zeros = sum(int((value == 0.0).sum()) for value, _ in rows.values())
    assert int((exported.values.numpy() == 0.0).sum()) == zeros
    if hp.get("l1", 0.0) >= 1.0:
        assert zeros >= len(rows) * dim // 4, zeros


def test_adagrad_and_ftrl_match_tensorflows_own_sparse_apply():
    dim, n = 5, 12
    keys = np.arange(n, dtype=np.int64) * 1000003
    start = np.random.default_rng(0).normal(size=(n, dim)).astype(np.float32)
    for optimizer, raw_apply, slot_inits in [
        (tfps.optimizers.Adagrad(0.1), lambda v, s, i, g: tf.raw_ops.ResourceSparseApplyAdagradV2(
            var=v.handle, accum=s[0].handle, lr=0.1, epsilon=1e-7, grad=g, indices=i), [0.1]),
        (tfps.optimizers.Ftrl(0.2, l1_regularization_strength=0.001, l2_regularization_strength=0.01),
         lambda v, s, i, g: tf.raw_ops.ResourceSparseApplyFtrl(
             var=v.handle, accum=s[0].handle, linear=s[1].handle, grad=g, indices=i, lr=0.2,
             l1=0.001, l2=0.01, lr_power=-0.5), [0.1, 0.0]),
    ]:
        table = tfps.DynamicTable(dim, optimizer=optimizer)
        table.insert(keys, start)
        var = tf.Variable(start)
        slots = [tf.Variable(tf.fill([n, dim], v)) for v in slot_inits]
        rng = np.random.default_rng(1)
        for step in range(5):
            idx = rng.choice(n, size=6, replace=False)
            grads = rng.normal(size=(6, dim)).astype(np.float32)
            table.apply_gradients(keys[idx], grads, step=step)
            raw_apply(var, slots, tf.constant(idx, tf.int64), grads)
        np.testing.assert_allclose(table.find(keys).numpy(), var.numpy(), rtol=1e-6, atol=1e-7)


def test_insert_keeps_slots_and_remove_forgets(run):
    table = tfps.DynamicTable(2, optimizer=tfps.optimizers.Adagrad(0.1),
                              initializer=tfps.initializers.Zeros())
    table.apply_gradients([1, 2], [[1.0, 1.0], [2.0, 2.0]])
    run(table.insert, tf.constant([1, 3], tf.int64), tf.constant([[5.0, 6.0], [7.0, 8.0]]))
    rows = table.export()
    by_key = dict(zip(rows.keys.numpy().tolist(), range(3)))
    np.testing.assert_allclose(rows.slots.numpy()[by_key[1]], [[1.1, 1.1]], rtol=1e-6)
    np.testing.assert_allclose(rows.slots.numpy()[by_key[3]], [[0.1, 0.1]], rtol=1e-6)
    np.testing.assert_array_equal(rows.values.numpy()[by_key[1]], [5.0, 6.0])
    removed = run(table.remove, tf.constant([1, 99], tf.int64))
    assert removed == 1
    _, exists = table.find([1, 2, 3], return_exists=True)
    np.testing.assert_array_equal(exists.numpy(), [False, True, True])
    np.testing.assert_array_equal(table.find([1]).numpy(), [[0.0, 0.0]])
    assert int(table.size()) == 2


def test_empty_inputs(run):
    table = tfps.DynamicTable(3)
    empty = tf.zeros([0], tf.int64)
    assert run(table.find, empty).shape == (0, 3)
    assert run(table.find, tf.zeros([2, 0], tf.int64)).shape == (2, 0, 3)
    assert run(table.find_or_insert, empty).shape == (0, 3)
    run(lambda k, g: table.apply_gradients(k, g), empty, tf.zeros([0, 3]))
    run(table.insert, empty, tf.zeros([0, 3]))
    assert run(table.remove, empty) == 0
    rows = table.export()
    assert rows.keys.shape == (0,) and rows.values.shape == (0, 3)
    assert rows.slots.shape == (0, 1, 3) and rows.metadata.shape == (0, 4)
    assert list(table.export_chunks(10)) == []
    assert int(table.size()) == 0


def test_export_in_bounded_chunks_covers_every_row_once(run):
    table = tfps.DynamicTable(2, optimizer="adam", seed=3)
    keys = random_keys(1000, seed=4)
    table.find_or_insert(keys)
    table.apply_gradients(keys[:300], np.ones((300, 2), np.float32), step=11)
    seen, cursor, chunks = [], 0, 0
    while cursor >= 0:
        rows, cursor = run(lambda c: table.export_chunk(c, 128), tf.constant(cursor, tf.int64))
        assert len(rows.keys) <= 128
        seen.append(rows)
        chunks += 1
    assert chunks >= 8
    all_keys = np.concatenate([r.keys for r in seen])
    assert sorted(all_keys.tolist()) == sorted(keys.tolist())
    metadata = np.concatenate([r.metadata for r in seen])
    trained = np.isin(all_keys, keys[:300])
    # Every key was looked up once (its count); 300 were then trained at step 11.
    np.testing.assert_array_equal(metadata[trained], [[1, 11, 1, 0]] * 300)
    np.testing.assert_array_equal(metadata[~trained], [[1, 0, 0, 0]] * 700)
    full = table.export()
    np.testing.assert_array_equal(np.sort(full.keys.numpy()), np.sort(all_keys))


def test_import_rows_round_trip_into_another_table(run):
    source = tfps.DynamicTable(3, optimizer="ftrl", seed=1)
    keys = np.concatenate([EDGE_KEYS, random_keys(50)])
    source.apply_gradients(keys, np.random.default_rng(0).normal(size=(len(keys), 3)), step=4)
    rows = source.export()
    target = tfps.DynamicTable(3, optimizer="ftrl", seed=2)
    run(target.import_rows, rows)
    copied = target.export()
    order_a, order_b = np.argsort(rows.keys.numpy()), np.argsort(copied.keys.numpy())
    for a, b in zip(rows, copied):
        np.testing.assert_array_equal(a.numpy()[order_a], b.numpy()[order_b])


@pytest.mark.parametrize("dim,n", [(16, 500), (64, 500), (64, 40_000)])
def test_rows_of_whole_cache_lines_read_back_exactly(run, dim, n):
    # Rows of 16 floats or a multiple fill whole cache lines, which the ops write out with
    # streaming stores; 40K rows at dim 64 (10 MB) also take the large-output path.
    table = tfps.DynamicTable(dim, optimizer="sgd", seed=4)
    rng = np.random.default_rng(dim + n)
    keys = random_keys(n, seed=n)
    stored = rng.normal(size=(n, dim)).astype(np.float32)
    run(table.insert, tf.constant(keys), tf.constant(stored))
    missing = random_keys(n // 4, seed=n + 1)
    query = np.concatenate([keys, missing, keys[:7]])
    order = rng.permutation(len(query))
    want = np.concatenate([stored, np.stack([reference.initial_row(int(k), dim, 4, "uniform", -0.05, 0.05)
                                             for k in missing]), stored[:7]])[order]
    values, exists = run(lambda k: table.find(k, return_exists=True), tf.constant(query[order]))
    np.testing.assert_array_equal(values, want)
    np.testing.assert_array_equal(exists, (order < n) | (order >= n + len(missing)))
    np.testing.assert_array_equal(run(table.find_or_insert, tf.constant(query[order])), want)
    assert int(table.size()) == n + len(missing)


def test_large_batches_grow_the_table_and_keep_every_row():
    # 300K keys at dim 8 is a 9.6 MB output, large enough that the op pre-faults it.
    table = tfps.DynamicTable(8, optimizer="sgd", seed=8)
    keys = np.arange(300_000, dtype=np.int64) * 7919  # clustered IDs
    first = table.find_or_insert(keys).numpy()
    assert int(table.size()) == len(keys)
    values, exists = table.find(keys, return_exists=True)
    assert exists.numpy().all()
    np.testing.assert_array_equal(values.numpy(), first)
    sample = np.r_[0:3, 1021:300_000:40_009, len(keys) - 1]
    np.testing.assert_array_equal(first[sample], np.stack(
        [reference.initial_row(int(keys[i]), 8, 8, "uniform", -0.05, 0.05) for i in sample]))


def test_large_outputs_stay_intact_while_held_and_when_their_memory_is_reused():
    # 140K keys at dim 16 is a 9 MB output: such outputs come from a cache of output blocks
    # that hands a freed block to the next output of a similar size.
    table = tfps.DynamicTable(16, optimizer="sgd", seed=3)
    keys_a = np.arange(140_000, dtype=np.int64) * 3 + 1
    keys_b = keys_a + 1
    sample = np.r_[0:2, 70_001, len(keys_a) - 1]

    def expected(keys):
        return np.stack([reference.initial_row(int(keys[i]), 16, 3, "uniform", -0.05, 0.05) for i in sample])

    held_a = table.find(keys_a)
    held_b = table.find_or_insert(keys_b)
    np.testing.assert_array_equal(held_a.numpy()[sample], expected(keys_a))
    sum_a = float(tf.reduce_sum(held_a))
    del held_a
    again_a = tf.function(table.find)(keys_a)  # may reuse the block of the output just freed
    np.testing.assert_array_equal(again_a.numpy()[sample], expected(keys_a))
    assert float(tf.reduce_sum(again_a)) == sum_a
    np.testing.assert_array_equal(held_b.numpy()[sample], expected(keys_b))


def test_negative_step_records_the_tables_own_apply_count():
    table = tfps.DynamicTable(2, optimizer="sgd")
    for _ in range(3):
        table.apply_gradients([5], [[1.0, 1.0]], step=-1)
    table.apply_gradients([6], [[1.0, 1.0]], step=-1)
    rows = table.export()
    last_seen = dict(zip(rows.keys.numpy().tolist(), rows.metadata.numpy()[:, 1].tolist()))
    assert last_seen == {5: 3, 6: 4}


@pytest.mark.parametrize("batch_size", [1, 10, 100])
def test_counts_are_occurrences_whatever_the_batch_size(batch_size):
    # 4 IDs: ID i occurs 100 * (i + 1) times in 1000 examples, in batches of any size.
    ids = keras.Input((), dtype=tf.int64)
    layer = tfps.keras_layers.DynamicEmbedding(2, optimizer=tfps.optimizers.SGD(0.01), seed=1)
    model = keras.Model(ids, keras.layers.Dense(1)(layer(ids)))
    model.compile(optimizer="sgd", loss="mse")
    x = np.repeat(np.arange(4, dtype=np.int64), [100, 200, 300, 400])
    np.random.default_rng(0).shuffle(x)
    model.fit(x, np.zeros(len(x), np.float32), batch_size=batch_size, epochs=1, verbose=0)
    rows = layer.table.export()
    counts = dict(zip(rows.keys.numpy().tolist(), rows.metadata.numpy()[:, 0].tolist()))
    assert counts == {0: 100, 1: 200, 2: 300, 3: 400}
    model.predict(x, batch_size=100, verbose=0)  # inference counts nothing
    assert layer.table.export().metadata.numpy()[:, 0].sum() == 1000


def test_find_or_insert_counts_given_occurrences_or_one_per_entry():
    table = tfps.DynamicTable(2, optimizer="sgd")
    table.find_or_insert(tf.constant([7, 8], tf.int64), occurrences=tf.constant([5, 0], tf.int64))
    table.find_or_insert(tf.constant([7, 7, 9], tf.int64))
    rows = table.export()
    counts = dict(zip(rows.keys.numpy().tolist(), rows.metadata.numpy()[:, 0].tolist()))
    assert counts == {7: 7, 8: 0, 9: 1}
    with pytest.raises(tf.errors.InvalidArgumentError, match="occurrences must be >= 0"):
        table.find_or_insert(tf.constant([7], tf.int64), occurrences=tf.constant([-1], tf.int64))
    with pytest.raises(tf.errors.InvalidArgumentError, match="occurrences must be empty or have the keys' shape"):
        table.find_or_insert(tf.constant([7, 8], tf.int64), occurrences=tf.constant([1], tf.int64))
