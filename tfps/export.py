"""Export a trained model as a SavedModel that stock TensorFlow and TF Serving load with no
tfps ops: every shard of every dynamic table is frozen into sorted keys and a values
matrix, looked up with tf.searchsorted and tf.gather after the same routing as in
training."""

import os
import shutil
import uuid

import numpy as np
import tensorflow as tf

from tfps import stock_ops


class FrozenTable(tf.Module):
    """The rows of one table shard as stock variables: sorted int64 keys [n] and values
    [n, dim] (float32 or float16)."""

    def __init__(self, keys, values, name=None):
        super().__init__(name=name)
        self.num_rows = int(keys.shape[0])
        self.keys = tf.Variable(keys, trainable=False, name="keys")
        self.values = tf.Variable(values, trainable=False, name="values")

    def find(self, keys):
        """(float32 rows [n, dim], exists [n]) of int64 keys [n]; absent rows are zeros."""
        if self.num_rows == 0:
            return (tf.zeros([tf.shape(keys)[0], self.values.shape[1]], tf.float32),
                    tf.zeros(tf.shape(keys), tf.bool))
        position = tf.minimum(tf.searchsorted(self.keys, keys, out_type=tf.int64), self.num_rows - 1)
        exists = tf.equal(tf.gather(self.keys, position), keys)
        rows = tf.cast(tf.gather(self.values, position), tf.float32)
        return tf.where(exists[:, None], rows, 0.0), exists


class ShardedFrozenTable(tf.Module):
    """One FrozenTable per shard of a trained table; keys route to them as in training."""

    def __init__(self, shards, name=None):
        super().__init__(name=name)
        self.shards = list(shards)

    @property
    def num_rows(self):
        return sum(shard.num_rows for shard in self.shards)

    def find(self, keys):
        """(float32 rows [n, dim], exists [n]) of int64 keys [n]."""
        if len(self.shards) == 1:
            return self.shards[0].find(keys)
        route = stock_ops.shard_of(keys, len(self.shards))
        positions = tf.dynamic_partition(tf.range(tf.size(keys)), route, len(self.shards))
        parts = tf.dynamic_partition(keys, route, len(self.shards))
        found = [shard.find(part) for shard, part in zip(self.shards, parts)]
        return (tf.dynamic_stitch(positions, [rows for rows, _ in found]),
                tf.dynamic_stitch(positions, [exists for _, exists in found]))


def freeze(layer, min_count=None, value_dtype=None):
    """A ShardedFrozenTable of a DynamicEmbedding's table, keeping rows whose occurrence
    count is >= min_count. Each shard is frozen on its own device: under
    ParameterServerStrategy its parameter server sorts its rows into variables it holds,
    and a SavedModel save writes them from there, so no row passes through the chief."""
    value_dtype = tf.as_dtype(np.dtype(value_dtype or np.float32))
    if value_dtype not in (tf.float32, tf.float16):
        raise ValueError(f"save_for_serving: value_dtype must be float32 or float16, got "
                         f"{value_dtype.name}")
    frozen = []
    for i, shard in enumerate(layer.table.shards):
        with tf.device(shard.resource_handle.device):
            rows = shard.export()
            keys, values = rows.keys, rows.values
            if min_count is not None:
                keep = rows.metadata[:, 0] >= min_count
                keys, values = tf.boolean_mask(keys, keep), tf.boolean_mask(values, keep)
            if value_dtype == tf.float16:
                _check_float16_range(layer.name, i, values)
            order = tf.argsort(keys, stable=True)
            frozen.append(FrozenTable(tf.gather(keys, order), tf.cast(tf.gather(values, order), value_dtype),
                                      name=f"{layer.name}_frozen{i}"))
    return ShardedFrozenTable(frozen, name=f"{layer.name}_frozen")


_FLOAT16_MAX = float(np.finfo(np.float16).max)


def _check_float16_range(layer_name, shard, values):
    """Refuses rows float16 would serve as inf, before anything is written."""
    largest = float(tf.reduce_max(tf.abs(values))) if tf.size(values) > 0 else 0.0
    if largest > _FLOAT16_MAX:
        raise ValueError(
            f"save_for_serving: value_dtype=float16 cannot hold the rows of '{layer_name}' "
            f"(shard {shard} has a value of magnitude {largest:g}, beyond float16's "
            f"{_FLOAT16_MAX:g}, which would be served as inf); export in float32")


def _dynamic_embeddings(model):
    from tfps.keras_layers import DynamicEmbedding
    found = []
    for module in (model,) + tuple(model.submodules):
        if isinstance(module, DynamicEmbedding) and all(module is not f for f in found):
            found.append(module)
    return found


def _serving_inputs(model, signatures):
    """(input signature of the serving function, a function from its inputs to the model's).

    Each dense Keras input is one signature input of its name. A ragged input [batch, (k)]
    becomes NAME_values [n] and NAME_row_splits [batch + 1], a sparse one NAME_indices
    [n, rank], NAME_values [n] and NAME_dense_shape [rank], rebuilt inside the graph, so no
    padding ever reaches a combiner (a padded batch would count the padding in a mean)."""
    if signatures is not None:
        return signatures, lambda inputs: inputs
    if not getattr(model, "inputs", None):
        raise ValueError("save_for_serving: the model has no known inputs (a subclassed model "
                         "not yet called on Keras inputs); pass signatures=[tf.TensorSpec(...), ...]")
    specs, rebuilders = {}, {}
    for keras_input in model.inputs:
        name = keras_input.name.split(":")[0]
        spec = keras_input.type_spec
        if isinstance(spec, tf.RaggedTensorSpec):
            if spec.ragged_rank != 1:
                raise ValueError(f"save_for_serving: input '{name}' is ragged in {spec.ragged_rank} "
                                 "dimensions; serving signatures carry one ragged dimension")
            specs[f"{name}_values"] = tf.TensorSpec([None] + spec.shape[2:], spec.dtype, f"{name}_values")
            specs[f"{name}_row_splits"] = tf.TensorSpec([None], spec.row_splits_dtype, f"{name}_row_splits")
            rebuilders[id(keras_input)] = lambda f, n=name: tf.RaggedTensor.from_row_splits(
                f[f"{n}_values"], f[f"{n}_row_splits"], validate=True)
        elif isinstance(spec, tf.SparseTensorSpec):
            rank = spec.shape.rank
            specs[f"{name}_indices"] = tf.TensorSpec([None, rank], tf.int64, f"{name}_indices")
            specs[f"{name}_values"] = tf.TensorSpec([None], spec.dtype, f"{name}_values")
            specs[f"{name}_dense_shape"] = tf.TensorSpec([rank], tf.int64, f"{name}_dense_shape")
            rebuilders[id(keras_input)] = lambda f, n=name: tf.SparseTensor(
                f[f"{n}_indices"], f[f"{n}_values"], f[f"{n}_dense_shape"])
        else:
            specs[name] = tf.TensorSpec(keras_input.shape, keras_input.dtype, name=name)
            rebuilders[id(keras_input)] = lambda f, n=name: f[n]
    structure = model.input  # as the model was built: one input, a list or a dict

    def model_inputs(features):
        return tf.nest.map_structure(lambda keras_input: rebuilders[id(keras_input)](features), structure)

    return [specs], model_inputs


def _named_outputs(model, outputs):
    """Outputs keyed by the model's output names (a signature would call them output_0, ...)."""
    if isinstance(outputs, dict):
        return outputs
    names = list(getattr(model, "output_names", None) or [])
    flat = list(outputs) if isinstance(outputs, (list, tuple)) else [outputs]
    if len(names) != len(flat) or len(set(names)) != len(names):
        return outputs
    return dict(zip(names, flat))


class _ServingModule(tf.Module):
    pass


def save_for_serving(model, export_dir, min_count=None, value_dtype=None, signatures=None):
    """Writes a SavedModel that runs `model(inputs, training=False)` with stock ops only.

    Args:
      model: a tf_keras model with DynamicEmbedding layers (trained locally or under
        ParameterServerStrategy).
      export_dir: a directory that must not exist yet (missing parents are created); it
        appears only when complete.
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
    signature, model_inputs = _serving_inputs(model, signatures)

    @tf.function(input_signature=signature)
    def serve(inputs):
        return _named_outputs(model, model(model_inputs(inputs), training=False))

    tmp = os.path.join(parent, f".{os.path.basename(export_dir)}.tmp-{uuid.uuid4().hex}")
    try:
        os.makedirs(parent, exist_ok=True)
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
