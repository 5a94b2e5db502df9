"""DynamicEmbedding and EarlyStopping for Keras 3 (`import keras`, TensorFlow backend):
the table, IDs, namespaces, combiners, admission and eviction of
tfps.keras_layers.DynamicEmbedding, trained on one host by Keras 3's `fit` or a custom loop
through the Keras 3 optimizer's apply, and saved in `.keras` archives.

Keras 3 has no ParameterServerStrategy support, so this layer trains its tables in the
process that runs the model (on its CPU, or its GPU where tfps was built with the GPU
kernels); for tables on parameter servers use the tf_keras layer (TF_USE_LEGACY_KERAS=1).
Importing this module installs tfps's Keras 3 patches (tfps.keras._patches)."""

import keras
import tensorflow as tf

from tfps.keras import _optimizer_bridge as optimizer_bridge
from tfps.keras import _patches as patches
from tfps.keras._early_stopping import TableSnapshots
from tfps.keras_layers._table_lookup import TableLookup
from tfps.table.sharded_table import check_transfer_dtype

patches.apply_keras3()


def _check_backend():
    if keras.backend.backend() != "tensorflow":
        raise ValueError(
            f"tfps.keras_layers.keras3.DynamicEmbedding runs on Keras 3's TensorFlow backend; this "
            f"process uses the '{keras.backend.backend()}' backend. Set KERAS_BACKEND=tensorflow "
            "before Keras is imported")


@keras.saving.register_keras_serializable(package="tfps")
class DynamicEmbedding(TableLookup, keras.layers.Layer):
    """Embeds 64-bit IDs with a dynamic table, in a Keras 3 model (TensorFlow backend).

    The same layer as tfps.keras_layers.DynamicEmbedding, with the same arguments, inputs
    and outputs (see there), for Keras 3. A training lookup (fit, training=True, or a plain
    call under a GradientTape) inserts new IDs; its gradient reaches the Keras 3 optimizer
    through the layer's zero-size `table_proxy` variable, and the optimizer's apply sends
    the per-ID sums, after loss-scale unscaling and clipping, to the table, whose own
    optimizer (`optimizer`) updates the rows. So the table trains once per optimizer step,
    not when the layer is frozen or a step is skipped. Inference inserts nothing.

    Unlike the tf_keras layer, it cannot train under ParameterServerStrategy (Keras 3 has
    no support for it) or any other distribution strategy: the tables live in this process.
    """

    _keras = keras

    def __init__(self, dim, combiner=None, initializer=None, optimizer="adagrad",
                 key_dtype=tf.int64, seed=None, unseen="zeros", embeddings_regularizer=None,
                 admission=None, eviction=None, max_rows=None, worker_cache_rows=None,
                 max_staleness_steps=None, transfer_dtype="float32", non_finite="refuse", storage=None,
                 **kwargs):
        _check_backend()
        kwargs["autocast"] = False  # IDs are not activations (see the tf_keras layer)
        super().__init__(**kwargs)
        # A table lookup is a custom op, which XLA cannot compile: jit_compile=True then falls
        # back to False with Keras' warning (Keras' Layer.__init__ sets this per instance).
        self.supports_jit = False
        if worker_cache_rows is not None:
            raise ValueError(
                f"DynamicEmbedding '{self.name}': worker_cache_rows caches rows of parameter "
                "servers on each worker, and the Keras 3 layer's table lives in this process; "
                "leave it None (the tf_keras layer takes it under ParameterServerStrategy)")
        if check_transfer_dtype(transfer_dtype, f"DynamicEmbedding '{self.name}'") != tf.float32:
            raise ValueError(
                f"DynamicEmbedding '{self.name}': transfer_dtype={transfer_dtype!r} is what rows "
                "travel as between workers and parameter servers, and the Keras 3 layer cannot "
                "train under ParameterServerStrategy; leave it float32 (the tf_keras layer "
                "takes it)")
        self._init_table_lookup(dim, combiner, initializer, optimizer, key_dtype, seed, unseen,
                                embeddings_regularizer, admission, eviction, max_rows,
                                worker_cache_rows, max_staleness_steps, transfer_dtype, non_finite,
                                storage)

    def _check_strategy(self, strategy):
        if isinstance(strategy, tf.distribute.experimental.ParameterServerStrategy):
            raise ValueError(
                f"DynamicEmbedding '{self.name}': Keras 3 cannot train under "
                "ParameterServerStrategy. For tables on parameter servers, set "
                "TF_USE_LEGACY_KERAS=1 before TensorFlow is imported and use "
                "tfps.keras_layers.DynamicEmbedding with tf_keras")
        if tf.distribute.has_strategy() and not isinstance(strategy, tf.distribute.OneDeviceStrategy):
            raise ValueError(
                f"DynamicEmbedding '{self.name}': {type(strategy).__name__} is not supported by "
                "the Keras 3 layer, whose table lives in this process; train without a strategy")

    def build(self, input_shape):
        # The table's stand-in among the model's variables (tfps.keras._keras3_bridge).
        self.table_proxy = self.add_weight(shape=(0, self.dim), initializer="zeros", name="table_proxy",
                                           trainable=True, autocast=False)
        optimizer_bridge.register_proxy(self.table_proxy, self)
        self.built = True

    def _read_proxy(self):
        return tf.convert_to_tensor(self.table_proxy)

    def __call__(self, inputs, *args, **kwargs):
        for value in tf.nest.flatten(inputs):
            if (type(value).__module__ or "").startswith("tf_keras"):
                raise TypeError(
                    f"DynamicEmbedding '{self.name}' is the Keras 3 layer and was given a tf_keras "
                    f"{type(value).__name__}; in a tf_keras model use tfps.keras_layers.DynamicEmbedding")
        return super().__call__(inputs, *args, **kwargs)

    def compute_output_spec(self, inputs, training=None, namespace=None):
        shape = tuple(inputs.shape)
        if self.combiner is None:
            return keras.KerasTensor(shape + (self.dim,), dtype=self.compute_dtype,
                                     ragged=getattr(inputs, "ragged", False))
        if len(shape) < 2:
            raise ValueError("DynamicEmbedding: a combiner needs multi-hot input of rank >= 2 "
                             f"(IDs along the last axis), got shape {shape}")
        return keras.KerasTensor(shape[:-1] + (self.dim,), dtype=self.compute_dtype)

    def get_config(self):
        return {**super().get_config(), **self._lookup_config()}


class EarlyStopping(TableSnapshots, keras.callbacks.EarlyStopping):
    """keras.callbacks.EarlyStopping (Keras 3) that, with `restore_best_weights=True`, also
    gives back every DynamicEmbedding's table as it was at the end of the best epoch, as
    tfps.callbacks.EarlyStopping does for tf_keras (see there; the same `snapshot_dir`).
    The stock callback restores the dense weights only, leaving the last epoch's rows
    under the best epoch's dense layers."""
