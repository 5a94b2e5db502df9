"""Export a trained model as a SavedModel that stock TensorFlow and TF Serving load with no
tfps ops.

Each table shard's rows are frozen into variables (tfps.keras._serving_rows): the serving
order of its keys (stock_ops.serving_order, ascending) and its values in that order,
looked up with tf.searchsorted and tf.gather after the same routing as in training; an
export of changes adds, per shard, a layer of the rows changed and the keys removed
since the export it follows, and reuses the layers before. Each shard writes its own rows
into a tensor bundle on its parameter server, one table stripe at a time, so no row
passes through the chief and no shard is ever whole in memory. The SavedModel is saved
with empty stand-ins for those variables; the chief then merges the dense variables with
the shards' bundles (MergeV2Checkpoints), as a checkpoint of several tasks is merged, and
keeps the bundles (hard links) under tfps_rows/ for the next export of changes.

save_for_retrieval and load_for_retrieval (tfps.table._retrieval) export a table's keys and
vectors for a vector index instead.
"""

import os
import random
import shutil
import uuid

import tensorflow as tf

from tfps import _arguments as arguments
from tfps import _durable as durable
from tfps.keras import _serving_rows as serving_rows
from tfps.keras._serving_rows import freeze  # noqa: F401  (tfps.export's)
from tfps.table._retrieval import load_for_retrieval, save_for_retrieval  # noqa: F401  (tfps.export's)

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
    """The DynamicEmbedding layers of a tf_keras or Keras 3 model."""
    from tfps.keras_layers._table_lookup import table_layers
    return table_layers(model)


def _type_spec(keras_input):
    """The TypeSpec of a tf_keras or Keras 3 model input."""
    if hasattr(keras_input, "type_spec"):
        return keras_input.type_spec
    shape, dtype = tf.TensorShape(keras_input.shape), tf.as_dtype(keras_input.dtype)
    if getattr(keras_input, "ragged", False):
        return tf.RaggedTensorSpec(shape, dtype, ragged_rank=getattr(keras_input, "ragged_rank", 1) or 1)
    if getattr(keras_input, "sparse", False):
        return tf.SparseTensorSpec(shape, dtype)
    return tf.TensorSpec(shape, dtype)


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
        spec = _type_spec(keras_input)
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


def save_for_serving(model, export_dir, min_count=None, value_dtype=None, signatures=None,
                     changes_since=None, chain=None, max_change_layers=8, max_layered_rows=1.25):
    """Writes a SavedModel that runs `model(inputs, training=False)` with stock ops only.

    Args:
      model: a tf_keras model with DynamicEmbedding layers (trained locally or under
        ParameterServerStrategy), or a Keras 3 model with tfps.keras_layers.keras3's.
      export_dir: a directory that must not exist yet (missing parents are created); it
        appears only when complete.
      min_count: an int >= 1: keep only rows whose occurrence count is >= min_count;
        pruned IDs serve the layer's inference default (zeros, or the initial value).
      value_dtype: float32 (default) or float16 storage of the frozen rows.
      signatures: input signature (list of TensorSpec) when the model has no Keras inputs.
      changes_since: the directory of the export this one follows (whole or of changes):
        write only the rows changed and the keys removed since it, and reuse its rows
        (hard-linked), so the export costs the rows that changed. Its min_count,
        value_dtype and chain carry over. The SavedModel serves exactly as a whole export
        would. A shard whose changes the table cannot tell (restored or cleared since, or
        the chain moved on to another export) is written whole.
      chain: a name for the chain of exports of changes a whole export starts; by default
        each whole export starts a chain of its own, so other exports, checkpoints and
        backups in between take no changes away from it. Exports of changes continue
        the chain of the export they follow.
      max_change_layers: a shard's rows are its whole export and the exports of changes
        after it, which serving consults newest first; a shard that has this many exports
        of changes is written whole again.
      max_layered_rows: a shard is also written whole again when its whole export and
        exports of changes would hold more than this many times its rows (a row changed
        in every export is held once per export), which bounds a version's size.

    Returns:
      dict with "export_dir", "bytes" of the export (a file with two names, counted
      once), "bytes_written" (without the files reused from earlier exports), "rows" written per layer name (every row, or the rows
      changed), "removed" per layer name, and "whole_shards" per layer name (all of them
      in a whole export).
    """
    export_dir = os.path.abspath(arguments.path(export_dir, "export_dir", "save_for_serving"))
    if changes_since is not None:
        changes_since = arguments.path(changes_since, "changes_since", "save_for_serving")
    if not hasattr(model, "layers"):  # a tf_keras or Keras 3 Model, not a layer or None
        raise ValueError(f"save_for_serving: model must be a Keras model holding tfps "
                         f"DynamicEmbedding layers, got {type(model).__name__}")
    if os.path.exists(export_dir):
        raise FileExistsError(f"save_for_serving: {export_dir} already exists; choose a new "
                              "directory (an export is never written over another)")
    parent = os.path.dirname(export_dir)
    layers = _dynamic_embeddings(model)
    if not layers:
        raise ValueError("save_for_serving: the model has no tfps DynamicEmbedding layer; "
                         "use tf.saved_model.save for it")
    if min_count is not None:
        min_count = arguments.positive_int(min_count, "min_count", "save_for_serving")
    max_change_layers = arguments.positive_int(max_change_layers, "max_change_layers", "save_for_serving")
    max_layered_rows = arguments.number_at_least(max_layered_rows, 1, "max_layered_rows", "save_for_serving")
    if chain is not None and (not isinstance(chain, str) or not chain):
        raise ValueError(f"save_for_serving: chain must be a non-empty string, got {chain!r}")
    previous = None
    if changes_since is not None:
        previous, min_count, value_dtype = serving_rows.read_previous(
            os.path.abspath(changes_since), layers, chain, min_count, value_dtype)
        chain = previous["chain"]
    value_dtype = serving_rows.value_dtype_of(value_dtype)
    export_id = random.getrandbits(62) + 1
    chain = chain or f"serving-{export_id:x}"
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
    kept_rows = os.path.join(tmp, serving_rows.LAYERS_DIR)
    try:
        tf.io.gfile.makedirs(scratch)
        tf.io.gfile.makedirs(kept_rows)
        module = _ServingModule()
        plans, row_variables = [], {}
        for index, layer in enumerate(layers):
            plans.append(serving_rows.write_layers(
                layer, scratch, f"table{index}", min_count or 0, value_dtype,
                previous=previous and serving_rows.previous_of_table(previous, index),
                export_id=export_id if previous else None, max_change_layers=max_change_layers,
                max_layered_rows=max_layered_rows))
            row_variables.update(plans[-1].variables)
        bundles = [prefix for plan in plans for prefix in plan.prefixes]
        for prefix in bundles:  # kept for the exports of changes that follow this one
            serving_rows.link_bundle(prefix, os.path.join(kept_rows, os.path.basename(prefix)))
        # The stand-ins are tracked at one short path each, which names their entries in
        # the SavedModel's variables (the keys the shards' bundles already use).
        module.frozen_rows = row_variables
        # The layers use their frozen tables until the graph is saved.
        for layer, plan in zip(layers, plans):
            layer.use_serving_table(plan.frozen)
        # Saved as the signature only: tracking the tf.function as well would trace the
        # model a second time, the largest part of an export of few changes.
        concrete = serve.get_concrete_function()
        # Track exactly the variables the serving graph reads (dense weights and frozen
        # rows), not the layers, whose table resources would need tfps ops to load.
        stand_ins = {id(v) for v in row_variables.values()}
        module.variables_read = [v for v in concrete.variables if id(v) not in stand_ins]
        tf.saved_model.save(module, tmp, signatures={"serving_default": concrete})
        _merge_rows_into(os.path.join(tmp, "variables", "variables"), bundles,
                         [serving_rows.VARIABLE_KEY.format(name) for name in row_variables], scratch)
        if tf.io.gfile.exists(scratch):
            tf.io.gfile.rmtree(scratch)
        serving_rows.write_manifest(kept_rows, export_id, chain, min_count, value_dtype, layers, plans)
        durable.replace(tmp, export_dir)
    finally:
        for layer in layers:
            layer.use_serving_table(None)
        if os.path.exists(tmp):
            shutil.rmtree(tmp, ignore_errors=True)
    serving_rows.commit(layers, plans, export_dir, export_id, chain)
    return _export_summary(export_dir, layers, plans, previous)


def _export_summary(export_dir, layers, plans, previous):
    reused = set()
    if previous is not None:
        for name in (n for plan in plans for n in plan.reused):
            for path in tf.io.gfile.glob(os.path.join(previous["directory"], name) + ".*"):
                reused.add(os.stat(path).st_ino)
    counted, size, written = set(), 0, 0
    for d, _, files in os.walk(export_dir):
        for f in files:
            stat = os.stat(os.path.join(d, f))
            if stat.st_ino in counted:  # a second name (a kept link) of a file counted
                continue
            counted.add(stat.st_ino)
            size += stat.st_size
            if stat.st_ino not in reused:
                written += stat.st_size
    new_layers = [[shard[-1] for shard in plan.shard_layers
                   if shard and shard[-1]["name"] not in plan.reused] for plan in plans]
    return {"export_dir": export_dir, "bytes": size, "bytes_written": written,
            "rows": {layer.name: sum(entry["rows"] for entry in new) for layer, new in zip(layers, new_layers)},
            "removed": {layer.name: sum(entry.get("removed", 0) for entry in new)
                        for layer, new in zip(layers, new_layers)},
            "whole_shards": {layer.name: sum(entry["kind"] == "whole" for entry in new)
                             for layer, new in zip(layers, new_layers)}}
