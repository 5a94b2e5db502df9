"""DynamicEmbedding locally: oracle against a pre-sized Keras Embedding, inputs, errors."""

import numpy as np
import pytest
import tensorflow as tf
import tf_keras as keras

import tfps
from tests.table_rows import assert_same_rows, sorted_rows
from tfps.keras_layers import DynamicEmbedding

VOCAB, DIM, FIELDS = 40, 4, 3


def dense_head():
    return keras.layers.Dense(1, activation="sigmoid", kernel_initializer=keras.initializers.Constant(
        np.linspace(-0.5, 0.5, FIELDS * DIM)[:, None]))


def oracle_pair(table_optimizer, keras_optimizer_fn, steps_per_execution=1):
    start = np.random.default_rng(0).normal(scale=0.3, size=(VOCAB, DIM)).astype(np.float32)
    ids = keras.Input((FIELDS,), dtype=tf.int64)
    reference_embedding = keras.layers.Embedding(
        VOCAB, DIM, embeddings_initializer=keras.initializers.Constant(start))
    reference = keras.Model(ids, dense_head()(keras.layers.Flatten()(reference_embedding(ids))))
    dynamic = DynamicEmbedding(DIM, optimizer=table_optimizer, initializer="zeros")
    ids2 = keras.Input((FIELDS,), dtype=tf.int64)
    model = keras.Model(ids2, dense_head()(keras.layers.Flatten()(dynamic(ids2))))
    dynamic.table.insert(np.arange(VOCAB, dtype=np.int64), start)
    for m in (reference, model):
        m.compile(optimizer=keras_optimizer_fn(), loss="binary_crossentropy",
                  steps_per_execution=steps_per_execution)
    return reference, reference_embedding, model, dynamic


@pytest.mark.parametrize("steps_per_execution", [1, 10])
@pytest.mark.parametrize("table_optimizer,keras_optimizer_fn", [
    (tfps.optimizers.SGD(0.5), lambda: keras.optimizers.SGD(0.5)),
    (tfps.optimizers.SGD(0.5), lambda: keras.optimizers.legacy.SGD(0.5)),
    (tfps.optimizers.Adagrad(0.3), lambda: keras.optimizers.legacy.Adagrad(0.3, initial_accumulator_value=0.1)),
], ids=["sgd", "legacy-sgd", "legacy-adagrad"])
def test_same_losses_and_rows_as_a_presized_keras_embedding(table_optimizer, keras_optimizer_fn,
                                                            steps_per_execution):
    rng = np.random.default_rng(1)
    x = rng.integers(0, VOCAB, size=(512, FIELDS)).astype(np.int64)  # repeats within batches
    y = (x.sum(1) % 3 == 0).astype(np.float32)
    reference, reference_embedding, model, dynamic = oracle_pair(table_optimizer, keras_optimizer_fn,
                                                                 steps_per_execution)
    ref_hist = reference.fit(x, y, batch_size=32, epochs=3, shuffle=False, verbose=0).history["loss"]
    hist = model.fit(x, y, batch_size=32, epochs=3, shuffle=False, verbose=0).history["loss"]
    np.testing.assert_allclose(hist, ref_hist, atol=1e-5)
    rows = dynamic.table.find(np.arange(VOCAB, dtype=np.int64)).numpy()
    np.testing.assert_allclose(rows, reference_embedding.embeddings.numpy(), atol=1e-5)
    assert ref_hist[-1] < ref_hist[0]
    assert dynamic.table_proxy.shape == (0, DIM)  # the proxy only carries gradients


def test_jit_compile_falls_back_to_graphs_for_a_model_with_tables_and_the_table_trains():
    reference, reference_embedding, model, dynamic = oracle_pair(
        tfps.optimizers.SGD(0.5), lambda: keras.optimizers.SGD(0.5))
    with pytest.warns(UserWarning, match=f"jit_compile=True falls back to False .* {dynamic.name} "):
        model.compile(optimizer=keras.optimizers.SGD(0.5), loss="binary_crossentropy", jit_compile=True)
    assert model.jit_compile is False
    rng = np.random.default_rng(1)
    x = rng.integers(0, VOCAB, size=(256, FIELDS)).astype(np.int64)
    y = (x.sum(1) % 3 == 0).astype(np.float32)
    for m in (reference, model):
        m.fit(x, y, batch_size=32, shuffle=False, verbose=0)
    np.testing.assert_allclose(dynamic.table.find(np.arange(VOCAB, dtype=np.int64)).numpy(),
                               reference_embedding.embeddings.numpy(), atol=1e-5)
    reference.compile(optimizer="sgd", loss="mse", jit_compile=True)  # no table: XLA as asked
    assert reference.jit_compile is True


def test_inference_never_inserts_and_unseen_ids_read_zero_or_initial():
    layer = DynamicEmbedding(3, initializer=tfps.initializers.RandomUniform(0.5, 1.0))
    trained = layer(tf.constant([[1, 2]], tf.int64), training=True)
    assert layer.table.shard_sizes() == [2]
    out = layer(tf.constant([[1, 99]], tf.int64), training=False).numpy()
    np.testing.assert_array_equal(out[0, 0], trained.numpy()[0, 0])
    np.testing.assert_array_equal(out[0, 1], np.zeros(3))
    assert layer.table.shard_sizes() == [2]
    initial = DynamicEmbedding(3, initializer=tfps.initializers.RandomUniform(0.5, 1.0), unseen="initial")
    initial.build(None)
    row = initial(tf.constant([99], tf.int64)).numpy()[0]
    assert np.all((row >= 0.5) & (row < 1.0))
    assert initial.table.shard_sizes() == [0]


def test_input_kinds_and_combiners():
    layer = DynamicEmbedding(2, initializer="zeros")
    layer.build(None)
    layer.table.insert(np.array([1, 2, 3], np.int64), np.array([[1, 0], [0, 2], [4, 4]], np.float32))
    dense = layer(tf.constant([[1, 2], [3, 3]], tf.int64)).numpy()
    np.testing.assert_array_equal(dense, [[[1, 0], [0, 2]], [[4, 4], [4, 4]]])
    for ids in (tf.constant([1], tf.int32), tf.constant([1], tf.uint64)):
        np.testing.assert_array_equal(layer(ids).numpy(), [[1, 0]])
    ragged = tf.ragged.constant([[1, 2], [], [3]], dtype=tf.int64)
    for combiner, expected in (("sum", [[1, 2], [0, 0], [4, 4]]),
                               ("mean", [[0.5, 1], [0, 0], [4, 4]]),
                               ("sqrtn", [[1 / 2 ** 0.5, 2 / 2 ** 0.5], [0, 0], [4, 4]])):
        layer.combiner = combiner
        np.testing.assert_allclose(layer(ragged).numpy(), expected, rtol=1e-6)
        sparse = ragged.to_sparse()
        np.testing.assert_allclose(layer(sparse).numpy(), expected, rtol=1e-6)
    layer.combiner = "mean"
    np.testing.assert_allclose(layer(tf.constant([[1, 2]], tf.int64)).numpy(), [[0.5, 1]])
    layer.combiner = None
    out = layer(ragged)
    assert isinstance(out, tf.RaggedTensor)
    np.testing.assert_array_equal(out.values.numpy(), [[1, 0], [0, 2], [4, 4]])
    assert layer(tf.zeros([0, 5], tf.int64)).shape == (0, 5, 2)


def test_string_ids_and_namespaces_do_not_collide():
    layer = DynamicEmbedding(2)
    layer(tf.constant([["a", "b"]]), training=True)
    layer(tf.constant([[7, 7]], tf.int64), training=True, namespace="columns")
    layer(tf.constant([7], tf.int64), training=True, namespace=5)
    layer(tf.constant([7], tf.int64), training=True)
    # "a", "b", 7 in columns 1 and 2, 7 in namespace 5 and 7 itself: six distinct keys.
    assert layer.table.shard_sizes() == [6]
    keys = tfps.keys.ids_to_keys(tf.constant(["a"]))
    assert keys.numpy()[0] == tfps.keys.fingerprint64(tf.constant(["a"])).numpy()[0]


@pytest.mark.parametrize("call,error,message", [
    (lambda l: l(tf.constant([1.0])), TypeError, "IDs must be int32, int64, uint64 or string, got float32"),
    # named as given, not as Keras' cast to the compute dtype would make them
    (lambda l: l(tf.constant([1.0], tf.float64)), TypeError, "got float64; cast float IDs to integers"),
    (lambda l: l(tf.constant([1.0], tf.float16)), TypeError, "got float16; cast float IDs to integers"),
    (lambda l: l(tf.ragged.constant([[[1]]], dtype=tf.int64, ragged_rank=2)), ValueError,
     "ragged input must be"),
    (lambda l: l(tf.constant([1, 2], tf.int64), namespace="columns"), ValueError, "needs \\[batch, k\\]"),
    (lambda l: l(tf.constant([1], tf.int64), namespace=1.5), ValueError,
     r"namespace must be an int in \[-2\^63, 2\^63\), an integer tensor or 'columns', got 1.5"),
    (lambda l: l(tf.constant([1], tf.int64), namespace=2 ** 70), ValueError, "got 1180591620717411303424"),
    (lambda l: l(tf.constant([1], tf.int64), namespace="rows"), ValueError, "or 'columns', got 'rows'"),
    (lambda l: l(tf.constant([1], tf.int64), namespace=tf.constant([0.5])), ValueError, "an integer tensor"),
])
def test_bad_inputs_are_named(call, error, message):
    layer = DynamicEmbedding(2)
    with pytest.raises(error, match=message):
        call(layer)


def test_a_namespace_may_be_a_numpy_int_or_a_tensor_of_one_per_id():
    layer = DynamicEmbedding(2, initializer=tfps.initializers.RandomUniform(-1.0, 1.0), unseen="initial")
    ids = tf.constant([7, 8, 9], tf.int64)
    by_int = [layer(ids[i:i + 1], namespace=n).numpy()[0] for i, n in enumerate((3, 4, 0))]
    np.testing.assert_array_equal(layer(ids, namespace=tf.constant([3, 4, 0])).numpy(), np.stack(by_int))
    np.testing.assert_array_equal(layer(ids, namespace=np.int64(3)).numpy(), layer(ids, namespace=3).numpy())
    assert not np.array_equal(layer(ids, namespace=3).numpy(), layer(ids).numpy())


def test_combiner_on_dense_1d_and_bad_arguments():
    with pytest.raises(ValueError, match="a combiner needs multi-hot input of rank >= 2"):
        DynamicEmbedding(2, combiner="sum")(tf.constant([1, 2], tf.int64))
    with pytest.raises(ValueError, match="sparse input needs a combiner"):
        DynamicEmbedding(2)(tf.ragged.constant([[1]], dtype=tf.int64).to_sparse())
    for kwargs, message in ((dict(dim=0), "dim must be a positive int"),
                            (dict(dim=2, combiner="max"), "combiner must be one of"),
                            (dict(dim=2, unseen="nan"), "unseen must be one of"),
                            (dict(dim=2, key_dtype=tf.float32), "key_dtype must be")):
        with pytest.raises(ValueError, match=message):
            DynamicEmbedding(**kwargs)


def test_config_round_trip_and_model_styles(tmp_path):
    layer = DynamicEmbedding(3, combiner="mean", optimizer=tfps.optimizers.Ftrl(0.1, l1_regularization_strength=0.01),
                             initializer=tfps.initializers.TruncatedNormal(0.0, 0.02), seed=9,
                             unseen="initial", name="ids")
    clone = DynamicEmbedding.from_config(layer.get_config())
    assert clone.get_config() == layer.get_config()
    x = np.array([[1, 2], [3, 4]], np.int64)
    y = np.array([1.0, 0.0], np.float32)
    sequential = keras.Sequential([keras.Input((2,), dtype=tf.int64), DynamicEmbedding(2, combiner="sum"),
                                   keras.layers.Dense(1)])

    class Subclassed(keras.Model):
        def __init__(self):
            super().__init__()
            self.embedding = DynamicEmbedding(2, combiner="sum")
            self.head = keras.layers.Dense(1)

        def call(self, ids, training=None):
            return self.head(self.embedding(ids, training=training))

    for model in (sequential, Subclassed()):
        model.compile(optimizer="sgd", loss="mse")
        model.fit(x, y, epochs=1, verbose=0)
        assert model.predict(x, verbose=0).shape == (2, 1)
    embedding = sequential.layers[0]
    assert embedding.table.shard_sizes() == [4]
    # Weights checkpoint: table rows are saved and restored with the model.
    path = str(tmp_path / "weights")
    sequential.save_weights(path)
    before = embedding.table.find(np.arange(1, 5, dtype=np.int64)).numpy()
    sequential.fit(x, y, epochs=2, verbose=0)
    embedding.table.find_or_insert(np.array([77], np.int64))
    sequential.load_weights(path)
    np.testing.assert_array_equal(embedding.table.find(np.arange(1, 5, dtype=np.int64)).numpy(), before)
    assert embedding.table.shard_sizes() == [4]


def test_backup_and_restore_brings_the_table_back_after_an_interruption(tmp_path):
    x = np.random.default_rng(0).integers(0, 50, size=(256, 2)).astype(np.int64)
    y = (x[:, 0] % 2).astype(np.float32)
    layer = DynamicEmbedding(2, combiner="sum", optimizer=tfps.optimizers.Adagrad(0.1))
    model = keras.Sequential([keras.Input((2,), dtype=tf.int64), layer, keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    snapshots = {}

    class Interrupt(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            snapshots[epoch] = sorted_rows(layer.table)
            if epoch == 1:
                raise RuntimeError("simulated preemption")

    backup = keras.callbacks.BackupAndRestore(str(tmp_path / "backup"))
    with pytest.raises(RuntimeError, match="simulated preemption"):
        model.fit(x, y, epochs=4, batch_size=32, verbose=0, callbacks=[backup, Interrupt()])
    layer.table.clear()  # the new process would start with empty tables

    class CheckRestored(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            snapshots["restored"] = sorted_rows(layer.table)

    model.fit(x, y, epochs=4, batch_size=32, verbose=0, callbacks=[backup, CheckRestored()])
    # The backup is taken at the end of each epoch, before the interruption in epoch 1.
    assert_same_rows(snapshots[1], snapshots["restored"])


def test_default_seeds_make_two_layers_start_independent_and_a_rebuilt_layer_start_the_same():
    def initial_rows(**kwargs):
        layer = DynamicEmbedding(8, initializer=tfps.initializers.RandomUniform(-1.0, 1.0), unseen="initial",
                                 **kwargs)
        return layer(tf.constant([3, 4], tf.int64), training=False).numpy()

    user, item = initial_rows(name="user"), initial_rows(name="item")
    assert not np.allclose(user, item)
    np.testing.assert_array_equal(initial_rows(name="user"), user)  # same name, same rows
    np.testing.assert_array_equal(initial_rows(name="a", seed=5), initial_rows(name="b", seed=5))


def _weighted_batch(form):
    """IDs (0 to 19, repeats within an example) and positive weights of 4 examples in
    `form`, and the same as SparseTensors for tf.nn.embedding_lookup_sparse."""
    rng = np.random.default_rng(5)
    lengths = [3, 3, 3, 3] if form == "dense" else [1, 4, 2, 3]
    ids = [rng.integers(0, 20, n).tolist() for n in lengths]
    ids[1][2] = ids[1][0]  # a repeat
    weights = [rng.uniform(0.2, 2.0, n).astype(np.float32).tolist() for n in lengths]
    indices = [[i, j] for i, row in enumerate(ids) for j in range(len(row))]
    shape = [len(ids), max(lengths)]
    sparse = (tf.SparseTensor(indices, sum(ids, []), shape), tf.SparseTensor(indices, sum(weights, []), shape))
    if form == "sparse":
        return sparse, sparse
    if form == "ragged":
        return (tf.ragged.constant(ids, tf.int64), tf.ragged.constant(weights)), sparse
    return (tf.constant(ids, tf.int64), tf.constant(weights)), sparse


@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
@pytest.mark.parametrize("form", ["sparse", "ragged", "dense"])
def test_weighted_combiners_match_embedding_lookup_sparse_and_train_as_it_does(form, combiner):
    """Per-ID weights as tf.nn.embedding_lookup_sparse's sp_weights, on a variable of the
    same rows: the outputs, and the rows after one SGD step on the same loss."""
    start = np.random.default_rng(0).normal(size=(20, 3)).astype(np.float32)
    (ids, weights), (sp_ids, sp_weights) = _weighted_batch(form)
    layer = DynamicEmbedding(3, combiner=combiner, optimizer=tfps.optimizers.SGD(0.5))
    layer.table.insert(np.arange(20, dtype=np.int64), start)
    stock = tf.Variable(start)
    pull = tf.constant(np.random.default_rng(1).normal(size=(4, 3)).astype(np.float32))
    with tf.GradientTape(persistent=True) as tape:
        ours = layer(ids, weights=weights, training=True)
        theirs = tf.nn.embedding_lookup_sparse(stock, sp_ids, sp_weights, combiner=combiner)
        our_loss, their_loss = tf.reduce_sum(ours * pull), tf.reduce_sum(theirs * pull)
    np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=1e-6, atol=1e-6)
    keras.optimizers.SGD(1.0).apply_gradients(
        zip(tape.gradient(our_loss, layer.trainable_variables), layer.trainable_variables))
    stock.assign_sub(0.5 * tf.convert_to_tensor(tape.gradient(their_loss, stock)))
    trained = layer.table.find(np.arange(20, dtype=np.int64)).numpy()
    np.testing.assert_allclose(trained, stock.numpy(), rtol=1e-6, atol=1e-6)
    assert np.abs(trained - start).max() > 0.05  # the weighted rows moved


def test_weights_that_do_not_match_the_ids_are_refused():
    layer = DynamicEmbedding(3, combiner="sum")
    ids = tf.ragged.constant([[1, 2], [3]], tf.int64)
    with pytest.raises(tf.errors.InvalidArgumentError, match="weights must have the IDs' row lengths"):
        layer(ids, weights=tf.ragged.constant([[1.0], [2.0, 3.0]]))
    with pytest.raises(tf.errors.InvalidArgumentError, match="weights must have the IDs' row lengths"):
        layer(ids, weights=tf.ragged.constant([[1.0], [2.0, 3.0], [4.0]]))  # a row more
    with pytest.raises(TypeError, match=r"ragged IDs need ragged \[batch, \(k\)\] weights"):
        layer(ids, weights=tf.ragged.constant([[[0.5], [1.0]], [[2.0]]], ragged_rank=1))
    sparse_ids = tf.SparseTensor([[0, 0], [0, 1], [1, 0]], tf.constant([1, 2, 3], tf.int64), [2, 2])
    with pytest.raises(tf.errors.InvalidArgumentError, match="weights must be at the IDs' indices"):
        layer(sparse_ids, weights=tf.SparseTensor([[0, 0], [1, 0]], [1.0, 2.0], [2, 2]))
    with pytest.raises(TypeError, match=r"ragged IDs need ragged \[batch, \(k\)\] weights, got EagerTensor"):
        layer(ids, weights=tf.constant([[1.0, 2.0], [3.0, 0.0]]))
    with pytest.raises(tf.errors.InvalidArgumentError, match="weights must have the IDs' shape"):
        layer(tf.constant([[1, 2]], tf.int64), weights=tf.constant([[1.0, 2.0, 3.0]]))
    with pytest.raises(ValueError, match="weights weigh each ID in a combiner .* this layer has none"):
        DynamicEmbedding(3)(tf.constant([[1, 2]], tf.int64), weights=tf.constant([[1.0, 2.0]]))
