"""Criteo-format input: a generator of synthetic files and a tf.data reader.

A line is: label, 13 integer features, 26 categorical features as hex strings, separated
by tabs; any feature may be empty. The reader turns integers into log(1 + max(x, 0))
(empty = 0) and categoricals into 64-bit keys, each field in its own namespace (the same
keys DynamicEmbedding(namespace="columns") makes). Malformed lines are counted and either
skipped with a warning naming the file and line (once per line, however often a repeated
dataset reads it), or raise. A line that passes holds only finite numbers.
"""

import json
import os
import sys
import uuid

import numpy as np
import tensorflow as tf

from tfps.data import _service as service
from tfps.data._service import local_data_service  # noqa: F401  (exported here, as before)
from tfps.table import keys as keys_lib
from tfps.table import _stock_ops as stock_ops

__all__ = ["NUM_DENSE", "NUM_CATEGORICAL", "NUM_COLUMNS", "BEST_AUC_FILE", "write_criteo", "best_auc",
           "parse_lines", "criteo_dataset", "local_data_service"]

NUM_DENSE, NUM_CATEGORICAL = 13, 26
NUM_COLUMNS = 1 + NUM_DENSE + NUM_CATEGORICAL


def write_criteo(directory, num_files=2, rows_per_file=10000, seed=0, vocabulary=5000):
    """Writes synthetic Criteo-format files; returns their paths.

    Each field draws power-law IDs (log-uniform ranks up to `vocabulary`); the label is a
    Bernoulli draw from a logistic model of a per-ID effect in 6 fields and two integer
    features, so an AUC well above 0.5 is reachable. About 5% of integers and 3% of
    categoricals are left empty. The AUC of the true click probabilities, the best any
    model can reach on a file, goes to BEST_AUC_FILE in the directory (see best_auc).
    """
    os.makedirs(directory, exist_ok=True)
    rng = np.random.default_rng(seed)
    paths, best = [], {}
    for f in range(num_files):
        n = rows_per_file
        ranks = np.floor(np.exp(rng.random((n, NUM_CATEGORICAL)) * np.log(vocabulary))).astype(np.uint64)
        field = np.arange(NUM_CATEGORICAL, dtype=np.uint64)
        ids = keys_lib.mix64_numpy(ranks * np.uint64(31) + field) & np.uint64(0xFFFFFFFF)
        effect = np.sin(ranks[:, :6].astype(np.float64) * 12.9898 + np.arange(6) * 78.233).sum(1)
        ints = rng.poisson(3.0, (n, NUM_DENSE)) * rng.integers(1, 50, (1, NUM_DENSE))
        logit = 1.5 * effect + 0.3 * np.log1p(ints[:, 0]) - 0.4 * np.log1p(ints[:, 1]) - 0.5
        probability = 1 / (1 + np.exp(-logit))
        labels = (rng.random(n) < probability).astype(int)
        empty_int = rng.random((n, NUM_DENSE)) < 0.05
        empty_cat = rng.random((n, NUM_CATEGORICAL)) < 0.03
        path = os.path.join(directory, f"part-{f:05d}.tsv")
        with open(_temporary(path), "w") as out:
            for i in range(n):
                dense = ["" if empty_int[i, j] else str(ints[i, j]) for j in range(NUM_DENSE)]
                cats = ["" if empty_cat[i, j] else f"{ids[i, j]:08x}" for j in range(NUM_CATEGORICAL)]
                out.write("\t".join([str(labels[i])] + dense + cats) + "\n")
        paths.append(path)
        best[os.path.basename(path)] = _roc_auc(labels, probability)
    best_path = os.path.join(directory, BEST_AUC_FILE)
    with open(_temporary(best_path), "w") as out:
        json.dump(best, out, indent=1)
    # Every file is whole before any takes its name, so a reader (or a run stopped part way
    # and started again) finds all of them or none; processes that generate the same data
    # at once (every task of a cluster, say) write files of their own.
    for path in [best_path] + paths:
        os.replace(_temporary(path), path)
    return paths


def _temporary(path):
    return f"{path}.tmp-{os.getpid()}"


BEST_AUC_FILE = "best_auc.json"


def best_auc(path):
    """The AUC of the true click probabilities of a file write_criteo generated (what the
    data allows a model to reach), or None for other files."""
    try:
        with open(os.path.join(os.path.dirname(path), BEST_AUC_FILE)) as f:
            return json.load(f).get(os.path.basename(path))
    except (OSError, ValueError):
        return None


def _roc_auc(labels, scores):
    """Mann-Whitney AUC of continuous scores (ties have probability zero)."""
    ranks = np.empty(len(scores))
    ranks[np.argsort(scores, kind="stable")] = np.arange(1, len(scores) + 1)
    positives = int(labels.sum())
    negatives = len(labels) - positives
    return float((ranks[labels == 1].sum() - positives * (positives + 1) / 2) / (positives * negatives))


def parse_lines(lines):
    """Parses a batch of lines: (features, labels, valid) where invalid lines hold zeros.

    features: {"dense_features": float32 [n, 13], "categorical_keys": int64 [n, 26]}; labels: float32 [n].
    """
    columns = tf.strings.split(lines, "\t")
    right_count = tf.equal(columns.row_lengths(), NUM_COLUMNS)
    fields = columns.to_tensor(default_value="", shape=[None, NUM_COLUMNS])
    label, dense, categorical = fields[:, 0], fields[:, 1:1 + NUM_DENSE], fields[:, 1 + NUM_DENSE:]
    valid = (right_count & tf.strings.regex_full_match(label, "[01]")
             & tf.reduce_all(tf.strings.regex_full_match(dense, "(-?[0-9]{1,18})?"), axis=1)
             & tf.reduce_all(tf.strings.regex_full_match(categorical, "[0-9a-fA-F]{0,16}"), axis=1))
    clean_dense = tf.where(valid[:, None] & (dense != ""), dense, "0")
    values = tf.strings.to_number(clean_dense, tf.int64)
    dense_features = tf.math.log1p(tf.cast(tf.maximum(values, 0), tf.float32))
    namespaces = tf.range(1, NUM_CATEGORICAL + 1, dtype=tf.int64)[None, :]
    keys = stock_ops.namespaced_keys(keys_lib.fingerprint64(categorical), namespaces)
    labels = tf.where(valid & (label == "1"), 1.0, 0.0)
    return {"dense_features": dense_features, "categorical_keys": keys}, labels, valid


def criteo_dataset(files, batch_size, malformed="skip", shuffle_buffer=0, seed=None,
                   lines_per_parse=1024, data_service=None, repeat=False, job_name=None):
    """A tf.data pipeline over Criteo-format files.

    Args:
      files: a path or a list of paths; paths ending in .gz are read as gzip.
      batch_size: examples per output batch.
      malformed: "skip" (count, warn with file and line once, drop) or "raise".
      shuffle_buffer: examples to shuffle over (0: keep file order).
      data_service: address of a tf.data service dispatcher; with it, one epoch hands each
        line to exactly one consumer (distributed_epoch), which is how every worker of a
        ParameterServerStrategy cluster reads its own part of the data.
      repeat: repeat the epochs forever (what model.fit under ParameterServerStrategy wants).
      job_name: the tf.data service job the consumers share (default: one new name per
        call; every worker that receives this dataset joins the same job).

    Returns:
      Dataset of ({"dense_features": [b, 13] float32, "categorical_keys": [b, 26] int64},
      [b] float32).
    """
    if malformed not in ("skip", "raise"):
        raise ValueError(f"criteo_dataset: malformed must be 'skip' or 'raise', got {malformed!r}")
    if isinstance(files, (str, bytes, os.PathLike)):
        files = [files]
    files = [os.fspath(f) for f in files]
    if not files:
        raise ValueError("criteo_dataset: no input files")
    for path in files:
        if not tf.io.gfile.exists(path):
            raise FileNotFoundError(f"criteo_dataset: {path} does not exist")

    def numbered_lines(file_index, path):
        # Criteo ships its files gzipped: a path ending in .gz is read as gzip.
        compression = tf.where(tf.strings.regex_full_match(path, r".*\.gz"), "GZIP", "")
        lines = tf.data.TextLineDataset(path, compression_type=compression)
        lines = lines.enumerate(start=1).batch(lines_per_parse)
        return lines.map(lambda number, text: (file_index, number, text))

    dataset = tf.data.Dataset.from_tensor_slices((tf.range(len(files), dtype=tf.int64), list(files))).interleave(
        numbered_lines, cycle_length=min(4, len(files)), num_parallel_calls=tf.data.AUTOTUNE)

    def parse(file_index, numbers, lines):
        features, labels, valid = parse_lines(lines)
        return features, labels, valid, file_index, numbers

    dataset = dataset.map(parse, num_parallel_calls=tf.data.AUTOTUNE)
    if repeat:  # before the count, which then sees every pass and reports a line once
        dataset = dataset.repeat()
    dataset = dataset.scan((tf.constant(0, tf.int64), tf.zeros([len(files)], tf.int64)),
                           _count_and_report(malformed, files))
    dataset = dataset.unbatch()
    if shuffle_buffer:
        dataset = dataset.shuffle(shuffle_buffer, seed=seed)
    dataset = dataset.batch(batch_size)
    if data_service is not None:
        # Whole batches go to the consumers (one RPC per batch, not per line); each batch,
        # and so each line, goes to exactly one of them per epoch.
        dataset = service.distribute(dataset, data_service, job_name or f"tfps-criteo-{uuid.uuid4().hex}")
    return dataset.prefetch(tf.data.AUTOTUNE)


def _count_and_report(mode, files):
    """A scan step over parsed line batches (each of one file) that drops malformed lines,
    counting them, and warns of them (or raises, with mode "raise"). Its state is (lines
    reported, per file the last line number reported): a pass over the files again (a
    repeated dataset) reports nothing new."""
    files = tf.constant(files)

    def step(state, batch):
        count, reported_through = state
        features, labels, valid, file_index, numbers = batch
        bad = tf.logical_not(valid)
        bad_numbers = tf.boolean_mask(numbers, bad)
        path = files[file_index]
        if mode == "raise":
            check = tf.debugging.Assert(tf.equal(tf.size(bad_numbers), 0), [
                "tfps.data: malformed Criteo line(s) in", path, "line", bad_numbers[:1],
                "(wrong column count, non-numeric integer, non-hex categorical, or a label not 0/1)"])
            deps, new_state = [check], state
        else:
            new = tf.boolean_mask(bad_numbers, bad_numbers > reported_through[file_index])
            total = count + tf.size(new, tf.int64)

            def warn():
                with tf.control_dependencies([tf.print(
                        "tfps.data: WARNING: skipped malformed line(s)", new, "of", path,
                        "-", total, "malformed so far", output_stream=sys.stderr, summarize=-1)]):
                    return tf.constant(True)
            deps = [tf.cond(tf.size(new) > 0, warn, lambda: tf.constant(True))]
            last = tf.reduce_max(tf.concat([new, reported_through[file_index:file_index + 1]], 0))
            new_state = (total, tf.tensor_scatter_nd_update(reported_through, [[file_index]], [last]))
        with tf.control_dependencies(deps):
            kept = {k: tf.boolean_mask(v, valid) for k, v in features.items()}
            return new_state, (kept, tf.boolean_mask(labels, valid))
    return step
