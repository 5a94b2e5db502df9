"""Chains of checkpoints of changes that interleave with other savers: each chain's next
save of changes holds exactly the changes since that chain's own last save."""

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import tfps
from tests.cluster_run import ROOT, run_cluster_program
from tests.save_chains_check import check_interleaved_savers, make_table
from tests.table_rows import assert_same_rows, sorted_rows


def test_three_savers_in_every_order_each_restore_their_last_save(tmp_path):
    result = check_interleaved_savers(lambda: make_table(tfps.DynamicTable), str(tmp_path))
    assert result["mismatches"] == []
    assert result["restores"] == 18 and result["saves_of_changes"] == 8


def test_three_savers_in_every_order_under_parameter_server_strategy(tmp_path):
    result = run_cluster_program("pss_save_chains.py", str(tmp_path))
    assert result["mismatches"] == []
    assert result["restores"] == 18 and result["saves_of_changes"] == 8 and result["shards"] == 2


def trained(table):
    keys = np.arange(500, dtype=np.int64) * 7919
    table.find_or_insert(keys)
    table.apply_gradients(keys, np.full((500, 4), 0.1, np.float32), step=-1)
    return table, keys


@pytest.mark.parametrize("other", ["checkpoint", "checkpoint_manager", "save_weights_style"])
def test_a_whole_save_elsewhere_between_two_backups_leaves_the_chain_intact(tmp_path, other):
    # The smallest form of the failure: a backup chain, then any other save, then changes.
    table, keys = trained(tfps.DynamicTable(4))
    checkpoint = tf.train.Checkpoint(t=table)
    writer = tfps.checkpoint.TracedWriter(checkpoint)
    chain = [writer.write(str(tmp_path / "backup" / "ckpt-1"))]
    table.apply_gradients(keys[:50], np.full((50, 4), 0.5, np.float32), step=-1)
    if other == "checkpoint":
        tf.train.Checkpoint(t=table).write(str(tmp_path / "epochs" / "epoch-1"))
    elif other == "checkpoint_manager":
        tf.train.CheckpointManager(tf.train.Checkpoint(t=table), str(tmp_path / "m"), 2).save()
    else:
        with tfps.checkpoint.changes_only():  # a chain of its own, in its own directory
            tf.train.Checkpoint(t=table).write(str(tmp_path / "other" / "w"))
    table.remove(keys[100:110])
    chain.append(writer.write(str(tmp_path / "backup" / "ckpt-2"), changes_only=True))
    # The backup of changes holds the 50 rows changed since the chain's whole backup (and
    # the 10 keys removed), not only what changed since the other save.
    assert int(tf.train.load_checkpoint(chain[1]).get_tensor("t/rows")[0]) == 50
    restored = tfps.DynamicTable(4)
    for path in chain:
        tf.train.Checkpoint(t=restored).read(path)
    assert_same_rows(sorted_rows(restored), sorted_rows(table))


def test_two_named_chains_in_one_directory_stay_apart(tmp_path):
    table, keys = trained(tfps.DynamicTable(4))
    checkpoint = tf.train.Checkpoint(t=table)
    paths = {"a": [], "b": []}
    for name in ("a", "b"):
        with tfps.checkpoint.chain(name):
            paths[name].append(checkpoint.write(str(tmp_path / f"{name}-0")))
    table.apply_gradients(keys[:20], np.ones((20, 4), np.float32), step=-1)
    with tfps.checkpoint.changes_only(chain="a"):
        paths["a"].append(checkpoint.write(str(tmp_path / "a-1")))
    expected_a = sorted_rows(table)
    table.apply_gradients(keys[20:30], np.ones((10, 4), np.float32), step=-1)
    with tfps.checkpoint.changes_only(chain="b"):  # holds all 30 changes since b's save
        paths["b"].append(checkpoint.write(str(tmp_path / "b-1")))
    assert int(tf.train.load_checkpoint(paths["b"][1]).get_tensor("t/rows")[0]) == 30
    for name, expected in (("a", expected_a), ("b", sorted_rows(table))):
        restored = tfps.DynamicTable(4)
        for path in paths[name]:
            tf.train.Checkpoint(t=restored).read(path)
        assert_same_rows(sorted_rows(restored), expected)


def test_a_failed_save_changes_no_chain(tmp_path):
    table, keys = trained(tfps.DynamicTable(4))
    checkpoint = tf.train.Checkpoint(t=table)
    chain = [checkpoint.write(str(tmp_path / "ckpt-0"))]
    table.apply_gradients(keys[:20], np.ones((20, 4), np.float32), step=-1)
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the save wants a directory")
    with pytest.raises(tf.errors.OpError):
        with tfps.checkpoint.changes_only(chain=str(tmp_path)):
            checkpoint.write(str(blocked / "ckpt-1"))
    with tfps.checkpoint.changes_only():
        chain.append(checkpoint.write(str(tmp_path / "ckpt-2")))
    assert int(tf.train.load_checkpoint(chain[1]).get_tensor("t/rows")[0]) == 20
    restored = tfps.DynamicTable(4)
    for path in chain:
        tf.train.Checkpoint(t=restored).read(path)
    assert_same_rows(sorted_rows(restored), sorted_rows(table))


@pytest.mark.parametrize("name", ["", 7])
def test_a_chain_name_that_is_not_a_non_empty_string_is_refused(name):
    with pytest.raises(ValueError, match="must be a non-empty string"):
        with tfps.checkpoint.chain(name):
            pass
    with pytest.raises(ValueError, match="must be a non-empty string"):
        with tfps.checkpoint.changes_only(chain=name):
            pass


def test_tasks_that_see_different_storage_fail_the_save_and_restore_naming_task_and_path(tmp_path):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=ROOT)
    program = os.path.join(ROOT, "tests", "cluster_programs", "unshared_storage.py")
    run = subprocess.run([sys.executable, "-m", "tfps.launch", "--num_ps", "2", "--num_workers", "1",
                          "--max_restarts", "0", "--log_dir", str(tmp_path / "logs"), program, str(tmp_path)],
                         capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["save_kind"] == "FailedPreconditionError"
    assert re.search(r"tfps checkpoint file 'relative/ckpt-tfps.DynamicTable.t0.shard-0000[01]-of-00002', "
                     r"which /job:ps/replica:0/task:[01]/device:CPU:0 wrote, is not visible on "
                     r"/job:chief/.*every task must reach the checkpoint location", out["save_message"])
    assert not out["manifest_written"]
    assert out["rows_after_failed_save"] == 1000  # no chain recorded: the next save is whole
    assert out["restore_kind"] == "NotFoundError"
    assert re.search(r"copy/ckpt-tfps.DynamicTable.t0.shard-0000[01]-of-00002' cannot be read.*"
                     r"on /job:ps/replica:0/task:[01]/device:CPU:0; every task must reach", out["restore_message"])
    assert out["restored_rows"] == 0


def states_passed_through(optimizer, gradients, updates):
    """[updates + 1, keys, 1 + slots, dim]: each row's value and slots after 0 .. updates
    applications of its constant gradient, from a zero row (float64, tests/reference.py)."""
    from tests.reference import RowOptimizer
    rows = np.zeros(gradients.shape)[:, None, :]
    reference = RowOptimizer(optimizer, gradients.shape[1], 0.01)
    slots = np.repeat(reference.initial_slots()[None], len(gradients), axis=0)
    states = [np.concatenate([rows, slots], axis=1)]
    value = rows[:, 0]
    for step in range(1, updates + 1):
        value, slots = reference.apply(value, np.moveaxis(slots, 1, 0), gradients, step)
        slots = np.moveaxis(np.asarray(slots), 0, 1)
        states.append(np.concatenate([value[:, None], slots], axis=1))
    return np.stack(states)


def test_a_save_while_two_workers_apply_updates_holds_states_each_row_passed_through(tmp_path):
    from tests.cluster_programs import pss_save_during_training as program
    out = run_cluster_program("pss_save_during_training.py", str(tmp_path))
    keys = np.arange(out["keys"], dtype=np.int64) * 7919
    gradients = program.gradient(keys).astype(np.float64)
    mid_training = 0
    for optimizer in ("sgd", "adam"):
        states = states_passed_through(optimizer, gradients, out["updates"])
        for path in out["saves"]:
            tables = program.make_tables()
            tf.train.Checkpoint(**tables).read(path).assert_consumed()
            rows = sorted_rows(tables[optimizer])
            # A key not yet updated has no row (a save before its first update).
            present = np.isin(keys, rows["keys"])
            assert present.sum() == len(rows["keys"]), "a key the workers never updated"
            if not present.any():
                assert not path.endswith("after")
                continue
            saved = np.concatenate([rows["values"][:, None], rows["slots"].reshape(present.sum(), -1, out["dim"])], 1)
            if optimizer == "adam":  # the row's updates so far: its optimizer step
                count = rows["metadata"][:, 2].astype(np.int64)
            else:  # SGD keeps no step: the updates that its first element took
                count = np.rint(-rows["values"][:, 0] / (0.01 * gradients[present, 0])).astype(np.int64)
            assert ((count >= 1) & (count <= out["updates"])).all()
            # Each row (value and every slot, every element) is its state after `count`
            # updates: nearer to it than a quarter of the way to the state one update away.
            rows_of = np.nonzero(present)[0]
            expected, before = states[count, rows_of], states[count - 1, rows_of]
            step = np.abs(expected - before)
            changing = step > 1e-6 * np.abs(expected) + 1e-12  # Adam's m stops moving in float32
            assert (np.abs(saved - expected)[changing] < 0.25 * step[changing]).all(), (optimizer, path)
            assert np.allclose(saved, expected, rtol=1e-4, atol=1e-6), (optimizer, path)
            if path.endswith("after"):
                assert present.all() and (count == out["updates"]).all()
            elif present.any() and count.min() < out["updates"]:
                mid_training += 1
    assert mid_training >= 2  # at least one save per table landed while updates ran
