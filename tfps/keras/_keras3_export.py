"""Keras 3's `model.export()` (its ExportArchive) keeps a DynamicEmbedding's rows.

The archive tracks the variables of the layers it is given and the TrackableResources
among their descendants: a table shard (DynamicTable) is such a resource, but its rows
are written by the ShardedTable that holds the shards (tfps.table.checkpoint), which the
archive would leave out, saving empty tables. So where the archive tracks a layer, the
tables of the DynamicEmbeddings in it are tracked too. The SavedModel then holds every
row and loads where tfps is imported; for serving without tfps, tfps.export.save_for_serving
writes the rows into stock variables instead.
"""

import functools

_installed = False


def _tracking_tables(original):
    @functools.wraps(original)
    def track_layer(self, layer):
        original(self, layer)
        from tfps.keras_layers._table_lookup import TableLookup
        tables = [sub.table for sub in layer._flatten_layers(include_self=True, recursive=True)  # pylint: disable=protected-access
                  if isinstance(sub, TableLookup)]
        if tables:
            tracked = list(getattr(self._tf_trackable, "tfps_tables", []))
            self._tf_trackable.tfps_tables = tracked + [t for t in tables if all(t is not s for s in tracked)]

    return track_layer


def install():
    """Patches Keras 3's TensorFlow export archive once."""
    global _installed
    if _installed:
        return
    from keras.src.backend.tensorflow.export import TFExportArchive
    TFExportArchive._backend_track_layer = _tracking_tables(TFExportArchive._backend_track_layer)  # pylint: disable=protected-access
    _installed = True
