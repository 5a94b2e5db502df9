"""Export a trained model as a SavedModel that stock TensorFlow and TF Serving load with no
tfps ops.

Each shard of each dynamic table becomes two variables: the serving order of its keys
(stock_ops.serving_order, ascending) and its values in that order, looked up with
tf.searchsorted and tf.gather after the same routing as in training. Each shard writes
its own rows into the SavedModel's variables (Tfps>TableExportForServing, on its
parameter server), one table stripe at a time, so no row passes through the chief and no
shard is ever whole in memory. The SavedModel is saved with empty stand-ins for those
variables; the chief then merges the dense variables with the shards' files
(MergeV2Checkpoints), as a checkpoint of several tasks is merged.

save_for_retrieval and load_for_retrieval (tfps.table._retrieval) export a table's keys and
vectors for a vector index instead.
"""

import functools
import os
import re
import shutil
import uuid

import numpy as np
import tensorflow as tf

from tfps import _arguments as arguments
from tfps.table import _stock_ops as stock_ops
from tfps._ops import ops
from tfps.table.sharded_table import on_every_shard
from tfps.table._retrieval import load_for_retrieval, save_for_retrieval  # noqa: F401  (tfps.export's)

_VARIABLE_KEY = "frozen_rows/{}/.ATTRIBUTES/VARIABLE_VALUE"


class FrozenTable(tf.Module):
    """The rows of one table shard for serving: `order` int64 [n], the serving order of its
    keys ascending, and `values` [n, dim] in that order: float32, or float16 values as
    their int16 bit patterns (as the export op writes them). Created empty (their first
    dimension unknown): the export writes the rows into the SavedModel."""

    def __init__(self, num_rows, dim, value_dtype, name=None):
        super().__init__(name=name)
        self.num_rows = num_rows
        self.value_dtype = value_dtype
        stored = tf.int16 if value_dtype == tf.float16 else tf.float32
        self.order = tf.Variable(tf.zeros([0], tf.int64), shape=[None], trainable=False, name="order")
        self.values = tf.Variable(tf.zeros([0, dim], stored), shape=[None, dim],
                                  trainable=False, name="values")

    def find(self, keys):
        """(float32 rows [n, dim], exists [n]) of int64 keys [n]; absent rows are zeros."""
        if self.num_rows == 0:
            return (tf.zeros([tf.shape(keys)[0], self.values.shape[1]], tf.float32),
                    tf.zeros(tf.shape(keys), tf.bool))
        order = stock_ops.serving_order(keys)
        last = tf.shape(self.order, out_type=tf.int64)[0] - 1
        position = tf.minimum(tf.searchsorted(self.order, order, out_type=tf.int64), last)
        exists = tf.equal(tf.gather(self.order, position), order)
        rows = tf.gather(self.values, position)
        if self.value_dtype == tf.float16:
            rows = tf.bitcast(rows, tf.float16)
        rows = tf.cast(rows, tf.float32)
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


def _value_dtype(value_dtype):
    if not isinstance(value_dtype, tf.dtypes.DType):
        value_dtype = tf.as_dtype(np.dtype(value_dtype or np.float32))
    if value_dtype not in (tf.float32, tf.float16):
        raise ValueError(f"save_for_serving: value_dtype must be float32 or float16, got "
                         f"{value_dtype.name}")
    return value_dtype


def freeze(layer, directory, table_name, min_count=None, value_dtype=None):
    """Writes the rows of a DynamicEmbedding's table whose occurrence count is >= min_count
    as one tensor bundle per shard, `directory/<table_name>_shard<i>`, each written by its
    shard's device (under ParameterServerStrategy, its parameter server), all shards at
    once. Returns (a ShardedFrozenTable of empty stand-ins with the row counts, the
    bundles' prefixes, {stand-in name: variable}); the bundles hold the rows under the keys
    the SavedModel gives the stand-ins when tracked as `frozen_rows/<stand-in name>`."""
    value_dtype = _value_dtype(value_dtype)
    shards = layer.table.shards
    names = [(f"{table_name}_shard{i}_order", f"{table_name}_shard{i}_values") for i in range(len(shards))]
    prefixes = [os.path.join(directory, f"{table_name}_shard{i}") for i in range(len(shards))]

    def write(i):
        with tf.device(shards[i].resource_handle.device):
            try:
                return int(ops.tfps_table_export_for_serving(
                    shards[i].resource_handle, prefixes[i], hashes_key=_VARIABLE_KEY.format(names[i][0]),
                    values_key=_VARIABLE_KEY.format(names[i][1]), value_dtype=value_dtype,
                    min_count=0 if min_count is None else int(min_count)))
            except tf.errors.InvalidArgumentError as e:
                found = re.search(r"float16 cannot hold (.*?) \(it rounds", e.message)
                if found is None:
                    raise
                raise ValueError(
                    f"save_for_serving: value_dtype=float16 cannot hold the rows of '{layer.name}': "
                    f"shard {i} has {found.group(1)}, which float16 would serve as inf; export in "
                    "float32") from None
    rows = on_every_shard([functools.partial(write, i) for i in range(len(shards))])
    frozen, variables = [], {}
    for i, (shard, n) in enumerate(zip(shards, rows)):
        with tf.device(shard.resource_handle.device):
            frozen.append(FrozenTable(n, layer.table.dim, value_dtype, name=f"{layer.name}_frozen{i}"))
        variables[names[i][0]], variables[names[i][1]] = frozen[-1].order, frozen[-1].values
    return ShardedFrozenTable(frozen, name=f"{layer.name}_frozen"), prefixes, variables


def _merge_rows_into(variables_prefix, row_bundles, row_keys, scratch):
    """Replaces the stand-ins' entries in the SavedModel's variables (`variables_prefix`)
    with the shards' bundles: the other entries (dense variables, the object graph) are
    copied into a bundle of their own on the chief, and all are merged into one."""
    dtypes = tf.train.load_checkpoint(variables_prefix).get_variable_to_dtype_map()
    missing = sorted(set(row_keys) - set(dtypes))
    if missing:
        raise RuntimeError(f"save_for_serving: the SavedModel names its variables differently "
                           f"than expected (no {missing[:2]}); this TensorFlow version is not supported")
    others = sorted(set(dtypes) - set(row_keys))
    dense = os.path.join(scratch, "dense")
    with tf.device("CPU:0"):
        tensors = tf.raw_ops.RestoreV2(prefix=variables_prefix, tensor_names=others,
                                       shape_and_slices=[""] * len(others),
                                       dtypes=[dtypes[k] for k in others])
        tf.raw_ops.SaveV2(prefix=dense, tensor_names=others, shape_and_slices=[""] * len(others),
                          tensors=tensors)
        del tensors
        for path in tf.io.gfile.glob(variables_prefix + ".*"):
            tf.io.gfile.remove(path)
        tf.raw_ops.MergeV2Checkpoints(checkpoint_prefixes=[dense] + list(row_bundles),
                                      destination_prefix=variables_prefix, delete_old_dirs=True)


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
      min_count: an int >= 1: keep only rows whose occurrence count is >= min_count;
        pruned IDs serve the layer's inference default (zeros, or the initial value).
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
    value_dtype = _value_dtype(value_dtype)
    if min_count is not None:
        min_count = arguments.positive_int(min_count, "min_count", "save_for_serving")
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
    scratch = os.path.join(tmp, "variables", "tfps-rows")
    try:
        tf.io.gfile.makedirs(scratch)
        module = _ServingModule()
        frozen_tables, bundles, row_variables = [], [], {}
        for index, layer in enumerate(layers):
            frozen, prefixes, variables = freeze(layer, scratch, f"table{index}", min_count, value_dtype)
            frozen_tables.append(frozen)
            bundles += prefixes
            row_variables.update(variables)
        # The stand-ins are tracked at one short path each, which names their entries in
        # the SavedModel's variables (the keys the shards' bundles already use).
        module.frozen_rows = row_variables
        # Saving may trace `serve` again, so the layers use their frozen tables until it is done.
        for layer, frozen in zip(layers, frozen_tables):
            layer.use_serving_table(frozen)
        concrete = serve.get_concrete_function()
        module.serve = serve
        # Track exactly the variables the serving graph reads (dense weights and frozen
        # rows), not the layers, whose table resources would need tfps ops to load.
        stand_ins = {id(v) for v in row_variables.values()}
        module.variables_read = [v for v in concrete.variables if id(v) not in stand_ins]
        tf.saved_model.save(module, tmp, signatures={"serving_default": concrete})
        _merge_rows_into(os.path.join(tmp, "variables", "variables"), bundles,
                         [_VARIABLE_KEY.format(name) for name in row_variables], scratch)
        if tf.io.gfile.exists(scratch):
            tf.io.gfile.rmtree(scratch)
        os.rename(tmp, export_dir)
    finally:
        for layer in layers:
            layer.use_serving_table(None)
        if os.path.exists(tmp):
            shutil.rmtree(tmp, ignore_errors=True)
    size = sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(export_dir) for f in files)
    return {"export_dir": export_dir, "bytes": size,
            "rows": {layer.name: frozen.num_rows for layer, frozen in zip(layers, frozen_tables)}}
