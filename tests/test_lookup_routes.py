"""A table's update reuses its lookup: the gradient of one lookup, summed per key in the
order of the lookup's distinct keys, goes to the shards along the lookup's partition.
Checked in the graphs Keras' optimizers build (tests/test_dynamic_embedding_pss.py checks
the keys each PS is sent), and against rows computed by hand where a gradient is not one
lookup's: a layer called twice in a step, a gradient applied in another function."""

import gc
import weakref

import numpy as np
import pytest
import tensorflow as tf
import tf_keras as keras

import tfps
from tests.test_sparse_updates import KERAS_SGD, build_model, mse
from tfps.table import _lookup_routes as lookup_routes

TABLE_LR = 0.5


@pytest.mark.parametrize("family", ["current", "legacy"])
def test_a_traced_step_updates_the_distinct_keys_its_lookup_found(family):
    model, _, _ = build_model("sgd")
    optimizer = KERAS_SGD[family]()

    @tf.function
    def step(ids, labels):
        with tf.GradientTape() as tape:
            loss = mse(labels, model(ids, training=True))
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables),
                                      model.trainable_variables))

    graph = step.get_concrete_function(tf.TensorSpec([None, 3], tf.int64), tf.TensorSpec([None])).graph
    ops = {op.type: op for op in graph.get_operations()}
    distinct_keys = ops["Tfps>UniqueKeys"].outputs[0]
    assert ops["Tfps>TableFindOrInsert"].inputs[1] is distinct_keys
    assert ops["Tfps>TableApplyGradients"].inputs[1] is distinct_keys
    # The gradient is summed per key once, by tfps's op; not by tf_keras's tf.unique.
    assert "Tfps>SumByKey" in ops and "Unique" not in ops


def _layer_and_optimizer(family):
    layer = tfps.keras_layers.DynamicEmbedding(2, optimizer=tfps.optimizers.SGD(TABLE_LR), seed=3)
    layer.build(None)
    return layer, KERAS_SGD[family]()


def _expected_rows(layer, keys, gradient_per_key):
    return layer.table.find(tf.constant(keys, tf.int64)).numpy() - TABLE_LR * np.asarray(
        gradient_per_key, np.float32)[:, None]


@pytest.mark.parametrize("family", ["current", "legacy"])
@pytest.mark.parametrize("traced", [False, True], ids=["eager", "tf.function"])
def test_a_layer_called_twice_in_a_step_applies_both_calls_gradients(family, traced):
    layer, optimizer = _layer_and_optimizer(family)
    first, second = tf.constant([5, 7, 5, 9], tf.int64), tf.constant([7, 11, 7], tf.int64)
    keys = [5, 7, 9, 11]
    # d loss / d row, per element: the key's occurrences in the first call, plus twice those
    # in the second.
    expected = _expected_rows(layer, keys, [2, 1 + 2 * 2, 1, 2])

    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(layer(first, training=True)) + 2 * tf.reduce_sum(layer(second, training=True))
        optimizer.apply_gradients(zip(tape.gradient(loss, layer.trainable_variables), layer.trainable_variables))

    (tf.function(step) if traced else step)()
    np.testing.assert_allclose(layer.table.find(tf.constant(keys, tf.int64)).numpy(), expected, rtol=1e-6)


@pytest.mark.parametrize("family", ["current", "legacy"])
@pytest.mark.parametrize("traced", [False, True], ids=["eager", "tf.function"])
def test_a_gradient_applied_apart_from_its_lookup_updates_its_own_keys(family, traced):
    layer, optimizer = _layer_and_optimizer(family)
    ids = tf.constant([3, 4, 3, 3], tf.int64)
    expected = _expected_rows(layer, [3, 4], [3, 1])

    def gradients():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(layer(ids, training=True))
        return tape.gradient(loss, layer.trainable_variables)

    def apply(grads):
        optimizer.apply_gradients(zip(grads, layer.trainable_variables))

    if traced:  # computed in one function, applied in another
        tf.function(apply)(tf.function(gradients)())
    else:
        apply(gradients())
    np.testing.assert_allclose(layer.table.find(tf.constant([3, 4], tf.int64)).numpy(), expected, rtol=1e-6)


def test_a_lookup_is_found_from_its_own_tensors_only_and_lives_as_long_as_its_keys():
    table = object()
    keys, unique = tf.constant([3, 1, 3], tf.int64), tf.constant([3, 1], tf.int64)
    lookup_routes.record(table, keys, unique, "routing")
    lookup, summed = lookup_routes.lookup_of(keys)
    assert lookup.table is table and lookup.unique is unique and lookup.routing == "routing" and not summed
    assert lookup_routes.lookup_of(unique) == (lookup, True)
    assert lookup_routes.lookup_of(tf.constant([3, 1, 3], tf.int64)) == (None, False)  # equal values

    @tf.function
    def through_identity():
        graph_keys = tf.constant([1, 1], tf.int64)
        lookup_routes.record(table, graph_keys, tf.constant([1], tf.int64), "graph routing")
        assert lookup_routes.lookup_of(tf.identity(tf.identity(graph_keys)))[0].routing == "graph routing"
        assert lookup_routes.lookup_of(graph_keys + 0) == (None, False)

    through_identity.get_concrete_function()
    freed = weakref.ref(lookup)
    del keys, lookup
    gc.collect()
    assert freed() is None  # nothing but its keys kept it
    assert lookup_routes.lookup_of(unique) == (None, False)


def test_the_update_of_a_model_trained_by_fit_matches_the_rows_computed_by_hand():
    layer = tfps.keras_layers.DynamicEmbedding(2, optimizer=tfps.optimizers.SGD(TABLE_LR), seed=3,
                                               combiner="sum")
    ids = keras.Input((3,), dtype=tf.int64)
    model = keras.Model(ids, tf.reduce_sum(layer(ids), -1))
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss=lambda y, p: tf.reduce_sum(p))
    batch = np.array([[1, 2, 1], [2, 2, 6]], np.int64)
    expected = _expected_rows(layer, [1, 2, 6], [2, 3, 1])
    model.fit(batch, np.zeros(2, np.float32), batch_size=2, epochs=1, verbose=0)
    np.testing.assert_allclose(layer.table.find(tf.constant([1, 2, 6], tf.int64)).numpy(), expected,
                               rtol=1e-6)
