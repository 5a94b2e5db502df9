"""Table checkpoints: each shard's rows stream to a file of their own; restores re-partition,
bring back the clock, and check every file before any shard is touched."""

import os

import numpy as np
import pytest
import tensorflow as tf

import tfps
from tfps.sharded_table import ShardedTable

DIM = 4
KEYS = np.concatenate([np.arange(3000, dtype=np.int64) * 7919 - 10 ** 6,
                       [0, -1, -(1 << 63), (1 << 63) - 1]]).astype(np.int64)


def trained_table(table):
    """Rows with real slots and metadata; the clock ends at 3."""
    table.find_or_insert(KEYS)
    for i in range(3):
        table.apply_gradients(KEYS[i::3], np.full((len(KEYS[i::3]), DIM), 0.1 * (i + 1), np.float32),
                              step=-1)
    return table


def sorted_rows(table):
    rows = table.export()
    order = np.argsort(rows.keys.numpy())
    return {name: getattr(rows, name).numpy()[order] for name in rows._fields}


def assert_same_rows(a, b):
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


def table_files(directory):
    return sorted(f for f in tf.io.gfile.listdir(directory) if "-tfps.DynamicTable." in f)


@pytest.mark.parametrize("root", ["local", "ram"])
def test_a_table_round_trips_rows_slots_metadata_and_clock(tmp_path, root):
    directory = str(tmp_path) if root == "local" else f"ram://{tmp_path.name}"
    table = trained_table(tfps.DynamicTable(DIM, optimizer="adam"))
    saved = sorted_rows(table)
    checkpoint = tf.train.Checkpoint(table=table)
    path = checkpoint.save(os.path.join(directory, "ckpt"))
    assert table_files(directory) == ["ckpt-1-tfps.DynamicTable.t0.shard-00000-of-00001"]
    table.clear()
    table.find_or_insert(np.array([42], np.int64))
    checkpoint.restore(path).assert_consumed()
    assert_same_rows(sorted_rows(table), saved)
    # The clock went on from 3: the next apply records step 4 as last seen.
    table.apply_gradients(KEYS[:1], np.ones((1, DIM), np.float32), step=-1)
    rows = sorted_rows(table)
    assert rows["metadata"][rows["keys"] == KEYS[0]][0, 1] == 4


@pytest.mark.parametrize("restore_shards", [1, 2, 3])
def test_shards_restore_into_any_number_of_shards_each_keeping_its_own_keys(tmp_path, restore_shards):
    saved_table = trained_table(ShardedTable(DIM, optimizer="adagrad", devices=["/cpu:0"] * 2))
    saved = sorted_rows(saved_table)
    path = tf.train.Checkpoint(table=saved_table).write(str(tmp_path / "ckpt"))
    assert len(table_files(str(tmp_path))) == 2
    restored = ShardedTable(DIM, optimizer="adagrad", devices=["/cpu:0"] * restore_shards)
    tf.train.Checkpoint(table=restored).read(path).assert_consumed()
    assert_same_rows(sorted_rows(restored), saved)
    for i, shard in enumerate(restored.shards):
        keys = shard.export().keys
        assert np.all(tfps.keys.shard_of(keys, restore_shards).numpy() == i)


@pytest.mark.parametrize("damage,error,message", [
    ("flipped byte", tf.errors.DataLossError, "is corrupt or truncated: checksum"),
    ("truncated", tf.errors.DataLossError, "is corrupt or truncated"),
    ("missing", tf.errors.NotFoundError, "cannot be read"),
])
def test_a_damaged_file_fails_the_restore_naming_it_and_no_shard_changes(tmp_path, damage, error, message):
    table = trained_table(ShardedTable(DIM, devices=["/cpu:0"] * 2))
    path = tf.train.Checkpoint(table=table).write(str(tmp_path / "ckpt"))
    damaged = os.path.join(str(tmp_path), table_files(str(tmp_path))[1])
    if damage == "missing":
        os.remove(damaged)
    else:
        data = bytearray(open(damaged, "rb").read())
        if damage == "flipped byte":
            data[len(data) // 2] ^= 0x40
        else:
            data = data[:-100]
        open(damaged, "wb").write(bytes(data))
    table.clear()
    table.find_or_insert(KEYS[:50])  # the state a failed restore must leave alone
    before = sorted_rows(table)
    with pytest.raises(error, match=message) as raised:
        tf.train.Checkpoint(table=table).read(path)
    assert os.path.basename(damaged) in str(raised.value)
    assert_same_rows(sorted_rows(table), before)
    assert min(table.shard_sizes()) > 0


def test_a_table_of_another_layout_is_refused_before_any_file_is_read(tmp_path):
    path = tf.train.Checkpoint(table=trained_table(tfps.DynamicTable(DIM))).write(str(tmp_path / "c"))
    for other in (tfps.DynamicTable(DIM + 1), tfps.DynamicTable(DIM, optimizer="ftrl")):
        other.find_or_insert(KEYS[:10])
        before = sorted_rows(other)
        with pytest.raises(tf.errors.InvalidArgumentError, match="has \\[format version, dim, slots, optimizer\\]"):
            tf.train.Checkpoint(table=other).read(path)
        assert_same_rows(sorted_rows(other), before)


def test_a_newer_format_version_is_refused_naming_both_versions(tmp_path):
    from tfps._ops import ops
    table = trained_table(tfps.DynamicTable(DIM))
    path = str(tmp_path / "shard.rows")
    ops.tfps_table_save(table.resource_handle, path, 0, 1)
    data = bytearray(open(path, "rb").read())
    data[8] = 2  # the version field; the header checksum below is made to match it
    data[60:64] = crc32c(bytes(data[:60])).to_bytes(4, "little")
    open(path, "wb").write(bytes(data))
    with pytest.raises(tf.errors.FailedPreconditionError, match="format version 2; this tfps reads version 1"):
        ops.tfps_row_files_check([path], [-1], dim=DIM, num_slots=1, optimizer="adagrad")


def crc32c(data):
    """Bitwise CRC-32C, an independent reference for the file's checksums."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def test_the_file_layout_is_as_documented(tmp_path):
    """Parses a row file with NumPy from docs/checkpoints.md alone."""
    from tfps._ops import ops
    table = trained_table(tfps.DynamicTable(DIM, optimizer="adagrad"))
    path = str(tmp_path / "shard.rows")
    ops.tfps_table_save(table.resource_handle, path, 0, 1, max_chunk_bytes=64 * 1024)
    data = open(path, "rb").read()
    assert data[:8] == b"TFPSROWS"
    version, dim, slots, optimizer = np.frombuffer(data, np.uint32, 4, 8)
    clock = int(np.frombuffer(data, np.int64, 1, 24)[0])
    assert (version, dim, slots, optimizer, clock) == (1, DIM, 1, 1, 3)
    assert int(np.frombuffer(data, np.uint32, 1, 60)[0]) == crc32c(data[:60])
    offset, keys, values, chunks = 64, [], [], 0
    while data[offset:offset + 4] == b"CHNK":
        n = int(np.frombuffer(data, np.uint32, 1, offset + 4)[0])
        start, at = offset, offset + 8
        keys.append(np.frombuffer(data, np.int64, n, at))
        at += 8 * n + 24 * n
        values.append(np.frombuffer(data, np.float32, n * DIM, at).reshape(n, DIM))
        at += 4 * n * DIM * 2
        assert int(np.frombuffer(data, np.uint32, 1, at)[0]) == crc32c(data[start:at])
        offset, chunks = at + 4, chunks + 1
    assert data[offset:offset + 4] == b"TEND" and len(data) == offset + 32
    assert chunks > 1  # 64 KiB chunks
    assert np.frombuffer(data, np.uint64, 2, offset + 8).tolist() == [len(KEYS), chunks]
    keys, values = np.concatenate(keys), np.concatenate(values)
    np.testing.assert_array_equal(values, table.find(keys).numpy())
    np.testing.assert_array_equal(np.sort(keys), np.sort(KEYS))


def test_checkpoint_manager_deletes_the_table_files_of_checkpoints_it_drops(tmp_path):
    table = trained_table(tfps.DynamicTable(DIM))
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(table=table), str(tmp_path), max_to_keep=1)
    for _ in range(3):
        manager.save()
    assert table_files(str(tmp_path)) == ["ckpt-3-tfps.DynamicTable.t0.shard-00000-of-00001"]
