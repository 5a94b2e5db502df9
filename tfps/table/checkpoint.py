"""Checkpoints of dynamic tables: every shard streams its own rows to its own file.

Registered with TensorFlow's checkpointing (`registration.register_checkpoint_saver`), so
`tf.train.Checkpoint`, `CheckpointManager`, `model.save_weights` (TF format), Keras
`ModelCheckpoint` and `BackupAndRestore` all save tables this way, to any path
`tf.io.gfile` writes. For checkpoint prefix P, shard i of n of the checkpoint's t-th table
is written by `Tfps>TableSave`, placed on the shard's device (its parameter server), to
`P-tfps.DynamicTable.t<t>.shard-<i>-of-<n>` in chunks; no row passes through the chief.
The checkpoint itself records, per table, a small manifest: the files, their row counts
and the layout (dim, slots, optimizer). Restoring checks every file each new shard will
read (format version, layout, checksums, row counts) on every shard first, and only then
replaces the rows, each new shard keeping the keys routed to it, so the number of
parameter servers may change. docs/checkpoints.md describes the file format.

CheckpointManager deletes old checkpoints by their `.index` and `.data-*` files; tfps
extends that deletion to the table files of the same prefix.
"""

import contextlib
import functools
import inspect
import os
import threading
import uuid

import tensorflow as tf
from tensorflow.python.saved_model import registration

from tfps.table import optimizers as optimizers_lib
from tfps.table import _shared_location
from tfps._ops import ops
from tfps.table.sharded_table import ShardedTable, on_every_shard
from tfps.table.dynamic_table import DynamicTable

SAVER_NAME = "tfps.DynamicTable"  # package.name of the registration below
FORMAT_VERSION = 3  # custom_ops/table/kernels/row_file.h's kRowFileVersion
_OPTIMIZERS = tuple(cls.op_name for cls in optimizers_lib.OPTIMIZERS)  # checkpoints record the index


class _Mode(threading.local):
    changes_only = False
    chain = ""
    files_checked = None  # the tables of a restore whose files were checked first


_mode = _Mode()


@contextlib.contextmanager
def changes_only(chain=None):
    """Checkpoints saved in this block hold, for each table, only what changed since the
    last save of the same chain: the rows inserted or changed and the keys removed (other
    variables are saved whole as always). A chain is, by default, the checkpoint's
    directory (a CheckpointManager's, a backup's), or the name given as `chain`; saves
    of other chains, whole checkpoints, `.keras` saves and exports between never change
    what a chain's next save holds. Restoring the chain's last whole checkpoint and then
    each of these in order gives the table as it was at the last of them. A table that
    knows no earlier save of the chain (a fresh process that did not restore from it) or
    cannot tell every change since (after `clear()`, a restore from elsewhere, or more
    removals than it records) writes a whole save instead. Takes time and space in
    proportion to the rows changed. tfps.callbacks.IncrementalBackup manages such chains.
    """
    if chain is not None and (not isinstance(chain, str) or not chain):
        raise ValueError(f"tfps.checkpoint.changes_only: chain must be a non-empty string, got {chain!r}")
    with _mode_set(changes_only=True, chain=chain or ""):
        yield


@contextlib.contextmanager
def chain(name):
    """Checkpoints saved and restored in this block belong to the chain `name` instead of
    their directory's: for several chains of changes in one directory, or one chain whose
    saves go to several directories. A restore continues its chain, so the chain's next
    save of changes follows the checkpoint restored."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"tfps.checkpoint.chain: name must be a non-empty string, got {name!r}")
    with _mode_set(chain=name):
        yield


class TracedWriter:
    """Writes one tf.train.Checkpoint, whole or (`changes_only=True`) of changes, through a
    traced function per kind, traced again only when the objects the checkpoint reaches
    change (a variable created, a layer added).

    An eager `Checkpoint.write` whose variables live on several tasks (as under
    ParameterServerStrategy) traces its save function anew on every call; for a small
    save of changes, that tracing is most of the cost. Values are read when the function
    runs, so each write holds the variables' current values.

    Before its first write to a directory, it checks that every task holding the
    checkpoint's variables (the parameter servers, which write them and the tables' shards)
    sees that directory as this task does, and fails naming the first that does not.
    """

    def __init__(self, checkpoint):
        self._checkpoint = checkpoint
        self._traced = {}  # (changes_only, chain) -> (objects signature, function)
        self._checked = set()  # directories every task holding the checkpoint's objects sees

    def write(self, file_prefix, changes_only=False):
        """Writes the checkpoint at `file_prefix` (creating its directory, as
        `Checkpoint.write` does) and returns the prefix."""
        directory = os.path.dirname(file_prefix)
        if directory:
            tf.io.gfile.makedirs(directory)
        objects = tf.train.TrackableView(self._checkpoint).descendants()
        if directory not in self._checked:
            _shared_location.check_shared(directory or ".", _shared_location.holding_tasks(objects))
            self._checked.add(directory)
        signature = tuple(id(o) for o in objects)
        kind = (changes_only, _mode.chain)
        known = self._traced.get(kind)
        if known is None or known[0] != signature:
            function = tf.function(lambda prefix: self._checkpoint.write(prefix), autograph=False)
            with _mode_set(changes_only=changes_only):
                function.get_concrete_function(tf.TensorSpec([], tf.string))
            known = self._traced[kind] = (signature, function)
        with _mode_set(changes_only=changes_only):  # in case tf.function traces it once more
            known[1](tf.constant(file_prefix, tf.string))
        return file_prefix


@contextlib.contextmanager
def _mode_set(**fields):
    """Sets fields of this thread's _mode for the block, then puts back what they were."""
    previous = {name: getattr(_mode, name) for name in fields}
    for name, value in fields.items():
        setattr(_mode, name, value)
    try:
        yield
    finally:
        for name, value in previous.items():
            setattr(_mode, name, value)


def _shards(table):
    return table.shards if isinstance(table, ShardedTable) else [table]


def _manifest_names(key):
    return [f"{key}/files", f"{key}/rows", f"{key}/layout"]


def _layout(table):
    """int64 [format version, dim, slots, optimizer, shards] of a table."""
    shard = _shards(table)[0]
    return [FORMAT_VERSION, shard.dim, shard.num_slots, _OPTIMIZERS.index(shard.optimizer.op_name),
            len(_shards(table))]


def _save_id(file_prefix):
    """An int64 id in [1, 2^62] for one save: from its path and the time, so that saves of
    different runs (even with the same random seeds) differ. Computed when the save runs."""
    with tf.device("CPU:0"):
        stamp = tf.strings.as_string(tf.timestamp(), precision=6)
        return tf.strings.to_hash_bucket_fast(tf.strings.join([file_prefix, stamp], "@"), 1 << 62) + 1


def _save(trackables, file_prefix):
    names, tensors, shard_files, writers, commits = [], [], [], [], []
    base = tf.strings.regex_replace(file_prefix, r"^.*/", "")
    save_id = _save_id(file_prefix)
    for t, key in enumerate(sorted(trackables)):
        shards = _shards(trackables[key])
        suffixes = [f".t{t}.shard-{i:05d}-of-{len(shards):05d}" for i in range(len(shards))]
        # Thread-local: read here, not in the shards' threads.
        changes, chain = _mode.changes_only, _mode.chain

        def save_shard(i, shard=None, suffix=None):
            with tf.device(shard.resource_handle.device):
                saved = ops.tfps_table_save(shard.resource_handle, file_prefix + suffix, i,
                                            len(shards), save_id, changes_only=changes, chain=chain)
                return saved.rows, saved.stamp
        saved = on_every_shard([functools.partial(save_shard, i, shard, suffix)
                                for i, (shard, suffix) in enumerate(zip(shards, suffixes))])
        rows = [r for r, _ in saved]
        names += _manifest_names(key)
        tensors += [tf.stack([base + suffix for suffix in suffixes]), tf.stack(rows),
                    tf.constant(_layout(trackables[key]), tf.int64)]
        shard_files += [file_prefix + suffix for suffix in suffixes]
        writers += [shard.resource_handle.device or "this task" for shard in shards]
        commits += [functools.partial(_commit, shard, file_prefix + suffix, save_id, stamp, chain)
                    for shard, suffix, (_, stamp) in zip(shards, suffixes, saved)]
    # The manifest depends on every shard's row count, so it is written, and merged into
    # the checkpoint, only after every shard file is complete and seen from here (a task
    # writing where the others cannot see fails the save now, not the restore later). Only
    # then do the tables' chains move on to this save.
    with tf.device("CPU:0"), tf.control_dependencies(tensors):
        visible = ops.tfps_row_files_visible(tf.stack(shard_files), tf.constant(writers))
        with tf.control_dependencies([visible]):
            saved = tf.raw_ops.SaveV2(prefix=file_prefix, tensor_names=names,
                                      shape_and_slices=[""] * len(names), tensors=tensors)
    with tf.control_dependencies([saved]):
        committed = on_every_shard(commits)
    with tf.device("CPU:0"), tf.control_dependencies(committed):
        return tf.identity(file_prefix)


def _commit(shard, path, save_id, stamp, chain):
    with tf.device(shard.resource_handle.device):
        return ops.tfps_table_commit_save(shard.resource_handle, path, save_id, stamp, chain=chain)


def _restore(trackables, merged_prefix):
    chain = _mode.chain  # the chain a restore continues: the files' directory by default
    tables = _table_reads(trackables, merged_prefix)
    # Every table's files are checked before any table's rows are replaced (reading each
    # file whole: not twice).
    with tf.control_dependencies([] if _mode.files_checked is trackables else _checks(tables)):
        for shards, reads in tables:
            _restore_shards(shards, reads, chain=chain)


def _table_reads(trackables, merged_prefix):
    """For each table of a checkpoint being restored: (its shards, what each shard reads:
    paths and their row counts), the tables' layouts checked against the checkpoint's."""
    directory = tf.strings.regex_replace(merged_prefix, r"[^/]*$", "")
    tables = []
    for key, table in sorted(trackables.items()):
        files, rows, layout = tf.raw_ops.RestoreV2(
            prefix=merged_prefix, tensor_names=_manifest_names(key), shape_and_slices=[""] * 3,
            dtypes=[tf.string, tf.int64, tf.int64])
        _check_layout(key, layout, table)
        paths = directory + files
        shards = _shards(table)
        # With as many shards as were saved, shard i finds all its keys in file i.
        same_count = tf.equal(tf.size(paths), len(shards))
        tables.append((shards, [tf.cond(same_count, lambda i=i: (paths[i:i + 1], rows[i:i + 1]),
                                        lambda: (paths, rows)) for i in range(len(shards))]))
    return tables


def _checks(tables):
    """Has every shard of every table check the files it will read (format, layout,
    checksums, row counts, and that changes follow the rows it holds)."""
    def check(table_shard, shard_paths, shard_rows):
        with tf.device(table_shard.resource_handle.device):
            return ops.tfps_row_files_check(table_shard.resource_handle, shard_paths, shard_rows,
                                            dim=table_shard.dim, num_slots=table_shard.num_slots,
                                            optimizer=table_shard.optimizer.op_name)
    return [c for shards, reads in tables
            for c in on_every_shard([functools.partial(check, table_shard, *read)
                                     for table_shard, read in zip(shards, reads)])]


def _restore_shards(shards, reads, chain="", continue_chain=True):
    def restore(i, table_shard, shard_paths, shard_rows):
        with tf.device(table_shard.resource_handle.device):
            return ops.tfps_table_restore(table_shard.resource_handle, shard_paths, shard_rows,
                                          i, len(shards), records_verified=True, chain=chain,
                                          continue_chain=continue_chain)
    return on_every_shard([functools.partial(restore, i, table_shard, *read)
                           for i, (table_shard, read) in enumerate(zip(shards, reads))])


def _check_then_restore(shards, reads, chain="", continue_chain=True):
    """Has every shard check the files it will read (reads[i]: its paths and their row
    counts), and only when every check passed restore from them."""
    with tf.control_dependencies(_checks([(shards, reads)])):
        return _restore_shards(shards, reads, chain=chain, continue_chain=continue_chain)


def recording_tables(init):
    """MultiDeviceSaver.__init__ (tfps.keras._patches): keeps the tables a saver restores."""
    signature = inspect.signature(init)

    @functools.wraps(init)
    def wrapped(self, *args, **kwargs):
        init(self, *args, **kwargs)
        registered = signature.bind(self, *args, **kwargs).arguments.get("registered_savers")
        self._tfps_tables = (registered or {}).get(SAVER_NAME)
    return wrapped


def _checked_first(tables, prefix, restore, refused=None):
    """Runs restore() once every table's files are checked (eagerly; each file is read whole
    once by the check, once by the restore), or restore() alone when they were already."""
    if tables is None or _mode.files_checked is tables:
        return restore()
    if not tf.executing_eagerly():
        if tf.inside_function():  # the restore's own function (several tasks): checked outside
            return restore()
        raise RuntimeError(
            "tfps tables restore eagerly (TensorFlow 2): a TF1 graph-mode restore (Session, "
            "run_restore_ops) would leave them out and restore the other variables alone; "
            "restore with eager execution on")
    try:
        _checks(_table_reads(tables, prefix))
    except (tf.errors.OpError, ValueError):
        if refused is not None:
            refused()
        raise
    with _mode_set(files_checked=tables):
        return restore()


def checking_tables_before_any_restore(restore_saveables):
    """_CheckpointRestoreCoordinator.restore_saveables (tfps.keras._patches): TensorFlow
    restores Python state, then the variables, then the registered savers' objects, and
    objects made later (an optimizer's step counter, a layer built lazily) from the same
    checkpoint when they appear. A table's refusal (changes that do not follow its rows, a
    damaged file) would come after the others had taken the refused checkpoint's values:
    every table's files are checked first, and a refused checkpoint restores nothing later."""
    signature = inspect.signature(restore_saveables)

    @functools.wraps(restore_saveables)
    def wrapped(self, *args, **kwargs):
        registered = signature.bind(self, *args, **kwargs).arguments.get("registered_savers") or {}

        def refused():
            self.restore_uid = -1  # below every object's update id: its restores do nothing

        return _checked_first(registered.get(SAVER_NAME), self.save_path_tensor,
                              lambda: restore_saveables(self, *args, **kwargs), refused)
    return wrapped


def checking_tables_first(restore):
    """MultiDeviceSaver.restore (tfps.keras._patches): the same check for restores that make
    a saver themselves (a SavedModel's load), where restore_saveables has not checked."""
    @functools.wraps(restore)
    def wrapped(self, file_prefix, *args, **kwargs):
        return _checked_first(getattr(self, "_tfps_tables", None), file_prefix,
                              lambda: restore(self, file_prefix, *args, **kwargs))
    return wrapped


def _save_shard(shards, i, path):
    """Shard i writes its row file to `path` from its own device, as a snapshot: it belongs
    to no chain of saves, so incremental checkpoints are not disturbed. Returns the rows."""
    shard = shards[i]
    with tf.device(shard.resource_handle.device):
        return ops.tfps_table_save(shard.resource_handle, path, i, len(shards), 0, snapshot=True).rows


def _erase(shard, path):
    """Empties `path` from the shard's own device: an in-memory (ram://) file lives in the
    process that wrote it."""
    with tf.device(shard.resource_handle.device):
        tf.io.write_file(path, "")


def snapshot(table):
    """Each shard's row file (rows, and the admission and eviction state), as bytes, with
    its row count: for archives that hold a table themselves (.keras). Eager. Each shard
    writes its file into its own process' memory (ram://) and sends it over."""
    shards = _shards(table)
    tag = uuid.uuid4().hex

    def one(i, shard):
        path = f"ram://tfps-snapshot/{tag}/shard-{i}"
        rows = _save_shard(shards, i, path)
        with tf.device(shard.resource_handle.device):
            data = tf.io.read_file(path)
        _erase(shard, path)
        return data.numpy(), int(rows)
    return on_every_shard([functools.partial(one, i, shard) for i, shard in enumerate(shards)])


class SnapshotInPlace:
    """A table's rows kept where they are: each shard writes its row file into its own
    process' memory (ram://), or under `directory`, and restores from it later; no row
    passes through the caller. Eager. For keeping a state to go back to within one process
    (the best epoch of an EarlyStopping); checkpoints are for anything that must outlive it."""

    def __init__(self, table, directory=None):
        self._shards = _shards(table)
        tag = uuid.uuid4().hex
        root = (f"ram://tfps-snapshot/{tag}/" if directory is None
                else os.path.join(directory, f"tfps-snapshot-{tag}-"))
        self._paths = [f"{root}shard-{i}" for i in range(len(self._shards))]
        self._rows = on_every_shard([functools.partial(_save_shard, self._shards, i, path)
                                     for i, path in enumerate(self._paths)])

    def restore(self):
        """Replaces the table's rows with the snapshot's (each file checked first)."""
        reads = [(tf.constant([path]), tf.reshape(tf.cast(rows, tf.int64), [1]))
                 for path, rows in zip(self._paths, self._rows)]
        _check_then_restore(self._shards, reads, continue_chain=False)

    def discard(self):
        for shard, path in zip(self._shards, self._paths):
            _erase(shard, path)
            if not path.startswith("ram://") and tf.io.gfile.exists(path):
                tf.io.gfile.remove(path)


def restore_snapshot(table, files):
    """Restores `snapshot`'s [(bytes, rows)] into `table` (any number of shards): every file
    is checked on every shard first, as a checkpoint restore does, and only then read."""
    shards = _shards(table)
    tag = uuid.uuid4().hex
    same_count = len(files) == len(shards)
    placed = []
    reads = []
    for i, shard in enumerate(shards):
        mine = [i] if same_count else range(len(files))
        paths = [f"ram://tfps-snapshot/{tag}/{i}/file-{j}" for j in mine]
        with tf.device(shard.resource_handle.device):
            for path, j in zip(paths, mine):
                tf.io.write_file(path, files[j][0])
        placed.append((shard, paths))
        reads.append((tf.constant(paths), tf.constant([files[j][1] for j in mine], tf.int64)))
    try:
        _check_then_restore(shards, reads, continue_chain=False)
    finally:
        for shard, paths in placed:
            for path in paths:
                _erase(shard, path)


def _check_layout(key, layout, table):
    """Raises InvalidArgumentError before any file is read if the saved table cannot go
    into `table`: its dim, slots or optimizer differ, or its format is newer than this tfps
    reads."""
    dim, slots, optimizer = _layout(table)[1:4]
    fits = tf.reduce_all(tf.equal(layout[1:4], tf.constant([dim, slots, optimizer], tf.int64)))
    fits = tf.logical_and(fits, layout[0] <= FORMAT_VERSION)
    shown_key = key.replace("{", "(").replace("}", ")")  # braces are tf.strings.format's
    saved_optimizer = tf.gather(tf.constant(_OPTIMIZERS + ("unknown",)),
                                tf.clip_by_value(layout[3], 0, len(_OPTIMIZERS)))
    message = tf.strings.join([  # format() would quote the optimizer's name
        tf.strings.format(f"tfps: checkpointed table '{shown_key}' has format version {{}}, dim {{}}, "
                          "{} optimizer slot(s) and optimizer {} (", (layout[0], layout[1], layout[2], layout[3])),
        saved_optimizer,
        f"), but the table restoring it has dim {dim}, {slots} optimizer slot(s) and optimizer "
        f"{optimizer} ({_OPTIMIZERS[optimizer]}) and reads format versions up to {FORMAT_VERSION}"])
    if tf.executing_eagerly():  # the sentence alone, not wrapped in an Assert's report
        if not bool(fits):
            raise tf.errors.InvalidArgumentError(None, None, message.numpy().decode())
        return
    tf.debugging.Assert(fits, [message], summarize=1)


def files(prefix):
    """The files of the checkpoint `prefix`: its index, data and table files."""
    return [path for pattern in (prefix + ".index", prefix + ".data-*", f"{prefix}-{SAVER_NAME}*")
            for path in tf.io.gfile.glob(pattern)]


def delete(prefix):
    """Deletes the checkpoint `prefix`: its index, data and table files."""
    for path in files(prefix):
        tf.io.gfile.remove(path)


def deleting_table_files(delete):
    """checkpoint_management._delete_file_if_exists (tfps.keras._patches): CheckpointManager's
    deletion of old checkpoints takes their table files too."""
    def delete_file_if_exists(filespec):
        delete(filespec)
        if filespec.endswith(".index"):
            delete(filespec[:-len(".index")] + f"-{SAVER_NAME}*")
    return delete_file_if_exists


def register_saver():
    """Makes TensorFlow's checkpointing save and restore tables through _save and _restore
    (tfps.keras._patches calls it; idempotent)."""
    try:
        registration.register_checkpoint_saver(
            package="tfps", name="DynamicTable", predicate=_is_table, save_fn=_save,
            restore_fn=_restore)
    except ValueError:  # registered already
        pass


def _is_table(trackable):
    """A table that saves its own rows: a ShardedTable, or a DynamicTable of its own (a
    ShardedTable's saver writes its shards)."""
    return isinstance(trackable, ShardedTable) or (
        isinstance(trackable, DynamicTable) and not trackable.in_sharded_table)
