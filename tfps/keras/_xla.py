"""compile(jit_compile=True) on a tf_keras model with tables falls back to False, as Keras 3
does for its DynamicEmbedding: XLA compiles a step whole, and a table lookup is a custom
op without an XLA kernel, so the first step would fail naming that op instead."""

import functools
import warnings


def falling_back_from_xla(compile_):
    @functools.wraps(compile_)
    def compile(self, *args, **kwargs):  # pylint: disable=redefined-builtin
        result = compile_(self, *args, **kwargs)
        from tfps.keras_layers._table_lookup import table_layers
        layers = table_layers(self) if self._jit_compile else []  # pylint: disable=protected-access
        if layers:
            warnings.warn(
                f"tfps: jit_compile=True falls back to False for this model: the tables of "
                f"{', '.join(layer.name for layer in layers)} are looked up and updated by custom "
                "ops that XLA cannot compile, and XLA compiles a training step whole.",
                UserWarning, stacklevel=2)
            self._jit_compile = False  # pylint: disable=protected-access
        return result
    return compile
