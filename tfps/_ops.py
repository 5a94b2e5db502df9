"""The one place that loads the tfps op library."""

import glob
import os
import re

import tensorflow as tf

_HERE = os.path.dirname(os.path.abspath(__file__))
_BUILD_INFO = re.compile(rb"TFPS_BUILT_FOR_TENSORFLOW=([0-9A-Za-z.+-]+);")


def built_for_tensorflow(library_path):
    """The TensorFlow version a tfps library file was compiled against, or None."""
    with open(library_path, "rb") as f:
        match = _BUILD_INFO.search(f.read())
    return match.group(1).decode() if match else None


def check_library(library_path, installed_version):
    """Raises ImportError naming both versions if the library was built for another TF."""
    built_for = built_for_tensorflow(library_path)
    if built_for != installed_version:
        raise ImportError(
            f"tfps: the op library {os.path.basename(library_path)} was built for TensorFlow "
            f"{built_for or 'unknown'}, but TensorFlow {installed_version} is installed; "
            "rebuild tfps against this TensorFlow with `pip install --no-build-isolation "
            "--force-reinstall .`")


def _load():
    libraries = glob.glob(os.path.join(_HERE, "_tfps_ops*.so"))
    if not libraries:
        raise ImportError(
            f"tfps: the op library is missing from {_HERE}; build and install tfps with "
            "`pip install --no-build-isolation .` in an environment that has TensorFlow")
    check_library(libraries[0], tf.__version__)
    return tf.load_op_library(libraries[0])


def _load_gpu_kernels():
    """The GPU kernels of the table ops (scripts/build_gpu_ops.py cuda), where they were built
    and TensorFlow sees a GPU: a DynamicTable created under tf.device("/GPU:0") then lives
    in GPU memory. They register kernels only, for the ops of the library above."""
    path = os.path.join(_HERE, "_tfps_gpu_ops.so")
    if not os.path.exists(path) or not tf.config.list_physical_devices("GPU"):
        return False
    check_library(path, tf.__version__)
    tf.load_op_library(path)
    return True


ops = _load()
gpu_kernels_loaded = _load_gpu_kernels()
