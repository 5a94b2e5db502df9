"""What Keras' model-level paths (saving, weights, summary) do with dynamic tables.

The `.keras` format and TF-format weights/checkpoints carry every row (the layer writes its
table into the archive; tfps.checkpoint streams it from each parameter server). Two older
paths cannot: HDF5 files hold only a layer's variables, and `get_weights` / `set_weights`
trade in those variables as NumPy arrays. tfps makes the first refuse, before any file is
written, and the second warn, since silently dropping a model's embeddings is the worst
outcome of either. `summary()` ends with each table's dim, rows and shards, which the
parameter counts (of variables) leave out. tfps.keras._patches installs these when tfps is imported.
"""

import functools
import warnings


def tables_of(model):
    """The names of the DynamicEmbedding layers (tf_keras's or Keras 3's) in a model, nested
    models included."""
    from tfps.keras_layers._table_lookup import table_layers
    return [layer.name for layer in table_layers(model)]


# The saves that carry every row, as each Keras names them.
_WHOLE_SAVES = {
    "tf_keras": "Save in the .keras format (model.save('m.keras'), model.save_weights("
                "'m.weights.h5')), as a SavedModel directory, or as TF-format weights "
                "(model.save_weights('ckpt/weights'), tf.train.Checkpoint)",
    "keras3": "Save in the .keras format (model.save('m.keras'), model.save_weights("
              "'m.weights.h5')), with tf.train.Checkpoint(model=model), or export a SavedModel "
              "(model.export('dir'), tfps.export.save_for_serving)",
}


def refuse_hdf5(what, filepath, tables, keras="tf_keras"):
    """Raises for an HDF5 save of a model with the dynamic tables `tables` (names), naming
    the saves of `keras` ("tf_keras" or "keras3") that carry every row."""
    raise ValueError(
        f"tfps: {what} in HDF5 ('{filepath}') cannot hold the rows of the dynamic "
        f"tables of {', '.join(tables)}; nothing was written. {_WHOLE_SAVES[keras]}: each "
        "carries every row.")


def _writes_hdf5(filepath, save_format):
    """Whether a legacy save of `filepath` writes HDF5, by tf_keras' own rule."""
    if save_format is not None:
        return str(save_format).lower().strip() in ("h5", "hdf5", "keras")
    if type(filepath).__module__.startswith("h5py"):
        return True
    return str(filepath).endswith((".h5", ".hdf5", ".keras"))


def refusing_hdf5(save, what, always=False, keras="tf_keras"):
    """Wraps a save(model, filepath, ...) that writes HDF5 when tf_keras' rule says so, or
    `always` (Keras 3's legacy_h5_format); the refusal names the saves of `keras`."""
    @functools.wraps(save)
    def save_checked(model, filepath, *args, **kwargs):
        save_format = kwargs.get("save_format")
        if save_format is None and not always:  # positional: save_model(.., overwrite, include_optimizer,
            position = 2 if save.__name__ == "save_model" else 1  # save_format); save_weights(.., overwrite, save_format)
            save_format = args[position] if len(args) > position else None
        tables = tables_of(model) if always or _writes_hdf5(filepath, save_format) else []
        if tables:
            refuse_hdf5(what, filepath, tables, keras)
        return save(model, filepath, *args, **kwargs)
    return save_checked


def warning_dense_only(method, what):
    @functools.wraps(method)
    def warned(self, *args, **kwargs):
        tables = tables_of(self)
        if tables:
            warnings.warn(
                f"tfps: Model.{method.__name__} {what} the variables only, not the rows of the "
                f"dynamic tables of {', '.join(tables)}. To copy or keep a whole model use "
                "tf.train.Checkpoint or model.save / save_weights in the .keras or TF format "
                "(keras EarlyStopping(restore_best_weights=True) and clone_model + set_weights "
                "restore the dense layers only; tfps.callbacks.EarlyStopping, or in Keras 3 "
                "tfps.keras_layers.keras3.EarlyStopping, restores the tables too).", UserWarning,
                stacklevel=2)
        return method(self, *args, **kwargs)
    return warned


def with_table_lines(summary):
    @functools.wraps(summary)
    def summary_with_tables(self, *args, **kwargs):
        result = summary(self, *args, **kwargs)
        from tfps.keras_layers._table_lookup import table_layers
        layers = table_layers(self)
        if layers:
            print_fn = kwargs.get("print_fn") or (args[2] if len(args) > 2 else None) or print
            print_fn("Dynamic tables (rows live on the parameter servers, not in the counts above):")
            for layer in layers:
                sizes = layer.table.shard_sizes()
                print_fn(f"  {layer.name}: dim {layer.dim}, {sum(sizes)} rows in {len(sizes)} "
                         f"shard{'s' if len(sizes) > 1 else ''}, optimizer {layer.optimizer!r}")
        return result
    return summary_with_tables
