"""tfps.export.save_for_retrieval: each shard's keys and vectors as .npy files that NumPy
reads alone, and exports of changes (inserted, changed, removed rows) whose application to
the whole export gives the table's own export, on their own chain."""

import json
import os

import numpy as np
import pytest
import tensorflow as tf

import tfps
from tests import disk_events
from tfps._ops import ops
from tfps.table.sharded_table import ShardedTable


def table_state(table):
    """The table's own export (keys ascending, their values): the reference."""
    rows = table.export()
    order = np.argsort(rows.keys.numpy())
    return rows.keys.numpy()[order], rows.values.numpy()[order]


def sharded(num_shards=3, dim=4):
    return ShardedTable(dim, optimizer=tfps.optimizers.Adagrad(0.1), devices=["/cpu:0"] * num_shards)


def assert_loads_as(table, *directories):
    keys, vectors = tfps.export.load_for_retrieval(*directories)
    expected_keys, expected_vectors = table_state(table)
    np.testing.assert_array_equal(keys, expected_keys)
    np.testing.assert_array_equal(vectors, expected_vectors)


def test_a_whole_export_is_every_key_and_vector_in_plain_npy_files(tmp_path):
    table = sharded()
    keys = np.concatenate([np.random.default_rng(0).integers(-(1 << 63), (1 << 63) - 1, 70_000, dtype=np.int64),
                           [0, -1, -(1 << 63), (1 << 63) - 1]])  # more than one chunk of rows
    table.find_or_insert(keys)
    manifest = tfps.export.save_for_retrieval(table, str(tmp_path / "v1"))
    assert manifest["dim"] == 4 and manifest["num_shards"] == 3
    assert [s["kind"] for s in manifest["shards"]] == ["whole"] * 3
    assert json.loads((tmp_path / "v1" / "retrieval.json").read_text()) == manifest
    # np.load alone reads a shard, which holds exactly the keys routed to it.
    for i, size in enumerate(table.shard_sizes()):
        shard_keys = np.load(tmp_path / "v1" / f"shard-{i}-of-3.keys.npy")
        vectors = np.load(tmp_path / "v1" / f"shard-{i}-of-3.vectors.npy")
        assert shard_keys.dtype == np.int64 and vectors.dtype == np.float32
        assert shard_keys.shape == (size,) and vectors.shape == (size, 4)
        np.testing.assert_array_equal(vectors, table.find(shard_keys).numpy())
        assert (tfps.keys.shard_of(tf.constant(shard_keys), 3).numpy() == i).all()
        assert np.load(tmp_path / "v1" / f"shard-{i}-of-3.removed_keys.npy").shape == (0,)
    assert_loads_as(table, str(tmp_path / "v1"))


def test_the_shards_files_are_on_disk_before_the_manifest_that_names_them(tmp_path, monkeypatch):
    table = sharded()
    table.find_or_insert(np.arange(1000))
    events = disk_events.record(monkeypatch)
    tfps.export.save_for_retrieval(table, str(tmp_path / "v1"))
    [commit] = disk_events.renames_to(events, tmp_path / "v1" / "retrieval.json")
    files = [p for p in events[commit][3] if p.endswith(".npy")]
    assert len(files) == 9  # keys, vectors and removed keys of 3 shards
    assert set(map(os.path.realpath, files + [events[commit][1]])) <= disk_events.synced_before(events, commit)
    assert events[commit + 1] == ("sync", os.path.realpath(tmp_path / "v1"))


def test_changes_hold_the_inserted_changed_and_removed_rows_only(tmp_path):
    table = sharded()
    table.find_or_insert(np.arange(1000))
    tfps.export.save_for_retrieval(table, str(tmp_path / "v1"))
    table.apply_gradients(np.arange(10), np.ones((10, 4), np.float32))  # changed
    table.find_or_insert(np.arange(5000, 5020))                          # inserted
    table.remove(np.arange(990, 1000))                                   # removed
    table.remove(np.array([3]))                                          # changed, then removed
    table.insert(np.array([995]), np.full((1, 4), 7.0, np.float32))      # removed, then back
    manifest = tfps.export.save_for_retrieval(table, str(tmp_path / "v2"), changes_only=True)
    assert [s["kind"] for s in manifest["shards"]] == ["changes"] * 3
    written = np.concatenate([np.load(tmp_path / "v2" / f"shard-{i}-of-3.keys.npy") for i in range(3)])
    removed = np.concatenate([np.load(tmp_path / "v2" / f"shard-{i}-of-3.removed_keys.npy") for i in range(3)])
    assert sorted(written) == sorted([0, 1, 2, *range(4, 10), *range(5000, 5020), 995])
    assert set(removed) >= {3, *range(990, 1000)} - {995} and 3 in removed
    assert_loads_as(table, str(tmp_path / "v1"), str(tmp_path / "v2"))
    # Nothing changed since: the next changes are empty, and the chain still applies.
    manifest = tfps.export.save_for_retrieval(table, str(tmp_path / "v3"), changes_only=True)
    assert sum(s["rows"] + s["removed"] for s in manifest["shards"]) == 0
    assert_loads_as(table, *(str(tmp_path / v) for v in ("v1", "v2", "v3")))


def test_the_retrieval_chain_and_checkpoint_chains_do_not_take_each_others_changes(tmp_path):
    table = sharded(num_shards=1)
    checkpoint = tf.train.Checkpoint(table=table)
    table.find_or_insert(np.arange(100))
    tfps.export.save_for_retrieval(table, str(tmp_path / "r1"))
    checkpoint.write(str(tmp_path / "ckpt" / "whole"))
    table.apply_gradients(np.arange(5), np.ones((5, 4), np.float32))
    with tfps.checkpoint.changes_only():  # the checkpoint chain's save of changes comes first
        checkpoint.write(str(tmp_path / "ckpt" / "changes"))
    manifest = tfps.export.save_for_retrieval(table, str(tmp_path / "r2"), changes_only=True)
    assert manifest["shards"][0]["rows"] == 5
    table.apply_gradients(np.arange(50, 53), np.ones((3, 4), np.float32))
    with tfps.checkpoint.changes_only():  # and the retrieval export took nothing from it
        checkpoint.write(str(tmp_path / "ckpt" / "changes2"))
    restored = sharded(num_shards=1)
    for prefix in ("whole", "changes", "changes2"):
        tf.train.Checkpoint(table=restored).read(str(tmp_path / "ckpt" / prefix)).assert_consumed()
    np.testing.assert_array_equal(table_state(restored)[1], table_state(table)[1])


def test_an_export_that_is_not_committed_moves_no_chain(tmp_path):
    table = sharded(num_shards=1)
    table.find_or_insert(np.arange(100))
    tfps.export.save_for_retrieval(table, str(tmp_path / "v1"))
    table.apply_gradients(np.arange(7), np.ones((7, 4), np.float32))
    # The op writes files but a failure before the commit (here: none is made) loses nothing.
    rows, _, kind, _, _ = ops.tfps_table_export_for_retrieval(
        table.shards[0].resource_handle, str(tmp_path / "lost"), changes_only=True, chain="retrieval")
    assert (int(rows), int(kind)) == (7, 1)
    manifest = tfps.export.save_for_retrieval(table, str(tmp_path / "v2"), changes_only=True)
    assert manifest["shards"][0]["rows"] == 7
    assert_loads_as(table, str(tmp_path / "v1"), str(tmp_path / "v2"))


def test_a_table_without_a_known_chain_exports_whole_and_a_later_whole_shard_replaces_its_keys(tmp_path):
    table = sharded()
    table.find_or_insert(np.arange(300))
    first = tfps.export.save_for_retrieval(table, str(tmp_path / "v1"), changes_only=True)
    assert [s["kind"] for s in first["shards"]] == ["whole"] * 3  # no export of the chain before
    table.remove(np.arange(0, 300, 2))
    table.shards[1].clear()  # a shard that cannot tell its changes writes whole
    table.find_or_insert(np.arange(1000, 1010))
    second = tfps.export.save_for_retrieval(table, str(tmp_path / "v2"), changes_only=True)
    assert [s["kind"] for s in second["shards"]] == ["changes", "whole", "changes"]
    assert_loads_as(table, str(tmp_path / "v1"), str(tmp_path / "v2"))


def test_changes_given_out_of_order_or_after_a_gap_are_refused_naming_what_they_follow(tmp_path):
    table = sharded()
    table.find_or_insert(np.arange(100))
    versions = [str(tmp_path / "items" / str(v)) for v in (8, 9, 10)]
    tfps.export.save_for_retrieval(table, versions[0])
    table.remove(np.arange(50))
    manifest = tfps.export.save_for_retrieval(table, versions[1], changes_only=True)
    assert all(s["follows"] == json.loads(open(os.path.join(versions[0], "retrieval.json")).read())["export_id"]
               for s in manifest["shards"])
    table.find_or_insert(np.arange(6, 8))  # back after their removal
    table.remove(np.array([60]))
    tfps.export.save_for_retrieval(table, versions[2], changes_only=True)
    assert_loads_as(table, *versions)
    # Sorted as strings, "10" comes before "9": in that order the index would keep key 60
    # and lose keys 6 and 7; with version 9 left out it would keep the first 50 keys too.
    with pytest.raises(ValueError, match=r"items/10 \(shard \d\) holds the changes since .*items/9, given later, "
                                         r"not since .*items/8, which it is given after: give a whole export "
                                         r"and then every export of changes of its chain, in the order they were written"):
        tfps.export.load_for_retrieval(versions[0], versions[2], versions[1])
    with pytest.raises(ValueError, match=r"items/10 \(shard \d\) holds the changes since an export not given, "
                                         r"not since .*items/8"):
        tfps.export.load_for_retrieval(versions[0], versions[2])
    # A whole export resets every shard: changes after it apply from it alone.
    tfps.export.save_for_retrieval(table, str(tmp_path / "whole"))
    table.find_or_insert(np.arange(200, 210))
    tfps.export.save_for_retrieval(table, str(tmp_path / "after_whole"), changes_only=True)
    assert_loads_as(table, str(tmp_path / "whole"), str(tmp_path / "after_whole"))
    with pytest.raises(ValueError, match="holds the changes since an export not given, not since .*items/10"):
        tfps.export.load_for_retrieval(*versions, str(tmp_path / "after_whole"))


def test_bad_exports_and_loads_are_refused_naming_the_problem(tmp_path):
    table = sharded(num_shards=1)
    table.find_or_insert(np.arange(10))
    tfps.export.save_for_retrieval(table, str(tmp_path / "v1"))
    with pytest.raises(ValueError, match="already holds an export"):
        tfps.export.save_for_retrieval(table, str(tmp_path / "v1"))
    with pytest.raises(ValueError, match="chain must be a non-empty string"):
        tfps.export.save_for_retrieval(table, str(tmp_path / "v2"), chain="")
    with pytest.raises(TypeError, match="expected a DynamicEmbedding, ShardedTable or DynamicTable"):
        tfps.export.save_for_retrieval(np.zeros(3), str(tmp_path / "v2"))
    with pytest.raises(ValueError, match="directory must be a path"):
        tfps.export.save_for_retrieval(table, 5)
    with pytest.raises(ValueError, match="changes_only must be True or False"):
        tfps.export.save_for_retrieval(table, str(tmp_path / "v2"), changes_only="yes")
    busy = tmp_path / "busy"  # another program's files: none may be taken for part of an export
    busy.mkdir()
    (busy / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="is not empty"):
        tfps.export.save_for_retrieval(table, str(busy))
    assert os.listdir(busy) == ["notes.txt"]
    (tmp_path / "empty").mkdir()
    tfps.export.save_for_retrieval(table, tmp_path / "empty")  # an empty directory, as a PathLike
    assert_loads_as(table, str(tmp_path / "empty"))
    table.find_or_insert(np.arange(10, 20))
    tfps.export.save_for_retrieval(table, str(tmp_path / "v2"), changes_only=True)
    with pytest.raises(ValueError, match="the first export must be a whole one"):
        tfps.export.load_for_retrieval(str(tmp_path / "v2"))
    with pytest.raises(ValueError, match="no retrieval.json"):
        tfps.export.load_for_retrieval(str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="at least one export directory"):
        tfps.export.load_for_retrieval()
    with pytest.raises(ValueError, match="given twice"):
        tfps.export.load_for_retrieval(str(tmp_path / "v1"), str(tmp_path / "v2"), str(tmp_path / "v2"))
    other = sharded(num_shards=1, dim=3)
    other.find_or_insert(np.arange(5))
    tfps.export.save_for_retrieval(other, str(tmp_path / "other"))
    with pytest.raises(ValueError, match=r"does not follow .* exports of one table's chain only"):
        tfps.export.load_for_retrieval(str(tmp_path / "v1"), str(tmp_path / "other"))
    assert not [p for p in os.listdir(tmp_path / "v2") if "tmp" in p]
