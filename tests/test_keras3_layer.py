"""The Keras 3 DynamicEmbedding trains like a Keras 3 stock Embedding and like the NumPy
oracle of tests/test_sparse_updates.py in every execution mode (the sparse update goes
through the Keras 3 optimizer's apply: clipping, loss scaling, skipped steps, shared and
frozen layers), and saves in .keras archives with every row."""

import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import tfps
from tests import test_sparse_updates as oracle
from tests.test_sparse_updates_keras import BATCH, DIM, FIELDS, KERNEL, VOCAB, batches, start_rows

import keras  # noqa: E402  (TensorFlow 2.16 and later, all tfps supports, depend on Keras 3)
from tfps.keras_layers.keras3 import DynamicEmbedding  # noqa: E402

assert keras.__version__.startswith("3."), keras.__version__


def head():
    return keras.layers.Dense(1, kernel_initializer=keras.initializers.Constant(KERNEL))


def stock_model():
    ids = keras.Input((FIELDS,), dtype="int64")
    embedding = keras.layers.Embedding(VOCAB, DIM, embeddings_initializer=keras.initializers.Constant(start_rows()))
    return keras.Model(ids, head()(keras.layers.Flatten()(embedding(ids)))), embedding


def tfps_model(table_optimizer, **layer_args):
    ids = keras.Input((FIELDS,), dtype="int64")
    layer = DynamicEmbedding(DIM, optimizer=table_optimizer, **layer_args)
    model = keras.Model(ids, head()(keras.layers.Flatten()(layer(ids))))
    layer.table.insert(np.arange(VOCAB, dtype=np.int64), start_rows())
    return model, layer


def table_rows(layer):
    return layer.table.find(np.arange(VOCAB, dtype=np.int64)).numpy()


def fit_both(keras_optimizer_fn, table_optimizer, steps_per_execution=1):
    """Stock and tfps Keras 3 models trained on the same batches: (stock rows, tfps rows)."""
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
], ids=["clipnorm", "global_clipnorm", "clipvalue"])
def test_clipping_treats_the_table_gradient_as_a_stock_embedding_gradient(keras_optimizer_fn):
    stock, ours = fit_both(keras_optimizer_fn, tfps.optimizers.SGD(1.0), steps_per_execution=4)
    np.testing.assert_allclose(ours, stock, rtol=0, atol=1e-6)
    _, unclipped = fit_both(lambda: keras.optimizers.SGD(1.0), tfps.optimizers.SGD(1.0))
    moved = np.abs(ours - start_rows()).max()
    assert 0 < moved < 0.2 * np.abs(unclipped - start_rows()).max()


def build_oracle_model(optimizer_name, **layer_args):
    """tests/test_sparse_updates.py's model, in Keras 3."""
    ids = keras.Input((oracle.FIELDS,), dtype="int64")
    layer = DynamicEmbedding(oracle.DIM, combiner="sum", seed=11,
                             optimizer=oracle.TABLE_OPTIMIZERS[optimizer_name][0](), **layer_args)
    dense = keras.layers.Dense(1, kernel_initializer=keras.initializers.Constant([[0.5], [-0.3], [0.8]]),
                               bias_initializer="zeros")
    model = keras.Model(ids, keras.ops.squeeze(dense(layer(ids)), -1))
    return model, layer, dense


@pytest.mark.parametrize("mode", oracle.MODES)
@pytest.mark.parametrize("optimizer_name", ["adagrad", "adam"])
def test_every_execution_mode_trains_the_table_once_per_step_like_the_oracle(optimizer_name, mode):
    ids, labels = oracle.data()
    model, layer, dense = build_oracle_model(optimizer_name)
    kernel0 = dense.kernel.numpy()[:, 0].copy()
    oracle.train(mode, model, keras.optimizers.SGD(oracle.HEAD_LR), ids, labels)
    oracle.check_against_oracle(layer, dense, optimizer_name, ids, labels, kernel0)


def test_admission_keeps_ids_out_until_min_count_as_the_oracle_does():
    ids, labels = oracle.data()
    model, layer, dense = build_oracle_model("sgd", admission=tfps.admission.MinCount(40))
    kernel0 = dense.kernel.numpy()[:, 0].copy()
    oracle.train("fit", model, keras.optimizers.SGD(oracle.HEAD_LR), ids, labels)
    rows, _, _, _ = oracle.numpy_oracle("sgd", ids, labels, kernel0, 0.0, layer.seed, min_count=40)
    exported = layer.table.export()
    keys = exported.keys.numpy()
    assert sorted(keys) == sorted(rows) and 0 < len(rows) < len(oracle.VOCAB)  # 6 of 12 IDs stayed out
    np.testing.assert_allclose(exported.values.numpy(), np.stack([rows[int(k)] for k in keys]),
                               rtol=2e-4, atol=2e-6)


@pytest.fixture
def mixed_precision():
    keras.mixed_precision.set_dtype_policy("mixed_float16")
    yield
    keras.mixed_precision.set_dtype_policy("float32")


def test_mixed_precision_unscales_the_table_gradient(mixed_precision):
    mixed_stock, mixed_ours = fit_both(lambda: keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.5)),
                                       tfps.optimizers.SGD(0.5))
    keras.mixed_precision.set_dtype_policy("float32")
    _, float32_ours = fit_both(lambda: keras.optimizers.SGD(0.5), tfps.optimizers.SGD(0.5))
    update, float32_update = mixed_ours - start_rows(), float32_ours - start_rows()
    assert np.abs(float32_update).max() > 0.05
    # float16 activations round the gradient; an unscaled one would be 32768 times larger.
    np.testing.assert_allclose(update, float32_update, rtol=0, atol=2e-3 * np.abs(float32_update).max())
    np.testing.assert_allclose(mixed_ours, mixed_stock, rtol=0, atol=1e-5)


def test_a_step_the_loss_scale_optimizer_skips_leaves_the_table_alone(mixed_precision):
    model, layer = tfps_model(tfps.optimizers.SGD(0.5))
    optimizer = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.5))
    model.compile(optimizer=optimizer, loss="mse")
    x, y = batches(steps=1)
    model.fit(x, y, batch_size=BATCH, verbose=0)  # builds the optimizer
    trained = table_rows(layer)
    scale = float(optimizer.dynamic_scale.numpy())
    model.fit(x, np.full_like(y, np.inf), batch_size=BATCH, verbose=0)  # non-finite gradients
    assert float(optimizer.dynamic_scale.numpy()) == scale / 2  # the step was skipped
    np.testing.assert_array_equal(table_rows(layer), trained)
    assert np.abs(trained - start_rows()).max() > 1e-3


def train_stock_densely(model, optimizer, inputs, y):
    """Steps over the batches with every gradient dense: Keras 3's Adagrad would square a
    stock Embedding's slices one by one, where a table (and tf_keras) squares each row's sum."""
    for start in range(0, len(y), BATCH):
        batch = [x[start:start + BATCH] for x in inputs]
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(batch, training=True)[:, 0] - y[start:start + BATCH]))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply([tf.convert_to_tensor(g) for g in grads], model.trainable_variables)


@pytest.mark.parametrize("steps_per_execution", [1, 5])
def test_a_table_used_twice_per_step_updates_once_with_the_summed_gradient(steps_per_execution):
    target, history = keras.Input((1,), dtype="int64"), keras.Input((FIELDS - 1,), dtype="int64")
    layer = DynamicEmbedding(DIM, optimizer=tfps.optimizers.Adagrad(0.3))
    embedding = keras.layers.Embedding(VOCAB, DIM, embeddings_initializer=keras.initializers.Constant(start_rows()))
    ours, stock = [keras.Model([target, history], head()(keras.layers.Concatenate()(
        [keras.layers.Flatten()(embed(target)), keras.layers.Flatten()(embed(history))])))
        for embed in (layer, embedding)]
    layer.table.insert(np.arange(VOCAB, dtype=np.int64), start_rows())
    x, y = batches()
    adagrad = lambda: keras.optimizers.Adagrad(0.3, initial_accumulator_value=0.1, epsilon=1e-7)  # noqa: E731
    ours.compile(optimizer=adagrad(), loss="mse", steps_per_execution=steps_per_execution)
    ours.fit([x[:, :1], x[:, 1:]], y, batch_size=BATCH, shuffle=False, verbose=0)
    train_stock_densely(stock, adagrad(), [x[:, :1], x[:, 1:]], y)
    assert np.abs(table_rows(layer) - start_rows()).max() > 0.05
    np.testing.assert_allclose(table_rows(layer), embedding.embeddings.numpy(), rtol=0, atol=1e-5)


def test_a_frozen_layer_neither_trains_nor_grows_and_inference_inserts_nothing():
    model, layer = tfps_model(tfps.optimizers.SGD(1.0))
    layer.trainable = False
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse", steps_per_execution=4)
    x, y = batches()
    model.fit(x + VOCAB // 2, y, batch_size=BATCH, verbose=0)  # half the IDs are new
    model.evaluate(x + VOCAB, y, batch_size=BATCH, verbose=0)
    model.predict(x + VOCAB, batch_size=BATCH, verbose=0)
    np.testing.assert_array_equal(table_rows(layer), start_rows())
    assert layer.table.shard_sizes() == [VOCAB]


def test_a_keras_archive_keeps_every_row_slot_and_prediction(tmp_path):
    model, layer = tfps_model(tfps.optimizers.Adam(0.05), combiner=None, admission=tfps.admission.MinCount(2),
                              eviction=tfps.eviction.TTL(steps=50))
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    x, y = batches()
    model.fit(x + 1000 * (np.arange(len(x))[:, None] % 3), y, batch_size=BATCH, verbose=0)  # new IDs
    path = str(tmp_path / "model.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    loaded_layer = [lay for lay in loaded.layers if isinstance(lay, DynamicEmbedding)][0]
    assert loaded_layer is not layer and loaded_layer.table is not layer.table
    assert loaded_layer.get_config() == layer.get_config()
    before, after = layer.table.export(), loaded_layer.table.export()
    order_before, order_after = np.argsort(before.keys.numpy()), np.argsort(after.keys.numpy())
    for field in ("keys", "values", "slots", "metadata"):
        np.testing.assert_array_equal(getattr(after, field).numpy()[order_after],
                                      getattr(before, field).numpy()[order_before], err_msg=field)
    assert len(before.keys.numpy()) > VOCAB
    np.testing.assert_array_equal(loaded.predict(x, verbose=0), model.predict(x, verbose=0))
    loaded.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    loaded.fit(x, y, batch_size=BATCH, verbose=0)
    assert np.abs(table_rows(loaded_layer) - table_rows(layer)).max() > 1e-4  # the loaded table trains


def test_what_cannot_reach_the_rows_is_refused():
    x, y = batches(steps=1)
    for optimizer, message in ((keras.optimizers.AdamW(weight_decay=0.01), "exclude_from_weight_decay"),
                               (keras.optimizers.SGD(0.1, use_ema=True), "use_ema"),
                               (keras.optimizers.SGD(0.1, gradient_accumulation_steps=2),
                                "gradient_accumulation_steps=2")):
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


def test_a_process_that_imports_tfps_only_loads_the_archive(tmp_path):
    model, _ = tfps_model(tfps.optimizers.Adagrad(0.3))
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    x, y = batches()
    model.fit(x + VOCAB, y, batch_size=BATCH, verbose=0)
    model.save(str(tmp_path / "model.keras"))
    np.save(str(tmp_path / "x.npy"), x + VOCAB)
    code = ("import sys, numpy as np, keras, tfps\n"
            "m = keras.models.load_model(sys.argv[1])\n"
            "np.save(sys.argv[3], m.predict(np.load(sys.argv[2]), verbose=0))\n")
    env = {k: v for k, v in os.environ.items() if k != "TF_USE_LEGACY_KERAS"}  # a Keras 3 user's
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "model.keras"), str(tmp_path / "x.npy"),
                          str(tmp_path / "p.npy")], capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    np.testing.assert_array_equal(np.load(str(tmp_path / "p.npy")), model.predict(x + VOCAB, verbose=0))


def test_jit_compile_falls_back_to_graphs_and_the_table_trains():
    model, layer = tfps_model(tfps.optimizers.SGD(1.0))
    with pytest.warns(UserWarning, match="doesn't support `jit_compile=True`"):
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse", jit_compile=True)
    x, y = batches()
    model.fit(x, y, batch_size=BATCH, verbose=0)
    assert np.abs(table_rows(layer) - start_rows()).max() > 1e-3


def test_hdf5_saving_is_refused_and_get_weights_warns(tmp_path):
    model, _ = tfps_model(tfps.optimizers.SGD(1.0))
    with pytest.raises(ValueError, match="HDF5 .* cannot hold the rows of the dynamic tables") as refused:
        model.save(str(tmp_path / "model.h5"))
    assert not os.path.exists(tmp_path / "model.h5")
    # Every save the refusal names is one Keras 3 makes (tf_keras' TF-format weights and
    # SavedModel directories are not).
    assert "ckpt/weights" not in str(refused.value) and "SavedModel directory" not in str(refused.value)
    model.save(str(tmp_path / "m.keras"))
    model.save_weights(str(tmp_path / "m.weights.h5"))
    tf.train.Checkpoint(model=model).write(str(tmp_path / "ckpt" / "model"))
    model.export(str(tmp_path / "dir"), verbose=False)
    tfps.export.save_for_serving(model, str(tmp_path / "served"))
    for named in ("model.save('m.keras')", "model.save_weights('m.weights.h5')",
                  "tf.train.Checkpoint(model=model)", "model.export('dir')", "tfps.export.save_for_serving"):
        assert named in str(refused.value)
    with pytest.warns(UserWarning, match="get_weights returns the variables only.*keras3.EarlyStopping"):
        weights = model.get_weights()
    with pytest.warns(UserWarning, match="set_weights sets the variables only"):
        model.set_weights(weights)


def test_a_tf_train_checkpoint_of_the_model_restores_every_row(tmp_path):
    model, layer = tfps_model(tfps.optimizers.Adagrad(0.3))
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    x, y = batches()
    model.fit(x + VOCAB, y, batch_size=BATCH, verbose=0)  # new IDs too
    path = tf.train.Checkpoint(model=model).write(str(tmp_path / "ckpt"))
    restored, restored_layer = tfps_model(tfps.optimizers.Adagrad(0.3))
    tf.train.Checkpoint(model=restored).read(path).assert_existing_objects_matched()  # all but the optimizer
    before, after = layer.table.export(), restored_layer.table.export()
    assert len(before.keys.numpy()) == 2 * VOCAB
    for field in ("keys", "values", "slots", "metadata"):
        np.testing.assert_array_equal(np.sort(getattr(after, field).numpy(), axis=0),
                                      np.sort(getattr(before, field).numpy(), axis=0), err_msg=field)
    np.testing.assert_array_equal(restored.predict(x + VOCAB, verbose=0), model.predict(x + VOCAB, verbose=0))


def test_strategies_worker_caches_and_tf_keras_tensors_are_refused_with_the_way_out():
    with pytest.raises(ValueError, match="worker_cache_rows caches rows of parameter servers"):
        DynamicEmbedding(DIM, worker_cache_rows=100, max_staleness_steps=2)
    with pytest.raises(ValueError, match="transfer_dtype='bfloat16' is what rows travel as between workers and parameter servers"):
        DynamicEmbedding(DIM, transfer_dtype="bfloat16")
    with tf.distribute.MirroredStrategy(["/cpu:0"]).scope():
        with pytest.raises(ValueError, match="MirroredStrategy is not supported by the Keras 3 layer"):
            DynamicEmbedding(DIM)
    import tf_keras
    with pytest.raises(TypeError, match="given a tf_keras KerasTensor.*tfps.keras_layers.DynamicEmbedding"):
        DynamicEmbedding(DIM)(tf_keras.Input((3,), dtype="int64"))


def test_float_ids_are_refused_naming_the_dtype_given():
    for dtype in (tf.float64, tf.float16):
        with pytest.raises(TypeError, match=f"got {dtype.name}; cast float IDs to integers"):
            DynamicEmbedding(DIM)(tf.constant([[1.0, 2.0]], dtype))


def test_a_backend_other_than_tensorflow_is_refused(monkeypatch):
    # Keras' other backends need JAX, PyTorch or OpenVINO, which CI does not install: the
    # layer is asked as Keras would answer under JAX.
    monkeypatch.setattr(keras.backend, "backend", lambda: "jax")
    with pytest.raises(ValueError, match="the 'jax' backend. Set KERAS_BACKEND=tensorflow"):
        DynamicEmbedding(DIM)
