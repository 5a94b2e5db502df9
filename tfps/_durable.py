"""Files that must survive the machine's crash before a later step relies on them.

A rename makes a file appear whole to other processes, but after a power loss or a kernel
crash the renamed file may hold nothing, and TensorFlow's file objects only flush to the
operating system. So where tfps commits to a file (a backup chain that names its
checkpoints, then deletes the ones it no longer needs; an export renamed into place), it
first syncs the file's bytes to the disk, then the directory entries that lead to its
name.

Only paths of the local file system are synced (a plain path or file://; a network file
system mounted there is synced through its client). An object store (gs://, s3://) keeps
an object once its upload completes. Each parameter server closes its own table files
before the chief syncs them.
"""

import errno
import os

import tensorflow as tf

_LOCAL_SCHEME = "file://"


def _local_path(path):
    """The local file system's path of `path`, or None when it lives elsewhere."""
    path = os.fspath(path)
    if path.startswith(_LOCAL_SCHEME):
        return path[len(_LOCAL_SCHEME):]
    return None if "://" in path else path


# A file system that cannot sync (EINVAL, ENOTSUP: some FUSE mounts), or a directory this
# process may enter but not open (EACCES, EPERM: a parent of mode 0711): nothing to sync
# through, and failing a backup or an export for it would only stop training.
_CANNOT_SYNC = (errno.EINVAL, errno.ENOTSUP, errno.EACCES, errno.EPERM)


def _sync(path):
    # A file or a directory; fsync flushes its pages through any descriptor, read-only too.
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as e:
        if e.errno in _CANNOT_SYNC and os.path.isdir(path):
            return
        raise
    try:
        os.fsync(fd)
    except OSError as e:
        if e.errno not in _CANNOT_SYNC:
            raise
    finally:
        os.close(fd)


def _sync_directory_chain(directory):
    """`directory` and every directory above it: a directory made since the last sync is an
    entry of its parent, which needs syncing as much as the file's own entry does."""
    directory = os.path.abspath(directory)
    while True:
        _sync(directory)
        parent = os.path.dirname(directory)
        if parent == directory:
            return
        directory = parent


def sync_files(paths):
    """Syncs each file of `paths` and the directories that hold them."""
    directories = set()
    for path in paths:
        local = _local_path(path)
        if local is None:
            continue
        _sync(local)
        directories.add(os.path.dirname(os.path.abspath(local)))
    for directory in sorted(directories):
        _sync(directory)


def _sync_tree(root):
    """Every file and directory under `root`, each directory after its files."""
    for directory, _, files in os.walk(root, topdown=False):
        for name in files:
            _sync(os.path.join(directory, name))
        _sync(directory)


def replace(temporary, path):
    """Renames `temporary` (a file, or a directory and everything in it) to `path`,
    replacing a file there, with the bytes and the new name on disk before it returns."""
    local = _local_path(temporary)
    if local is not None:
        if os.path.isdir(local):
            _sync_tree(local)
        else:
            _sync(local)
    tf.io.gfile.rename(temporary, path, overwrite=True)
    local = _local_path(path)
    if local is not None:
        _sync_directory_chain(os.path.dirname(os.path.abspath(local)))
