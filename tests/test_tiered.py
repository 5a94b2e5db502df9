"""Tiered tables (tfps.storage.Tiered): the same rows as in memory, bit for bit, in every
mode, and every way rows leave a table (checkpoints whole and of changes into other shard
counts, serving and retrieval exports) reads both tiers. The core's own test
(custom_ops/core/tests/tiers_test.cc) covers every optimizer, stream, budget and policy in
C++; here the layers, the kernels and the cluster."""

import gc
import os

import numpy as np
import pytest
import tensorflow as tf
import tf_keras as keras

import tfps
from tests.cluster_run import run_cluster_program
from tests.table_rows import assert_same_rows, sorted_rows
from tests.test_checkpoint import DIM, KEYS, change, table_files, trained_table
from tests.test_export import serve_without_tfps
from tfps.keras_layers import DynamicEmbedding
from tfps.table.sharded_table import ShardedTable

ROWS = ("keys", "values", "slots", "metadata")


# Locally and under PSS, each at steps_per_execution 1 and 10, over the training paths.
@pytest.mark.parametrize("mode,steps_per_execution,path", [
    ("local", 1, "plain"), ("local", 10, "early_stopping"), ("pss", 10, "plain"),
    ("pss", 1, "worker_cache"), ("pss", 1, "synchronous")])
def test_tiered_tables_train_exactly_as_in_memory(mode, steps_per_execution, path):
    out = run_cluster_program("tiered_exact.py", "--mode", mode, "--steps_per_execution", str(steps_per_execution),
                              "--path", path)
    # EarlyStopping stopped after the second epoch and put back the first epoch's snapshot.
    assert out["epochs"] == (2 if path == "early_stopping" else 1)
    rows_created = out["rows_created"]
    tables = out["tables"]
    for name, table in tables.items():
        group, storage = name.split("/")
        reference = tables[f"{group}/memory"]
        assert table["rows"]["keys"], name
        for field in ROWS:
            assert table["rows"][field] == reference["rows"][field], f"{name}: {field} differ from in memory"
        assert table["inference"] == reference["inference"], name
        stats = table["stats"]
        assert stats["rows"] == len(table["rows"]["keys"])
        if storage == "memory":
            assert stats["rows_in_memory"] == stats["rows"] and stats["payloads_read"] == 0
            continue
        budget = max(2, int(float(storage) * rows_created))
        assert stats["rows_in_memory"] <= budget, name
        if budget < stats["rows"]:  # the rest were demoted, and lookups read them back
            assert stats["payloads_demoted"] >= stats["rows"] - budget and stats["payloads_read"] > 0, name
        assert stats["evicted"] == reference["stats"]["evicted"]
    assert tables["policies/memory"]["stats"]["evicted"] > 0  # TTL and the cap removed rows
    # Every shard of every tiered table opened its own directory (2 per table under PSS).
    tiered = sum(1 for name in tables if not name.endswith("/memory"))
    assert len(out["directories_in_use"]) == tiered * (2 if mode == "pss" else 1)


def tiered(path, num_shards, memory_rows=64, optimizer="adam"):
    return ShardedTable(DIM, optimizer=optimizer, devices=["/cpu:0"] * num_shards,
                        storage=tfps.storage.Tiered(str(path), memory_rows=memory_rows))


@pytest.mark.parametrize("saved_shards,restore_shards,restore_tiered", [(2, 3, True), (2, 1, False), (1, 2, True)])
def test_whole_and_changes_checkpoints_restore_into_any_shards_and_storage(tmp_path, saved_shards, restore_shards,
                                                                        restore_tiered):
    table = trained_table(tiered(tmp_path / "tier", saved_shards))
    assert table.stats()["rows_in_memory"] <= 64 < table.stats()["rows"]
    reference = trained_table(ShardedTable(DIM, optimizer="adam", devices=["/cpu:0"] * saved_shards))
    assert_same_rows(sorted_rows(table), sorted_rows(reference))
    checkpoint = tf.train.Checkpoint(table=table)
    whole = checkpoint.write(str(tmp_path / "whole"))
    change(table)
    change(reference)
    with tfps.checkpoint.changes_only():
        delta = checkpoint.write(str(tmp_path / "delta"))
    assert len([f for f in table_files(str(tmp_path)) if f.startswith("delta")]) == saved_shards
    latest = sorted_rows(table)
    assert_same_rows(latest, sorted_rows(reference))
    restored = (tiered(tmp_path / "restored", restore_shards, memory_rows=32) if restore_tiered else
                ShardedTable(DIM, optimizer="adam", devices=["/cpu:0"] * restore_shards))
    restored.find_or_insert(np.array([77], np.int64))  # gone after the whole restore
    for path in (whole, delta):
        tf.train.Checkpoint(table=restored).read(path).assert_consumed()
    assert_same_rows(sorted_rows(restored), latest)
    if restore_tiered:
        assert restored.stats()["rows_in_memory"] <= 32


def test_retrieval_exports_of_a_tiered_table_read_rows_from_disk(tmp_path):
    table = trained_table(tiered(tmp_path / "tier", 3, optimizer="adagrad"))
    tfps.export.save_for_retrieval(table, str(tmp_path / "v1"))
    change(table)
    tfps.export.save_for_retrieval(table, str(tmp_path / "v2"), changes_only=True)
    keys, vectors = tfps.export.load_for_retrieval(str(tmp_path / "v1"), str(tmp_path / "v2"))
    expected = sorted_rows(table)
    np.testing.assert_array_equal(keys, expected["keys"])
    np.testing.assert_array_equal(vectors, expected["values"])
    assert table.stats()["payloads_read"] > 0


def test_a_tiered_model_serves_without_tfps_as_it_predicts(tmp_path):
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 3000, (2048, 6)).astype(np.int64)
    labels = (ids[:, 0] % 3 == 0).astype(np.float32)

    def model_of(storage):
        inputs = keras.Input((6,), dtype=tf.int64, name="ids")
        table = DynamicEmbedding(4, combiner="mean", seed=5, name="ids_table", storage=storage)
        model = keras.Model(inputs, keras.layers.Dense(1, activation="sigmoid",
                                                       kernel_initializer="ones")(table(inputs)))
        model.compile(optimizer="sgd", loss="binary_crossentropy")
        model.fit(ids, labels, batch_size=128, epochs=1, verbose=0, shuffle=False)
        return model

    model = model_of(tfps.storage.Tiered(str(tmp_path / "tier"), memory_rows=100))
    in_memory = model_of(None)
    stats = model.layers[1].table.stats()
    assert stats["rows_in_memory"] <= 100 < stats["rows"]
    test = rng.integers(0, 3500, (256, 6)).astype(np.int64)  # seen and unseen IDs
    expected = model.predict(test, verbose=0)
    np.testing.assert_array_equal(expected, in_memory.predict(test, verbose=0))
    report = tfps.export.save_for_serving(model, str(tmp_path / "export"))
    assert report["rows"]["ids_table"] == stats["rows"]
    np.testing.assert_allclose(serve_without_tfps(report["export_dir"], {"ids": test}, tmp_path), expected, atol=1e-6)
    # The layer's configuration round-trips with its storage.
    config = model.layers[1].get_config()
    assert config["storage"] == {"class_name": "Tiered", "config": {
        "path": str(tmp_path / "tier"), "memory_rows": 100, "memory_bytes": None, "cache_bytes": 32 << 20}}


def test_each_shard_has_a_directory_of_its_own_that_goes_with_its_table(tmp_path):
    directory = tmp_path / "tier"
    table = tiered(directory, 2, memory_rows=16)
    table.find_or_insert(np.arange(2000, dtype=np.int64))
    assert len(os.listdir(directory)) == 2
    other = tfps.DynamicTable(DIM, storage=tfps.storage.Tiered(str(directory), memory_rows=8))
    other.find_or_insert(np.arange(100, dtype=np.int64))
    assert len(os.listdir(directory)) == 3
    # Named after the table, so a job that starts again opens (and wipes) what a killed task
    # left; a second live table of one name takes the next free name.
    assert sorted(os.listdir(directory)) == ["dynamic_table", "table_shard0", "table_shard1"]
    again = tiered(directory, 1, memory_rows=16)
    again.find_or_insert(np.arange(100, dtype=np.int64))
    assert "table_shard0.1" in os.listdir(directory)
    del table, again
    gc.collect()
    assert os.listdir(directory) == ["dynamic_table"]
    left = directory / "table_shard0" / "rows"
    left.mkdir(parents=True)
    (left / "000009.sst").write_bytes(b"half written by a killed task")
    restarted = tiered(directory, 2, memory_rows=16)
    assert restarted.stats()["rows"] == 0 and not (left / "000009.sst").exists()


@pytest.mark.parametrize("arguments,message", [
    (dict(path="relative/dir", memory_rows=10), "path must be absolute"),
    (dict(path="/tmp/x"), "exactly one of memory_rows or memory_bytes"),
    (dict(path="/tmp/x", memory_rows=10, memory_bytes=100), "exactly one of memory_rows or memory_bytes"),
    (dict(path="/tmp/x", memory_rows=0), "memory_rows must be a positive int"),
    (dict(path="/tmp/x", memory_rows=10, cache_bytes=-1), "cache_bytes must be an int >= 0"),
])
def test_bad_tier_arguments_are_refused_naming_them(arguments, message):
    with pytest.raises(ValueError, match=message):
        tfps.storage.Tiered(**arguments)


def test_a_budget_smaller_than_the_shards_or_an_unusable_directory_is_refused(tmp_path):
    with pytest.raises(ValueError, match="fewer than the table's 3 shards"):
        tiered(tmp_path, 3, memory_rows=2)
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    with pytest.raises(tf.errors.FailedPreconditionError, match="cannot open its disk tier.*a_file"):
        tfps.DynamicTable(DIM, storage=tfps.storage.Tiered(str(blocker), memory_rows=8))


def test_memory_bytes_is_a_budget_of_payload_blocks(tmp_path):
    # Adagrad at dim 4: a value and a slot, 32 bytes, and a 16-byte block header.
    table = tfps.DynamicTable(DIM, optimizer="adagrad",
                              storage=tfps.storage.Tiered(str(tmp_path), memory_bytes=48 * 300))
    table.find_or_insert(np.arange(5000, dtype=np.int64))
    stats = table.stats()
    assert 0 < stats["rows_in_memory"] <= 300
    assert stats["payload_memory_bytes"] >= stats["rows_in_memory"] * 48
