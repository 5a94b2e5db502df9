"""tfps._durable: what a replace syncs, and which failures to sync it lets pass."""

import errno
import os

import pytest

from tfps import _durable as durable


def test_a_directory_that_cannot_be_opened_or_synced_does_not_fail_the_replace(tmp_path, monkeypatch):
    """A parent of mode 0711 (enterable, not readable) or a file system without directory
    syncs: the file is still replaced, and its own bytes were synced."""
    real_open, synced = os.open, []

    def open_(path, flags, *args):
        if os.path.isdir(path) and path != str(tmp_path):
            raise PermissionError(errno.EACCES, "Permission denied", path)
        return real_open(path, flags, *args)

    def fsync(fd):
        path = os.readlink(f"/proc/self/fd/{fd}")
        if os.path.isdir(path):
            raise OSError(errno.EINVAL, "Invalid argument")
        synced.append(path)

    monkeypatch.setattr(os, "open", open_)
    monkeypatch.setattr(os, "fsync", fsync)
    (tmp_path / "chain.json.tmp").write_text("new")
    (tmp_path / "chain.json").write_text("old")
    durable.replace(str(tmp_path / "chain.json.tmp"), str(tmp_path / "chain.json"))
    assert (tmp_path / "chain.json").read_text() == "new"
    assert synced == [str(tmp_path / "chain.json.tmp")]


def test_a_file_whose_bytes_fail_to_sync_is_not_renamed(tmp_path, monkeypatch):
    def fsync(fd):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "fsync", fsync)
    (tmp_path / "chain.json.tmp").write_text("new")
    (tmp_path / "chain.json").write_text("old")
    with pytest.raises(OSError, match="Input/output error"):
        durable.replace(str(tmp_path / "chain.json.tmp"), str(tmp_path / "chain.json"))
    assert (tmp_path / "chain.json").read_text() == "old"


def test_paths_off_the_local_file_system_are_left_to_their_store(monkeypatch):
    def fsync(fd):
        raise AssertionError("nothing local to sync")

    monkeypatch.setattr(os, "fsync", fsync)
    durable.sync_files(["gs://bucket/ckpt-1.index", "s3://bucket/ckpt-1.data-00000-of-00001"])
