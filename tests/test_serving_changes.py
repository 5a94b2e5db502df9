"""Exports of changes for serving (save_for_serving(..., changes_since=...)): each version
serves exactly what a whole export at that moment serves, without tfps, and costs the rows
that changed."""

import os

import numpy as np
import pytest
import tensorflow as tf
import tf_keras as keras

import tfps
from tfps.keras_layers import DynamicEmbedding
from tests.test_export import serve_without_tfps

DIM = 4


def row_model(num_shards=2, **layer_args):
    """A model whose output is the embedding itself: what it serves is the table's rows."""
    ids = keras.Input((), dtype=tf.int64, name="ids")
    layer = DynamicEmbedding(DIM, name="rows", optimizer=tfps.optimizers.Adagrad(0.5), **layer_args)
    # Shards on local devices, as a parameter server strategy would place them.
    layer.table = tfps.ShardedTable(DIM, devices=["/cpu:0"] * num_shards, name="rows",
                                    optimizer=layer.optimizer, initializer=layer.initializer, seed=layer.seed,
                                    admission=layer.admission, eviction=layer.eviction)
    model = keras.Model(ids, keras.layers.Lambda(lambda x: x, name="out")(layer(ids)))
    model.compile(optimizer="sgd", loss="mse")
    return model, layer


def train(model, ids, seed):
    ids = np.asarray(ids, np.int64)
    target = np.random.default_rng(seed).normal(size=(len(ids), DIM)).astype(np.float32)
    model.fit(ids, target, batch_size=64, epochs=1, verbose=0, shuffle=False)


def serve(export_dir, ids):
    out = tf.saved_model.load(export_dir).signatures["serving_default"](ids=tf.constant(ids, tf.int64))
    return out["out"].numpy()


def expected_rows(layer, ids, min_count=None):
    """What serving must give each ID, from the table itself: its row, or zeros."""
    exported = layer.table.export()
    rows = dict(zip(exported.keys.numpy().tolist(), exported.values.numpy()))
    counts = dict(zip(exported.keys.numpy().tolist(), exported.metadata.numpy()[:, 0]))
    zero = np.zeros(DIM, np.float32)
    return np.stack([rows[i] if i in rows and (min_count is None or counts[i] >= min_count) else zero
                     for i in np.asarray(ids).tolist()])


def test_versions_of_changes_serve_as_whole_exports_and_as_the_table(tmp_path):
    model, layer = row_model()
    rng = np.random.default_rng(0)
    train(model, rng.integers(0, 3000, 4000), 0)
    probe = np.concatenate([np.arange(-10, 6000), [1 << 40]]).astype(np.int64)
    previous = str(tmp_path / "v0")
    first = tfps.export.save_for_serving(model, previous)
    np.testing.assert_array_equal(serve(previous, probe), expected_rows(layer, probe))
    for version in range(1, 5):
        # Drifting IDs: some old ones trained again, new ones arrive, some are removed.
        train(model, rng.integers(1000 * version, 1000 * version + 1500, 600), version)
        gone = layer.table.export().keys.numpy()[rng.integers(0, 500, 40)]
        layer.table.remove(gone)
        directory = str(tmp_path / f"v{version}")
        report = tfps.export.save_for_serving(model, directory, changes_since=previous, max_layered_rows=4)
        whole = tfps.export.save_for_serving(model, str(tmp_path / f"whole{version}"))
        served = serve(directory, probe)
        np.testing.assert_array_equal(served, serve(whole["export_dir"], probe))
        np.testing.assert_array_equal(served, expected_rows(layer, probe))
        assert not served[np.isin(probe, gone)].any()
        assert report["whole_shards"] == {"rows": 0}
        assert 0 < report["rows"]["rows"] < whole["rows"]["rows"] and report["removed"]["rows"] > 0
        # The whole export in between started a chain of its own: the next version
        # still follows this one.
        previous = directory
    assert first["whole_shards"] == {"rows": 2}


def test_an_export_of_changes_loads_without_tfps(tmp_path):
    model, layer = row_model()
    train(model, np.arange(0, 2000), 0)
    base = tfps.export.save_for_serving(model, str(tmp_path / "1"))
    train(model, np.arange(1500, 2500), 1)
    layer.table.remove(np.arange(0, 100))
    changes = tfps.export.save_for_serving(model, str(tmp_path / "2"), changes_since=base["export_dir"])
    probe = np.arange(-5, 2600, dtype=np.int64)
    served = serve_without_tfps(changes["export_dir"], {"ids": probe}, tmp_path)
    np.testing.assert_array_equal(served, expected_rows(layer, probe))


def test_its_cost_follows_the_rows_changed_not_the_table(tmp_path):
    written = {}
    for rows in (5_000, 50_000):
        model, layer = row_model()
        train(model, np.arange(0, rows), 0)
        base = tfps.export.save_for_serving(model, str(tmp_path / f"{rows}_1"))
        train(model, np.arange(0, 100), 1)
        changes = tfps.export.save_for_serving(model, str(tmp_path / f"{rows}_2"),
                                               changes_since=base["export_dir"])
        assert changes["rows"]["rows"] == 100 and changes["bytes"] > base["bytes_written"]
        assert base["bytes"] == base["bytes_written"]  # the kept links to its rows count once
        written[rows] = base["bytes_written"], changes["bytes_written"]
    # Ten times the table: the whole export grows with it, the export of changes does not.
    assert written[50_000][0] > 4 * written[5_000][0], written
    assert written[50_000][1] < 1.2 * written[5_000][1], written


def test_min_count_and_float16_carry_over_and_a_row_falling_under_it_stops_serving(tmp_path):
    model, layer = row_model()
    train(model, np.repeat(np.arange(0, 300), 3), 0)  # 3 occurrences each
    base = tfps.export.save_for_serving(model, str(tmp_path / "1"), min_count=3, value_dtype="float16")
    train(model, np.concatenate([np.arange(300, 400), np.repeat(np.arange(400, 450), 3)]), 1)
    changes = tfps.export.save_for_serving(model, str(tmp_path / "2"), changes_since=base["export_dir"])
    whole = tfps.export.save_for_serving(model, str(tmp_path / "w"), min_count=3, value_dtype="float16")
    probe = np.arange(0, 460, dtype=np.int64)
    served = serve(changes["export_dir"], probe)
    np.testing.assert_array_equal(served, serve(whole["export_dir"], probe))
    np.testing.assert_allclose(served, expected_rows(layer, probe, min_count=3), atol=2e-3)
    assert not served[300:400].any() and served[400:450].any()
    with pytest.raises(ValueError, match="min_count=2 differs from the export it follows"):
        tfps.export.save_for_serving(model, str(tmp_path / "3"), changes_since=base["export_dir"], min_count=2)


def test_a_shard_that_cannot_tell_its_changes_is_written_whole(tmp_path):
    model, layer = row_model(num_shards=3)
    train(model, np.arange(0, 3000), 0)
    base = tfps.export.save_for_serving(model, str(tmp_path / "1"))
    layer.table.shards[1].clear()  # this shard's changes since the export are unknown
    train(model, np.arange(2500, 3500), 1)
    changes = tfps.export.save_for_serving(model, str(tmp_path / "2"), changes_since=base["export_dir"])
    assert changes["whole_shards"] == {"rows": 1}
    probe = np.arange(0, 3600, dtype=np.int64)
    np.testing.assert_array_equal(serve(changes["export_dir"], probe), expected_rows(layer, probe))
    # Following an export that is no longer the chain's last: whole, and still exact.
    train(model, np.arange(0, 10), 2)
    stale = tfps.export.save_for_serving(model, str(tmp_path / "3"), changes_since=base["export_dir"])
    assert stale["whole_shards"] == {"rows": 3}
    np.testing.assert_array_equal(serve(stale["export_dir"], probe), expected_rows(layer, probe))


def test_a_shard_with_max_change_layers_is_written_whole_again(tmp_path):
    model, layer = row_model(num_shards=1)
    train(model, np.arange(0, 500), 0)
    previous = tfps.export.save_for_serving(model, str(tmp_path / "0"))["export_dir"]
    kinds = []
    for version in range(1, 6):
        train(model, np.arange(version * 100, version * 100 + 50), version)
        report = tfps.export.save_for_serving(model, str(tmp_path / str(version)), changes_since=previous,
                                              max_change_layers=2)
        kinds.append(report["whole_shards"]["rows"])
        probe = np.arange(0, 700, dtype=np.int64)
        np.testing.assert_array_equal(serve(report["export_dir"], probe), expected_rows(layer, probe))
        previous = report["export_dir"]
    assert kinds == [0, 0, 1, 0, 0]


def test_checkpoints_and_retrieval_exports_in_between_take_no_changes_away(tmp_path):
    model, layer = row_model()
    train(model, np.arange(0, 1000), 0)
    base = tfps.export.save_for_serving(model, str(tmp_path / "1"))
    train(model, np.arange(900, 1200), 1)
    tf.train.Checkpoint(model=model).write(str(tmp_path / "ckpt" / "c"))
    tfps.export.save_for_retrieval(layer, str(tmp_path / "retrieval"))
    train(model, np.arange(0, 50), 2)
    changes = tfps.export.save_for_serving(model, str(tmp_path / "2"), changes_since=base["export_dir"])
    assert changes["whole_shards"] == {"rows": 0} and changes["rows"]["rows"] == 350
    probe = np.arange(0, 1300, dtype=np.int64)
    np.testing.assert_array_equal(serve(changes["export_dir"], probe), expected_rows(layer, probe))


def test_a_version_survives_the_deletion_of_the_versions_before(tmp_path):
    import shutil
    model, layer = row_model()
    train(model, np.arange(0, 1000), 0)
    base = tfps.export.save_for_serving(model, str(tmp_path / "1"))
    train(model, np.arange(500, 1500), 1)
    changes = tfps.export.save_for_serving(model, str(tmp_path / "2"), changes_since=base["export_dir"])
    shutil.rmtree(base["export_dir"])
    train(model, np.arange(1400, 1600), 2)
    third = tfps.export.save_for_serving(model, str(tmp_path / "3"), changes_since=changes["export_dir"])
    shutil.rmtree(changes["export_dir"])
    probe = np.arange(0, 1700, dtype=np.int64)
    np.testing.assert_array_equal(serve(third["export_dir"], probe), expected_rows(layer, probe))


def test_bad_exports_of_changes_fail_clearly_and_write_nothing(tmp_path):
    model, layer = row_model()
    train(model, np.arange(0, 100), 0)
    base = tfps.export.save_for_serving(model, str(tmp_path / "1"), chain="ab")
    other, _ = row_model(num_shards=3)
    (tmp_path / "not_an_export").mkdir()
    cases = [
        (dict(changes_since=str(tmp_path / "missing")), "missing does not exist"),
        (dict(changes_since=str(tmp_path / "not_an_export")), "not a serving export that keeps its rows"),
        (dict(changes_since=base["export_dir"], chain="cd"), "is on chain 'ab', not 'cd'"),
        (dict(changes_since=base["export_dir"], value_dtype="float16"), "value_dtype=float16 differs"),
        (dict(changes_since=base["export_dir"], max_change_layers=0), "max_change_layers"),
        (dict(chain=""), "chain must be a non-empty string"),
    ]
    for args, message in cases:
        with pytest.raises(ValueError, match=message):
            tfps.export.save_for_serving(model, str(tmp_path / "bad"), **args)
    with pytest.raises(ValueError, match="are not those of the export it follows"):
        tfps.export.save_for_serving(other, str(tmp_path / "bad"), changes_since=base["export_dir"])
    assert sorted(os.listdir(tmp_path)) == ["1", "not_an_export"]


def test_a_shard_whose_layers_would_outgrow_its_rows_is_written_whole_again(tmp_path):
    model, layer = row_model(num_shards=1)
    train(model, np.arange(0, 1000), 0)
    previous = tfps.export.save_for_serving(model, str(tmp_path / "0"))["export_dir"]
    wholes = []
    for version in range(1, 5):
        train(model, np.arange(0, 300), version)  # the same 30% of the rows each time
        report = tfps.export.save_for_serving(model, str(tmp_path / str(version)), changes_since=previous,
                                              max_layered_rows=1.5)
        wholes.append(report["whole_shards"]["rows"])
        probe = np.arange(0, 1100, dtype=np.int64)
        np.testing.assert_array_equal(serve(report["export_dir"], probe), expected_rows(layer, probe))
        previous = report["export_dir"]
    # 1000 + 300 rows are within 1.5 times the table's 1000; a second layer of 300 is not.
    assert wholes == [0, 1, 0, 1]


def test_serving_exports_in_between_take_no_changes_from_a_checkpoint_chain(tmp_path):
    model, layer = row_model()
    train(model, np.arange(0, 1000), 0)
    checkpoint = tf.train.Checkpoint(table=layer.table)
    with tfps.checkpoint.chain("backups"):
        paths = [checkpoint.write(str(tmp_path / "ckpt" / "whole"))]
        train(model, np.arange(800, 1300), 1)
        base = tfps.export.save_for_serving(model, str(tmp_path / "1"))
        layer.table.remove(np.arange(0, 20))
        train(model, np.arange(1200, 1400), 2)
        tfps.export.save_for_serving(model, str(tmp_path / "2"), changes_since=base["export_dir"])
        with tfps.checkpoint.changes_only():
            paths.append(checkpoint.write(str(tmp_path / "ckpt" / "changes")))
    restored = tfps.ShardedTable(DIM, optimizer=tfps.optimizers.Adagrad(0.5), devices=["/cpu:0"] * 2)
    for path in paths:
        tf.train.Checkpoint(table=restored).read(path).assert_consumed()
    expected, got = layer.table.export(), restored.export()
    order_expected, order_got = np.argsort(expected.keys.numpy()), np.argsort(got.keys.numpy())
    np.testing.assert_array_equal(got.keys.numpy()[order_got], expected.keys.numpy()[order_expected])
    np.testing.assert_array_equal(got.values.numpy()[order_got], expected.values.numpy()[order_expected])
    np.testing.assert_array_equal(got.slots.numpy()[order_got], expected.slots.numpy()[order_expected])


def test_rows_evicted_by_ttl_stop_being_served(tmp_path):
    model, layer = row_model(eviction=tfps.eviction.TTL(steps=5))
    train(model, np.arange(0, 640), 0)  # 10 steps
    base = tfps.export.save_for_serving(model, str(tmp_path / "1"))
    old = layer.table.export().keys.numpy()
    train(model, np.arange(1000, 1640), 1)  # 10 more steps of other IDs: the old ones expire
    evicted = np.setdiff1d(old, layer.table.export().keys.numpy())
    assert len(evicted) > 300
    changes = tfps.export.save_for_serving(model, str(tmp_path / "2"), changes_since=base["export_dir"],
                                           max_layered_rows=4)
    assert changes["whole_shards"] == {"rows": 0} and changes["removed"]["rows"] >= len(evicted)
    probe = np.arange(0, 1700, dtype=np.int64)
    served = serve(changes["export_dir"], probe)
    np.testing.assert_array_equal(served, expected_rows(layer, probe))
    assert not served[np.isin(probe, evicted)].any() and serve(base["export_dir"], evicted).any()
