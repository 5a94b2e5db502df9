"""Admission, eviction and the row cap, through the layer and the table API: rows against a
NumPy oracle of training under MinCount in every execution mode, under mixed precision and
under tfps-launch (parameter servers in processes of their own), Probability admission
against a reference of its per-occurrence draw, TTL and DecayedFrequency against the clock,
caps split over shards, statistics, the state in checkpoints, and running out of memory."""

import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
import tf_keras as keras

import tfps
from tests import reference
from tests.test_sparse_updates import (BATCH, DIM, FIELDS, KERAS_SGD, MODES, STEPS, VOCAB, build_model,
                                       numpy_oracle, train)
from tfps.table.sharded_table import ShardedTable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MIN_COUNT = 15


def skewed_data(seed=7):
    """IDs drawn with weight 1 / (rank + 1): some reach MIN_COUNT in the first batch, some
    late, some never."""
    rng = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, len(VOCAB) + 1)
    ids = rng.choice(VOCAB, size=(STEPS, BATCH, FIELDS), p=weights / weights.sum())
    return ids, rng.normal(size=(STEPS, BATCH)).astype(np.float32)


def phased_data():
    """The first half of the batches hold the first half of VOCAB, the second the rest."""
    rng = np.random.default_rng(3)
    half = STEPS // 2
    ids = np.concatenate([rng.choice(VOCAB[:6], size=(half, BATCH, FIELDS)),
                          rng.choice(VOCAB[6:], size=(STEPS - half, BATCH, FIELDS))])
    return ids, rng.normal(size=(STEPS, BATCH)).astype(np.float32)


def sorted_export(table):
    rows = table.export()
    order = np.argsort(rows.keys.numpy())
    return {"keys": rows.keys.numpy()[order], "values": rows.values.numpy()[order],
            "slots": rows.slots.numpy()[order], "metadata": rows.metadata.numpy()[order],
            "scores": rows.scores.numpy()[order]}


def last_batch(ids, key):
    """The table's clock at the apply of the last batch that holds `key`."""
    return 1 + max(i for i, batch in enumerate(ids) if key in batch)


@pytest.mark.parametrize("mode", MODES)
def test_min_count_gives_an_id_its_row_at_its_nth_occurrence_in_every_mode(mode):
    ids, labels = skewed_data()
    model, layer, head = build_model("adagrad", admission=tfps.admission.MinCount(MIN_COUNT, sketch_bytes=0))
    kernel0 = head.kernel.numpy()[:, 0].copy()
    train(mode, model, KERAS_SGD["current"](), ids, labels)
    rows, slots, _, kernel = numpy_oracle("adagrad", ids, labels, kernel0, 0.0, layer.seed,
                                          min_count=MIN_COUNT)
    totals = {int(k): int((ids == k).sum()) for k in VOCAB}
    assert 0 < len(rows) < len(VOCAB)  # the data leaves some IDs out: the test can tell
    got = sorted_export(layer.table)
    assert got["keys"].tolist() == sorted(rows)
    np.testing.assert_allclose(got["values"], np.stack([rows[k] for k in sorted(rows)]), rtol=2e-4, atol=2e-6)
    np.testing.assert_allclose(got["slots"], np.stack([slots[k] for k in sorted(rows)]), rtol=2e-4, atol=2e-6)
    # A row's count holds every occurrence, those before its admission too.
    np.testing.assert_array_equal(got["metadata"][:, 0], [totals[k] for k in sorted(rows)])
    np.testing.assert_array_equal(got["metadata"][:, 1], [last_batch(ids, k) for k in sorted(rows)])
    np.testing.assert_allclose(head.kernel.numpy()[:, 0], kernel, rtol=2e-4, atol=2e-6)
    stats = layer.table.stats()
    never = [k for k in totals if k not in rows]
    assert stats["admitted"] == len(rows) and stats["pending"] == len(never)
    # Rejected: the occurrences looked up in the batches before a key's admitting one.
    rejected, seen = 0, dict.fromkeys(totals, 0)
    for batch in ids:
        for k in totals:
            n = int((batch == k).sum())
            seen[k] += n
            rejected += n if seen[k] < MIN_COUNT else 0
    assert stats["rejected"] == rejected


def test_min_count_under_mixed_precision_admits_the_oracles_ids_and_trains_their_rows():
    ids, labels = skewed_data()
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model, layer, head = build_model("adagrad", admission=tfps.admission.MinCount(MIN_COUNT, sketch_bytes=0))
        kernel0 = head.kernel.numpy()[:, 0].astype(np.float32)
        # A fixed loss scale: a dynamic one skips the first steps (their scaled gradients
        # overflow float16), which the oracle does not.
        optimizer = keras.mixed_precision.LossScaleOptimizer(KERAS_SGD["current"](), dynamic=False,
                                                             initial_scale=256)
        train("fit", model, optimizer, ids, labels)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    rows, slots, _, kernel = numpy_oracle("adagrad", ids, labels, kernel0, 0.0, layer.seed, min_count=MIN_COUNT)
    got = sorted_export(layer.table)
    assert 0 < len(rows) < len(VOCAB) and got["keys"].tolist() == sorted(rows)
    np.testing.assert_array_equal(got["metadata"][:, 0], [int((ids == k).sum()) for k in sorted(rows)])
    # float16 activations round the gradients: close to the float64 oracle, not equal.
    expected, expected_slots = (np.stack([d[k] for k in sorted(rows)]) for d in (rows, slots))
    np.testing.assert_allclose(got["values"], expected, rtol=0, atol=2e-3 * np.abs(expected).max())
    np.testing.assert_allclose(got["slots"], expected_slots, rtol=0, atol=1e-3 * np.abs(expected_slots).max())
    np.testing.assert_allclose(head.kernel.numpy()[:, 0], kernel, rtol=0, atol=1e-3)


def test_min_count_under_tfps_launch_gives_the_oracles_rows(tmp_path):
    """Chief, worker and parameter servers in processes of their own: the admission counts
    and decisions happen on the parameter servers, as in production."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=ROOT)
    out = subprocess.run(
        [sys.executable, "-m", "tfps.launch", "--num_ps", "2", "--num_workers", "1",
         "--log_dir", str(tmp_path / "logs"), os.path.join(ROOT, "tests", "cluster_programs", "launch_admission.py"),
         str(tmp_path)], capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert out.returncode == 0, out.stderr[-4000:]
    got = np.load(tmp_path / "result.npz")
    assert int(got["shards"]) == 2
    ids, labels = skewed_data()
    rows, slots, _, kernel = numpy_oracle("adagrad", ids, labels, got["kernel0"], 0.0, int(got["seed"]),
                                          min_count=MIN_COUNT)
    assert 0 < len(rows) < len(VOCAB) and got["keys"].tolist() == sorted(rows)
    np.testing.assert_allclose(got["values"], np.stack([rows[k] for k in sorted(rows)]), rtol=2e-4, atol=2e-6)
    np.testing.assert_allclose(got["slots"], np.stack([slots[k] for k in sorted(rows)]), rtol=2e-4, atol=2e-6)
    np.testing.assert_array_equal(got["metadata"][:, 0], [int((ids == k).sum()) for k in sorted(rows)])
    np.testing.assert_array_equal(got["metadata"][:, 1], [last_batch(ids, k) for k in sorted(rows)])
    np.testing.assert_allclose(got["kernel"], kernel, rtol=2e-4, atol=2e-6)


def test_an_id_not_yet_admitted_reads_as_unseen_says():
    for unseen in ("zeros", "initial"):
        layer = tfps.keras_layers.DynamicEmbedding(DIM, seed=5, unseen=unseen,
                                                   admission=tfps.admission.MinCount(2, sketch_bytes=0))
        first = layer(tf.constant([7, 8, 8], tf.int64), training=True).numpy()
        initial = [reference.initial_row(k, DIM, 5, "uniform", -0.05, 0.05) for k in (7, 8, 8)]
        expected = np.zeros_like(first) if unseen == "zeros" else np.stack(initial)
        np.testing.assert_array_equal(first[0], expected[0])  # one occurrence: pending
        np.testing.assert_array_equal(first[1:], np.stack(initial[1:]))  # two: admitted
        assert layer.table.export().keys.numpy().tolist() == [8]


def draws_admission(seed, key, index, p):
    """The per-occurrence draw of Probability admission, from its definition."""
    bits = reference.random_bits((seed ^ 0x61646D6974) & ((1 << 64) - 1), key & ((1 << 64) - 1), index)
    return (bits >> 11) * 2.0 ** -53 < p


@pytest.mark.parametrize("batch_size", [8, 24])
def test_probability_admission_follows_each_occurrences_draw_whatever_the_batching(batch_size):
    ids, labels = skewed_data(seed=11)
    model, layer, _ = build_model("sgd", admission=tfps.admission.Probability(0.05, sketch_bytes=0))
    model.compile(optimizer=KERAS_SGD["current"](), loss="mse")
    model.fit(ids.reshape(-1, FIELDS), labels.reshape(-1), batch_size=batch_size, shuffle=False, verbose=0)
    totals = {int(k): int((ids == k).sum()) for k in VOCAB}
    expected = sorted(k for k, n in totals.items() if any(draws_admission(layer.seed, k, i, 0.05) for i in range(n)))
    assert 0 < len(expected) < len(VOCAB)
    assert sorted(layer.table.export().keys.numpy().tolist()) == expected


def test_ttl_removes_the_ids_unseen_for_longer_than_its_steps():
    ids, labels = phased_data()
    model, layer, _ = build_model("sgd", eviction=tfps.eviction.TTL(steps=3))
    train("fit_spe10", model, KERAS_SGD["current"](), ids, labels)
    layer.table.evict()
    got = sorted_export(layer.table)
    keep = sorted(int(k) for k in VOCAB if (ids == k).any() and STEPS - last_batch(ids, int(k)) <= 3)
    assert got["keys"].tolist() == keep and len(keep) < len(set(ids.reshape(-1).tolist()))
    np.testing.assert_array_equal(got["metadata"][:, 1], [last_batch(ids, k) for k in keep])
    assert layer.table.stats()["evicted"] == len(set(ids.reshape(-1).tolist())) - len(keep)


def test_a_table_evicting_as_ids_stream_through_keeps_its_memory_level():
    # A sliding window of IDs: each step looks up 8192, 2048 of them new, and TTL removes
    # as many. Rows, and the memory of index, rows and the list of removed keys kept for
    # the next save of changes, level off once the table is full. The memory is what the
    # rows occupy: rows never move, so a stripe keeps room for the most rows it has held,
    # and as its row count wanders that most creeps up ever more slowly.
    table = tfps.DynamicTable(8, optimizer="sgd", eviction=tfps.eviction.TTL(steps=50))
    memory, rows = [], []
    for step in range(1300):
        keys = tf.range(step * 2048, step * 2048 + 8192, dtype=tf.int64)
        table.find_or_insert(keys)
        table.apply_gradients(keys, tf.zeros([8192, 8]), step=-1)
        if step in (200, 700, 1299):
            stats = table.stats()
            memory.append(stats["memory_bytes"])
            rows.append(stats["rows"])
    assert stats["evicted"] > 2_000_000
    assert max(rows) - min(rows) < 0.05 * rows[0]
    # Within 10% of its size after warm-up, and at most 2% more over the last 600 steps.
    assert memory[2] <= memory[0] * 1.10 and memory[2] <= memory[1] * 1.02, memory
    # What the rows occupy, not the blocks handed out for them: near the rows' own bytes.
    assert stats["row_memory_bytes"] <= 1.3 * rows[2] * (8 + 8 + 8 * 4 + 4), stats


def test_decayed_frequency_scores_decay_per_step_and_low_scores_go():
    ids, labels = phased_data()
    decay, threshold = 0.5, 0.5
    model, layer, _ = build_model("sgd", eviction=tfps.eviction.DecayedFrequency(decay, threshold))
    train("fit", model, KERAS_SGD["current"](), ids, labels)
    # Occurrences looked up at clock b (batch b) have decayed to the clock at the end.
    scores = {int(k): sum((batch == k).sum() * decay ** (STEPS - b) for b, batch in enumerate(ids)) for k in VOCAB}
    layer.table.evict()
    got = sorted_export(layer.table)
    keep = sorted(k for k, s in scores.items() if s >= threshold)
    assert got["keys"].tolist() == keep and 0 < len(keep) < len(VOCAB)
    # A row holds its score as of its last-seen step; it decays from there to the clock.
    now = got["scores"] * decay ** (STEPS - got["metadata"][:, 1])
    np.testing.assert_allclose(now, [scores[k] for k in keep], rtol=1e-5)


def test_a_row_cap_is_split_over_the_shards_and_keeps_the_recently_seen():
    table = ShardedTable(2, optimizer="sgd", devices=["/CPU:0", "/CPU:0"], max_rows=201,
                         eviction=tfps.eviction.LRU())
    hot = np.arange(50, dtype=np.int64) * 7919
    for batch in range(20):
        table.find_or_insert(hot)
        table.find_or_insert(np.arange(batch * 100, batch * 100 + 100, dtype=np.int64) + (1 << 40))
        table.apply_gradients(hot[:1], np.zeros([1, 2], np.float32), step=-1)
    assert sorted(table.shard_sizes()) == [100, 101]
    assert table.find(hot, return_exists=True)[1].numpy().mean() >= 0.9
    stats = table.stats()  # hot rows a sampled eviction took came back as new rows
    assert stats["evicted"] == stats["admitted"] - 201 and stats["admitted"] >= 50 + 2000
    with pytest.raises(ValueError, match="max_rows=1 is fewer than the table's 2 shards"):
        ShardedTable(2, devices=["/CPU:0", "/CPU:0"], max_rows=1)


@pytest.mark.parametrize("shards", [1, 3])
def test_a_capped_table_restored_into_another_number_of_shards_keeps_every_row(tmp_path, shards):
    def make(num_shards):
        return ShardedTable(2, optimizer="adagrad", devices=["/CPU:0"] * num_shards, name="capped",
                            max_rows=20_000, eviction=tfps.eviction.LRU())
    original = make(2)
    for batch in range(6):  # past the cap, so each shard is near its share of it
        original.find_or_insert(np.arange(batch * 5000, (batch + 1) * 5000, dtype=np.int64) * 7919 + 1)
    path = tf.train.Checkpoint(table=original).write(str(tmp_path / "ckpt"))
    restored = make(shards)
    tf.train.Checkpoint(table=restored).read(path).assert_consumed()
    # The saved keys land in other stripes here, some more than their share of the cap:
    # a restore evicts none of them.
    a, b = sorted_export(original), sorted_export(restored)
    assert 19_000 < len(a["keys"]) <= 20_000
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)
    # New keys bring every stripe back under its share.
    restored.find_or_insert(np.arange(100_000, 160_000, dtype=np.int64) * 7919 + 1)
    assert sum(restored.shard_sizes()) <= 20_000


@pytest.mark.parametrize("policy", [tfps.eviction.LRU(), None])
def test_a_row_cap_evicts_a_steps_new_ids_before_the_hot_rows_that_step_trained(policy):
    # 256 hot IDs, then 2,000 new ones, a step under a cap of 4,096 (16 rows a stripe):
    # the hot rows and the new ones tie on recency at their step, and where a stripe's new
    # rows filled it, a sample with no older row in it took hot rows before ties were
    # broken by count. (A hot ID looked up after its stripe filled with new ones is the
    # least recently seen row there, and goes as LRU says.)
    table = tfps.DynamicTable(2, optimizer="sgd", max_rows=4096, eviction=policy)
    hot = np.arange(256, dtype=np.int64) + (1 << 40)
    table.find_or_insert(hot)  # seen once before: the hot rows count more than a new ID
    table.apply_gradients(hot, np.zeros([len(hot), 2], np.float32), step=-1)
    for step in range(12):
        keys = np.concatenate([hot, np.arange(step * 2000, step * 2000 + 2000, dtype=np.int64)])
        table.find_or_insert(keys)
        table.apply_gradients(keys, np.zeros([len(keys), 2], np.float32), step=-1)
        assert table.find(hot, return_exists=True)[1].numpy().all(), f"a hot row was evicted at step {step}"
    stats = table.stats()
    assert stats["rows"] == 4096 and stats["evicted"] == stats["admitted"] - 4096


def test_table_stats_callback_logs_admission_and_eviction():
    ids, labels = skewed_data()
    model, layer, _ = build_model("sgd", admission=tfps.admission.MinCount(MIN_COUNT),
                                  eviction=tfps.eviction.TTL(steps=5))
    model.compile(optimizer=KERAS_SGD["current"](), loss="mse")
    history = model.fit(ids.reshape(-1, FIELDS), labels.reshape(-1), batch_size=BATCH, shuffle=False,
                        verbose=0, callbacks=[tfps.callbacks.TableStats()]).history
    stats = layer.table.stats()
    for name in ("rows", "admitted", "pending", "rejected", "evicted"):
        assert history[f"{layer.name}/{name}"] == [stats[name]]
    assert stats["rejected"] > 0 and stats["pending"] > 0


def fill(table, ids, occurrences):
    return table.find_or_insert(tf.constant(ids, tf.int64), tf.constant(occurrences, tf.int64),
                                return_admitted=True)[1].numpy()


def test_checkpoints_carry_pending_counts_scores_and_counters_exactly_into_as_many_shards(tmp_path):
    def make():
        return ShardedTable(3, optimizer="adagrad", devices=["/CPU:0", "/CPU:0"], name="state",
                            admission=tfps.admission.MinCount(6, sketch_bytes=0),
                            eviction=tfps.eviction.DecayedFrequency(0.9, 0.01))
    rng = np.random.default_rng(2)
    keys = np.arange(400, dtype=np.int64) * 104729 - 5000
    original = make()
    for _ in range(3):
        fill(original, keys, rng.integers(0, 3, len(keys)))
        original.apply_gradients(keys[:50], np.ones([50, 3], np.float32), step=-1)
    path = tf.train.Checkpoint(table=original).write(str(tmp_path / "ckpt"))
    restored = make()
    tf.train.Checkpoint(table=restored).read(path).assert_consumed()
    a, b = sorted_export(original), sorted_export(restored)
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)
    stats = lambda t: {k: v for k, v in t.stats().items() if k not in ("shards", "memory_bytes", "row_memory_bytes")}  # noqa: E731
    assert stats(original) == stats(restored) and stats(original)["pending"] > 0
    # Keys waiting for admission are admitted at the same occurrence either way.
    more = rng.integers(0, 3, len(keys))
    np.testing.assert_array_equal(fill(original, keys, more), fill(restored, keys, more))


def test_a_sketch_restored_into_more_shards_never_admits_a_key_later_and_counts_its_keys_once(tmp_path):
    admission = tfps.admission.MinCount(40, sketch_bytes=1 << 16)
    original = ShardedTable(2, devices=["/CPU:0"] * 2, admission=admission, name="sketch")
    keys = np.arange(3000, dtype=np.int64) * 15485863
    counts = (np.random.default_rng(4).zipf(1.5, len(keys)) % 39).astype(np.int64)
    fill(original, keys, counts)
    path = tf.train.Checkpoint(table=original).write(str(tmp_path / "ckpt"))
    resharded = ShardedTable(2, devices=["/CPU:0"] * 3, admission=admission, name="sketch")
    tf.train.Checkpoint(table=resharded).read(path)
    assert sum(resharded.stats()[k] for k in ("admitted", "rejected")) == \
        sum(original.stats()[k] for k in ("admitted", "rejected"))
    # Every new shard merges every saved sketch, yet counts only the keys routed to it: the
    # keys waiting (a linear-counting estimate) are counted once, not once per shard.
    waiting = int(np.sum(counts > 0))  # counts < 40: none admitted
    assert abs(original.stats()["pending"] - waiting) <= waiting // 20
    assert abs(resharded.stats()["pending"] - original.stats()["pending"]) <= waiting // 10
    step = np.full(len(keys), 1, np.int64)
    for _ in range(3):
        admitted_before, admitted_after = fill(original, keys, step), fill(resharded, keys, step)
        assert not (admitted_before & ~admitted_after).any()


def test_layer_config_and_keras_archives_keep_the_policies(tmp_path):
    ids = keras.Input((), dtype=tf.int64)
    layer = tfps.keras_layers.DynamicEmbedding(
        2, name="with_policies", admission=tfps.admission.Probability(0.5, sketch_bytes=1 << 12),
        eviction=tfps.eviction.TTL(seconds=3600.0), max_rows=1000)
    model = keras.Model(ids, keras.layers.Dense(1)(layer(ids)))
    model.compile("sgd", "mse")
    model.fit(np.arange(100), np.zeros(100), verbose=0)
    config = layer.get_config()
    clone = tfps.keras_layers.DynamicEmbedding.from_config(config)
    assert (clone.admission, clone.eviction, clone.max_rows) == (layer.admission, layer.eviction, 1000)
    model.save(str(tmp_path / "m.keras"))
    loaded = keras.models.load_model(str(tmp_path / "m.keras")).get_layer("with_policies")
    assert loaded.eviction == tfps.eviction.TTL(seconds=3600.0)
    np.testing.assert_array_equal(sorted_export(loaded.table)["keys"], sorted_export(layer.table)["keys"])


@pytest.mark.parametrize("sketch_bytes", [0, 1 << 20])
def test_keras_archives_keep_pending_counts_and_counters_and_leave_the_save_chain_alone(tmp_path, sketch_bytes):
    def model_with(layer):
        ids = keras.Input((), dtype=tf.int64)
        model = keras.Model(ids, keras.layers.Dense(1)(layer(ids)))
        model.compile("sgd", "mse")
        return model

    layer = tfps.keras_layers.DynamicEmbedding(2, name="admitting", admission=tfps.admission.MinCount(
        2, sketch_bytes=sketch_bytes))
    model = model_with(layer)
    model.fit(np.arange(100), np.zeros(100), batch_size=100, verbose=0)  # each ID once: waiting
    model.fit(np.arange(100, 110).repeat(2), np.zeros(20), batch_size=20, verbose=0)  # admitted
    model.save(str(tmp_path / "m.keras"))
    saved = layer.table.stats()
    loaded = keras.models.load_model(str(tmp_path / "m.keras")).get_layer("admitting")
    stats = loaded.table.stats()
    for name in ("rows", "admitted", "rejected", "clock"):
        assert stats[name] == saved[name], name
    assert saved["rejected"] == 100 and saved["rows"] == 10
    if sketch_bytes == 0:
        assert saved["pending"] == stats["pending"] == 100
    else:
        # The sketch's estimate less the keys it admitted; after a restore its cells still
        # hold the admitted keys' counts (until they halve away), which it cannot tell apart.
        assert abs(saved["pending"] - 100) <= 5 and 100 <= stats["pending"] <= 115, (saved, stats)
    # A second occurrence after loading admits the IDs the archive remembered once.
    ids = tf.constant(np.arange(100), tf.int64)
    with tf.GradientTape():
        loaded(ids, training=True)
    assert loaded.table.stats()["rows"] == 110
    # The archive took no changes: a changes-only checkpoint after it still holds the rows
    # changed since the table's last checkpoint (here: every row).
    with tfps.checkpoint.changes_only():
        tf.train.Checkpoint(table=layer.table).write(str(tmp_path / "delta"))
    restored = tfps.keras_layers.DynamicEmbedding(2, name="restored", admission=tfps.admission.MinCount(
        2, sketch_bytes=sketch_bytes))
    model_with(restored)
    tf.train.Checkpoint(table=restored.table).read(str(tmp_path / "delta")).assert_consumed()
    assert restored.table.stats()["rows"] == 10


@pytest.mark.parametrize("make,message", [
    (lambda: tfps.admission.MinCount(0), "count must be an int in"),
    (lambda: tfps.admission.MinCount(2, sketch_bytes=-1), "sketch_bytes must be an int"),
    (lambda: tfps.admission.Probability(1.5), r"p must be a number in \(0, 1\]"),
    (lambda: tfps.eviction.TTL(), "exactly one of steps or seconds"),
    (lambda: tfps.eviction.TTL(steps=3, seconds=2.0), "exactly one of steps or seconds"),
    (lambda: tfps.eviction.TTL(steps=0), "steps must be a positive int"),
    (lambda: tfps.eviction.DecayedFrequency(1.5, 1.0), r"decay must be a number in \(0, 1\]"),
    (lambda: tfps.eviction.DecayedFrequency(0.9, 0.0), "threshold must be a positive number"),
    (lambda: tfps.DynamicTable(2, max_rows=0), "max_rows must be a positive int"),
    (lambda: tfps.keras_layers.DynamicEmbedding(2, admission="min_count"),
     r"tfps admission policy 'min_count' needs arguments; use tfps.admission.MinCount\(n\)"),
    (lambda: tfps.keras_layers.DynamicEmbedding(2, eviction="ttl"), "tfps eviction policy 'ttl' needs arguments"),
    (lambda: tfps.keras_layers.DynamicEmbedding(2, eviction="least_used"), "unknown tfps eviction policy 'least_used'"),
    (lambda: tfps.keras_layers.DynamicEmbedding(2, admission=tfps.eviction.TTL(steps=5)),
     r"TTL\(steps=5, seconds=None\) is an eviction policy: pass it as eviction="),
    (lambda: tfps.DynamicTable(2, eviction=tfps.admission.MinCount(2)), "is an admission policy"),
    (lambda: tfps.keras_layers.DynamicEmbedding(2, eviction=tfps.eviction.LFU()), "only orders a row cap"),
    (lambda: tfps.callbacks.TableStats(log_dir=123), "log_dir must be a path"),
])
def test_bad_policies_are_refused_naming_the_argument(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_running_out_of_memory_is_an_error_naming_the_table_that_changes_nothing():
    program = """
import resource, numpy as np, tensorflow as tf, tfps
table = tfps.DynamicTable(512, optimizer="adam", name="oom_table")
table.find_or_insert(np.arange(10))
virtual = int(open("/proc/self/statm").read().split()[0]) * 4096
resource.setrlimit(resource.RLIMIT_AS, (virtual + (256 << 20), resource.RLIM_INFINITY))
for batch in range(1, 400):
    size, before = int(table.size()), table.find(np.arange(10)).numpy()
    try:
        table.find_or_insert(np.arange(batch << 20, (batch << 20) + 2048))
    except tf.errors.ResourceExhaustedError as e:
        assert "on table 'oom_table" in str(e) and "the table is unchanged" in str(e), str(e)
        assert int(table.size()) == size
        np.testing.assert_array_equal(table.find(np.arange(10)).numpy(), before)
        table.remove(np.arange(5))  # the process and the table go on
        print("out of memory after", batch, "batches; rows", int(table.size()))
        break
else:
    raise SystemExit("never ran out of memory")
"""
    out = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=ROOT))
    assert out.returncode == 0 and "out of memory after" in out.stdout, out.stdout + out.stderr[-3000:]


def test_a_sketch_that_cannot_fit_in_memory_is_refused_naming_sketch_bytes():
    program = """
import resource, tensorflow as tf, tfps
try:
    tfps.DynamicTable(4, name="huge_sketch", admission=tfps.admission.MinCount(2, sketch_bytes=1 << 40))
except tf.errors.InvalidArgumentError as e:
    assert "on table 'huge_sketch" in str(e) and "sketch_bytes 1099511627776 is more than half" in str(e), str(e)
    print("refused")
virtual = int(open("/proc/self/statm").read().split()[0]) * 4096
resource.setrlimit(resource.RLIMIT_AS, (virtual + (256 << 20), resource.RLIM_INFINITY))
try:
    tfps.DynamicTable(4, name="big_sketch", admission=tfps.admission.MinCount(2, sketch_bytes=1 << 30))
except tf.errors.ResourceExhaustedError as e:
    assert "on table 'big_sketch" in str(e) and "its admission sketch takes sketch_bytes 1073741824" in str(e), str(e)
    print("out of memory")
"""
    out = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=ROOT))
    assert out.returncode == 0 and out.stdout.split() == ["refused", "out", "of", "memory"], \
        out.stdout + out.stderr[-3000:]


@pytest.mark.parametrize("saved_sketch_bytes", [0, 1 << 16])
def test_a_checkpoint_restores_into_tables_of_other_admission_policies(tmp_path, saved_sketch_bytes):
    """Rows restore whatever the policy; waiting keys' counts only into a table that admits,
    and a table that admits every key holds none of them."""
    saved = tfps.DynamicTable(2, name="saved", admission=tfps.admission.MinCount(3, sketch_bytes=saved_sketch_bytes))
    keys = np.arange(20_000, dtype=np.int64)
    saved.find_or_insert(keys[:10])
    saved.find_or_insert(keys[:10])
    saved.find_or_insert(keys[:10])  # admitted on their third occurrence
    saved.find_or_insert(keys)       # the rest wait with one occurrence
    tf.train.Checkpoint(table=saved).write(str(tmp_path / "c"))
    rows = saved.find(keys[:10]).numpy()
    for name, admission in [("none", None), ("sketch", tfps.admission.MinCount(3)),
                            ("exact", tfps.admission.MinCount(3, sketch_bytes=0))]:
        restored = tfps.DynamicTable(2, name=f"restored_{name}", admission=admission)
        tf.train.Checkpoint(table=restored).read(str(tmp_path / "c")).assert_consumed()
        assert int(restored.size()) == 10, name
        np.testing.assert_array_equal(restored.find(keys[:10]).numpy(), rows)
        stats = restored.stats()
        if admission is None:
            # as much memory as the same rows restored from a table without waiting keys
            plain, plain_restored = tfps.DynamicTable(2, name="plain"), tfps.DynamicTable(2, name="plain_restored")
            plain.find_or_insert(keys[:10])
            tf.train.Checkpoint(table=plain).write(str(tmp_path / "plain"))
            tf.train.Checkpoint(table=plain_restored).read(str(tmp_path / "plain")).assert_consumed()
            assert stats["pending"] == 0 and stats["memory_bytes"] == plain_restored.stats()["memory_bytes"]
        elif saved_sketch_bytes == 0 or name == "sketch":
            assert stats["pending"] > 10_000, (name, stats)


def test_apply_gradients_by_default_records_the_tables_clock_so_evict_keeps_fresh_rows():
    table = tfps.DynamicTable(2, optimizer="sgd", eviction=tfps.eviction.TTL(steps=5))
    old, fresh = np.arange(10, dtype=np.int64), np.arange(100, 110, dtype=np.int64)
    table.find_or_insert(old)
    table.apply_gradients(old, np.ones((10, 2), np.float32))
    for _ in range(9):
        table.apply_gradients(fresh, np.ones((10, 2), np.float32))  # no step given
    rows = table.export()
    last_step = dict(zip(rows.keys.numpy().tolist(), rows.metadata.numpy()[:, 1].tolist()))
    assert [last_step[k] for k in (0, 100)] == [1, 10]  # the call that updated each last
    assert int(table.evict()) == 10  # the old rows, 9 steps unseen; the fresh ones stay
    assert table.find(fresh, return_exists=True)[1].numpy().all()
