"""Builds the tfps op library against the installed TensorFlow's tf.sysconfig flags."""

import os
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import build_config  # noqa: E402  (lives beside this file)


class BuildTfOpLibrary(build_ext):
    """Compiles every source in parallel with the TF flags (through the object cache) and
    links one shared library."""

    def build_extension(self, ext):
        compile_flags, link_flags = build_config.tensorflow_flags()
        cxx = os.environ.get("CXX", "g++")
        objects_dir = os.path.join(self.build_temp, "tfps_objects")
        os.makedirs(objects_dir, exist_ok=True)

        objects = [os.path.abspath(os.path.join(objects_dir, source.replace("/", "_") + ".o"))
                   for source in ext.sources]
        # Sources by their path in the tree, so an sdist's build reuses a checkout's objects.
        build_config.compile_in_parallel(
            [[cxx, "-c", source, "-o", obj, "-I", "."] + build_config.CXXFLAGS + compile_flags
             for source, obj in zip(ext.sources, objects)], cwd=HERE, cache_dir=build_config.object_cache_dir())
        output = self.get_ext_fullpath(ext.name)
        os.makedirs(os.path.dirname(output), exist_ok=True)
        subprocess.run([cxx, "-shared", "-o", output] + objects + link_flags + build_config.CORE_LINK_FLAGS + ["-pthread"],
                       check=True)


def runtime_requirements():
    """The TensorFlow the library is built against, and the tf_keras and TensorBoard of its
    minor version: the library refuses to load under any other TensorFlow, and tfps's
    Keras layers are tf_keras layers (TableStats writes TensorBoard summaries)."""
    import tensorflow as tf
    minor = ".".join(tf.__version__.split(".")[:2])
    return [f"tensorflow=={minor}.*", f"tf_keras=={minor}.*", f"tensorboard=={minor}.*", "numpy"]


setup(
    install_requires=runtime_requirements(),
    ext_modules=[
        Extension("tfps._tfps_ops", sources=build_config.CORE_SOURCES + build_config.OP_SOURCES)
    ],
    cmdclass={"build_ext": BuildTfOpLibrary},
)
