"""Keras callbacks for training with dynamic tables."""

import tensorflow as tf
import tf_keras as keras

from tfps import _arguments as arguments
from tfps.keras import _keras3_guard as keras3_guard
from tfps.keras import _scheduled_steps as scheduled_steps
from tfps.keras._early_stopping import EarlyStopping
from tfps.keras._incremental_backup import IncrementalBackup, ResumePoint
from tfps.keras._serving_exports import ExportForServing
from tfps.keras._synchronous_training import SynchronousTraining

__all__ = ["EarlyStopping", "ExportForServing", "IncrementalBackup", "ResumePoint", "SynchronousTraining",
           "TableStats"]


class TableStats(keras.callbacks.Callback):
    """Logs the statistics of every DynamicEmbedding's table while a model trains.

    At each epoch end, `{layer}/rows` and `{layer}/memory_mib` (index, mapped rows and
    admission counts, summed over the shards), and for a table with an admission or
    eviction policy or a row cap also `{layer}/admitted`, `/pending`, `/rejected` and
    `/evicted`, and for a table that skips non-finite steps `{layer}/skipped_steps` (see
    DynamicTable.stats), go into fit's logs, so History and other callbacks see them;
    with `log_dir` they are also written as TensorBoard scalars at the optimizer's step, and
    with `every_n_steps` every that many training steps as well (counted in steps, whatever
    `steps_per_execution`: at the end of each block of steps that reaches a multiple of
    N, since a block is where fit hands control back). Each table's statistics are read
    with one small op per shard, on its parameter server; under ParameterServerStrategy a
    summary first waits for the steps fit has scheduled, so it holds its step's rows.

    Args:
      log_dir: where TensorBoard summaries go (None: only fit's logs).
      every_n_steps: also write the summaries every this many training steps.
    """

    def __init__(self, log_dir=None, every_n_steps=None):
        super().__init__()
        if every_n_steps is not None:
            every_n_steps = arguments.positive_int(every_n_steps, "every_n_steps", "TableStats")
            if log_dir is None:
                raise ValueError("TableStats: every_n_steps writes TensorBoard summaries; give log_dir")
        if log_dir is not None:
            log_dir = arguments.path(log_dir, "log_dir", "TableStats")
            try:
                import tensorboard  # noqa: F401  (tf.summary writes nothing without it)
            except ImportError as e:
                raise ImportError("TableStats(log_dir=...) writes TensorBoard summaries, which "
                                  "need TensorBoard: pip install tensorboard") from e
        self.log_dir = log_dir
        self.every_n_steps = every_n_steps
        self._writer = None
        self._steps = 0
        self._last_batch = -1
        self._batch_end_step = None  # the step this epoch's last every_n_steps summary had
        self._supports_tf_logs = True  # its batch hook runs under ParameterServerStrategy too

    def set_model(self, model):
        keras3_guard.refuse_keras3("tfps.callbacks.TableStats", [model])
        super().set_model(model)

    def _statistics(self):
        from tfps.keras_layers._table_lookup import table_layers
        values = {}
        for layer in table_layers(self.model):
            stats = layer.table.stats()
            values[f"{layer.name}/rows"] = stats["rows"]
            values[f"{layer.name}/memory_mib"] = stats["memory_bytes"] / (1 << 20)
            if layer.admission or layer.eviction or layer.max_rows:
                for name in ("admitted", "pending", "rejected", "evicted"):
                    values[f"{layer.name}/{name}"] = stats[name]
            if layer.non_finite == "skip":
                values[f"{layer.name}/skipped_steps"] = stats["skipped_steps"]
        return values

    def _step(self):
        """The step summaries are written at: the optimizer's, or the steps counted here."""
        return int(self.model.optimizer.iterations.numpy()) if self.model.optimizer else self._steps

    def _summarize(self, values):
        """Writes `values` as TensorBoard scalars at this step; returns the step (None
        without log_dir)."""
        if self.log_dir is None:
            return
        if self._writer is None:
            self._writer = tf.summary.create_file_writer(self.log_dir)
        step = self._step()
        with self._writer.as_default():
            for name, value in values.items():
                tf.summary.scalar(name, value, step=step)
        self._writer.flush()
        return step

    def on_epoch_begin(self, epoch, logs=None):
        self._last_batch = -1
        self._batch_end_step = None

    def on_train_batch_end(self, batch, logs=None):
        # Called once per block of steps_per_execution steps; `batch` is its last step.
        before = self._steps
        self._steps += batch - self._last_batch
        self._last_batch = batch
        if self.every_n_steps is not None and self._steps // self.every_n_steps > before // self.every_n_steps:
            scheduled_steps.wait_for_scheduled_steps(self.model)  # the summary's step's statistics
            self._batch_end_step = self._summarize(self._statistics())

    def on_epoch_end(self, epoch, logs=None):
        values = self._statistics()
        if logs is not None:
            logs.update(values)
        if self._step() != self._batch_end_step:  # else the epoch's last block wrote this step already
            self._summarize(values)

    def on_train_end(self, logs=None):
        if self._writer is not None:
            self._writer.close()
            self._writer = None
