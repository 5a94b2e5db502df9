"""What train_ctr.py and stream_ctr.py record for the fault-injection suite
(benchmarks/faults.py) with --fault_report DIR, and the holds that let the suite kill a task
at a chosen point.

Records, on the chief: after each block of steps, the position reached (epoch x steps per
epoch + steps of this epoch: the steps run, counted as a resumed run counts them) in
DIR/progress-<cluster restart>; when the process's first fit starts after a restore, the
table's rows as restored (DIR/restored-<restart>.npz) and a copy of the backups they came from
(DIR/restore-<restart>/; a resume from an epoch checkpoint, record_checkpoint_restore, is
recorded as a chain of that checkpoint), which the suite restores again on its own and
compares row by row.

Holds (--fault_hold): "backup" pauses the 3rd backup of the first cluster after its files are
written and before chain.json lists them; "restore" pauses a restarted cluster's restore after
the whole backup is read and before the backups of changes; "after_training" pauses the first
cluster after fit ends (its backups deleted), before the final evaluation. Each touches
DIR/holding-<what> first, so the suite kills a task inside that window.
"""

import json
import os
import shutil
import threading
import time

import numpy as np
import tensorflow as tf
import tf_keras as keras

from tfps.keras import _incremental_backup as incremental_backup

HOLD_SECONDS = 60


def _restart():
    return int(os.environ.get("TFPS_CLUSTER_RESTARTS", "0"))


def _atomic_write(path, text):
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)


def _hold(directory, what):
    """Announces the hold, then waits until the suite releases it (a file release-<what>),
    kills this task, or HOLD_SECONDS pass."""
    _atomic_write(os.path.join(directory, f"holding-{what}"), str(os.getpid()))
    release = os.path.join(directory, f"release-{what}")
    deadline = time.monotonic() + HOLD_SECONDS
    while not os.path.exists(release) and time.monotonic() < deadline:
        threading.Event().wait(0.1)


def install_holds(directory, what, backup_dir):
    """Patches the backup's writes (or reads) to hold as the module docstring says."""
    chief_dir = os.path.join(backup_dir, "chief")
    state = incremental_backup._ChainTrainingState  # pylint: disable=protected-access
    if what == "backup" and _restart() == 0:
        original_back_up = state.back_up
        backups = []

        def back_up(self, *args, **kwargs):
            writer = self._writer
            original_write = writer.write

            def write(prefix, changes_only=False):
                result = original_write(prefix, changes_only=changes_only)
                backups.append(prefix)
                if len(backups) == 3:
                    _hold(directory, "backup")
                return result
            writer.write = write
            try:
                return original_back_up(self, *args, **kwargs)
            finally:
                writer.write = original_write
        state.back_up = back_up
    if what == "restore" and _restart() >= 1:
        original_read = tf.train.Checkpoint.read
        reads = []

        def read(self, save_path, *args, **kwargs):
            result = original_read(self, save_path, *args, **kwargs)
            if os.fspath(save_path).startswith(chief_dir):
                reads.append(save_path)
                if len(reads) == 1 and _restart() == 1:
                    _hold(directory, "restore")
            return result
        tf.train.Checkpoint.read = read


def _record_restore(directory, source_dir, state, table_layer):
    """Copies the checkpoints `state["chain"]` names from source_dir, with `state` as their
    chain.json, to DIR/restore-<restart>/, and the table's rows as restored to
    DIR/restored-<restart>.npz."""
    copy = os.path.join(directory, f"restore-{_restart()}")
    os.makedirs(copy, exist_ok=True)
    _atomic_write(os.path.join(copy, incremental_backup.CHAIN_FILE), json.dumps(state))
    for name in state["chain"]:
        for path in os.listdir(source_dir):
            if path.startswith(name + ".") or path.startswith(name + "-"):
                shutil.copy(os.path.join(source_dir, path), copy)
    rows = table_layer.table.export()
    order = np.argsort(rows.keys.numpy())
    np.savez(os.path.join(directory, f"restored-{_restart()}.npz"),
             **{name: getattr(rows, name).numpy()[order] for name in rows._fields})


def record_checkpoint_restore(directory, epochs, checkpoint_dir, table_layer):
    """Records a restart's resume from the epoch checkpoint of `epochs` epochs (none when 0)
    as a restore: a chain of that one checkpoint, written as tf.train.Checkpoint(root=model)
    writes, taken at the end of epoch `epochs` - 1."""
    if epochs:
        name = os.path.basename(tf.train.latest_checkpoint(checkpoint_dir))
        _record_restore(directory, checkpoint_dir, {"chain": [name], "epoch": epochs - 1, "batch": -1,
                                                    "checkpoint_root": "root"}, table_layer)


def hold_after_training(directory):
    """Holds the first cluster's run after fit, before its final evaluation and export."""
    if _restart() == 0:
        _hold(directory, "after_training")


class FaultReport(keras.callbacks.Callback):
    """Records progress and restores for benchmarks/faults.py (see the module docstring)."""

    def __init__(self, directory, backup_dir, table_layer):
        super().__init__()
        self.directory, self.chief_dir = directory, os.path.join(backup_dir, "chief")
        self.table_layer = table_layer
        self._supports_tf_logs = True  # its batch hook runs under ParameterServerStrategy too
        self._epoch, self._fits = 0, 0
        os.makedirs(directory, exist_ok=True)

    def on_train_begin(self, logs=None):
        self._fits += 1
        if self._fits > 1:  # only a process's first fit restores
            return
        chain_path = os.path.join(self.chief_dir, incremental_backup.CHAIN_FILE)
        if not os.path.exists(chain_path):
            return
        with open(chain_path) as f:
            state = json.load(f)
        if state["chain"]:
            _record_restore(self.directory, self.chief_dir, state, self.table_layer)

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        # The steps that have run, not those scheduled: under ParameterServerStrategy fit
        # schedules ahead of the workers, so the steps scheduled so far are waited for first.
        coordinator = getattr(self.model, "_cluster_coordinator", None)
        if coordinator is not None:
            coordinator.join()
        position = self._epoch * self.params["steps"] + batch + 1
        _atomic_write(os.path.join(self.directory, f"progress-{_restart()}"), str(position))
