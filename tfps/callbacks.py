"""Keras callbacks for training with dynamic tables."""

import json
import os
import sys
import time

import tensorflow as tf
import tf_keras as keras
from tf_keras.src.distribute import worker_training_state

from tfps import arguments
from tfps import checkpoint as checkpoint_lib

CHAIN_FILE = "chain.json"


class IncrementalBackup(keras.callbacks.BackupAndRestore):
    """BackupAndRestore whose backups hold only what changed since the one before.

    Every `full_every`-th backup is whole; the backups between hold, for each table, only
    the rows inserted or changed and the keys removed since the previous backup (other
    variables, being small, whole), so a backup costs time and space in proportion to the
    rows training touched, not to the tables. On `fit` the latest whole backup and its
    later ones are restored in order, and training resumes where the last one was taken,
    as with BackupAndRestore (`fit` restarts after a lost parameter server under
    tfps-launch this way). The chain is listed in `backup_dir/chief/chain.json`, which is
    replaced only after a backup is complete, so a crash mid-backup leaves the previous
    chain intact.

    Args:
      backup_dir: where the backups live (any path tf.io.gfile writes).
      save_freq: "epoch", or back up every this many training steps.
      every_seconds: also back up at the first step end this long after the last backup.
      full_every: every this many backups is whole (a restore reads at most
        full_every - 1 backups of changes after it).
      delete_checkpoint: delete the backups when `fit` ends normally.
    """

    def __init__(self, backup_dir, save_freq="epoch", every_seconds=None, full_every=10,
                 delete_checkpoint=True):
        if save_freq != "epoch":
            save_freq = arguments.positive_int(save_freq, 'save_freq ("epoch" or a number of steps)',
                                               "IncrementalBackup")
        super().__init__(backup_dir, save_freq=save_freq, delete_checkpoint=delete_checkpoint)
        full_every = arguments.positive_int(full_every, "full_every", "IncrementalBackup")
        if every_seconds is not None and not every_seconds > 0:
            raise ValueError(f"IncrementalBackup: every_seconds must be > 0, got {every_seconds!r}")
        self.full_every = full_every
        self.every_seconds = every_seconds
        self._last_backup = time.monotonic()
        self._batch_backed_up = -1
        self._supports_tf_logs = True  # its batch hooks run under ParameterServerStrategy too

    def on_train_begin(self, logs=None):
        if self.model.optimizer is not None and not getattr(self.model.optimizer, "_built", True):
            self.model.optimizer.build(self.model.trainable_variables)
        self._training_state = _ChainTrainingState(self.model, self.backup_dir, self.save_freq,
                                                   self.full_every)
        self.model._training_state = self._training_state  # pylint: disable=protected-access
        self._training_state.restore()
        self._last_backup = time.monotonic()

    def on_train_batch_begin(self, batch, logs=None):
        # BackupAndRestore records the batch here; this callback records it with each backup.
        pass

    def on_train_batch_end(self, batch, logs=None):
        # Under ParameterServerStrategy this runs once per steps_per_execution block.
        due = isinstance(self.save_freq, int) and batch - self._batch_backed_up >= self.save_freq
        due = due or (self.every_seconds is not None and
                      time.monotonic() - self._last_backup >= self.every_seconds)
        if not due:
            return
        coordinator = getattr(self.model, "_cluster_coordinator", None)
        if coordinator is not None:
            coordinator.join()  # the steps scheduled so far have run
        self._training_state._ckpt_saved_batch.assign(batch)  # pylint: disable=protected-access
        self._backup(epoch=self._current_epoch, batch=batch)
        self._batch_backed_up = batch

    def on_epoch_begin(self, epoch, logs=None):
        super().on_epoch_begin(epoch, logs)
        self._batch_backed_up = -1

    def on_epoch_end(self, epoch, logs=None):
        if self.save_freq == "epoch":
            self._backup(epoch=epoch)

    def _implements_train_batch_hooks(self):
        return self.save_freq != "epoch" or self.every_seconds is not None

    def _backup(self, epoch, batch=0):
        self._training_state.back_up(epoch=epoch, batch=batch)
        self._last_backup = time.monotonic()


class _ChainTrainingState(worker_training_state.WorkerTrainingState):
    """The training state of IncrementalBackup: a chain of checkpoints, one whole and then
    changes, listed in chain.json."""

    def __init__(self, model, backup_dir, save_freq, full_every):
        super().__init__(model, backup_dir, save_freq)
        self._directory = os.path.join(backup_dir, "chief")
        self._checkpoint = tf.train.Checkpoint(
            model=model, ckpt_saved_epoch=self._ckpt_saved_epoch,
            ckpt_saved_batch=self._ckpt_saved_batch,
            train_counter=model._train_counter)  # pylint: disable=protected-access
        self._writer = checkpoint_lib.TracedWriter(self._checkpoint)
        self._full_every = full_every
        self._chain, self._next = self._read_chain()

    def _chain_path(self):
        return os.path.join(self._directory, CHAIN_FILE)

    def _read_chain(self):
        if not tf.io.gfile.exists(self._chain_path()):
            return [], 1
        with tf.io.gfile.GFile(self._chain_path()) as f:
            state = json.load(f)
        return state["chain"], state["next"]

    def _write_chain(self, chain, next_number):
        temp = self._chain_path() + ".tmp"
        with tf.io.gfile.GFile(temp, "w") as f:
            json.dump({"chain": chain, "next": next_number}, f)
        tf.io.gfile.rename(temp, self._chain_path(), overwrite=True)

    def back_up(self, epoch, batch=0):
        tf.io.gfile.makedirs(self._directory)
        whole = not self._chain or len(self._chain) >= self._full_every
        name = f"ckpt-{self._next}"
        prefix = os.path.join(self._directory, name)
        self._writer.write(prefix, changes_only=not whole)
        dropped = self._chain if whole else []
        self._chain = [name] if whole else self._chain + [name]
        self._next += 1
        self._write_chain(self._chain, self._next)
        for old in dropped:
            checkpoint_lib.delete(os.path.join(self._directory, old))

    def restore(self):
        if not self._chain:
            return
        for name in self._chain:
            self._checkpoint.read(os.path.join(self._directory, name)).expect_partial()
        print(f"tfps IncrementalBackup: restored {self._chain[0]} (whole) and "
              f"{len(self._chain) - 1} backup(s) of changes from {self._directory}, taken at "
              f"epoch {int(self._ckpt_saved_epoch.numpy())}, batch "
              f"{int(self._ckpt_saved_batch.numpy())}", file=sys.stderr, flush=True)

    def delete_backup(self):
        if tf.io.gfile.exists(self._directory):
            tf.io.gfile.rmtree(self._directory)


class TableStats(keras.callbacks.Callback):
    """Logs the statistics of every DynamicEmbedding's table while a model trains.

    At each epoch end, `{layer}/rows` and `{layer}/memory_mib` (index, mapped rows and
    admission counts, summed over the shards), and for a table with an admission or
    eviction policy or a row cap also `{layer}/admitted`, `/pending`, `/rejected` and
    `/evicted` (see DynamicTable.stats), go into fit's logs, so History and other callbacks see them;
    with `log_dir` they are also written as TensorBoard scalars at the optimizer's step, and
    with `every_n_steps` every that many steps as well. Each table's statistics are read
    with one small op per shard, on its parameter server.

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
        if log_dir is not None and not isinstance(log_dir, (str, os.PathLike)):
            raise ValueError(f"TableStats: log_dir must be a path (str or os.PathLike), got {log_dir!r}")
        if log_dir is not None:
            log_dir = os.fspath(log_dir)
            try:
                import tensorboard  # noqa: F401  (tf.summary writes nothing without it)
            except ImportError as e:
                raise ImportError("TableStats(log_dir=...) writes TensorBoard summaries, which "
                                  "need TensorBoard: pip install tensorboard") from e
        self.log_dir = log_dir
        self.every_n_steps = every_n_steps
        self._writer = None
        self._steps = 0
        self._supports_tf_logs = True  # its batch hook runs under ParameterServerStrategy too

    def _statistics(self):
        from tfps.keras_layers import DynamicEmbedding
        values = {}
        for layer in self.model._flatten_layers(include_self=False, recursive=True):  # pylint: disable=protected-access
            if isinstance(layer, DynamicEmbedding):
                stats = layer.table.stats()
                values[f"{layer.name}/rows"] = stats["rows"]
                values[f"{layer.name}/memory_mib"] = stats["memory_bytes"] / (1 << 20)
                if layer.admission or layer.eviction or layer.max_rows:
                    for name in ("admitted", "pending", "rejected", "evicted"):
                        values[f"{layer.name}/{name}"] = stats[name]
        return values

    def _summarize(self, values):
        if self.log_dir is None:
            return
        if self._writer is None:
            self._writer = tf.summary.create_file_writer(self.log_dir)
        step = int(self.model.optimizer.iterations.numpy()) if self.model.optimizer else self._steps
        with self._writer.as_default():
            for name, value in values.items():
                tf.summary.scalar(name, value, step=step)
        self._writer.flush()

    def on_train_batch_end(self, batch, logs=None):
        self._steps += 1
        if self.every_n_steps is not None and self._steps % self.every_n_steps == 0:
            self._summarize(self._statistics())

    def on_epoch_end(self, epoch, logs=None):
        values = self._statistics()
        if logs is not None:
            logs.update(values)
        self._summarize(values)

    def on_train_end(self, logs=None):
        if self._writer is not None:
            self._writer.close()
            self._writer = None
