"""Table checkpoints: each shard's rows stream to a file of their own; restores re-partition,
bring back the clock, and check every file before any shard is touched."""

import os
import threading

import numpy as np
import pytest
import tensorflow as tf
import tf_keras as keras

import tfps
from tests.table_rows import assert_same_rows, sorted_rows
from tfps.keras_layers import DynamicEmbedding
from tfps.table.sharded_table import ShardedTable

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
        with pytest.raises(tf.errors.InvalidArgumentError,
                           match=r"^tfps: checkpointed table 'table' has format version 3, dim 4, 1 optimizer "
                                 rf"slot\(s\) and optimizer 1 \(adagrad\), but the table restoring it has "
                                 rf"dim {other.dim}"):
            tf.train.Checkpoint(table=other).read(path)
        assert_same_rows(sorted_rows(other), before)


def test_a_newer_format_version_is_refused_naming_both_versions(tmp_path):
    from tfps._ops import ops
    table = trained_table(tfps.DynamicTable(DIM))
    path = str(tmp_path / "shard.rows")
    ops.tfps_table_save(table.resource_handle, path, 0, 1, 5)
    data = bytearray(open(path, "rb").read())
    data[8] = 4  # the version field; the header checksum below is made to match it
    data[60:64] = crc32c(bytes(data[:60])).to_bytes(4, "little")
    open(path, "wb").write(bytes(data))
    with pytest.raises(tf.errors.FailedPreconditionError, match="format version 4; this tfps reads versions 1 to 3"):
        ops.tfps_row_files_check(table.resource_handle, [path], [-1], dim=DIM, num_slots=1, optimizer="adagrad")


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
    for _ in range(2):
        table.count_skipped_step()
    path = str(tmp_path / "shard.rows")
    ops.tfps_table_save(table.resource_handle, path, 0, 1, 5, max_chunk_bytes=64 * 1024)
    data = open(path, "rb").read()
    assert data[:8] == b"TFPSROWS"
    version, dim, slots, optimizer = np.frombuffer(data, np.uint32, 4, 8)
    clock = int(np.frombuffer(data, np.int64, 1, 24)[0])
    assert (version, dim, slots, optimizer, clock) == (3, DIM, 1, 1, 3)
    assert np.frombuffer(data, np.uint32, 3, 32).tolist() == [0, 1, 0]  # shard 0 of 1, whole
    assert np.frombuffer(data[44:60], np.uint64).tolist() == [5, 0]  # save id; a whole file follows none
    assert int(np.frombuffer(data, np.uint32, 1, 60)[0]) == crc32c(data[:60])
    offset, keys, values, chunks = 64, [], [], 0
    while data[offset:offset + 4] == b"CHNK":
        n = int(np.frombuffer(data, np.uint32, 1, offset + 4)[0])
        start, at = offset, offset + 8
        keys.append(np.frombuffer(data, np.int64, n, at))
        at += 8 * n + 32 * n
        values.append(np.frombuffer(data, np.float32, n * DIM, at).reshape(n, DIM))
        at += 4 * n * DIM * 2
        assert int(np.frombuffer(data, np.uint32, 1, at)[0]) == crc32c(data[start:at])
        offset, chunks = at + 4, chunks + 1
    # The table's state after the rows: admitted, rejected, evicted, skipped steps, then
    # (clock, time) pairs.
    assert data[offset:offset + 4] == b"TABL"
    n = int(np.frombuffer(data, np.uint32, 1, offset + 4)[0])
    state = np.frombuffer(data, np.int64, n, offset + 8)
    assert n == 4  # no TTL in seconds: no clock times
    assert state.tolist() == [table.stats()[k] for k in ("admitted", "rejected", "evicted", "skipped_steps")]
    assert state[3] == 2
    assert int(np.frombuffer(data, np.uint32, 1, offset + 8 + 8 * n)[0]) == crc32c(data[offset:offset + 8 + 8 * n])
    offset += 12 + 8 * n
    assert data[offset:offset + 4] == b"TEND" and len(data) == offset + 40
    assert chunks > 1  # 64 KiB chunks
    assert np.frombuffer(data, np.uint64, 3, offset + 8).tolist() == [len(KEYS), chunks, 0]
    assert int(np.frombuffer(data, np.uint32, 1, offset + 36)[0]) == crc32c(data[offset:offset + 36])
    keys, values = np.concatenate(keys), np.concatenate(values)
    np.testing.assert_array_equal(values, table.find(keys).numpy())
    np.testing.assert_array_equal(np.sort(keys), np.sort(KEYS))


def test_a_version_1_file_from_the_documented_layout_restores(tmp_path):
    """Files written before rows kept a score column (3 metadata columns, no state records)
    still restore; their rows' scores read 0."""
    from tfps._ops import ops
    rng = np.random.default_rng(5)
    keys = np.array([3, -7, 1 << 40], np.int64)
    metadata = np.array([[5, 2, 0], [1, 9, 0], [7, 4, 0]], np.int64)
    values = rng.normal(size=(3, DIM)).astype(np.float32)
    slots = rng.uniform(0.1, 1, size=(3, 1, DIM)).astype(np.float32)
    header = bytearray(b"TFPSROWS" + np.array([1, DIM, 1, 1], np.uint32).tobytes() +
                       np.array([9], np.int64).tobytes() + np.array([0, 1, 0], np.uint32).tobytes())
    header += bytes(60 - len(header))
    header += crc32c(bytes(header)).to_bytes(4, "little")
    record = b"CHNK" + np.uint32(3).tobytes() + keys.tobytes() + metadata.tobytes() + \
        values.tobytes() + slots.tobytes()
    record += crc32c(record).to_bytes(4, "little")
    footer = b"TEND" + bytes(4) + np.array([3, 1, 0], np.uint64).tobytes() + bytes(4)
    footer += crc32c(footer).to_bytes(4, "little")
    path = str(tmp_path / "v1.rows")
    open(path, "wb").write(bytes(header) + record + footer)
    table = tfps.DynamicTable(DIM, optimizer="adagrad")
    ops.tfps_row_files_check(table.resource_handle, [path], [3], dim=DIM, num_slots=1, optimizer="adagrad")
    assert int(ops.tfps_table_restore(table.resource_handle, [path], [3], 0, 1)) == 3
    rows = sorted_rows(table)
    order = np.argsort(keys)
    np.testing.assert_array_equal(rows["values"], values[order])
    np.testing.assert_array_equal(rows["slots"], slots[order])
    np.testing.assert_array_equal(rows["metadata"], np.c_[metadata, np.zeros(3, np.int64)][order])
    assert int(table.clock()) == 9


def test_a_version_2_file_restores_with_no_skipped_steps(tmp_path):
    """Files written before tables counted skipped steps (a TABL record of three counters)
    still restore, their counters and clock record kept."""
    from tfps._ops import ops
    keys = np.array([11, -4], np.int64)
    metadata = np.array([[2, 1, 0, 0], [3, 1, 0, 0]], np.int64)
    values = np.arange(2 * DIM, dtype=np.float32).reshape(2, DIM)
    slots = np.full((2, 1, DIM), 0.5, np.float32)
    header = bytearray(b"TFPSROWS" + np.array([2, DIM, 1, 1], np.uint32).tobytes() +
                       np.array([4], np.int64).tobytes() + np.array([0, 1, 0], np.uint32).tobytes())
    header += bytes(60 - len(header))
    header += crc32c(bytes(header)).to_bytes(4, "little")
    records = b""
    for magic, payload, n in ((b"CHNK", keys.tobytes() + metadata.tobytes() + values.tobytes() + slots.tobytes(), 2),
                              (b"TABL", np.array([2, 7, 1], np.int64).tobytes(), 3)):
        record = magic + np.uint32(n).tobytes() + payload
        records += record + crc32c(record).to_bytes(4, "little")
    footer = b"TEND" + bytes(4) + np.array([2, 1, 0], np.uint64).tobytes() + bytes(4)
    footer += crc32c(footer).to_bytes(4, "little")
    path = str(tmp_path / "v2.rows")
    open(path, "wb").write(bytes(header) + records + footer)
    table = tfps.DynamicTable(DIM, optimizer="adagrad")
    ops.tfps_row_files_check(table.resource_handle, [path], [2], dim=DIM, num_slots=1, optimizer="adagrad")
    assert int(ops.tfps_table_restore(table.resource_handle, [path], [2], 0, 1)) == 2
    np.testing.assert_array_equal(table.find(keys).numpy(), values)
    stats = table.stats()
    assert [stats[k] for k in ("admitted", "rejected", "evicted", "skipped_steps", "clock")] == [2, 7, 1, 0, 4]


def test_skipped_steps_are_restored_whole_into_any_number_of_shards(tmp_path):
    table = trained_table(ShardedTable(DIM, devices=["/cpu:0"] * 2))
    for _ in range(3):
        table.count_skipped_step()
    path = tf.train.Checkpoint(table=table).write(str(tmp_path / "c"))
    for shards in (1, 3):
        restored = ShardedTable(DIM, devices=["/cpu:0"] * shards)
        tf.train.Checkpoint(table=restored).read(path)
        assert [s["skipped_steps"] for s in restored.stats()["shards"]] == [3] * shards
        assert restored.stats()["skipped_steps"] == 3
        assert restored.stats()["admitted"] == table.stats()["admitted"]  # shared out, summing to it


def test_checkpoint_manager_deletes_the_table_files_of_checkpoints_it_drops(tmp_path):
    table = trained_table(tfps.DynamicTable(DIM))
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(table=table), str(tmp_path), max_to_keep=1)
    for _ in range(3):
        manager.save()
    assert table_files(str(tmp_path)) == ["ckpt-3-tfps.DynamicTable.t0.shard-00000-of-00001"]


def change(table):
    """Updates some rows, adds keys, removes others."""
    table.apply_gradients(KEYS[:40], np.full((40, DIM), -0.3, np.float32), step=-1)
    table.find_or_insert(np.arange(5, dtype=np.int64) + (1 << 40))
    table.remove(KEYS[100:130])


@pytest.mark.parametrize("saved_shards,restore_shards", [(1, 1), (2, 2), (2, 3)])
def test_whole_then_changes_restore_the_latest_table(tmp_path, saved_shards, restore_shards):
    table = trained_table(ShardedTable(DIM, optimizer="adam", devices=["/cpu:0"] * saved_shards))
    checkpoint = tf.train.Checkpoint(table=table)
    whole = checkpoint.write(str(tmp_path / "whole"))
    deltas = []
    for i in range(2):
        change(table)
        table.remove(KEYS[200 + i:201 + i])
        with tfps.checkpoint.changes_only():
            deltas.append(checkpoint.write(str(tmp_path / f"delta{i}")))
    latest = sorted_rows(table)
    whole_bytes = sum(os.path.getsize(os.path.join(tmp_path, f)) for f in table_files(str(tmp_path))
                      if f.startswith("whole"))
    delta_bytes = sum(os.path.getsize(os.path.join(tmp_path, f)) for f in table_files(str(tmp_path))
                      if f.startswith("delta1"))
    assert delta_bytes < 0.05 * whole_bytes  # 40 changed and 5 new rows of 3000
    restored = ShardedTable(DIM, optimizer="adam", devices=["/cpu:0"] * restore_shards)
    restored.find_or_insert(np.array([77], np.int64))  # gone after the whole restore
    for path in [whole] + deltas:
        tf.train.Checkpoint(table=restored).read(path).assert_consumed()
    assert_same_rows(sorted_rows(restored), latest)


def test_traced_writer_saves_current_values_and_objects_added_after_tracing(tmp_path):
    table = trained_table(tfps.DynamicTable(DIM, optimizer="adam"))
    dense = tf.Variable([1.0, 2.0])
    checkpoint = tf.train.Checkpoint(table=table, dense=dense)
    writer = tfps.checkpoint.TracedWriter(checkpoint)
    with tfps.checkpoint.chain("traced"):  # one chain over two directories
        paths = [writer.write(str(tmp_path / "not" / "yet" / "whole"))]  # directories made as needed
        for i in range(3):
            change(table)
            dense.assign([10.0 * i, -1.0])
            paths.append(writer.write(str(tmp_path / f"delta{i}"), changes_only=True))
        # Deltas after the first reuse its trace; the restore below needs every value they hold.
        assert writer._traced[(True, "traced")][1].experimental_get_tracing_count() == 1
        checkpoint.extra = tf.Variable(7.0)  # a new object: the next write traces again
        change(table)
        paths.append(writer.write(str(tmp_path / "delta3"), changes_only=True))
    assert "extra/.ATTRIBUTES/VARIABLE_VALUE" in dict(tf.train.list_variables(paths[-1]))
    restored_table, restored_dense = tfps.DynamicTable(DIM, optimizer="adam"), tf.Variable([0.0, 0.0])
    restored = tf.train.Checkpoint(table=restored_table, dense=restored_dense, extra=tf.Variable(0.0))
    for path in paths:
        restored.read(path).expect_partial()
    assert_same_rows(sorted_rows(restored_table), sorted_rows(table))
    np.testing.assert_array_equal(restored_dense.numpy(), [20.0, -1.0])
    assert restored.extra.numpy() == 7.0
    # A delta holds the 40 changed and 5 new rows only.
    assert tf.train.load_checkpoint(paths[1]).get_tensor("table/rows").tolist() == [45]


@pytest.mark.parametrize("restore_shards", [1, 3])
def test_changes_restored_out_of_order_or_without_their_whole_save_are_refused(tmp_path, restore_shards):
    table = trained_table(ShardedTable(DIM, devices=["/cpu:0"] * 2))
    checkpoint = tf.train.Checkpoint(table=table)
    writer = tfps.checkpoint.TracedWriter(checkpoint)  # the traced save makes a new id each time too
    chain = [writer.write(str(tmp_path / "whole"))]
    for i in range(2):
        change(table)
        chain.append(writer.write(str(tmp_path / f"delta{i}"), changes_only=True))
    restored = ShardedTable(DIM, devices=["/cpu:0"] * restore_shards)
    restored.find_or_insert(np.array([77], np.int64))
    before = sorted_rows(restored)
    reader = tf.train.Checkpoint(table=restored)
    with pytest.raises(tf.errors.FailedPreconditionError,
                       match="delta0-tfps.DynamicTable.t0.shard-0000.-of-00002' holds the changes since the save with id"):
        reader.read(chain[1])  # changes without their whole save
    assert_same_rows(sorted_rows(restored), before)
    reader.read(chain[0])
    with pytest.raises(tf.errors.FailedPreconditionError, match="restore the checkpoint these changes follow first"):
        reader.read(chain[2])  # the second changes before the first
    for path in chain[1:]:
        reader.read(path)
    assert_same_rows(sorted_rows(restored), sorted_rows(table))
    # A table restored from the chain goes on with it: its own changes follow the last.
    change(restored)
    with tfps.checkpoint.changes_only():
        chain.append(reader.write(str(tmp_path / "delta2")))
    again = ShardedTable(DIM, devices=["/cpu:0"] * 2)
    for path in chain:
        tf.train.Checkpoint(table=again).read(path)
    assert_same_rows(sorted_rows(again), sorted_rows(restored))


def test_exports_between_restores_leave_the_next_changes_restorable(tmp_path):
    """A process that follows a training job's checkpoints and exports after each restore:
    an export for serving or retrieval, a SavedModel or a checkpoint of its own changes no
    row, so the changes after the restored checkpoint still follow the table; once a row
    changes (a training step), they no longer do and are refused."""
    source = DynamicEmbedding(DIM, name="items")
    source.build(None)
    trained_table(source.table)
    writer = tfps.checkpoint.TracedWriter(tf.train.Checkpoint(table=source.table))
    chain = [writer.write(str(tmp_path / "whole"))]
    for i in range(2):
        change(source.table)
        chain.append(writer.write(str(tmp_path / f"delta{i}"), changes_only=True))
    ids = keras.Input((1,), dtype=tf.int64, name="ids")
    follower = DynamicEmbedding(DIM, name="items")
    model = keras.Model(ids, follower(ids))
    reader = tf.train.Checkpoint(table=follower.table)
    for version, path in enumerate(chain, 1):
        reader.read(path)
        serving = tmp_path / "serving"
        tfps.export.save_for_serving(model, str(serving / str(version)),
                                     changes_since=None if version == 1 else str(serving / str(version - 1)))
        tfps.export.save_for_retrieval(follower, str(tmp_path / "retrieval" / str(version)), changes_only=version > 1)
        model.save(str(tmp_path / "saved_model" / str(version)))  # tf_keras: a SavedModel
    assert_same_rows(sorted_rows(follower.table), sorted_rows(source.table))
    for trained in (False, True):
        other = DynamicEmbedding(DIM, name="items")
        other.build(None)
        again = tf.train.Checkpoint(table=other.table)
        again.read(chain[0])
        again.read(chain[1])
        again.write(str(tmp_path / f"own-{trained}"))  # a save of its own: still as of delta0
        if not trained:
            again.read(chain[2])
            assert_same_rows(sorted_rows(other.table), sorted_rows(source.table))
            continue
        other.table.apply_gradients(KEYS[:1], np.ones((1, DIM), np.float32), step=-1)
        before = sorted_rows(other.table)
        with pytest.raises(tf.errors.FailedPreconditionError,
                           match="has changed since its last save or restore, of .*restore the checkpoint "
                                 "these changes follow first"):
            again.read(chain[2])  # delta1 follows delta0, which the trained table no longer equals
        assert_same_rows(sorted_rows(other.table), before)


def test_a_refused_restore_leaves_the_dense_layers_and_optimizer_as_they_were(tmp_path):
    """TensorFlow restores other variables before the tables' saver runs, and objects made
    later from the same checkpoint: a restore of changes the table refuses must not have
    moved the rest of the model already, nor move what is made after it."""
    def build():
        ids = keras.Input((2,), dtype=tf.int64)
        embedded = DynamicEmbedding(DIM, optimizer=tfps.optimizers.Adagrad(0.1), name="items")(ids)
        model = keras.Model(ids, keras.layers.Dense(1)(keras.layers.Flatten()(embedded)))
        model.compile(keras.optimizers.legacy.Adam(0.01), "mse")
        return model
    x, y = np.arange(64).reshape(32, 2), np.ones(32)
    source = build()
    source.fit(x, y, verbose=0)  # one step: the whole checkpoint's optimizer is at step 1
    writer = tf.train.Checkpoint(model=source)
    chain = [writer.write(str(tmp_path / "whole"))]
    for i in range(2):
        source.fit(x + i, y, verbose=0)
        with tfps.checkpoint.changes_only():
            chain.append(writer.write(str(tmp_path / f"delta{i}")))
    follower = build()
    reader = tf.train.Checkpoint(model=follower)
    reader.read(chain[0])
    dense = [v.numpy() for v in follower.variables]
    table = follower.get_layer("items").table
    rows = sorted_rows(table)
    with pytest.raises(tf.errors.FailedPreconditionError, match="restore the checkpoint these changes follow first"):
        reader.read(chain[2])  # skips delta0
    for before, variable in zip(dense, follower.variables):
        np.testing.assert_array_equal(variable.numpy(), before, err_msg=variable.name)
    assert_same_rows(sorted_rows(table), rows)
    # The follower's optimizer did not exist yet: made now, it takes the whole checkpoint's
    # step, not the refused one's (3).
    assert follower.optimizer.iterations.numpy() == 1
    for path in chain[1:]:
        reader.read(path)
    assert follower.optimizer.iterations.numpy() == source.optimizer.iterations.numpy() == 3
    for mine, theirs in zip(follower.variables, source.variables):
        np.testing.assert_array_equal(mine.numpy(), theirs.numpy(), err_msg=mine.name)
    assert_same_rows(sorted_rows(table), sorted_rows(source.get_layer("items").table))


def test_a_tf1_graph_mode_restore_of_tables_is_refused(tmp_path):
    """TensorFlow's graph-mode restore leaves registered savers' ops out: it would restore
    the other variables and silently not the table."""
    path = tf.train.Checkpoint(table=trained_table(tfps.DynamicTable(DIM)), v=tf.Variable(1.0)).write(
        str(tmp_path / "whole"))
    with tf.Graph().as_default(), tf.compat.v1.Session() as session:
        table, v = tfps.DynamicTable(DIM), tf.Variable(0.0)
        session.run(tf.compat.v1.global_variables_initializer())
        with pytest.raises(RuntimeError, match="tfps tables restore eagerly"):
            tf.train.Checkpoint(table=table, v=v).read(path).run_restore_ops(session)
        assert session.run(v) == 0.0


def test_a_table_cleared_since_its_last_save_saves_whole_under_changes_only(tmp_path):
    table = trained_table(tfps.DynamicTable(DIM))
    checkpoint = tf.train.Checkpoint(table=table)
    whole = checkpoint.write(str(tmp_path / "whole"))
    table.clear()
    table.find_or_insert(KEYS[:10])
    with tfps.checkpoint.changes_only():
        delta = checkpoint.write(str(tmp_path / "delta"))
    restored = tfps.DynamicTable(DIM)
    for path in (whole, delta):
        tf.train.Checkpoint(table=restored).read(path)
    assert_same_rows(sorted_rows(restored), sorted_rows(table))
    assert restored.size().numpy() == 10


def test_after_a_restore_the_next_changes_are_only_what_changed_since(tmp_path):
    table = trained_table(tfps.DynamicTable(DIM))
    whole = tf.train.Checkpoint(table=table).write(str(tmp_path / "whole"))
    restored = tfps.DynamicTable(DIM)
    checkpoint = tf.train.Checkpoint(table=restored)
    checkpoint.read(whole)
    restored.apply_gradients(KEYS[:3], np.ones((3, DIM), np.float32), step=-1)
    with tfps.checkpoint.changes_only():
        checkpoint.write(str(tmp_path / "delta"))
    from tfps._ops import ops
    files = [os.path.join(tmp_path, f) for f in table_files(str(tmp_path)) if f.startswith("delta")]
    follower = tfps.DynamicTable(DIM)  # a table as of the whole save, which the changes follow
    tf.train.Checkpoint(table=follower).read(whole)
    assert int(ops.tfps_row_files_check(follower.resource_handle, files, [3], dim=DIM, num_slots=1,
                                        optimizer="adagrad")) >= 0


def test_a_restore_is_one_change_that_no_concurrent_update_lands_inside(tmp_path):
    # Rows hold whole numbers and each update subtracts exactly 1 from every HOT row (SGD at
    # rate 1), so after a restore every HOT row must be its saved value less one and the same
    # number of updates: an update that landed inside the restore would reach the rows
    # restored before it and be overwritten in the rest.
    keys = np.arange(300_000, dtype=np.int64) * 7919
    hot = keys[::4001][:64]  # spread over the stripes
    table = tfps.DynamicTable(16, optimizer=tfps.optimizers.SGD(1.0))
    table.insert(keys, np.repeat((keys % 1000).astype(np.float32)[:, None], 16, 1))
    checkpoint = tf.train.Checkpoint(table=table)
    path = checkpoint.save(str(tmp_path / "whole"))
    saved = table.find(hot).numpy()
    stop, training = threading.Event(), threading.Event()
    updates = []

    def train():
        while not stop.is_set():
            table.apply_gradients(hot, np.ones((len(hot), 16), np.float32))
            updates.append(1)
            if len(updates) >= 3:
                training.set()

    trainer = threading.Thread(target=train)
    trainer.start()
    try:
        assert training.wait(timeout=60), "the training thread made no 3 updates in 60 s"
        during = len(updates)  # training runs when the restore starts
        checkpoint.restore(path).assert_consumed()
    finally:
        stop.set()
        trainer.join()
    landed = saved - table.find(hot).numpy()
    np.testing.assert_array_equal(landed, landed[0, 0])  # one whole count in every row
    assert landed[0, 0] >= 0 and len(updates) > during
