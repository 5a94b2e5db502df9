"""Records, in order, the file syncs, renames and removals a block makes, to check that
what a commit names reached the disk before the commit (tfps._durable)."""

import glob
import os

import tensorflow as tf


def record(monkeypatch):
    """Patches os.fsync, tf.io.gfile.rename and tf.io.gfile.remove for the test; returns the
    list they append to: ("sync", real path) | ("rename", source, target, the files beside
    target then) | ("remove", path)."""
    events = []
    real_fsync, real_rename, real_remove = os.fsync, tf.io.gfile.rename, tf.io.gfile.remove

    def fsync(fd):
        events.append(("sync", os.path.realpath(os.readlink(f"/proc/self/fd/{fd}"))))
        real_fsync(fd)

    def rename(source, target, overwrite=False):
        events.append(("rename", source, target, glob.glob(os.path.join(os.path.dirname(target), "*"))))
        real_rename(source, target, overwrite=overwrite)

    def remove(path):
        events.append(("remove", path))
        real_remove(path)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(tf.io.gfile, "rename", rename)
    monkeypatch.setattr(tf.io.gfile, "remove", remove)
    return events


def synced_before(events, index):
    """The real paths synced before events[index]."""
    return {e[1] for e in events[:index] if e[0] == "sync"}


def renames_to(events, path):
    """The indices of the renames onto `path`."""
    return [k for k, e in enumerate(events)
            if e[0] == "rename" and os.path.realpath(e[2]) == os.path.realpath(path)]
