"""IncrementalBackup under model.fit: when backups are taken, what a restarted fit restores
and where it resumes, and what it does with backups it cannot read."""

import glob
import json
import os

import numpy as np
import pytest
import tensorflow as tf
import tf_keras as keras

import tfps
from tests import disk_events
from tests.table_rows import assert_same_rows, sorted_rows
from tfps.keras.callbacks import IncrementalBackup, ResumePoint

BATCH, STEPS_PER_EPOCH = 64, 12


def data():
    rng = np.random.default_rng(0)
    x = rng.integers(0, 5000, size=(BATCH * STEPS_PER_EPOCH, 2)).astype(np.int64)
    return x, (x[:, 0] % 2).astype(np.float32)


def model_and_layer(name=None):
    layer = tfps.keras_layers.DynamicEmbedding(4, combiner="sum", optimizer=tfps.optimizers.Adagrad(0.1), name=name)
    model = keras.Sequential([keras.Input((2,), dtype=tf.int64), layer, keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    return model, layer


class Watch(keras.callbacks.Callback):
    """Runs after the backup callback: records every backup as it lands (chain.json's
    content and the table's rows then), the steps fit runs, and the rows restored; raises
    a simulated preemption at the end of step `stop_at` = (epoch, batch)."""

    def __init__(self, directory, layer, stop_at=None):
        super().__init__()
        self.chain_path = os.path.join(directory, "chief", "chain.json")
        self.layer, self.stop_at = layer, stop_at
        self.backups, self.steps, self.restored, self.epoch = [], [], None, None

    def _record_backup(self):
        if os.path.exists(self.chain_path):
            with open(self.chain_path) as f:
                state = json.load(f)
            if not self.backups or self.backups[-1][0] != state:
                self.backups.append((state, sorted_rows(self.layer.table)))

    def on_train_begin(self, logs=None):
        if self.restored is None:  # the first fit's start, after any restore
            self.restored = sorted_rows(self.layer.table)

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        self.steps.append((self.epoch, batch))

    def on_train_batch_end(self, batch, logs=None):
        self._record_backup()
        if (self.epoch, batch) == self.stop_at:
            raise RuntimeError("simulated preemption")

    def on_epoch_end(self, epoch, logs=None):
        self._record_backup()


def fit(model, backup, watch, epochs=3, others=()):
    x, y = data()
    model.fit(x, y, batch_size=BATCH, epochs=epochs, shuffle=False, verbose=0,
              callbacks=[backup, *others, watch])


def interrupted_then_resumed(directory, stop_at, others=(), **backup_args):
    """Trains until a preemption at `stop_at`, empties the table as a new process would
    start, and fits again from the backups, with the callbacks `others` in both fits:
    (watch of the first fit, of the second, the resume point between them)."""
    model, layer = model_and_layer()
    first = Watch(directory, layer, stop_at)
    with pytest.raises(RuntimeError, match="simulated preemption"):
        fit(model, IncrementalBackup(directory, **backup_args), first, others=others)
    resume_point = IncrementalBackup.resume_point(directory)
    layer.table.clear()
    second = Watch(directory, layer)
    fit(model, IncrementalBackup(directory, **backup_args), second, others=others)
    return first, second, resume_point


def table_files(directory, backup):
    return glob.glob(os.path.join(directory, "chief", f"{backup}-tfps.DynamicTable.t*.shard-*"))


@pytest.mark.parametrize("arguments,message", [
    (dict(save_freq=0), r'save_freq \("epoch" or a number of steps\) must be a positive int, got 0'),
    (dict(save_freq="batch"), "save_freq .* got 'batch'"),
    (dict(full_every=0), "full_every must be a positive int, got 0"),
    (dict(every_seconds=-1), "every_seconds must be a number > 0, got -1"),
    (dict(every_seconds="60"), "every_seconds must be a number > 0, got '60'"),
    (dict(backup_dir=""), "backup_dir must be a non-empty path, got ''"),
    (dict(backup_dir=None), "backup_dir must be a non-empty path, got None"),
    (dict(backup_dir=123), "backup_dir must be a non-empty path, got 123"),
])
def test_bad_arguments_are_refused_naming_them(tmp_path, arguments, message):
    arguments = dict(dict(backup_dir=str(tmp_path)), **arguments)
    with pytest.raises(ValueError, match="IncrementalBackup: " + message):
        IncrementalBackup(**arguments)


def test_a_directory_that_cannot_hold_backups_fails_when_fit_starts(tmp_path):
    a_file = tmp_path / "not_a_directory"
    a_file.write_text("")
    model, layer = model_and_layer()
    watch = Watch(str(a_file), layer)
    with pytest.raises(ValueError, match=f"IncrementalBackup: cannot write backups under {a_file}/chief"):
        fit(model, IncrementalBackup(str(a_file), save_freq=5), watch)
    assert watch.steps == []


def test_a_restarted_fit_restores_the_rows_of_the_last_backup_and_resumes_after_it(tmp_path):
    directory = str(tmp_path / "backup")
    # Steps end at 5, 10, ..., 20 of 36: the last backup is after step 20, epoch 1 batch 7.
    assert IncrementalBackup.resume_point(directory) is None
    first, second, resume_point = interrupted_then_resumed(directory, stop_at=(1, 9), save_freq=5,
                                                           full_every=3)
    states = [state for state, _ in first.backups]
    assert [(s["epoch"], s["batch"], s["steps_done"]) for s in states] == [
        (0, 4, 5), (0, 9, 10), (1, 2, 15), (1, 7, 20)]
    assert [s["chain"] for s in states] == [
        ["ckpt-1"], ["ckpt-1", "ckpt-2"], ["ckpt-1", "ckpt-2", "ckpt-3"], ["ckpt-4"]]
    assert not table_files(directory, "ckpt-1")  # dropped with its chain
    assert_same_rows(second.restored, first.backups[-1][1])
    assert resume_point == ResumePoint(epoch=1, step=8, steps_done=20)
    assert second.steps[0] == (1, 8)
    assert len(second.steps) == 36 - 20
    assert not os.path.exists(os.path.join(directory, "chief"))  # deleted when fit ended


def chunked_stream(model, backup, watch, chunks=4, resume=None, stop_at=None):
    """Trains on chunks of a stream, one fit per chunk numbered by its epoch (a user's
    loop that evaluates between fits), from `resume` (a ResumePoint) on; each chunk's data
    from its resumed step on."""
    x, y = data()
    first_chunk, first_step = (resume.epoch, resume.step) if resume else (0, 0)
    for chunk in range(first_chunk, chunks):
        step = first_step if chunk == first_chunk else 0
        # The chunk's examples are the data's, shifted so that each chunk differs.
        ids = x[step * BATCH:] + chunk * 7
        dataset = tf.data.Dataset.from_tensor_slices((ids, y[step * BATCH:])).batch(BATCH)
        watch.stop_at = stop_at
        model.fit(dataset, initial_epoch=chunk, epochs=chunk + 1, steps_per_epoch=STEPS_PER_EPOCH,
                  verbose=0, callbacks=[backup, watch])


def test_one_chain_across_the_fits_of_a_chunked_stream_resumes_at_the_chunk_and_step(tmp_path):
    directory = str(tmp_path / "backup")
    # Uninterrupted: 4 chunks of 12 steps, backups every 5 steps counted across the fits.
    # Each model as a new process makes it (the table's seed follows from its name).
    model, layer = model_and_layer("ids")
    plain_model, plain_layer = model_and_layer("ids")
    plain_model.set_weights(model.get_weights())  # the dense layers' initial values
    chunked_stream(plain_model, IncrementalBackup(str(tmp_path / "unused"), save_freq=1000,
                                                  delete_checkpoint=False), Watch(str(tmp_path / "unused"), plain_layer))
    expected = sorted_rows(plain_layer.table)

    backup = IncrementalBackup(directory, save_freq=5, full_every=3, delete_checkpoint=False)
    first = Watch(directory, layer)
    with pytest.raises(RuntimeError, match="simulated preemption"):
        chunked_stream(model, backup, first, stop_at=(2, 7))
    states = [state for state, _ in first.backups]
    # Later fits continue the chain: no restore rolls a chunk's last steps back.
    assert [(s["epoch"], s["batch"]) for s in states] == [(0, 4), (0, 9), (1, 2), (1, 7), (2, 0), (2, 5)]
    assert [len(s["chain"]) for s in states] == [1, 2, 3, 1, 2, 3]
    resume = IncrementalBackup.resume_point(directory)
    assert (resume.epoch, resume.step) == (2, 6)

    # A new process: a fresh model (its table empty), the same program resumed.
    model, layer = model_and_layer("ids")
    backup, second = IncrementalBackup(directory, save_freq=5, full_every=3, delete_checkpoint=False), Watch(directory, layer)
    chunked_stream(model, backup, second, resume=resume)
    assert_same_rows(second.restored, first.backups[-1][1])
    assert second.steps[0] == (2, 6) and len(second.steps) == 6 + 12
    assert_same_rows(sorted_rows(layer.table), expected)
    backup.delete_backups()
    assert not os.path.exists(os.path.join(directory, "chief"))


def test_a_save_freq_longer_than_an_epoch_counts_steps_across_epochs(tmp_path):
    directory = str(tmp_path / "backup")
    model, layer = model_and_layer()
    watch = Watch(directory, layer)
    fit(model, IncrementalBackup(directory, save_freq=15, delete_checkpoint=False), watch, epochs=5)
    assert [(s["epoch"], s["batch"], s["steps_done"]) for s, _ in watch.backups] == [
        (1, 2, 15), (2, 5, 30), (3, 8, 45), (4, 11, 60)]
    # The last backup came after the epoch's last step: fit resumes at the next epoch.
    assert IncrementalBackup.resume_point(directory) == ResumePoint(epoch=5, step=0, steps_done=60)


def test_a_backup_taken_mid_epoch_by_time_resumes_within_that_epoch(tmp_path, capfd):
    directory = str(tmp_path / "backup")
    # every_seconds this short backs up at every step end.
    first, second, _ = interrupted_then_resumed(directory, stop_at=(1, 4), every_seconds=1e-9)
    assert (first.backups[-1][0]["epoch"], first.backups[-1][0]["batch"]) == (1, 4)
    # Told as Keras' progress bar counts epochs and batches, from 1.
    assert "taken after batch 5 of epoch 2 (" in capfd.readouterr().err
    assert_same_rows(second.restored, first.backups[-1][1])
    assert second.steps[0] == (1, 5)


def test_epoch_backups_resume_at_the_start_of_the_interrupted_epoch(tmp_path, capfd):
    directory = str(tmp_path / "backup")
    first, second, _ = interrupted_then_resumed(directory, stop_at=(1, 3))
    assert (first.backups[-1][0]["epoch"], first.backups[-1][0]["batch"]) == (0, -1)
    assert "taken at the end of epoch 1 (" in capfd.readouterr().err
    assert_same_rows(second.restored, first.backups[-1][1])
    assert second.steps[0] == (1, 0)


@pytest.mark.parametrize("other", ["model_checkpoint", "checkpoint_manager"])
def test_checkpoints_written_beside_the_backups_leave_recovery_intact(tmp_path, other):
    # The main job writes a whole checkpoint every epoch beside its backups of changes.
    directory = str(tmp_path / "backup")
    if other == "model_checkpoint":
        saver = keras.callbacks.ModelCheckpoint(str(tmp_path / "epochs" / "w-{epoch}"), save_weights_only=True)
    else:
        class Manager(keras.callbacks.Callback):
            def on_train_batch_end(self, batch, logs=None):
                if batch % 3 == 1:
                    if not hasattr(self, "manager"):
                        self.manager = tf.train.CheckpointManager(
                            tf.train.Checkpoint(model=self.model), str(tmp_path / "manager"), 2)
                    self.manager.save()
        saver = Manager()
    first, second, _ = interrupted_then_resumed(directory, stop_at=(1, 9), others=[saver], save_freq=5)
    assert [state["chain"] for state, _ in first.backups][-1] == ["ckpt-1", "ckpt-2", "ckpt-3", "ckpt-4"]
    assert_same_rows(second.restored, first.backups[-1][1])
    assert second.steps[0] == (1, 8)


def test_a_backup_of_another_model_is_refused_naming_the_difference(tmp_path):
    directory = str(tmp_path / "backup")
    model, layer = model_and_layer()
    with pytest.raises(RuntimeError, match="simulated preemption"):
        fit(model, IncrementalBackup(directory, save_freq=5), Watch(directory, layer, stop_at=(0, 9)))
    wider = tfps.keras_layers.DynamicEmbedding(8, combiner="sum", optimizer=tfps.optimizers.Adagrad(0.1),
                                              name=layer.name)
    other = keras.Sequential([keras.Input((2,), dtype=tf.int64), wider, keras.layers.Dense(1)])
    other.compile(optimizer="sgd", loss="mse")
    watch = Watch(directory, wider)
    with pytest.raises(ValueError, match="IncrementalBackup: .*chief holds backups of another model.*"
                                         "table 0 .* has dim 4 in the backup, 8 here.*"
                                         r"variable 0 \('.*kernel.*' here\) is \[4, 1\] float32 in the backup, "
                                         r"\[8, 1\] float32 here"):
        fit(other, IncrementalBackup(directory, save_freq=5), watch)
    assert watch.steps == []
    # The same model resumes from it.
    second = Watch(directory, layer)
    layer.table.clear()
    fit(model, IncrementalBackup(directory, save_freq=5), second)
    assert second.steps[0] == (0, 10)


def corrupt(path):
    with open(path, "r+b") as f:
        size = f.seek(0, os.SEEK_END)
        f.seek(size // 2)
        byte = f.read(1)
        f.seek(size // 2)
        f.write(bytes([byte[0] ^ 0xFF]))


@pytest.mark.parametrize("damage", ["corrupt", "delete"])
def test_an_unreadable_backup_of_changes_resumes_from_the_backup_before_it(tmp_path, capfd, damage):
    directory = str(tmp_path / "backup")
    model, layer = model_and_layer()
    first = Watch(directory, layer, stop_at=(1, 9))
    with pytest.raises(RuntimeError, match="simulated preemption"):
        fit(model, IncrementalBackup(directory, save_freq=5), first)
    assert first.backups[-1][0]["chain"] == ["ckpt-1", "ckpt-2", "ckpt-3", "ckpt-4"]
    (damaged,) = table_files(directory, "ckpt-4")
    corrupt(damaged) if damage == "corrupt" else os.remove(damaged)
    layer.table.clear()
    capfd.readouterr()
    second = Watch(directory, layer)
    fit(model, IncrementalBackup(directory, save_freq=5), second)
    assert "backup ckpt-4 in" in capfd.readouterr().err
    assert_same_rows(second.restored, first.backups[-2][1])
    assert second.steps[0] == (1, 3)  # after the backup of step 15, epoch 1 batch 2
    # The chain was cut before ckpt-4 when the restore fell back, and the next backup follows ckpt-3.
    assert [state["chain"] for state, _ in second.backups[:2]] == [
        ["ckpt-1", "ckpt-2", "ckpt-3"], ["ckpt-1", "ckpt-2", "ckpt-3", "ckpt-5"]]


def test_changes_that_do_not_follow_the_restored_backup_resume_from_the_one_before(tmp_path, capfd):
    directory = str(tmp_path / "backup")
    model, layer = model_and_layer()
    first = Watch(directory, layer, stop_at=(1, 9))
    with pytest.raises(RuntimeError, match="simulated preemption"):
        fit(model, IncrementalBackup(directory, save_freq=5), first)
    chain_path = os.path.join(directory, "chief", "chain.json")
    with open(chain_path) as f:
        state = json.load(f)
    state["chain"] = ["ckpt-1", "ckpt-2", "ckpt-4"]  # ckpt-4 holds the changes since ckpt-3
    with open(chain_path, "w") as f:
        json.dump(state, f)
    layer.table.clear()
    capfd.readouterr()
    second = Watch(directory, layer)
    fit(model, IncrementalBackup(directory, save_freq=5), second)
    err = capfd.readouterr().err
    assert "backup ckpt-4 in" in err and "ckpt-4-tfps.DynamicTable.t0.shard-00000-of-00001' holds the changes" in err
    assert "resuming from ckpt-2" in err
    assert_same_rows(second.restored, first.backups[1][1])
    assert second.steps[0] == (0, 10)  # after ckpt-2, the backup of step 10
    assert second.backups[0][0]["chain"] == ["ckpt-1", "ckpt-2"]


def test_an_unreadable_whole_backup_or_chain_file_fails_naming_it(tmp_path):
    directory = str(tmp_path / "backup")
    model, layer = model_and_layer()
    with pytest.raises(RuntimeError, match="simulated preemption"):
        fit(model, IncrementalBackup(directory, save_freq=5), Watch(directory, layer, stop_at=(0, 9)))
    (whole,) = table_files(directory, "ckpt-1")
    corrupt(whole)
    with pytest.raises(ValueError, match="IncrementalBackup: the whole backup ckpt-1 in .* cannot be read"):
        fit(model, IncrementalBackup(directory), Watch(directory, layer))
    with open(os.path.join(directory, "chief", "chain.json"), "w") as f:
        f.write('{"chain": ["ckpt-1"')
    with pytest.raises(ValueError, match="IncrementalBackup: .*chain.json is not a list of backups"):
        fit(model, IncrementalBackup(directory), Watch(directory, layer))


def test_each_backup_is_on_disk_before_the_chain_names_it_and_before_the_old_chain_is_deleted(
        tmp_path, monkeypatch):
    """A rename is atomic for other processes, not across a power loss: a chain file on disk
    naming checkpoints still in the page cache, or an old chain deleted before its
    successor reached the disk, would leave nothing to recover from."""
    directory = str(tmp_path / "backup")
    events = disk_events.record(monkeypatch)
    model, layer = model_and_layer()
    watch = Watch(directory, layer, stop_at=(1, 9))
    with pytest.raises(RuntimeError, match="simulated preemption"):
        fit(model, IncrementalBackup(directory, save_freq=5, full_every=2), watch)

    chief = os.path.realpath(os.path.join(directory, "chief"))
    commits = disk_events.renames_to(events, os.path.join(chief, "chain.json"))
    assert len(commits) == 4  # backups after steps 5, 10, 15 and 20
    for commit, (state, _) in zip(commits, watch.backups):
        named = [path for path in events[commit][3]
                 if os.path.basename(path).split(".")[0].split("-tfps")[0] in state["chain"]]
        assert any("tfps.DynamicTable" in path for path in named)
        assert any(path.endswith(".index") for path in named)
        before = disk_events.synced_before(events, commit)
        assert not [path for path in named if os.path.realpath(path) not in before]
        assert os.path.realpath(events[commit][1]) in before  # the new chain file's bytes
        assert events[commit + 1] == ("sync", chief)  # and its name, right after the rename
        # backup_dir/chief was made for the backups: its entry, and backup_dir's, too.
        assert events[commit + 2] == ("sync", os.path.dirname(chief))
        assert events[commit + 3] == ("sync", os.path.dirname(os.path.dirname(chief)))
    # full_every=2: the chain [ckpt-1, ckpt-2] is deleted once ckpt-3 (whole) is committed.
    removed = [k for k, e in enumerate(events) if e[0] == "remove" and "/ckpt-1" in e[1]]
    assert removed and min(removed) > commits[2]
    assert [s["chain"] for s, _ in watch.backups] == [
        ["ckpt-1"], ["ckpt-1", "ckpt-2"], ["ckpt-3"], ["ckpt-3", "ckpt-4"]]
