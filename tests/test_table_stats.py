"""Table statistics: table.stats() and the TableStats callback's fit logs and TensorBoard
scalars, against the table's own contents."""

import glob

import numpy as np
import pytest
import tensorflow as tf
import tf_keras as keras

import tfps
from tests.cluster_run import run_cluster_program


def test_stats_count_rows_and_memory_per_shard_and_in_total():
    table = tfps.ShardedTable(4, devices=["/CPU:0", "/CPU:0"], name="stats")
    table.find_or_insert(tf.constant(np.arange(1000), tf.int64))
    table.apply_gradients(tf.constant(np.arange(10), tf.int64), tf.ones([10, 4]), step=-1)
    stats = table.stats()
    assert [s["rows"] for s in stats["shards"]] == table.shard_sizes() and stats["rows"] == 1000
    assert stats["memory_bytes"] == sum(s["memory_bytes"] for s in stats["shards"])
    # At least the rows' bytes are mapped: key, count, step, value and Adagrad's slot.
    assert stats["row_memory_bytes"] >= 1000 * (8 + 8 + 2 * 4 * 4)
    assert stats["memory_bytes"] > stats["row_memory_bytes"]
    assert stats["clock"] == max(s["clock"] for s in stats["shards"]) >= 1


def test_memory_of_a_small_table_counts_its_row_blocks_not_whole_mapped_regions():
    # Rows come from large mappings whose untouched pages cost nothing; many small tables
    # must not each report a whole mapping (32 MiB) as their memory.
    table = tfps.DynamicTable(8, optimizer="adagrad")
    table.apply_gradients(tf.range(50, dtype=tf.int64), tf.ones([50, 8]))
    stats = table.stats()
    assert 50 * (8 + 8 + 2 * 8 * 4) <= stats["row_memory_bytes"] < stats["memory_bytes"] < (1 << 20), stats


def _scalars(log_dir):
    """{tag: [(step, value), ...]} from the TensorBoard event files under log_dir."""
    found = {}
    for path in sorted(glob.glob(f"{log_dir}/events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                found.setdefault(value.tag, []).append((event.step, float(tf.make_ndarray(value.tensor))))
    return found


SUMMARIES = [  # steps_per_execution, every_n_steps, {step: rows} for 10 new IDs per step
    (1, 5, {5: 50, 10: 100, 15: 150, 20: 200, 25: 250, 30: 300, 35: 350, 40: 400}),
    # Blocks of 10 steps: a summary at each block end that reaches a multiple of 5 or 15.
    (10, 5, {10: 100, 20: 200, 30: 300, 40: 400}),
    (10, 15, {20: 200, 30: 300, 40: 400})]


@pytest.mark.parametrize("steps_per_execution,every,expected", SUMMARIES)
def test_table_stats_callback_logs_rows_into_history_and_tensorboard(tmp_path, steps_per_execution, every,
                                                                     expected):
    import tensorboard  # noqa: F401  (installed by scripts/install.sh; summaries need it)
    ids = keras.Input((), dtype=tf.int64)
    layer = tfps.keras_layers.DynamicEmbedding(4, name="users")
    model = keras.Model(ids, keras.layers.Dense(1)(layer(ids)))
    model.compile("sgd", "mse", steps_per_execution=steps_per_execution)
    x = np.arange(200, dtype=np.int64)  # 20 steps of 10 new IDs each, then the same again
    callback = tfps.callbacks.TableStats(log_dir=str(tmp_path), every_n_steps=every)
    history = model.fit(np.concatenate([x, x + 200]), np.zeros(400, np.float32), batch_size=10,
                        shuffle=False, epochs=2, steps_per_epoch=20, verbose=0, callbacks=[callback]).history
    assert history["users/rows"] == [200, 400]
    assert history["users/memory_mib"][1] * (1 << 20) == layer.table.stats()["memory_bytes"]
    # Each step once: an epoch end on a multiple of every_n_steps writes no second point.
    assert _scalars(tmp_path)["users/rows"] == sorted(expected.items())


def test_table_stats_callback_under_parameter_server_strategy_writes_each_steps_rows():
    import tensorboard  # noqa: F401
    out = run_cluster_program("table_stats_pss.py", *(f"{spe},{every}" for spe, every, _ in SUMMARIES))
    for (steps_per_execution, every, expected), result in zip(SUMMARIES, out["results"]):
        assert (result["steps_per_execution"], result["every"]) == (steps_per_execution, every)
        assert result["history_rows"] == [200, 400]
        # The rows as of the summary's step: the steps scheduled before it have all run.
        assert [(step, rows) for step, rows in result["summaries"]] == sorted(expected.items())  # each once


def test_table_stats_arguments_are_checked():
    with pytest.raises(ValueError, match="every_n_steps writes TensorBoard summaries; give log_dir"):
        tfps.callbacks.TableStats(every_n_steps=10)
    with pytest.raises(ValueError, match="every_n_steps"):
        tfps.callbacks.TableStats(log_dir="/tmp/x", every_n_steps=0)


def test_table_stats_writes_a_new_fits_summaries_though_its_optimizer_starts_over(tmp_path):
    import tensorboard  # noqa: F401
    ids = keras.Input((), dtype=tf.int64)
    layer = tfps.keras_layers.DynamicEmbedding(4, name="users")
    model = keras.Model(ids, keras.layers.Dense(1)(layer(ids)))
    callback = tfps.callbacks.TableStats(log_dir=str(tmp_path), every_n_steps=20)
    for first in (0, 200):  # a new optimizer each time: both fits end at its step 20
        model.compile("sgd", "mse")
        model.fit(np.arange(first, first + 200, dtype=np.int64), np.zeros(200, np.float32), batch_size=10,
                  shuffle=False, epochs=1, verbose=0, callbacks=[callback])
    assert _scalars(tmp_path)["users/rows"] == [(20, 200.0), (20, 400.0)]
