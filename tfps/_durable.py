"""Files that must survive the machine's crash before a later step relies on them.

A rename makes a file appear whole to other processes, but after a power loss or a kernel
crash the renamed file may hold nothing, and TensorFlow's file objects only flush to the
operating system. So where tfps commits to a file (a backup chain that names its
checkpoints, then deletes the ones it no longer needs; an export renamed into place), it
first syncs the file's bytes to the disk, then the directory's entry for its name.

Only local paths are synced (a plain path or file://): an object store (gs://, s3://)
keeps an object once its upload completes, and a network file system a client has
closed. Each parameter server closes its own table files before the chief syncs them.
"""

import os

import tensorflow as tf

_LOCAL_SCHEME = "file://"


def _local_path(path):
    """The local file system's path of `path`, or None when it lives elsewhere."""
    if path.startswith(_LOCAL_SCHEME):
        return path[len(_LOCAL_SCHEME):]
    return None if "://" in path else path


def _sync(path):
    # A file or a directory; fsync flushes its pages through any descriptor, read-only too.
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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


def sync_tree(root):
    """Syncs every file and directory under `root` (an export directory), and `root`'s
    own entry in its parent."""
    local = _local_path(root)
    if local is None:
        return
    for directory, _, files in os.walk(local):
        sync_files([os.path.join(directory, name) for name in files])
        _sync(directory)
    _sync(os.path.dirname(os.path.abspath(local)))


def replace(temporary, path):
    """Renames `temporary` (a file, or a directory and everything in it) to `path`,
    replacing a file there, with the bytes and the new name on disk before it returns."""
    local = _local_path(temporary)
    if local is not None and os.path.isdir(local):
        sync_tree(temporary)
    else:
        sync_files([temporary])
    tf.io.gfile.rename(temporary, path, overwrite=True)
    local = _local_path(path)
    if local is not None:
        _sync(os.path.dirname(os.path.abspath(local)))
