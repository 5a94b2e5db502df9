"""EarlyStopping whose restore_best_weights restores the dynamic tables too."""

import contextlib
import warnings

import tensorflow as tf
import tf_keras as keras

from tfps import _arguments as arguments
from tfps.keras import _keras3_guard as keras3_guard
from tfps.table.checkpoint import SnapshotInPlace


class TableSnapshots:
    """The tables' part of EarlyStopping, mixed in before a Keras' EarlyStopping (tf_keras's
    here, Keras 3's in tfps.keras_layers.keras3): both take a snapshot of the weights into
    `best_weights` at each new best epoch and set it back at the end of training."""

    def __init__(self, *args, snapshot_dir=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.snapshot_dir = (None if snapshot_dir is None
                             else arguments.path(snapshot_dir, "snapshot_dir", "tfps EarlyStopping"))
        self._table_snapshots = []

    def _tables(self):
        from tfps.keras_layers._table_lookup import table_layers
        return [layer.table for layer in table_layers(self.model)]

    def _discard_snapshots(self):
        for snapshot in self._table_snapshots:
            snapshot.discard()
        self._table_snapshots = []

    def on_train_begin(self, logs=None):
        super().on_train_begin(logs)
        self._discard_snapshots()

    def on_epoch_end(self, epoch, logs=None):
        dense_snapshot = self.best_weights
        with _dense_only_warnings_silenced():
            super().on_epoch_end(epoch, logs)
        if self.best_weights is not dense_snapshot:  # the stock callback took a snapshot
            if self.snapshot_dir is not None:
                tf.io.gfile.makedirs(self.snapshot_dir)
            self._discard_snapshots()
            self._table_snapshots = [SnapshotInPlace(table, self.snapshot_dir)
                                     for table in self._tables()]

    def on_train_end(self, logs=None):
        restores = self.restore_best_weights and self.best_weights is not None
        with _dense_only_warnings_silenced():
            super().on_train_end(logs)
        if restores:
            for snapshot in self._table_snapshots:
                snapshot.restore()
        self._discard_snapshots()


class EarlyStopping(TableSnapshots, keras.callbacks.EarlyStopping):
    """keras.callbacks.EarlyStopping that, with `restore_best_weights=True`, also gives back
    every DynamicEmbedding's table as it was at the end of the best epoch: rows, optimizer
    slots, counts and admission and eviction state, and rows first seen after that epoch
    are gone. The stock callback restores the dense weights only (get_weights), leaving
    embeddings from the last epoch under dense layers from the best one.

    It snapshots each table whenever the stock callback snapshots the weights, and restores
    both when the stock callback does (at the end of training). Each shard writes its
    snapshot itself, on its parameter server, into that server's memory, or under
    `snapshot_dir`; no row passes through the chief. The snapshot of a new best epoch
    replaces the one before, so a parameter server holds one copy of its rows in memory
    (none with `snapshot_dir`). A restored table's clock is the best epoch's too, as the
    rest of its state is. If fit ends in an exception, the last snapshot is not restored,
    and under `snapshot_dir` its files stay there.

    Args: those of keras.callbacks.EarlyStopping, and
      snapshot_dir: a directory where the parameter servers write the snapshots instead of
        their memory, for tables whose second copy memory cannot hold; under a cluster
        every task must reach it (shared storage).
    """

    def set_model(self, model):
        keras3_guard.refuse_keras3("tfps.callbacks.EarlyStopping", [model])
        super().set_model(model)


@contextlib.contextmanager
def _dense_only_warnings_silenced():
    """Around the stock callback's get_weights / set_weights calls: tfps warns that they
    leave the tables out, which this callback covers."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"tfps: Model\.(get|set)_weights")
        yield
