"""A clear refusal where a Keras 3 object meets tfps's layers, metrics or callbacks, which
are tf_keras (Keras 2) objects: Keras 3 would otherwise fail deep inside them, or, for a
metric, accept it as a plain function and average its per-batch results into a wrong value.
"""

import sys

_REMEDY = ("tfps's layers, metrics and callbacks are tf_keras (Keras 2) objects, and Keras 3 has "
           "no ParameterServerStrategy support. Either set TF_USE_LEGACY_KERAS=1 before TensorFlow "
           "is imported and build the model with tf_keras (`import tf_keras as keras`, or tf.keras "
           "under that variable), as the README's quick start does; or, to train on one host with "
           "Keras 3, use tfps.keras_layers.keras3.DynamicEmbedding (and its EarlyStopping).")


def is_keras3(obj):
    """Whether `obj` is a Keras 3 object (tensor, layer, model, optimizer, ...)."""
    module = type(obj).__module__ or ""
    return module == "keras" or module.startswith("keras.")


def refuse_keras3(what, objects):
    """Raises TypeError if any of `objects` is a Keras 3 object."""
    for obj in objects:
        if is_keras3(obj):
            raise TypeError(f"{what} was given a Keras 3 {type(obj).__name__}. {_REMEDY}")


def refuse_keras3_caller(what, depth=12):
    """Raises TypeError when Keras 3 code is calling (a Keras 3 model that took a tfps
    metric as a plain function)."""
    frame = sys._getframe(1)  # pylint: disable=protected-access
    for _ in range(depth):
        if frame is None:
            return
        if frame.f_globals.get("__name__", "").startswith("keras.src."):
            raise TypeError(f"{what} is being used by a Keras 3 model. {_REMEDY}")
        frame = frame.f_back
