"""Export a trained model as a SavedModel that stock TensorFlow and TF Serving load with no
tfps ops: every dynamic table is frozen into sorted keys and a values matrix, looked up
with tf.searchsorted and tf.gather."""

import os
import shutil
import uuid

import numpy as np
import tensorflow as tf

from tfps import stock_ops


class FrozenTable(tf.Module):
    """The rows of a dynamic table as stock variables: sorted int64 keys [n] and values
    [n, dim] (float32 or float16)."""

    def __init__(self, keys, values, name=None):
        super().__init__(name=name)
        order = np.argsort(keys, kind="stable")
        self.num_rows = int(len(keys))
        self.keys = tf.Variable(keys[order], trainable=False, name="keys")
        self.values = tf.Variable(values[order], trainable=False, name="values")

    def find(self, keys):
        """(float32 rows [n, dim], exists [n]) of int64 keys [n]; absent rows are zeros."""
        if self.num_rows == 0:
            return (tf.zeros([tf.shape(keys)[0], self.values.shape[1]], tf.float32),
                    tf.zeros(tf.shape(keys), tf.bool))
        position = tf.minimum(tf.searchsorted(self.keys, keys, out_type=tf.int64), self.num_rows - 1)
        exists = tf.equal(tf.gather(self.keys, position), keys)
        rows = tf.cast(tf.gather(self.values, position), tf.float32)
        return tf.where(exists[:, None], rows, 0.0), exists


def freeze(layer, min_count=None, value_dtype=None, chunk_rows=1 << 16):
    """A FrozenTable of a DynamicEmbedding's table, read shard by shard in chunks (under
    ParameterServerStrategy each chunk comes from its PS), keeping rows whose occurrence
    count is >= min_count."""
    value_dtype = np.dtype(value_dtype or np.float32)
    if value_dtype not in (np.float32, np.float16):
        raise ValueError(f"save_for_serving: value_dtype must be float32 or float16, got {value_dtype}")
    keys, values = [], []
    for chunk in layer.table.export_chunks(chunk_rows):
        keep = slice(None)
        if min_count is not None:
            keep = chunk.metadata.numpy()[:, 0] >= min_count
        keys.append(chunk.keys.numpy()[keep])
        values.append(chunk.values.numpy()[keep].astype(value_dtype))
    keys = np.concatenate(keys) if keys else np.zeros([0], np.int64)
    values = np.concatenate(values) if values else np.zeros([0, layer.dim], value_dtype)
    return FrozenTable(keys, values, name=f"{layer.name}_frozen")


def _dynamic_embeddings(model):
    from tfps.keras_layers import DynamicEmbedding
    found = []
    for module in (model,) + tuple(model.submodules):
        if isinstance(module, DynamicEmbedding) and all(module is not f for f in found):
            found.append(module)
    return found


def _input_signature(model, signatures):
    if signatures is not None:
        return signatures
    inputs = getattr(model, "inputs", None)
    if not inputs:
        raise ValueError("save_for_serving: the model has no known inputs (a subclassed model "
                         "not yet called on Keras inputs); pass signatures=[tf.TensorSpec(...), ...]")
    specs = [tf.TensorSpec(t.shape, t.dtype, name=t.name.split(":")[0]) for t in inputs]
    return [specs[0]] if len(specs) == 1 else [specs]


class _ServingModule(tf.Module):
    pass


def save_for_serving(model, export_dir, min_count=None, value_dtype=None, signatures=None):
    """Writes a SavedModel that runs `model(inputs, training=False)` with stock ops only.

    Args:
      model: a tf_keras model with DynamicEmbedding layers (trained locally or under
        ParameterServerStrategy).
      export_dir: a directory that must not exist yet; it appears only when complete.
      min_count: keep only rows whose occurrence count is >= min_count; pruned IDs serve
        the layer's inference default (zeros, or the initial value).
      value_dtype: float32 (default) or float16 storage of the frozen rows.
      signatures: input signature (list of TensorSpec) when the model has no Keras inputs.

    Returns:
      dict with "rows" per layer name, "bytes" of the SavedModel and "export_dir".
    """
    export_dir = os.path.abspath(export_dir)
    if os.path.exists(export_dir):
        raise FileExistsError(f"save_for_serving: {export_dir} already exists; choose a new "
                              "directory (an export is never written over another)")
    parent = os.path.dirname(export_dir)
    layers = _dynamic_embeddings(model)
    if not layers:
        raise ValueError("save_for_serving: the model has no tfps DynamicEmbedding layer; "
                         "use tf.saved_model.save for it")
    module = _ServingModule()
    module.frozen_tables = [freeze(layer, min_count, value_dtype) for layer in layers]
    signature = _input_signature(model, signatures)

    @tf.function(input_signature=signature)
    def serve(inputs):
        return model(inputs, training=False)

    tmp = os.path.join(parent, f".{os.path.basename(export_dir)}.tmp-{uuid.uuid4().hex}")
    try:
        os.mkdir(tmp)
    except OSError as e:
        raise PermissionError(f"save_for_serving: cannot write into {parent}: {e}") from e
    # Saving may trace `serve` again, so the layers use their frozen tables until it is done.
    for layer, frozen in zip(layers, module.frozen_tables):
        layer._serving_table = frozen  # pylint: disable=protected-access
    try:
        concrete = serve.get_concrete_function()
        module.serve = serve
        # Track exactly the variables the serving graph reads (dense weights and frozen
        # rows), not the layers, whose table resources would need tfps ops to load.
        module.variables_read = list(concrete.variables)
        tf.saved_model.save(module, tmp, signatures={"serving_default": concrete})
        os.rename(tmp, export_dir)
    finally:
        for layer in layers:
            layer._serving_table = None  # pylint: disable=protected-access
        if os.path.exists(tmp):
            shutil.rmtree(tmp, ignore_errors=True)
    size = sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(export_dir) for f in files)
    return {"export_dir": export_dir, "bytes": size,
            "rows": {layer.name: frozen.num_rows for layer, frozen in zip(layers, module.frozen_tables)}}
