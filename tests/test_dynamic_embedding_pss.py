"""DynamicEmbedding under ParameterServerStrategy model.fit (in-process clusters, one per
process)."""

import numpy as np
import pytest

import tfps
from tests.cluster_run import run_cluster_program


def test_two_workers_two_ps_learn_an_id_only_task_with_keys_on_both_shards():
    out = run_cluster_program("pss_train.py")
    assert out["table_devices"] == ["/job:ps/replica:0/task:0/device:CPU:0",
                                    "/job:ps/replica:0/task:1/device:CPU:0"]
    assert min(out["shard_sizes"]) > 0.3 * sum(out["shard_sizes"])
    assert out["evaluation"]["auc"] >= 0.75
    assert out["history"]["loss"][-1] < out["history"]["loss"][0]
    # A worker cache's copies stand for rows both workers move (tests/test_worker_cache.py).
    assert out["cache_copy_rate_scale"] == 2
    assert "GradientAccumulator: under a ParameterServerStrategy of 2 workers" in out["accumulator_refusal"]


def test_no_update_of_either_worker_is_lost_even_on_rows_both_update():
    out = run_cluster_program("pss_no_lost_updates.py")
    keys = np.array(out["keys"], np.int64)
    counts = np.array(out["counts"])
    values = np.array(out["values"], np.float32)
    # Every step of either worker updated each hot row once.
    hot = keys < 0
    np.testing.assert_array_equal(np.sort(keys[hot]), -np.arange(out["hot"], 0, -1))
    np.testing.assert_array_equal(counts[hot], out["steps"])
    # Each worker walked its own range tag * 2^20 + j: both ranges are there, complete.
    tags = keys[~hot] >> 20
    assert len(np.unique(tags)) == 2
    for tag in np.unique(tags):
        offsets = np.sort(keys[~hot][tags == tag] - (tag << 20))
        np.testing.assert_array_equal(offsets, np.arange(len(offsets)))
    assert counts.min() >= 1
    assert counts.sum() == out["steps"] * out["batch"]
    assert min(out["shard_sizes"]) > 0
    # Every key holds exactly its own updates: initial - lr * count / batch per element.
    reference = tfps.DynamicTable(out["dim"], seed=out["seed"])
    initial = reference.find(keys).numpy()
    expected = initial - (out["learning_rate"] / out["batch"]) * counts[:, None]
    np.testing.assert_allclose(values, expected, atol=1e-6)


def test_checkpoint_restores_into_a_cluster_with_more_ps_tasks(tmp_path):
    saved = run_cluster_program("pss_checkpoint.py", "save", str(tmp_path))
    assert len(saved["shard_sizes"]) == 2 and min(saved["shard_sizes"]) > 0
    restored = run_cluster_program("pss_checkpoint.py", "restore", str(tmp_path))
    assert len(restored["shard_sizes"]) == 3 and min(restored["shard_sizes"]) > 0
    assert restored["num_keys"] == sum(saved["shard_sizes"])
    assert restored["keys_equal"] and restored["values_equal"]
    assert restored["slots_equal"] and restored["metadata_equal"]


def test_backup_and_restore_resumes_with_the_backed_up_tables(tmp_path):
    out = run_cluster_program("pss_checkpoint.py", "backup", str(tmp_path))
    assert out["step_backup_refusal"] is not None and out["refused_untrained"]
    assert ("BackupAndRestore(save_freq=5) never backs up under ParameterServerStrategy" in out["step_backup_refusal"]
            and "tfps.callbacks.IncrementalBackup(backup_dir, save_freq=5)" in out["step_backup_refusal"])
    assert not (tmp_path / "every_5_steps").exists()
    assert out["num_keys"] > 0 and min(out["shard_sizes"]) > 0
    assert out["keys_equal"] and out["values_equal"] and out["slots_equal"] and out["metadata_equal"]


@pytest.mark.parametrize("optimizer,steps_per_execution",
                         [("legacy-adagrad", 1), ("legacy-adagrad", 10), ("sgd", 1), ("sgd", 10),
                          ("legacy-rmsprop", 10)])
def test_sharded_table_under_pss_trains_exactly_like_a_stock_embedding_and_updates_along_its_lookup(
        optimizer, steps_per_execution):
    out = run_cluster_program("pss_matches_stock_embedding.py", optimizer, str(steps_per_execution))
    assert out["table_shards"] == 2
    initial, ours, stock = (np.array(out[k]) for k in ("initial", "tfps_rows", "stock_rows"))
    assert np.abs(ours - initial).max() > 1e-3  # the rows really trained
    np.testing.assert_allclose(ours, stock, rtol=0, atol=1e-6)
    np.testing.assert_allclose(out["tfps_kernel"], out["stock_kernel"], rtol=0, atol=1e-6)
    # The update sends each PS the very tensor of keys its lookup sent (the runtime then
    # transfers it once), not keys partitioned again.
    sent = out["keys_sent_by_device"]
    assert sorted(sent) == [f"/job:ps/replica:0/task:{i}/device:CPU:0" for i in range(2)]
    for ops in sent.values():
        assert len(ops["Tfps>TableFindOrInsert"]) == 1
        assert ops["Tfps>TableApplyGradients"] == ops["Tfps>TableFindOrInsert"]
