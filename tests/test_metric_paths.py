"""Every tfps metric, in every local Keras evaluation path (fit's validation_data, evaluate
after fit, evaluate with steps=, a freshly loaded and compiled model, steps_per_execution 1
and 8), reads what scikit-learn computes on predict's output for the same examples.
ParameterServerStrategy's paths are in test_metrics_pss.py."""

import numpy as np
import pytest
import tensorflow as tf
import tf_keras as keras

import tfps
from tests.auc_reference import assert_metrics_read, bucketed_metrics, sklearn_metrics

N, BATCH, USERS = 16384, 512, 50


def examples(seed):
    rng = np.random.default_rng(seed)
    user = rng.integers(0, USERS, N)
    features = rng.normal(size=(N, 4)).astype(np.float32)
    logit = 2 * features[:, 0] + np.linspace(-2, 1, USERS)[user]
    labels = rng.random(N) < 1 / (1 + np.exp(-logit))
    return {"features": features, "user": user.astype(np.int64)}, labels.astype(np.float32)


def metrics():
    return [tfps.metrics.AUC(name="auc"), tfps.metrics.AUC(curve="PR", name="pr_auc"),
            tfps.metrics.GroupAUC(name="group_auc"), tfps.metrics.BinaryLogLoss(),
            tfps.metrics.CalibrationRatio()]


def click_model(steps_per_execution, weighted=False):
    features = keras.Input(shape=(4,), name="features")
    user = keras.Input(shape=(), dtype=tf.int64, name="user")
    user_vector = tfps.keras_layers.DynamicEmbedding(4, optimizer=tfps.optimizers.Adagrad(0.1), name="users")(user)
    hidden = keras.layers.Dense(8, activation="relu")(keras.layers.Concatenate()([features, user_vector]))
    prediction = keras.layers.Dense(1, activation="sigmoid")(hidden)
    model = keras.Model({"features": features, "user": user},
                        tfps.metrics.FeedGroups("group_auc")([prediction, user]))
    chosen = {"weighted_metrics": metrics()} if weighted else {"metrics": metrics()}
    model.compile(optimizer=keras.optimizers.Adam(0.02), loss="binary_crossentropy",
                  steps_per_execution=steps_per_execution, **chosen)
    return model


def assert_reads_sklearn(results, model, x, y):
    """results: the metrics' values for examples x, y; compared with the exact areas of
    predict's output in the metrics' buckets, and with scikit-learn's values of it within
    the documented bucket error (the model's predictions are spread, as a trained model's
    are, so few pairs share a bucket)."""
    predictions = model.predict(x, batch_size=BATCH, verbose=0)[:, 0]
    expected = sklearn_metrics(y, predictions, x["user"])
    assert 0.7 < expected["auc"] < 0.99 and 0.6 < expected["group_auc"] < 0.99
    assert_metrics_read(results, expected, bucketed=bucketed_metrics(y, predictions, x["user"]))


@pytest.mark.parametrize("steps_per_execution", [1, 8])
def test_every_metric_reads_sklearns_value_in_every_local_evaluation_path(tmp_path, steps_per_execution):
    (x, y), (x_val, y_val) = examples(0), examples(1)
    model = click_model(steps_per_execution)
    history = model.fit(x, y, batch_size=BATCH, epochs=2, validation_data=(x_val, y_val), verbose=0).history
    # fit's validation_data: the last epoch's values are the final model's.
    assert_reads_sklearn({name[4:]: values[-1] for name, values in history.items() if name.startswith("val_")},
                         model, x_val, y_val)
    # evaluate after fit.
    assert_reads_sklearn(model.evaluate(x_val, y_val, batch_size=BATCH, return_dict=True, verbose=0),
                         model, x_val, y_val)
    # evaluate with steps= over an endless dataset: the first N / BATCH batches.
    endless = tf.data.Dataset.from_tensor_slices((x_val, y_val)).batch(BATCH).repeat()
    assert_reads_sklearn(model.evaluate(endless, steps=N // BATCH, return_dict=True, verbose=0),
                         model, x_val, y_val)
    # A freshly loaded model, compiled with new metrics, that has run no step.
    path = str(tmp_path / "model.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    loaded.compile(loss="binary_crossentropy", metrics=metrics(), steps_per_execution=steps_per_execution)
    assert_reads_sklearn(loaded.evaluate(x_val, y_val, batch_size=BATCH, return_dict=True, verbose=0),
                         loaded, x_val, y_val)


@pytest.mark.parametrize("label_shape", ["[n]", "[n, 1]"])
def test_every_metric_as_a_weighted_metric_reads_sklearns_weighted_value(label_shape):
    # Keras hands weighted_metrics [batch, 1] weights beside the model's [batch, 1] output.
    (x, y), (x_val, y_val) = examples(0), examples(1)
    weights = np.random.default_rng(2).uniform(0.1, 3.0, N).astype(np.float32)
    model = click_model(steps_per_execution=8, weighted=True)
    model.fit(x, y, sample_weight=weights, batch_size=BATCH, epochs=2, verbose=0)
    labels = y_val if label_shape == "[n]" else y_val[:, None]
    results = model.evaluate(x_val, labels, sample_weight=weights, batch_size=BATCH, return_dict=True, verbose=0)
    predictions = model.predict(x_val, batch_size=BATCH, verbose=0)[:, 0]
    expected = sklearn_metrics(y_val, predictions, x_val["user"], weights)
    unweighted = sklearn_metrics(y_val, predictions, x_val["user"])
    assert abs(expected["auc"] - unweighted["auc"]) > 1e-3  # the weights change every value read
    # Keras' compiled loss divides the weighted sum by the examples, not by the weights.
    assert_metrics_read(results, expected, loss=False,
                        bucketed=bucketed_metrics(y_val, predictions, x_val["user"], weights))
