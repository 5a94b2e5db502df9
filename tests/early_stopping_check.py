"""Shared by tests/test_early_stopping.py and its cluster program: trains a model with a
DynamicEmbedding under tfps.callbacks.EarlyStopping, with a monitored score injected per
epoch so that the best epoch is known, and records at every epoch end the table's rows and
the model's predictions on fixed IDs. Each epoch brings IDs never seen before, so the rows
of the best epoch differ from the last epoch's in keys as well as values."""

import numpy as np
import tensorflow as tf
import tf_keras as keras

import tfps
from tests.table_rows import sorted_rows

BATCH, STEPS_PER_EPOCH, NUM_IDS = 16, 5, 400
PROBE = np.arange(0, NUM_IDS, 7, dtype=np.int64)


def dataset_fn(_=None):
    def batch(step):
        ids = (step * BATCH + tf.range(BATCH, dtype=tf.int64)) % NUM_IDS
        return ids, tf.cast(ids % 3 == 0, tf.float32)
    return tf.data.Dataset.range(1 << 20).map(batch)


def recording_callbacks(keras_module, scores, layer):
    """(a callback that puts scores[epoch] into the epoch's logs as "score", for the
    callbacks after it; one that records the table's rows and the predictions on PROBE at
    every epoch end), for tf_keras or Keras 3."""

    class ScoreSequence(keras_module.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            logs["score"] = scores[epoch]

    class EpochRecorder(keras_module.callbacks.Callback):
        rows, predictions = [], []

        def on_epoch_end(self, epoch, logs=None):
            self.rows.append(sorted_rows(layer.table))
            self.predictions.append(np.asarray(self.model(tf.constant(PROBE))))

    return ScoreSequence(), EpochRecorder()


def same_rows(a, b):
    return a.keys() == b.keys() and all(
        a[name].shape == b[name].shape and np.array_equal(a[name], b[name]) for name in a)


def train(scores, patience, restore_best_weights, strategy=None, snapshot_dir=None, keras3=False):
    """Returns what the checks need: epochs run, the best epoch's index by the scores, and
    how the final model compares with the recorded epochs. keras3: a Keras 3 model, layer
    and callback (tfps.keras_layers.keras3) instead of tf_keras ones."""
    if keras3:
        import keras as keras_module
        from tfps.keras_layers.keras3 import DynamicEmbedding, EarlyStopping
    else:
        keras_module, DynamicEmbedding, EarlyStopping = (
            keras, tfps.keras_layers.DynamicEmbedding, tfps.callbacks.EarlyStopping)
    scope = strategy.scope() if strategy is not None else tf.name_scope("local")
    with scope:
        ids = keras_module.Input((), dtype="int64")
        layer = DynamicEmbedding(4, optimizer=tfps.optimizers.Adagrad(0.5), name="items")
        model = keras_module.Model(ids, keras_module.layers.Dense(1, activation="sigmoid")(layer(ids)))
        model.compile(keras_module.optimizers.Adagrad(0.5), "binary_crossentropy")
    scoring, recorder = recording_callbacks(keras_module, scores, layer)
    stopping = EarlyStopping(monitor="score", mode="min", patience=patience,
                             restore_best_weights=restore_best_weights, snapshot_dir=snapshot_dir)
    data = (keras.utils.experimental.DatasetCreator(dataset_fn) if strategy is not None
            else dataset_fn())
    history = model.fit(data, epochs=len(scores), steps_per_epoch=STEPS_PER_EPOCH, verbose=0,
                        callbacks=[scoring, recorder, stopping])
    epochs_run = len(history.history["loss"])
    best = int(np.argmin(scores[:epochs_run]))
    final_rows = sorted_rows(layer.table)
    final_predictions = np.asarray(model(tf.constant(PROBE)))
    return {
        "epochs_run": epochs_run,
        "best_epoch": best,
        "rows_per_epoch": [len(r["keys"]) for r in recorder.rows],
        "final_rows": len(final_rows["keys"]),
        "rows_equal_best": same_rows(final_rows, recorder.rows[best]),
        "rows_equal_last": same_rows(final_rows, recorder.rows[-1]),
        "best_differs_from_last": not same_rows(recorder.rows[best], recorder.rows[-1]),
        "prediction_gap_to_best": float(np.abs(final_predictions - recorder.predictions[best]).max()),
        "prediction_gap_to_last": float(np.abs(final_predictions - recorder.predictions[-1]).max()),
        "best_prediction_gap_to_last": float(np.abs(recorder.predictions[best] - recorder.predictions[-1]).max()),
    }
