import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402


@pytest.fixture(params=["eager", "tf_function"])
def run(request):
    """Calls fn(*args) eagerly, or inside a fresh tf.function, and returns NumPy results."""

    def call(fn, *args):
        if request.param == "tf_function":
            inner = fn
            # An op without outputs is an Operation in a graph; a tf.function cannot return it.
            fn = tf.function(lambda *a: _no_operations(inner(*a)), autograph=False)
        out = fn(*args)
        return tf.nest.map_structure(lambda t: t.numpy() if hasattr(t, "numpy") else t, out)

    call.mode = request.param
    return call


def _no_operations(out):
    return None if isinstance(out, tf.Operation) else out

