"""The one place that loads the tfps op library."""

import glob
import json
import os

import tensorflow as tf

_HERE = os.path.dirname(os.path.abspath(__file__))
_BUILD_INFO = os.path.join(_HERE, "_tfps_ops.build.json")


def _load():
    libraries = glob.glob(os.path.join(_HERE, "_tfps_ops*.so"))
    if not libraries or not os.path.exists(_BUILD_INFO):
        raise ImportError(
            f"tfps: the op library is missing from {_HERE}; build and install tfps with "
            "`pip install --no-build-isolation .` in an environment that has TensorFlow")
    with open(_BUILD_INFO) as f:
        built_for = json.load(f)["tensorflow_version"]
    if built_for != tf.__version__:
        raise ImportError(
            f"tfps: the op library was built for TensorFlow {built_for}, but TensorFlow "
            f"{tf.__version__} is installed; rebuild tfps against this TensorFlow with "
            "`pip install --no-build-isolation --force-reinstall .`")
    return tf.load_op_library(libraries[0])


ops = _load()
