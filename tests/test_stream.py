"""tfps.stream.DriftingStream is a pure function of the example index with the drift its
docstring promises, and examples/stream_ctr.py keeps exactly the rows its policies say,
checked against the stream's own IDs counted in NumPy."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from tfps.data.stream import DriftingStream

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(ROOT, "examples", "stream_ctr.py")


def ids_of(stream, first, count):
    return stream.examples(tf.range(first, first + count, dtype=tf.int64))[0]["ids"].numpy()


def test_any_range_of_the_stream_regenerates_exactly_whatever_the_batching():
    stream = DriftingStream(live_ids=1000, seed=3)
    whole = ids_of(stream, 0, 4096)
    batched = np.concatenate([f["ids"].numpy() for f, _ in stream.dataset(0, 512, num_batches=8)])
    np.testing.assert_array_equal(batched, whole)
    np.testing.assert_array_equal(ids_of(DriftingStream(live_ids=1000, seed=3), 1000, 96), whole[1000:1096])
    assert not np.array_equal(ids_of(DriftingStream(live_ids=1000, seed=4), 0, 4096), whole)


def test_ids_live_in_a_sliding_window_newest_most_often_and_one_offs_never_return():
    stream = DriftingStream(live_ids=1000, new_ids_per_example=0.05, one_off=0.2)
    n = 40_000
    ids = ids_of(stream, 0, n)
    one_off = ids >= (1 << 62)
    # One-offs: the share asked for (within 5 sigma), each the example's own index.
    share, sigma = one_off.mean(), np.sqrt(0.2 * 0.8 / ids.size)
    assert abs(share - 0.2) < 5 * sigma
    rows = np.nonzero(one_off)[0]
    np.testing.assert_array_equal(ids[one_off] - (1 << 62), rows)
    # The live window of example i is [floor(0.05 i), floor(0.05 i) + 1000).
    base = np.floor(np.arange(n) * 0.05).astype(np.int64)[:, None]
    offset = np.where(one_off, 0, ids - base)
    assert offset.min() >= 0 and offset.max() < 1000
    # Rank 0 (offset 999, the newest ID) is drawn about as often as ranks 1-2 together,
    # and ten times as often as rank 9 (log-uniform ranks).
    by_rank = np.bincount(999 - offset[~one_off], minlength=1000)
    assert 0.8 < by_rank[0] / (by_rank[1] + by_rank[2]) < 1.25
    assert 6 < by_rank[0] / by_rank[9] < 16


def test_labels_follow_the_click_probabilities():
    stream = DriftingStream(live_ids=2000)
    _, labels, probability = stream.examples(tf.range(200_000, dtype=tf.int64))
    labels, probability = labels.numpy(), probability.numpy()
    sigma = np.sqrt(np.sum(probability * (1 - probability))) / labels.size
    assert abs(labels.mean() - probability.mean()) < 5 * sigma
    # The probabilities are informative: high ones click more.
    high = probability > np.median(probability)
    assert labels[high].mean() > 1.5 * labels[~high].mean()


def occurrences_per_column_id(stream, examples, batch_size):
    """Per (column, ID) pair of the first `examples`: its occurrences, and whether its
    first two occurrences fall in different batches (the first is then looked up without a
    row under MinCount(2), and rejected)."""
    ids = ids_of(stream, 0, examples)
    columns = np.broadcast_to(np.arange(ids.shape[1]), ids.shape)
    _, pair, counts = np.unique(np.stack([columns.ravel(), ids.ravel()]), axis=1,
                                return_inverse=True, return_counts=True)
    batch = np.arange(ids.size) // ids.shape[1] // batch_size
    order = np.argsort(pair, kind="stable")  # each pair's occurrences in example order
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    twice = counts >= 2
    split = np.zeros(counts.size, bool)
    split[twice] = batch[order[starts[twice]]] != batch[order[starts[twice] + 1]]
    return counts, split


def run_example(args, tmp_path, launched=False):
    command = [sys.executable, EXAMPLE, "--json", "--batch_size", "512", "--examples", "40960",
               "--chunk", "20480", "--eval_examples", "4096", *args]
    if launched:
        command = [sys.executable, "-m", "tfps.launch", "--num_ps", "2", "--num_workers", "1",
                   "--log_dir", str(tmp_path / "logs"), *command[1:], "--pid_dir", str(tmp_path / "pids")]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=ROOT)
    out = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env, cwd=str(tmp_path))
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    return [json.loads(line[len("STREAM "):]) for line in out.stdout.splitlines() if line.startswith("STREAM ")]


@pytest.mark.parametrize("min_count", [0, 2])  # the rejected count below assumes 2
def test_the_streaming_example_keeps_the_ids_its_admission_admits(tmp_path, min_count):
    # Exact counts (no sketch) and no eviction: the table's rows are exactly the (column,
    # ID) pairs of the trained examples that occurred min_count times.
    records = run_example(["--min_count", str(min_count), "--sketch_mb", "0", "--ttl_steps", "0"], tmp_path)
    assert [r["examples"] for r in records] == [20480, 40960]
    counts, first_two_in_two_batches = occurrences_per_column_id(DriftingStream(), 40960, 512)
    last = records[-1]
    assert last["rows"] == np.sum(counts >= max(min_count, 1)) == last["admitted"]
    assert last["evicted"] == 0
    if min_count:
        assert last["pending"] == np.sum(counts < min_count)
        # Looked up without a row: once-seen IDs, and the first occurrence of an ID whose
        # second came in a later batch.
        assert last["rejected"] == np.sum(counts == 1) + np.sum(first_two_in_two_batches)
    else:
        assert last["pending"] == last["rejected"] == 0
    assert 0.5 < records[-1]["rolling_auc"] < 1.0


def test_the_streaming_example_evicts_and_reports_every_task_on_a_launched_cluster(tmp_path):
    records = run_example(["--ttl_steps", "10"], tmp_path, launched=True)
    last = records[-1]
    assert last["evicted"] > 0 and last["rows"] == last["admitted"] - last["evicted"]
    assert sorted(last["rss_mib"]) == ["chief_0", "ps_0", "ps_1", "worker_0"]
    assert all(mib > 50 for mib in last["rss_mib"].values())
