"""What Keras 3's model-level paths do with a DynamicEmbedding's rows, as tfps.keras._saving
does for tf_keras.

- `model.export()` (Keras 3's ExportArchive) tracks the variables of the layers it is given
  and the TrackableResources among their descendants: a table shard (DynamicTable) is
  such a resource, but its rows are written by the ShardedTable that holds the shards
  (tfps.table.checkpoint), which the archive would leave out, saving empty tables. So
  where the archive tracks a layer, the tables of the DynamicEmbeddings in it are tracked
  too: the SavedModel holds every row and loads where tfps is imported (for serving
  without tfps, tfps.export.save_for_serving writes the rows into stock variables).
- Keras 3's `model.export()` gives every input a dense TensorSpec, ragged and sparse ones
  too: their IDs would arrive padded, and a DynamicEmbedding would look up every pad as an
  ID. Such a model's export is refused, pointing to tfps.export.save_for_serving, which
  keeps ragged and sparse inputs (an export given its own input_signature goes ahead).
- A legacy HDF5 save (`model.save("m.h5")`) holds a layer's variables only: it is refused
  before anything is written; `get_weights` / `set_weights` trade in variables only: they
  warn (tfps.keras._saving's wrappers).

tfps.keras._patches installs these when the Keras 3 layer is imported.
"""

import functools


def tracking_tables(original):
    @functools.wraps(original)
    def track_layer(self, layer):
        original(self, layer)
        from tfps.keras_layers._table_lookup import table_layers
        tables = [sub.table for sub in table_layers(layer)]
        if tables:
            tracked = list(getattr(self._tf_trackable, "tfps_tables", []))
            self._tf_trackable.tfps_tables = tracked + [t for t in tables if all(t is not s for s in tracked)]

    return track_layer


def refusing_padded_ids(original):
    @functools.wraps(original)
    def export(self, filepath, *args, **kwargs):
        # (format, verbose, input_signature) in Keras' order; older Keras 3 takes format only.
        given = dict(zip(("format", "verbose", "input_signature"), args), **kwargs)
        if given.get("format", "tf_saved_model") == "tf_saved_model" and given.get("input_signature") is None:
            from tfps.keras_layers._table_lookup import table_layers
            try:
                inputs = list(self.inputs or [])
            except (AttributeError, ValueError):  # a subclassed model has no symbolic inputs
                inputs = []
            composite = [t.name for t in inputs if getattr(t, "ragged", False) or getattr(t, "sparse", False)]
            if composite and table_layers(self):
                raise ValueError(
                    f"tfps: model.export() would give the ragged or sparse input(s) {composite} "
                    "dense signatures (Keras 3 does so for every model), so their padding would "
                    "reach the model as values, and a DynamicEmbedding looks up every value as an "
                    "ID. Export this model with tfps.export.save_for_serving(model, directory), "
                    "which keeps ragged and sparse inputs")
        return original(self, filepath, *args, **kwargs)

    return export
