"""The table's update follows the Keras optimizer step as a stock Embedding's does: clipping,
mixed precision (unscaled, skipped with the step), a layer used twice per step, freezing,
gradients computed without a step, inference, and what cannot be supported raises."""

import numpy as np
import pytest
import tensorflow as tf
import tf_keras as keras

import tfps

VOCAB, DIM, FIELDS, BATCH = 30, 4, 3, 16
KERNEL = np.linspace(-0.6, 0.6, FIELDS * DIM)[:, None]


def batches(steps=12, seed=3):
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, VOCAB, size=(steps * BATCH, FIELDS)).astype(np.int64)  # repeats
    return ids, rng.normal(size=steps * BATCH).astype(np.float32)


def start_rows():
    return np.random.default_rng(0).normal(scale=0.3, size=(VOCAB, DIM)).astype(np.float32)


def head():
    return keras.layers.Dense(1, kernel_initializer=keras.initializers.Constant(KERNEL))


def stock_model():
    ids = keras.Input((FIELDS,), dtype=tf.int64)
    embedding = keras.layers.Embedding(VOCAB, DIM, embeddings_initializer=keras.initializers.Constant(start_rows()))
    return keras.Model(ids, head()(keras.layers.Flatten()(embedding(ids)))), embedding


def tfps_model(table_optimizer, layer_kwargs=None):
    ids = keras.Input((FIELDS,), dtype=tf.int64)
    layer = tfps.keras_layers.DynamicEmbedding(DIM, optimizer=table_optimizer, **(layer_kwargs or {}))
    model = keras.Model(ids, head()(keras.layers.Flatten()(layer(ids))))
    layer.table.insert(np.arange(VOCAB, dtype=np.int64), start_rows())
    return model, layer


def table_rows(layer):
    return layer.table.find(np.arange(VOCAB, dtype=np.int64)).numpy()


def fit_both(keras_optimizer_fn, table_optimizer, steps_per_execution=1, x=None, y=None):
    """Stock and tfps models trained on the same batches: (stock rows, tfps rows)."""
    if x is None:
        x, y = batches()
    stock, embedding = stock_model()
    ours, layer = tfps_model(table_optimizer)
    for model in (stock, ours):
        model.compile(optimizer=keras_optimizer_fn(), loss="mse", steps_per_execution=steps_per_execution)
        model.fit(x, y, batch_size=BATCH, shuffle=False, verbose=0)
    return embedding.embeddings.numpy(), table_rows(layer)


@pytest.mark.parametrize("keras_optimizer_fn", [
    lambda: keras.optimizers.SGD(1.0, clipnorm=0.01),
    lambda: keras.optimizers.SGD(1.0, global_clipnorm=1e-3),
    lambda: keras.optimizers.SGD(1.0, clipvalue=1e-3),
    lambda: keras.optimizers.legacy.SGD(1.0, clipnorm=0.01),
    lambda: keras.optimizers.legacy.SGD(1.0, global_clipnorm=1e-3),
    lambda: keras.optimizers.legacy.SGD(1.0, clipvalue=1e-3),
], ids=["clipnorm", "global_clipnorm", "clipvalue", "legacy-clipnorm", "legacy-global_clipnorm",
        "legacy-clipvalue"])
def test_clipping_treats_the_table_gradient_as_a_stock_embedding_gradient(keras_optimizer_fn):
    stock, ours = fit_both(keras_optimizer_fn, tfps.optimizers.SGD(1.0), steps_per_execution=4)
    np.testing.assert_allclose(ours, stock, rtol=0, atol=1e-6)
    _, unclipped = fit_both(lambda: keras.optimizers.SGD(1.0), tfps.optimizers.SGD(1.0))
    moved = np.abs(ours - start_rows()).max()
    assert 0 < moved < 0.2 * np.abs(unclipped - start_rows()).max()


def test_rmsprop_follows_keras_legacy_rmsprop_on_a_stock_embedding():
    # With momentum, Keras applies TensorFlow's own ResourceSparseApplyRMSProp kernel to the
    # embedding: an oracle written by neither tfps nor its tests.
    stock, ours = fit_both(
        lambda: keras.optimizers.legacy.RMSprop(0.02, rho=0.8, momentum=0.5, epsilon=1e-6),
        tfps.optimizers.RMSprop(0.02, rho=0.8, momentum=0.5, epsilon=1e-6), steps_per_execution=3)
    assert np.abs(stock - start_rows()).max(axis=1).min() > 1e-3  # every row trained
    np.testing.assert_allclose(ours, stock, rtol=0, atol=2e-6)


@pytest.fixture
def mixed_precision():
    keras.mixed_precision.set_global_policy("mixed_float16")
    yield
    keras.mixed_precision.set_global_policy("float32")


def test_mixed_precision_unscales_the_table_gradient(mixed_precision):
    mixed_stock, mixed_ours = fit_both(lambda: keras.optimizers.SGD(0.5), tfps.optimizers.SGD(0.5))
    keras.mixed_precision.set_global_policy("float32")
    _, float32_ours = fit_both(lambda: keras.optimizers.SGD(0.5), tfps.optimizers.SGD(0.5))
    update, float32_update = mixed_ours - start_rows(), float32_ours - start_rows()
    assert np.abs(float32_update).max() > 0.05
    # float16 activations round the gradient; an unscaled one would be 32768 times larger.
    np.testing.assert_allclose(update, float32_update, rtol=0, atol=2e-3 * np.abs(float32_update).max())
    np.testing.assert_allclose(mixed_ours, mixed_stock, rtol=0, atol=1e-5)


def test_a_step_the_loss_scale_optimizer_skips_leaves_the_table_alone(mixed_precision):
    model, layer = tfps_model(tfps.optimizers.SGD(0.5))
    optimizer = keras.mixed_precision.LossScaleOptimizer(keras.optimizers.SGD(0.5))
    model.compile(optimizer=optimizer, loss="mse")
    x, y = batches(steps=1)
    scale = float(optimizer.loss_scale)
    model.fit(x, np.full_like(y, np.inf), batch_size=BATCH, verbose=0)  # non-finite gradients
    assert float(optimizer.loss_scale) == scale / 2  # the step was skipped
    np.testing.assert_array_equal(table_rows(layer), start_rows())
    model.fit(x, y, batch_size=BATCH, verbose=0)
    assert np.abs(table_rows(layer) - start_rows()).max() > 1e-3


def shared_models(table_optimizer):
    """A table used twice per step (a target ID and a history of IDs), tfps and stock."""
    target, history = keras.Input((1,), dtype=tf.int64), keras.Input((FIELDS - 1,), dtype=tf.int64)
    layer = tfps.keras_layers.DynamicEmbedding(DIM, optimizer=table_optimizer)
    embedding = keras.layers.Embedding(VOCAB, DIM, embeddings_initializer=keras.initializers.Constant(start_rows()))
    models = []
    for embed in (layer, embedding):
        x = keras.layers.Concatenate()([keras.layers.Flatten()(embed(target)), keras.layers.Flatten()(embed(history))])
        models.append(keras.Model([target, history], head()(x)))
    layer.table.insert(np.arange(VOCAB, dtype=np.int64), start_rows())
    return models, layer, embedding


@pytest.mark.parametrize("steps_per_execution", [1, 5])
def test_a_table_used_twice_per_step_updates_once_with_the_summed_gradient(steps_per_execution):
    (ours, stock), layer, embedding = shared_models(tfps.optimizers.Adagrad(0.3))
    x, y = batches()
    for model in (ours, stock):
        model.compile(optimizer=keras.optimizers.legacy.Adagrad(0.3, initial_accumulator_value=0.1),
                      loss="mse", steps_per_execution=steps_per_execution)
        model.fit([x[:, :1], x[:, 1:]], y, batch_size=BATCH, shuffle=False, verbose=0)
    assert np.abs(table_rows(layer) - start_rows()).max() > 0.05
    np.testing.assert_allclose(table_rows(layer), embedding.embeddings.numpy(), rtol=0, atol=1e-5)


def test_adam_advances_a_shared_tables_row_step_once_per_optimizer_step():
    (ours, _), layer, _ = shared_models(tfps.optimizers.Adam(0.01))
    x, y = batches()
    ours.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse", steps_per_execution=3)
    ours.fit([x[:, :1], x[:, 1:]], y, batch_size=BATCH, shuffle=False, verbose=0)
    rows = layer.table.export()
    batches_holding = {k: len({i // BATCH for i in np.nonzero((x == k).any(1))[0]}) for k in range(VOCAB)}
    np.testing.assert_array_equal(rows.metadata.numpy()[:, 2], [batches_holding[k] for k in rows.keys.numpy()])


def test_a_frozen_layer_neither_trains_nor_grows():
    model, layer = tfps_model(tfps.optimizers.SGD(1.0))
    layer.trainable = False
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse", steps_per_execution=4)
    x, y = batches()
    model.fit(x + VOCAB // 2, y, batch_size=BATCH, verbose=0)  # half the IDs are new
    np.testing.assert_array_equal(table_rows(layer), start_rows())
    assert layer.table.shard_sizes() == [VOCAB]
    assert layer.table_proxy not in model.trainable_variables


def custom_loop(model, variables_of, apply_step=True):
    optimizer = keras.optimizers.SGD(0.5)
    x, y = batches(steps=3)

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x, training=True)[:, 0] - y))
        variables = variables_of(model)
        gradients = tape.gradient(loss, variables)
        if apply_step:
            optimizer.apply_gradients(zip(gradients, variables))
        return gradients

    for i in range(3):
        step(x[i * BATCH:(i + 1) * BATCH], y[i * BATCH:(i + 1) * BATCH])


def test_fine_tuning_the_head_alone_leaves_the_table_alone():
    model, layer = tfps_model(tfps.optimizers.SGD(1.0))
    kernel = model.layers[-1].kernel.numpy()
    custom_loop(model, lambda m: m.layers[-1].trainable_variables)
    assert np.abs(model.layers[-1].kernel.numpy() - kernel).max() > 1e-3
    np.testing.assert_array_equal(table_rows(layer), start_rows())


def test_computing_gradients_without_an_optimizer_step_leaves_the_table_alone():
    model, layer = tfps_model(tfps.optimizers.SGD(1.0))
    custom_loop(model, lambda m: m.trainable_variables, apply_step=False)
    np.testing.assert_array_equal(table_rows(layer), start_rows())


def test_evaluate_and_predict_neither_train_nor_insert():
    model, layer = tfps_model(tfps.optimizers.SGD(1.0))
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse", steps_per_execution=5)
    x, y = batches()
    model.evaluate(x + VOCAB // 2, y, batch_size=BATCH, verbose=0)
    model.predict(x + VOCAB // 2, batch_size=BATCH, verbose=0)
    np.testing.assert_array_equal(table_rows(layer), start_rows())
    assert layer.table.shard_sizes() == [VOCAB]


def test_a_mirrored_strategy_is_refused_when_the_layer_is_made():
    with tf.distribute.MirroredStrategy(["/cpu:0"]).scope():
        with pytest.raises(ValueError, match="MirroredStrategy is not supported"):
            tfps.keras_layers.DynamicEmbedding(DIM)


def test_weight_decay_and_ema_that_cannot_reach_the_rows_are_refused():
    x, y = batches(steps=1)
    for optimizer, message in ((keras.optimizers.AdamW(weight_decay=0.01), "exclude_from_weight_decay"),
                               (keras.optimizers.SGD(0.1, use_ema=True), "use_ema")):
        model, _ = tfps_model(tfps.optimizers.SGD(1.0))
        model.compile(optimizer=optimizer, loss="mse")
        with pytest.raises(ValueError, match=message):
            model.fit(x, y, batch_size=BATCH, verbose=0)
    model, layer = tfps_model(tfps.optimizers.SGD(1.0))
    optimizer = keras.optimizers.AdamW(weight_decay=0.01)
    optimizer.exclude_from_weight_decay(var_names=["table_proxy"])
    model.compile(optimizer=optimizer, loss="mse")
    model.fit(x, y, batch_size=BATCH, verbose=0)
    assert np.abs(table_rows(layer) - start_rows()).max() > 1e-3


def test_an_optimizer_that_cannot_carry_the_table_gradient_refuses_it():
    model, layer = tfps_model(tfps.optimizers.SGD(1.0))
    x, y = batches(steps=1)
    optimizer = tf.compat.v1.train.GradientDescentOptimizer(0.1)
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(model(x, training=True)[:, 0] - y))
    gradients = tape.gradient(loss, model.trainable_variables)
    with pytest.raises(TypeError, match="GradientDescentOptimizer cannot apply the gradient of DynamicEmbedding"):
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))
    np.testing.assert_array_equal(table_rows(layer), start_rows())


def accumulate(model, accumulator_or_none, optimizer, x, y, k, compiled):
    """Steps of k micro-batches each, their gradients summed (by the accumulator, or for a
    stock model by adding the tensors) and applied once. An accumulator of numbered
    contributions takes micro-batch i as contribution i, after a first attempt of it that
    set another micro-batch's gradient, which the second must replace."""
    variables = model.trainable_variables

    def micro_gradients(xs, ys):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.square(tf.squeeze(model(xs, training=True), -1) - ys))
        return tape.gradient(loss, variables)

    def step(xs, ys):
        if accumulator_or_none is None:
            summed = None
            for i in range(k):
                grads = [tf.convert_to_tensor(g) for g in micro_gradients(xs[i], ys[i])]
                summed = grads if summed is None else [a + b for a, b in zip(summed, grads)]
            optimizer.apply_gradients(zip(summed, variables))
            return
        for i in range(k):
            if accumulator_or_none.contributions is None:
                accumulator_or_none.add(micro_gradients(xs[i], ys[i]))
                continue
            accumulator_or_none.add(micro_gradients(xs[(i + 1) % k], ys[(i + 1) % k]), contribution=i)
            accumulator_or_none.add(micro_gradients(xs[i], ys[i]), contribution=i)
        accumulator_or_none.apply_to(optimizer)
    run = tf.function(step) if compiled else step
    for s in range(len(x) // (k * BATCH)):
        xs = x[s * k * BATCH:(s + 1) * k * BATCH].reshape(k, BATCH, FIELDS)
        ys = y[s * k * BATCH:(s + 1) * k * BATCH].reshape(k, BATCH)
        run(tf.constant(xs), tf.constant(ys))


@pytest.mark.parametrize("shared_by_workers,contributions", [(False, None), (True, None), (True, 3)],
                         ids=["slices", "summed-per-key", "numbered-contributions"])
@pytest.mark.parametrize("compiled", [False, True])
def test_accumulating_three_micro_batches_updates_the_table_once_with_their_sum(compiled, shared_by_workers,
                                                                               contributions):
    x, y = batches()
    stock, embedding = stock_model()
    accumulate(stock, None, keras.optimizers.SGD(0.01), x, y, k=3, compiled=compiled)
    ours, layer = tfps_model(tfps.optimizers.SGD(0.01))
    accumulator = tfps.GradientAccumulator(ours.trainable_variables, shared_by_workers=shared_by_workers,
                                           contributions=contributions)
    accumulate(ours, accumulator, keras.optimizers.SGD(0.01), x, y, k=3, compiled=compiled)
    np.testing.assert_allclose(table_rows(layer), embedding.embeddings.numpy(), rtol=1e-5, atol=1e-6)
    assert np.abs(table_rows(layer) - start_rows()).max() > 1e-2  # the rows really trained
    assert max(layer.table.clocks().numpy()) == len(x) // (3 * BATCH)  # one table update per apply


@pytest.mark.parametrize("compiled", [False, True])
def test_under_loss_scaling_a_shared_accumulator_skips_the_steps_the_default_one_skips(compiled):
    """mixed_float16 and a LossScaleOptimizer, whose first scaled gradients overflow: a
    table refuses Inf, so a shared add counts it and its sums read NaN, and the optimizer
    skips those steps as it does with the default accumulator's slices. Both must end on
    the same rows, moved by the steps that were not skipped."""
    def trained(shared, contributions=None):
        keras.mixed_precision.set_global_policy("mixed_float16")
        try:
            ours, layer = tfps_model(tfps.optimizers.SGD(0.01))
        finally:
            keras.mixed_precision.set_global_policy("float32")
        optimizer = keras.mixed_precision.LossScaleOptimizer(keras.optimizers.SGD(0.01))
        accumulator = tfps.GradientAccumulator(ours.trainable_variables, shared_by_workers=shared,
                                               contributions=contributions)

        def step(xs, ys):
            for i in range(3):
                with tf.GradientTape() as tape:
                    loss = optimizer.get_scaled_loss(tf.reduce_sum(tf.square(
                        tf.cast(tf.squeeze(ours(xs[i], training=True), -1), tf.float32) - ys[i])))
                accumulator.add(optimizer.get_unscaled_gradients(tape.gradient(loss, ours.trainable_variables)),
                                contribution=None if contributions is None else i)
            accumulator.apply_to(optimizer)
        run = tf.function(step) if compiled else step
        x, y = batches(steps=3 * 24)
        for s in range(len(x) // (3 * BATCH)):
            run(tf.constant(x[s * 3 * BATCH:(s + 1) * 3 * BATCH].reshape(3, BATCH, FIELDS)),
                tf.constant(y[s * 3 * BATCH:(s + 1) * 3 * BATCH].reshape(3, BATCH)))
        return table_rows(layer), float(optimizer.loss_scale)

    (slices, scale), (summed, shared_scale) = trained(False), trained(True)
    numbered, numbered_scale = trained(True, contributions=3)
    assert scale == shared_scale == numbered_scale < 2.0 ** 15  # steps were skipped, as many in each
    np.testing.assert_allclose(summed, slices, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(numbered, slices, rtol=1e-5, atol=1e-6)
    assert np.abs(slices - start_rows()).max() > 1e-3


@pytest.mark.parametrize("clipping", [{"clipvalue": 1e-3}, {"clipnorm": 0.01}, {"global_clipnorm": 1e-3}],
                         ids=["clipvalue", "clipnorm", "global_clipnorm"])
def test_numbered_contributions_clip_as_one_process_clips_their_whole_batch(clipping):
    """Three micro-batches set as contributions 0 to 2 (the loss of each a third of the
    whole batch's mean) train the table as a stock Embedding trained on the three at once:
    the table's slices are kept as the tape gave them, so clipping sees each occurrence's
    slice, as in one process, not each key's sum."""
    k = 3
    x, y = batches(steps=k * 8)
    stock, embedding = stock_model()
    stock_optimizer = keras.optimizers.SGD(1.0, **clipping)
    ours, layer = tfps_model(tfps.optimizers.SGD(1.0))
    optimizer = keras.optimizers.SGD(1.0, **clipping)
    accumulator = tfps.GradientAccumulator(ours.trainable_variables, shared_by_workers=True, contributions=k)
    for s in range(len(x) // (k * BATCH)):
        xs, ys = x[s * k * BATCH:(s + 1) * k * BATCH], y[s * k * BATCH:(s + 1) * k * BATCH]
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(stock(xs, training=True)[:, 0] - ys))
        stock_optimizer.apply_gradients(zip(tape.gradient(loss, stock.trainable_variables), stock.trainable_variables))
        for i in range(k):
            with tf.GradientTape() as tape:
                part = tf.reduce_mean(tf.square(ours(xs[i * BATCH:(i + 1) * BATCH], training=True)[:, 0]
                                                - ys[i * BATCH:(i + 1) * BATCH])) / k
            accumulator.add(tape.gradient(part, ours.trainable_variables), contribution=i)
        accumulator.apply_to(optimizer)
    np.testing.assert_allclose(table_rows(layer), embedding.embeddings.numpy(), rtol=0, atol=1e-6)
    moved = np.abs(table_rows(layer) - start_rows()).max()
    assert moved > 1e-4  # clipped, but trained


@pytest.mark.parametrize("compiled", [False, True])
def test_an_apply_missing_a_numbered_contribution_is_refused_naming_it(compiled):
    ours, layer = tfps_model(tfps.optimizers.SGD(0.01))
    optimizer = keras.optimizers.SGD(0.01)
    accumulator = tfps.GradientAccumulator(ours.trainable_variables, shared_by_workers=True, contributions=3)
    x, y = batches(steps=1)

    def add(i):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(ours(x, training=True)[:, 0] - y))
        accumulator.add(tape.gradient(loss, ours.trainable_variables), contribution=i)

    def apply():
        accumulator.apply_to(optimizer)
    add, apply = (tf.function(add), tf.function(apply)) if compiled else (add, apply)
    add(0)
    add(2)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"(?s)apply_to: contributions.{0,4}\b1\b.{0,4}were not set since the last apply"):
        apply()
    assert int(optimizer.iterations) == 0 and np.array_equal(table_rows(layer), start_rows())
    add(1)
    apply()
    assert int(optimizer.iterations) == 1
    add(0)  # the apply started over: contributions 1 and 2 are missing again
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"(?s)apply_to: contributions.{0,4}\b1,? 2\b.{0,4}were not set"):
        apply()


def test_numbered_contributions_are_refused_where_they_cannot_be_kept():
    ours, _ = tfps_model(tfps.optimizers.SGD(0.01))
    variables = ours.trainable_variables
    with pytest.raises(ValueError, match="contributions=2 numbers the workers' adds .* shared_by_workers=True"):
        tfps.GradientAccumulator(variables, contributions=2)
    with pytest.raises(ValueError, match="contributions must be a positive int"):
        tfps.GradientAccumulator(variables, shared_by_workers=True, contributions=0)
    numbered = tfps.GradientAccumulator(variables, shared_by_workers=True, contributions=2)
    for wrong in (None, 2, -1, 1.0, tf.constant(1)):
        with pytest.raises(ValueError, match=r"contribution must be a Python int in \[0, 2\) .* a tensor cannot"):
            numbered.add([None] * len(variables), contribution=wrong)
    with pytest.raises(ValueError, match="contribution=0 needs an accumulator made with contributions="):
        tfps.GradientAccumulator(variables).add([None] * len(variables), contribution=0)


def test_a_shared_accumulator_refuses_a_table_with_a_worker_cache():
    """The chief applies a shared accumulator's steps, and a worker cache's copies are
    refreshed only by the applies of the worker holding them: the workers would read their
    first copies forever (under tfps-launch, synchronous rows then differ from uncached
    ones even at max_staleness_steps=0). In one process, accumulation with a cache works."""
    ids = keras.Input((FIELDS,), dtype=tf.int64)
    cached = tfps.keras_layers.DynamicEmbedding(DIM, optimizer=tfps.optimizers.SGD(0.1), worker_cache_rows=64,
                                                max_staleness_steps=0, name="cached_ids")
    model = keras.Model(ids, keras.layers.Dense(1)(keras.layers.Flatten()(cached(ids))))
    with pytest.raises(ValueError, match="DynamicEmbedding 'cached_ids' has a worker cache .*worker_cache_rows=64"):
        tfps.GradientAccumulator(model.trainable_variables, shared_by_workers=True)
    tfps.GradientAccumulator(model.trainable_variables)  # in one process, the apply refreshes it


def test_a_shared_accumulator_keeps_every_add_of_threads_adding_at_once():
    """shared_by_workers=True: workers add at once. Four threads stand for them here, each
    adding the same gradients 100 times: a table's (into its per-key sums) and a stock
    variable's slices (a gather's gradient, added densely under the variable's lock,
    where scatter_add would let two adds of one row overwrite each other)."""
    import threading
    ours, layer = tfps_model(tfps.optimizers.SGD(1.0))
    gathered = tf.Variable(tf.zeros([2, 1 << 17]))
    variables = ours.trainable_variables + [gathered]
    x, y = batches(steps=1)

    def gradients():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.square(ours(x, training=True)[:, 0] - y)) + tf.reduce_sum(
                tf.gather(gathered, [0]))
        return tape.gradient(loss, variables)

    once = tfps.GradientAccumulator(variables)
    once.add(gradients())
    expected = once.gradients()
    shared = tfps.GradientAccumulator(variables, shared_by_workers=True)

    @tf.function
    def add_100():
        for _ in tf.range(100):
            shared.add(gradients())

    add_100.get_concrete_function()
    threads = [threading.Thread(target=add_100) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    got = shared.gradients()
    for index, (variable, want, have) in enumerate(zip(variables, expected, got)):
        if variable is layer.table_proxy:
            keys, rows = have.indices.numpy(), have.values.numpy()
            sums = {}
            for key, row in zip(want.indices.numpy(), want.values.numpy()):
                sums[int(key)] = sums.get(int(key), 0) + row.astype(np.float64)
            assert sorted(keys.tolist()) == sorted(sums)
            for key, row in zip(keys, rows):
                np.testing.assert_allclose(row, 400 * sums[int(key)], rtol=1e-4, atol=1e-4)  # a lost add: 2.5e-3
        else:
            np.testing.assert_allclose(tf.convert_to_tensor(have).numpy(),
                                       400 * tf.convert_to_tensor(want).numpy(), rtol=1e-4, atol=1e-4,
                                       err_msg=variable.name)
    assert tf.convert_to_tensor(got[-1]).numpy()[0].min() == 400.0  # each of 131,072 elements


@pytest.mark.parametrize("compiled", [False, True])
def test_an_apply_with_nothing_accumulated_is_refused_and_steps_nothing(compiled):
    ours, layer = tfps_model(tfps.optimizers.SGD(0.01))
    optimizer = keras.optimizers.Adam(0.01)
    accumulator = tfps.GradientAccumulator(ours.trainable_variables)

    def apply(optimizer):
        accumulator.apply_to(optimizer)

    apply = tf.function(apply) if compiled else apply
    x, y = batches(steps=1)
    for _ in range(2):  # refused at first, and again after an apply has started over
        accumulator.add([None] * len(ours.trainable_variables))  # a loss that reached nothing
        with pytest.raises(tf.errors.InvalidArgumentError, match="no gradients were added since the last apply"):
            apply(optimizer)
        assert int(optimizer.iterations) == (0 if _ == 0 else 1)
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(ours(x, training=True)[:, 0] - y))
        accumulator.add(tape.gradient(loss, ours.trainable_variables))
        apply(optimizer)
        assert int(optimizer.iterations) == (1 if _ == 0 else 2)


@pytest.mark.parametrize("compiled", [False, True])
def test_summing_table_gradients_densely_fails_naming_the_accumulator(compiled):
    ours, layer = tfps_model(tfps.optimizers.SGD(0.05))
    stock, embedding = stock_model()
    x, _ = batches(steps=1)
    dense_total = tf.Variable(tf.zeros_like(layer.table_proxy))  # the usual variable accumulator
    names_it = r"gradient of a DynamicEmbedding table .* has no dense form, so .* cannot sum it.*tfps.GradientAccumulator"

    def gradient_of(model, variable):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(model(x, training=True))
        return tape.gradient(loss, variable)

    forms = {"add_n": lambda g: tf.add_n([g, g, g]), "plus": lambda g: g + g,
             "tensor_plus": lambda g: tf.zeros_like(dense_total) + g,
             "assign_add": lambda g: dense_total.assign_add(g)}
    for name, form in forms.items():
        def summed(form=form):
            return form(gradient_of(ours, layer.table_proxy))
        # Eagerly at once; in tf.function when it runs (a graph's list inputs hide errors).
        with pytest.raises((TypeError, tf.errors.InvalidArgumentError), match=names_it):
            (tf.function(summed) if compiled else summed)()
    np.testing.assert_array_equal(table_rows(layer), start_rows())
    # Other IndexedSlices still densify and add as before: a stock Embedding's, k = 3.
    stock_gradient = gradient_of(stock, embedding.embeddings)
    np.testing.assert_allclose(tf.add_n([stock_gradient] * 3).numpy(),
                               3 * tf.convert_to_tensor(stock_gradient).numpy(), rtol=1e-6)
    np.testing.assert_allclose((tf.zeros_like(embedding.embeddings) + stock_gradient).numpy(),
                               tf.convert_to_tensor(stock_gradient).numpy())
    import os
    guide = open(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "keras.md")).read()
    assert "tfps.GradientAccumulator" in guide
