"""The table trains exactly once per optimizer step, in every execution mode: rows, slots and
per-row step counts against a NumPy oracle of the whole model (table optimizer on the rows,
Keras SGD on the head)."""

import numpy as np
import pytest
import tensorflow as tf
import tf_keras as keras

import tfps
from tests.reference import RowOptimizer, initial_row

DIM, FIELDS, BATCH, STEPS, HEAD_LR = 3, 3, 8, 20, 0.05
# Repeats within and across batches; negative and extreme keys are ordinary keys.
VOCAB = np.array([0, 1, 2, 3, 5, 8, 13, 21, -1, -7, -(1 << 63), (1 << 63) - 1], np.int64)

TABLE_OPTIMIZERS = {
    "sgd": (lambda: tfps.optimizers.SGD(0.3), dict(lr=0.3)),
    "adagrad": (lambda: tfps.optimizers.Adagrad(0.2), dict(lr=0.2)),
    "adam": (lambda: tfps.optimizers.Adam(0.05), dict(lr=0.05)),
    "ftrl": (lambda: tfps.optimizers.Ftrl(0.2, l1_regularization_strength=0.001,
                                          l2_regularization_strength=0.01),
             dict(lr=0.2, l1=0.001, l2=0.01)),
    # L1 as large as the gradients' sums: FTRL's branch that sets coordinates exactly to 0.
    "ftrl_l1": (lambda: tfps.optimizers.Ftrl(0.2, l1_regularization_strength=0.05,
                                             l2_regularization_strength=0.01),
                dict(lr=0.2, l1=0.05, l2=0.01)),
    "rmsprop": (lambda: tfps.optimizers.RMSprop(0.05, rho=0.8, momentum=0.5),
                dict(lr=0.05, rho=0.8, momentum=0.5)),
}
KERAS_SGD = {"current": lambda: keras.optimizers.SGD(HEAD_LR),
             "legacy": lambda: keras.optimizers.legacy.SGD(HEAD_LR)}


def data():
    rng = np.random.default_rng(7)
    ids = rng.choice(VOCAB, size=(STEPS, BATCH, FIELDS))
    labels = rng.normal(size=(STEPS, BATCH)).astype(np.float32)
    return ids, labels


def numpy_oracle(optimizer_name, ids, labels, kernel, bias, seed, table_lr_at=None, clip_row_norm=None,
                 l2=0.0, min_count=None, transfer=None):
    """Rows, slots and per-row step counts after STEPS of: prediction = (sum of the row of
    each field's ID) . kernel + bias, loss = mean squared error (+ l2 * the squared norm of
    each distinct row the step looks up), the table optimizer on rows (at learning rate
    table_lr_at(step), if given; each row's gradient clipped to clip_row_norm, if given) and
    SGD on kernel and bias. Float64. With min_count, an ID has a row only from the step its
    occurrences so far reach min_count; before, it reads zeros and gets no gradient (rows,
    slots and steps then hold just the admitted IDs). With `transfer` (a rounding function),
    the rows a step reads and the gradients sent to the table (before its clipping) pass
    through it: what a table's transfer_dtype does to them."""
    transfer = transfer or (lambda x: x)
    _, hp = TABLE_OPTIMIZERS[optimizer_name]
    hp = dict(hp)
    row_optimizer = RowOptimizer(optimizer_name.split("_")[0], DIM, hp.pop("lr"), **hp)
    fixed_lr = row_optimizer.lr
    rows = {int(k): initial_row(int(k), DIM, seed, "uniform", -0.05, 0.05).astype(np.float64)
            for k in VOCAB}
    slots = {k: row_optimizer.initial_slots() for k in rows}
    steps = {k: 0 for k in rows}
    kernel, bias = kernel.astype(np.float64).copy(), float(bias)
    occurred = {k: 0 for k in rows}
    admitted = set(rows) if min_count is None else set()
    for step, (batch_ids, y) in enumerate(zip(ids, labels)):
        row_optimizer.lr = table_lr_at(step) if table_lr_at is not None else fixed_lr
        for k in batch_ids.reshape(-1):
            occurred[int(k)] += 1
        admitted |= {k for k, n in occurred.items() if min_count is not None and n >= min_count}
        row = {k: transfer(rows[k]) if k in admitted else np.zeros(DIM) for k in rows}
        summed = np.stack([sum(row[int(k)] for k in example) for example in batch_ids])
        residual = 2.0 * (summed @ kernel + bias - y) / len(y)
        row_gradients = {}
        for example, r in zip(batch_ids, residual):
            for k in example:
                if int(k) in admitted:
                    row_gradients[int(k)] = row_gradients.get(int(k), 0.0) + r * kernel
        for k in row_gradients:
            row_gradients[k] = transfer(row_gradients[k] + 2.0 * l2 * row[k])  # the row the step read
            norm = np.linalg.norm(row_gradients[k])
            if clip_row_norm is not None and norm > clip_row_norm:
                row_gradients[k] = row_gradients[k] * clip_row_norm / norm
        for k, g in row_gradients.items():
            steps[k] += 1
            rows[k], slots[k] = row_optimizer.apply(rows[k], slots[k], g, steps[k])
        kernel -= HEAD_LR * (summed.T @ residual)
        bias -= HEAD_LR * residual.sum()
    keep = lambda d: {k: v for k, v in d.items() if k in admitted}  # noqa: E731
    return keep(rows), keep(slots), keep(steps), kernel


def build_model(optimizer_name, table_optimizer=None, **layer_args):
    ids = keras.Input((FIELDS,), dtype=tf.int64)
    # A fixed seed: the default derives from the layer's name, which depends on how many
    # layers the process made before.
    layer = tfps.keras_layers.DynamicEmbedding(
        DIM, combiner="sum", seed=11,
        optimizer=table_optimizer or TABLE_OPTIMIZERS[optimizer_name][0](), **layer_args)
    head = keras.layers.Dense(1, kernel_initializer=keras.initializers.Constant([0.5, -0.3, 0.8]),
                              bias_initializer="zeros")
    model = keras.Model(ids, tf.squeeze(head(layer(ids)), -1))
    return model, layer, head


def mse(y, prediction):
    return tf.reduce_mean(tf.square(prediction - y))


def train(mode, model, optimizer, ids, labels):
    """Runs STEPS optimizer steps over the batches in the given execution mode."""
    if mode.startswith("fit"):
        model.compile(optimizer=optimizer, loss="mse",
                      steps_per_execution=10 if mode == "fit_spe10" else 1)
        model.fit(ids.reshape(-1, FIELDS), labels.reshape(-1), batch_size=BATCH, shuffle=False,
                  epochs=1, verbose=0)
        return

    def step(x, y):
        with tf.GradientTape() as tape:
            # A plain call, as many custom loops write it: under a tape it trains.
            prediction = model(x) if mode == "plain_call" else model(x, training=True)
            loss = mse(y, prediction) + tf.add_n([tf.constant(0.0)] + model.losses)
        variables = model.trainable_variables
        optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))

    if mode == "eager":
        for x, y in zip(ids, labels):
            step(tf.constant(x), tf.constant(y))
    elif mode in ("function", "plain_call"):
        compiled = tf.function(step)
        for x, y in zip(ids, labels):
            compiled(tf.constant(x), tf.constant(y))
    elif mode == "range_loop":
        @tf.function
        def run_all(all_ids, all_labels):
            for i in tf.range(STEPS):
                step(all_ids[i], all_labels[i])
        run_all(tf.constant(ids), tf.constant(labels))
    else:
        raise ValueError(mode)


def check_against_oracle(layer, head, optimizer_name, ids, labels, kernel0, table_lr_at=None, **oracle_args):
    rows, slots, steps, kernel = numpy_oracle(optimizer_name, ids, labels, kernel0, 0.0, layer.seed,
                                              table_lr_at, **oracle_args)
    exported = layer.table.export()
    order = np.argsort(exported.keys.numpy())
    keys = exported.keys.numpy()[order]
    np.testing.assert_array_equal(keys, np.sort(VOCAB))
    expected_rows = np.stack([rows[int(k)] for k in keys])
    initial = np.stack([initial_row(int(k), DIM, layer.seed, "uniform", -0.05, 0.05) for k in keys])
    assert np.abs(expected_rows - initial).max(axis=1).min() > 1e-3  # every row really trains
    np.testing.assert_allclose(exported.values.numpy()[order], expected_rows, rtol=2e-4, atol=2e-6)
    np.testing.assert_allclose(exported.slots.numpy()[order], np.stack([slots[int(k)] for k in keys]),
                               rtol=2e-4, atol=2e-6)
    # The table counts its applies: once per optimizer step, so a key's last-seen step is
    # the last batch that holds it, and Adam's per-row step is the number of such batches.
    metadata = exported.metadata.numpy()[order]
    last_batch = [1 + max(i for i, batch in enumerate(ids) if k in batch) for k in keys]
    np.testing.assert_array_equal(metadata[:, 1], last_batch)
    row_steps = [steps[int(k)] if optimizer_name == "adam" else 0 for k in keys]
    np.testing.assert_array_equal(metadata[:, 2], row_steps)
    np.testing.assert_allclose(head.kernel.numpy()[:, 0], kernel, rtol=2e-4, atol=2e-6)


MODES = ["eager", "function", "range_loop", "plain_call", "fit", "fit_spe10"]


def trains_like_its_oracle(optimizer_name, mode, family="current"):
    """Trains the model with `optimizer_name`'s table in `mode`, checks it against the
    oracle, and returns (layer, ids, labels, kernel0) for further checks."""
    ids, labels = data()
    model, layer, head = build_model(optimizer_name)
    kernel0 = head.kernel.numpy()[:, 0].copy()
    train(mode, model, KERAS_SGD[family](), ids, labels)
    check_against_oracle(layer, head, optimizer_name, ids, labels, kernel0)
    return layer, ids, labels, kernel0


@pytest.mark.parametrize("family", ["current", "legacy"])
@pytest.mark.parametrize("mode", MODES)
def test_every_execution_mode_trains_the_table_once_per_step(mode, family):
    trains_like_its_oracle("adagrad", mode, family)


@pytest.mark.parametrize("mode", ["range_loop", "fit_spe10"])
@pytest.mark.parametrize("optimizer_name", ["sgd", "adam", "ftrl", "rmsprop"])
def test_each_table_optimizer_follows_its_oracle_inside_loops(optimizer_name, mode):
    trains_like_its_oracle(optimizer_name, mode)


@pytest.mark.parametrize("mode", ["eager", "function", "plain_call", "fit"])
def test_rmsprop_follows_its_oracle_in_the_other_modes(mode):
    # The optimizer docs/extending.md adds: its momentum slot carries updates across steps.
    trains_like_its_oracle("rmsprop", mode, "legacy")


@pytest.mark.parametrize("mode", ["eager", "function", "fit", "fit_spe10"])
def test_ftrl_l1_sets_exactly_the_oracles_coordinates_to_zero(mode):
    layer, ids, labels, kernel0 = trains_like_its_oracle("ftrl_l1", mode)
    rows = numpy_oracle("ftrl_l1", ids, labels, kernel0, 0.0, layer.seed)[0]
    exported = layer.table.export()
    values = exported.values.numpy()[np.argsort(exported.keys.numpy())]
    expected = np.stack([rows[int(k)] for k in np.sort(VOCAB)])
    np.testing.assert_array_equal(values == 0.0, expected == 0.0)
    assert (values == 0.0).sum() >= 8  # of 36 coordinates


# ExponentialDecay(0.3, 4, 0.5): the table's rate halves every 4 Keras optimizer steps.
def _decaying():
    return keras.optimizers.schedules.ExponentialDecay(0.3, decay_steps=4, decay_rate=0.5)


def _decaying_rate(step):
    return 0.3 * 0.5 ** (step / 4)


@pytest.mark.parametrize("mode", ["eager", "range_loop", "fit", "fit_spe10"])
@pytest.mark.parametrize("optimizer_name", ["adagrad", "ftrl"])
def test_a_learning_rate_schedule_is_evaluated_on_the_keras_optimizer_step(optimizer_name, mode):
    ids, labels = data()
    hp = dict(TABLE_OPTIMIZERS[optimizer_name][1])
    hp.pop("lr")
    table_optimizer = (tfps.optimizers.Adagrad(_decaying()) if optimizer_name == "adagrad" else
                       tfps.optimizers.Ftrl(_decaying(), l1_regularization_strength=hp["l1"],
                                            l2_regularization_strength=hp["l2"]))
    model, layer, head = build_model(optimizer_name, table_optimizer)
    kernel0 = head.kernel.numpy()[:, 0].copy()
    train(mode, model, KERAS_SGD["current"](), ids, labels)
    check_against_oracle(layer, head, optimizer_name, ids, labels, kernel0, _decaying_rate)


def test_a_learning_rate_variable_changed_by_a_callback_takes_effect_from_the_next_step():
    ids, labels = data()
    rate = tf.Variable(0.2)

    class LowerTheRate(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            if batch == 10:
                rate.assign(0.02)

    model, layer, head = build_model("adagrad", tfps.optimizers.Adagrad(rate))
    kernel0 = head.kernel.numpy()[:, 0].copy()
    model.compile(optimizer=KERAS_SGD["current"](), loss="mse")
    model.fit(ids.reshape(-1, FIELDS), labels.reshape(-1), batch_size=BATCH, shuffle=False, epochs=1,
              verbose=0, callbacks=[LowerTheRate()])
    check_against_oracle(layer, head, "adagrad", ids, labels, kernel0, lambda step: 0.2 if step < 10 else 0.02)


def test_learning_rate_schedules_round_trip_through_config_and_refuse_what_cannot_work():
    optimizer = tfps.optimizers.Adam(_decaying())
    clone = tfps.optimizers.get(tfps.optimizers.serialize(optimizer))
    assert clone == optimizer and clone.learning_rate == pytest.approx(0.3)
    assert float(clone.learning_rate_at(tf.constant(8))) == pytest.approx(0.075)
    assert tfps.optimizers.SGD(0.1).learning_rate_at(tf.constant(3)) is None
    with pytest.raises(ValueError, match="beta folds into l2"):
        tfps.optimizers.Ftrl(_decaying(), beta=0.1)
    with pytest.raises(ValueError, match="learning_rate must be a positive number"):
        tfps.optimizers.SGD(tf.Variable(-1.0))


@pytest.mark.parametrize("mode", ["eager", "range_loop", "fit"])
def test_rows_gradients_are_clipped_to_clip_row_norm_per_row(mode):
    ids, labels = data()
    model, layer, head = build_model("sgd", tfps.optimizers.SGD(0.3, clip_row_norm=0.1))
    kernel0 = head.kernel.numpy()[:, 0].copy()
    train(mode, model, KERAS_SGD["current"](), ids, labels)
    check_against_oracle(layer, head, "sgd", ids, labels, kernel0, clip_row_norm=0.1)
    # The clip bit: unclipped, the rows would differ.
    rows, _, _, _ = numpy_oracle("sgd", ids, labels, kernel0, 0.0, layer.seed)
    exported = layer.table.export()
    got = dict(zip(exported.keys.numpy().tolist(), exported.values.numpy()))
    assert max(np.abs(got[k] - rows[k]).max() for k in rows) > 1e-3


@pytest.mark.parametrize("mode", ["eager", "function", "fit_spe10"])
def test_embeddings_regularizer_adds_to_the_rows_each_step_looks_up(mode):
    ids, labels = data()
    model, layer, head = build_model("adagrad", embeddings_regularizer=keras.regularizers.L2(0.5))
    kernel0 = head.kernel.numpy()[:, 0].copy()
    train(mode, model, KERAS_SGD["current"](), ids, labels)
    check_against_oracle(layer, head, "adagrad", ids, labels, kernel0, l2=0.5)
    config = layer.get_config()
    assert config["embeddings_regularizer"]["config"] == {"l2": 0.5}
    assert type(layer).from_config(config).embeddings_regularizer.l2 == pytest.approx(0.5)
