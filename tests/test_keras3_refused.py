"""A Keras 3 object reaching a tfps layer, metric or callback is refused at once with one
paragraph naming TF_USE_LEGACY_KERAS and tf_keras, instead of failing deep inside or (a
metric in a Keras 3 model) reporting a wrong value."""

import numpy as np
import pytest

import tfps

keras3 = pytest.importorskip("keras")  # TensorFlow 2.16+ depends on Keras 3
REMEDY = (r"tfps.s layers, metrics and callbacks are tf_keras .*set TF_USE_LEGACY_KERAS=1 .*tf_keras.*"
          r"tfps.keras_layers.keras3.DynamicEmbedding")


def keras3_model():
    inputs = keras3.Input((3,))
    return keras3.Model(inputs, keras3.layers.Dense(1, activation="sigmoid")(inputs))


def test_keras3_is_keras_3():
    assert keras3.__version__.startswith("3.")


@pytest.mark.parametrize("layer", [lambda: tfps.keras_layers.DynamicEmbedding(4),
                                   lambda: tfps.metrics.FeedGroups()])
def test_a_layer_called_on_a_keras3_tensor_is_refused(layer):
    with pytest.raises(TypeError, match="given a Keras 3 KerasTensor. " + REMEDY):
        layer()(keras3.Input((3,), dtype="int64"))


@pytest.mark.parametrize("metric", [tfps.metrics.AUC, tfps.metrics.BinaryLogLoss,
                                    tfps.metrics.CalibrationRatio, tfps.metrics.GroupAUC])
def test_a_metric_in_a_keras3_model_is_refused(metric):
    model = keras3_model()
    model.compile("sgd", "binary_crossentropy", metrics=[metric()])
    with pytest.raises(TypeError, match=f"tfps.metrics.{metric.__name__} is being used by a Keras 3 model. "
                                        + REMEDY):
        model.fit(np.zeros((8, 3), np.float32), np.ones((8, 1), np.float32), verbose=0)


@pytest.mark.parametrize("callback", [lambda tmp: tfps.callbacks.TableStats(),
                                      lambda tmp: tfps.callbacks.IncrementalBackup(str(tmp)),
                                      lambda tmp: tfps.callbacks.ExportForServing(str(tmp))])
def test_a_callback_given_a_keras3_model_is_refused(callback, tmp_path):
    model = keras3_model()
    model.compile("sgd", "binary_crossentropy")
    with pytest.raises(TypeError, match="was given a Keras 3 Functional. " + REMEDY):
        model.fit(np.zeros((8, 3), np.float32), np.ones((8, 1), np.float32), verbose=0,
                  callbacks=[callback(tmp_path)])
