"""IncrementalBackup: BackupAndRestore for models with dynamic tables, whose backups between
whole ones hold only the table rows that changed.

The backups of one fit form a chain listed in `backup_dir/chief/chain.json`: a whole
checkpoint, then checkpoints of changes, each restored after the one before. The file also
records where training stood at the last backup (epoch, step, steps run), which is where
a restarted fit resumes and where an endless input stream should resume too
(`IncrementalBackup.resume_point`), and what the backups hold (each table's
configuration, each variable's shape), so a backup of another model is refused instead of
resumed. It is replaced only after a backup is complete. The backup directory is the
chain's own (tfps.checkpoint): other checkpoints written beside it elsewhere never change
what its backups of changes hold.
"""

import collections
import functools
import json
import os
import sys
import time

import tensorflow as tf
import tf_keras as keras
from tf_keras.src.distribute import worker_training_state
from tf_keras.src.utils import mode_keys

from tfps import _arguments as arguments
from tfps import _durable as durable
from tfps.table import checkpoint as checkpoint_lib
from tfps.keras import _keras3_guard as keras3_guard
from tfps.keras import _scheduled_steps as scheduled_steps

CHAIN_FILE = "chain.json"

ResumePoint = collections.namedtuple("ResumePoint", ["epoch", "step", "steps_done"])
ResumePoint.__doc__ = """Where a fit restarted from a backup resumes: at step `step` of epoch
`epoch` (both from 0), after `steps_done` training steps of the interrupted fit."""


def _log(message):
    print(f"tfps IncrementalBackup: {message}", file=sys.stderr, flush=True)


class IncrementalBackup(keras.callbacks.BackupAndRestore):
    """BackupAndRestore whose backups hold only what changed since the one before.

    Every `full_every`-th backup is whole; the backups between hold, for each table, only
    the rows inserted or changed and the keys removed since the previous backup (other
    variables, being small, whole), so a backup costs time and space in proportion to the
    rows training touched, not to the tables. On `fit` the latest whole backup and its
    later ones are restored in order, and training resumes where the last one was taken,
    as with BackupAndRestore (`fit` restarts after a lost parameter server under
    tfps-launch this way). A backup of changes that cannot be read (corrupt, truncated or
    missing) is reported, and training resumes from the backup before it instead.

    Input is not part of a backup: a resumed epoch reads its data from the start, as with
    BackupAndRestore. A program whose input is an endless stream starts the stream at
    `IncrementalBackup.resume_point(backup_dir)` instead, or it trains again on the
    stream's first batches.

    One chain across several fits (a stream trained chunk by chunk, evaluated between
    chunks): give every fit the same callback, made with delete_checkpoint=False, and
    number the fits' epochs on (`initial_epoch=chunk, epochs=chunk + 1`). Only the first
    fit of the process restores; the later ones continue its chain from the model as it
    stands, and resume_point's epoch is the chunk to resume. Delete the backups with
    `delete_backups()` when the stream ends.

    Args:
      backup_dir: where the backups live (any path tf.io.gfile writes).
      save_freq: "epoch", or back up every this many training steps (counted across
        epochs, so a frequency longer than an epoch backs up every few epochs).
      every_seconds: also back up at the first step end this long after the last backup.
      full_every: every this many backups is whole (a restore reads at most
        full_every - 1 backups of changes after it).
      delete_checkpoint: delete the backups when `fit` ends normally. Kept, they end at the
        last backup taken, not at fit's end (fit takes none of its own there): a finished
        program run again resumes there and trains the steps after it once more, unless
        save_freq="epoch" backed up the last epoch's end.
    """

    def __init__(self, backup_dir, save_freq="epoch", every_seconds=None, full_every=10,
                 delete_checkpoint=True):
        if not isinstance(backup_dir, (str, os.PathLike)) or not os.fspath(backup_dir):
            raise ValueError(f"IncrementalBackup: backup_dir must be a non-empty path, got {backup_dir!r}")
        if save_freq != "epoch":
            save_freq = arguments.positive_int(save_freq, 'save_freq ("epoch" or a number of steps)',
                                               "IncrementalBackup")
        super().__init__(os.fspath(backup_dir), save_freq=save_freq,
                         delete_checkpoint=delete_checkpoint)
        full_every = arguments.positive_int(full_every, "full_every", "IncrementalBackup")
        if every_seconds is not None and not (arguments.is_number(every_seconds) and every_seconds > 0):
            raise ValueError(f"IncrementalBackup: every_seconds must be a number > 0, got {every_seconds!r}")
        self.full_every = full_every
        self.every_seconds = every_seconds
        self._last_backup = time.monotonic()
        self._steps_since_backup = 0
        self._last_batch = -1
        self._supports_tf_logs = True  # its batch hooks run under ParameterServerStrategy too
        self._training_state = None
        self._chain_model = None  # the model whose chain this callback continues across fits

    @staticmethod
    def resume_point(backup_dir):
        """The ResumePoint of the last backup in `backup_dir`, or None when it holds none:
        for an input stream to start where the restarted fit resumes (with one stream
        shared by every worker, as through tf.data service, at example
        `steps_done * batch_size`). Call it before `fit`, which deletes the backups when
        it ends normally."""
        state = _read_chain_file(os.path.join(os.fspath(backup_dir), "chief"))
        if not state.get("chain") or "steps_done" not in state:
            return None
        return _resume_point(state["epoch"], state["batch"], state["steps_done"],
                             state.get("steps_per_epoch"))

    def set_model(self, model):
        keras3_guard.refuse_keras3("tfps.callbacks.IncrementalBackup", [model])
        super().set_model(model)

    def on_train_begin(self, logs=None):
        if self._chain_model is self.model and self._training_state is not None:
            # A later fit of the same model: its state is the chain's, and newer.
            self._training_state.continue_without_restore()
            self.model._training_state = self._training_state  # pylint: disable=protected-access
            return
        if self.model.optimizer is not None and not getattr(self.model.optimizer, "_built", True):
            self.model.optimizer.build(self.model.trainable_variables)
        self._training_state = _ChainTrainingState(self.model, self.backup_dir, self.save_freq,
                                                   self.full_every)
        self.model._training_state = self._training_state  # pylint: disable=protected-access
        self._training_state.restore()
        self._last_backup = time.monotonic()
        self._steps_since_backup = 0

    def on_train_end(self, logs=None):
        if self.delete_checkpoint:
            self.delete_backups()
        else:
            self._chain_model = self.model  # a later fit continues this chain
        self.model._training_state = None  # pylint: disable=protected-access

    def delete_backups(self):
        """Deletes this callback's backups (fit does so itself unless delete_checkpoint=False)."""
        directory = os.path.join(self.backup_dir, "chief")
        if tf.io.gfile.exists(directory):
            tf.io.gfile.rmtree(directory)
        self._training_state, self._chain_model = None, None

    def on_train_batch_begin(self, batch, logs=None):
        # BackupAndRestore records the batch here; this callback records it with each backup.
        pass

    def on_train_batch_end(self, batch, logs=None):
        # Under ParameterServerStrategy this runs once per steps_per_execution block, and
        # `batch` is the block's last step.
        self._steps_since_backup += batch - self._last_batch
        self._last_batch = batch
        due = isinstance(self.save_freq, int) and self._steps_since_backup >= self.save_freq
        due = due or (self.every_seconds is not None and
                      time.monotonic() - self._last_backup >= self.every_seconds)
        if not due:
            return
        scheduled_steps.wait_for_scheduled_steps(self.model)
        self._backup(epoch=self._current_epoch, batch=batch)

    def on_epoch_begin(self, epoch, logs=None):
        super().on_epoch_begin(epoch, logs)
        resumed = self._training_state.resumed_at
        self._last_batch = resumed.step - 1 if resumed and resumed.epoch == epoch else -1

    def on_epoch_end(self, epoch, logs=None):
        if self.save_freq == "epoch":
            self._backup(epoch=epoch, batch=-1)

    def _implements_train_batch_hooks(self):
        return self.save_freq != "epoch" or self.every_seconds is not None

    def _backup(self, epoch, batch):
        self._training_state.back_up(epoch=epoch, batch=batch, steps_per_epoch=self.params.get("steps"))
        self._last_backup = time.monotonic()
        self._steps_since_backup = 0


def refusing_step_backups_under_pss(original):
    """Wraps BackupAndRestore.on_train_begin: under ParameterServerStrategy tf_keras runs
    none of its batch hooks, so a BackupAndRestore with save_freq=N would back up nothing
    at all (not even at an epoch's end) and a lost task would cost the whole run. For a
    model with tables that is refused before training, naming what does back up."""

    @functools.wraps(original)
    def on_train_begin(self, logs=None):
        from tfps.keras_layers._table_lookup import table_layers
        save_freq = self.save_freq
        if (arguments.is_int(save_freq) and save_freq > 0
                and isinstance(self.model.distribute_strategy, tf.distribute.ParameterServerStrategy)
                and table_layers(self.model)):
            raise ValueError(
                f"keras.callbacks.BackupAndRestore(save_freq={save_freq}) never backs up under "
                "ParameterServerStrategy: tf_keras skips its batch hooks there, so no backup would "
                f"be written, not even at an epoch's end. Use tfps.callbacks.IncrementalBackup("
                f"backup_dir, save_freq={save_freq}), which backs up every {save_freq} steps there, "
                "or save_freq='epoch'")
        return original(self, logs)

    return on_train_begin


def _resume_point(epoch, batch, steps_done, steps_per_epoch):
    """Where training resumes after a backup taken after step `batch` of `epoch` (-1: at
    the epoch's end)."""
    if batch < 0 or (steps_per_epoch is not None and batch >= steps_per_epoch - 1):
        return ResumePoint(epoch + 1, 0, steps_done)
    return ResumePoint(epoch, batch + 1, steps_done)


def _read_chain_file(directory):
    path = os.path.join(directory, CHAIN_FILE)
    if not tf.io.gfile.exists(path):
        return {}
    try:
        with tf.io.gfile.GFile(path) as f:
            state = json.load(f)
        if not isinstance(state.get("chain"), list) or not isinstance(state.get("next"), int):
            raise ValueError("it has no list 'chain' and number 'next'")
    except ValueError as e:  # json.JSONDecodeError is one
        raise ValueError(f"IncrementalBackup: {path} is not a list of backups ({e}); restore it, "
                         f"or remove {directory} to start training afresh") from e
    return state


def _contents(model):
    """What a backup of `model` holds, in the model's order (names may differ between
    processes, order and shapes do not): {"tables": [[layer name, config without the name]],
    "variables": [[name, shape, dtype]]}, as JSON gives it back."""
    from tfps.keras_layers._table_lookup import table_layers
    tables = [[layer.name, {k: v for k, v in layer.get_config().items() if k != "name"}]
              for layer in table_layers(model)]
    variables = [[v.name, [int(d) if d is not None else None for d in v.shape], v.dtype.name]
                 for v in model.variables if "table_proxy" not in v.name]
    return json.loads(json.dumps({"tables": tables, "variables": variables}, default=str, sort_keys=True))


def _differences(saved, now, limit=5):
    """Sentences naming how the model `now` differs from the one a backup holds."""
    found = []
    for kind, what in (("tables", "table"), ("variables", "variable")):
        before, after = saved.get(kind, []), now.get(kind, [])
        if len(before) != len(after):
            found.append(f"the backup holds {len(before)} {what}(s), this model {len(after)}")
        for i, (old, new) in enumerate(zip(before, after)):
            if kind == "variables" and old[1:] != new[1:]:
                found.append(f"variable {i} ('{new[0]}' here) is {old[1]} {old[2]} in the backup, "
                             f"{new[1]} {new[2]} here")
            elif kind == "tables" and old[1] != new[1]:
                found += [f"table {i} ('{new[0]}' here) has {k} {old[1].get(k)!r} in the backup, "
                          f"{new[1].get(k)!r} here" for k in sorted(set(old[1]) | set(new[1]))
                          if old[1].get(k) != new[1].get(k)]
    return found[:limit] + ([f"and {len(found) - limit} more"] if len(found) > limit else [])


class _ChainTrainingState(worker_training_state.WorkerTrainingState):
    """The training state of IncrementalBackup: a chain of checkpoints, one whole and then
    changes, listed in chain.json."""

    def __init__(self, model, backup_dir, save_freq, full_every):
        super().__init__(model, backup_dir, save_freq)
        self._directory = os.path.join(backup_dir, "chief")
        self._check_directory()
        self._checkpoint = tf.train.Checkpoint(
            model=model, ckpt_saved_epoch=self._ckpt_saved_epoch,
            ckpt_saved_batch=self._ckpt_saved_batch,
            train_counter=model._train_counter)  # pylint: disable=protected-access
        self._writer = checkpoint_lib.TracedWriter(self._checkpoint)
        self._full_every = full_every
        state = _read_chain_file(self._directory)
        self._chain, self._next = state.get("chain", []), state.get("next", 1)
        self._steps_per_epoch = state.get("steps_per_epoch")  # of the fit the chain backs up
        self._saved_contents = state.get("contents")  # None in chains of earlier releases
        self._contents = _contents(model)
        # Chains of tfps releases before this file recorded positions resume as Keras does.
        self._positions_recorded = not self._chain or "steps_done" in state
        self.resumed_at = None  # the ResumePoint fit resumed at, once it asked
        self._chain_continued = False  # a later fit of the same process: nothing to resume

    def _check_directory(self):
        """Fails now, not at the first backup, when the directory cannot hold backups."""
        probe = os.path.join(self._directory, f".probe-{os.getpid()}")
        try:
            tf.io.gfile.makedirs(self._directory)
            with tf.io.gfile.GFile(probe, "w") as f:
                f.write("")
            tf.io.gfile.remove(probe)
        except tf.errors.OpError as e:
            raise ValueError(f"IncrementalBackup: cannot write backups under {self._directory}: "
                             f"{e.message}") from e

    def _write_chain(self, epoch, batch, steps_done):
        path = os.path.join(self._directory, CHAIN_FILE)
        with tf.io.gfile.GFile(path + ".tmp", "w") as f:
            json.dump({"chain": self._chain, "next": self._next, "epoch": epoch, "batch": batch,
                       "steps_done": steps_done, "steps_per_epoch": self._steps_per_epoch,
                       "contents": self._contents}, f)
        durable.replace(path + ".tmp", path)

    def back_up(self, epoch, batch=-1, steps_per_epoch=None):
        self._steps_per_epoch = steps_per_epoch
        self._ckpt_saved_epoch.assign(epoch)
        self._ckpt_saved_batch.assign(batch)
        whole = not self._chain or len(self._chain) >= self._full_every
        name = f"ckpt-{self._next}"
        prefix = self._writer.write(os.path.join(self._directory, name), changes_only=not whole)
        # On disk before the chain names it, and before the chain it replaces is deleted.
        durable.sync_files(checkpoint_lib.files(prefix))
        dropped = self._chain if whole else []
        self._chain = [name] if whole else self._chain + [name]
        self._next += 1
        self._write_chain(epoch, batch, int(self._model._train_counter.numpy()))  # pylint: disable=protected-access
        for old in dropped:
            checkpoint_lib.delete(os.path.join(self._directory, old))

    def restore(self):
        if not self._chain:
            _log(f"no backup in {self._directory}; training starts from the beginning")
            return
        if self._saved_contents is not None:
            differences = _differences(self._saved_contents, self._contents)
            if differences:
                raise ValueError(
                    f"IncrementalBackup: {self._directory} holds backups of another model, which "
                    f"this run will not resume: {'; '.join(differences)}. Give this run a "
                    f"backup_dir of its own, or remove {self._directory} to start afresh")
        for k, name in enumerate(self._chain):
            try:
                self._checkpoint.read(os.path.join(self._directory, name)).expect_partial()
            # Unreadable (damaged, truncated, missing), or changes that do not follow the
            # state restored before them.
            except (tf.errors.DataLossError, tf.errors.NotFoundError,
                    tf.errors.FailedPreconditionError) as e:
                if k == 0:
                    raise ValueError(
                        f"IncrementalBackup: the whole backup {name} in {self._directory} cannot be "
                        f"read ({e.message}); restore it, or remove {self._directory} to start "
                        "training afresh") from e
                _log(f"backup {name} in {self._directory} cannot be applied ({e.message}); resuming "
                     f"from {self._chain[k - 1]} before it, so the training between them is lost")
                self._chain = self._chain[:k]
                self.restore()
                self._write_chain(*self._saved_position())
                return
        epoch, batch, steps_done = self._saved_position()
        # In the words of Keras' progress bar, whose epochs count from 1.
        taken = f"at the end of epoch {epoch + 1}" if batch < 0 else f"after batch {batch + 1} of epoch {epoch + 1}"
        _log(f"restored {self._chain[0]} (whole) and {len(self._chain) - 1} backup(s) of changes "
             f"from {self._directory}, taken {taken} ({steps_done} steps done)")

    def _saved_position(self):
        return (int(self._ckpt_saved_epoch.numpy()), int(self._ckpt_saved_batch.numpy()),
                int(self._model._train_counter.numpy()))  # pylint: disable=protected-access

    def continue_without_restore(self):
        """For a later fit of the model this chain backs up: it starts where asked."""
        self._positions_recorded, self._chain_continued = True, True
        self.resumed_at = None

    def maybe_load_initial_counters_from_ckpt(self, steps_per_epoch, initial_epoch, mode):
        if self._chain_continued:
            return initial_epoch, 0
        if not self._positions_recorded:
            return super().maybe_load_initial_counters_from_ckpt(steps_per_epoch, initial_epoch, mode)
        if mode != mode_keys.ModeKeys.TRAIN or not self._chain:
            return initial_epoch, 0
        self.resumed_at = _resume_point(*self._saved_position(), steps_per_epoch)
        return self.resumed_at.epoch, self.resumed_at.step

    def delete_backup(self):
        if tf.io.gfile.exists(self._directory):
            tf.io.gfile.rmtree(self._directory)
