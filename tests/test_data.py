"""tfps.data: the Criteo reader against a pure-Python parse, malformed lines, and one epoch
shared by two workers with each line read once."""

import math
import os

import numpy as np
import pytest
import tensorflow as tf

import tfps
from tests.cluster_run import run_cluster_program

EDGE_LINES = [
    "1\t" + "\t".join(["-3", "", "7"] + ["0"] * 10) + "\t" + "\t".join(["ABCDEF01", ""] + ["0a"] * 24),
    "0\t" + "\t".join([""] * 13) + "\t" + "\t".join([""] * 26),
]


def python_parse(line):
    cols = line.rstrip("\n").split("\t")
    label = float(cols[0])
    dense = [math.log1p(max(int(c), 0)) if c else 0.0 for c in cols[1:14]]
    return label, dense, cols[14:]


def test_reader_matches_a_pure_python_parse(tmp_path):
    paths = tfps.data.write_criteo(str(tmp_path), num_files=2, rows_per_file=700, seed=3)
    with open(paths[0], "a") as f:
        f.write("\n".join(EDGE_LINES) + "\n")
    lines = [l for p in paths for l in open(p)]
    expected = [python_parse(l) for l in lines]
    got_dense, got_keys, got_labels = [], [], []
    for features, labels in tfps.data.criteo_dataset(paths, 256):
        got_dense.append(features["dense_features"].numpy())
        got_keys.append(features["categorical_keys"].numpy())
        got_labels.append(labels.numpy())
    # File order is interleaved: compare as multisets keyed by the whole parsed row.
    dense, keys, labels = (np.concatenate(x) for x in (got_dense, got_keys, got_labels))
    assert len(labels) == len(lines)
    cats = np.array([e[2] for e in expected])
    fingerprints = tfps.keys.fingerprint64(tf.constant(cats)).numpy()
    columns = np.broadcast_to(np.arange(1, 27), fingerprints.shape)
    expected_keys = tfps.keys.ids_to_keys(tf.constant(fingerprints), tf.constant(columns)).numpy()
    expected_rows = sorted(zip([e[0] for e in expected], [tuple(np.float32(e[1])) for e in expected],
                               map(tuple, expected_keys)))
    got_rows = sorted(zip(labels.tolist(), map(tuple, dense), map(tuple, keys)))
    assert [r[0] for r in got_rows] == [r[0] for r in expected_rows]
    np.testing.assert_allclose([r[1] for r in got_rows], [r[1] for r in expected_rows], rtol=1e-6)
    assert [r[2] for r in got_rows] == [r[2] for r in expected_rows]


MALFORMED = ["1\t2\t3",                                                  # wrong column count
             "0\t" + "\t".join(["x1"] + [""] * 12) + "\t" + "\t".join([""] * 26),   # non-numeric
             "1\t" + "\t".join([""] * 13) + "\t" + "\t".join(["zz"] + [""] * 25),   # non-hex
             "7\t" + "\t".join([""] * 13) + "\t" + "\t".join([""] * 26),            # bad label
             "0\t" + "\t".join(["-"] + [""] * 12) + "\t" + "\t".join([""] * 26)]     # a lone minus


def test_malformed_lines_are_skipped_with_a_warning_naming_file_and_line(tmp_path, capfd):
    path = tfps.data.write_criteo(str(tmp_path), num_files=1, rows_per_file=50, seed=1)[0]
    with open(path, "a") as f:
        f.write("\n".join(MALFORMED) + "\n")
    total = sum(int(tf.size(y)) for _, y in tfps.data.criteo_dataset([path], 16))
    assert total == 50
    err = capfd.readouterr().err
    assert "skipped malformed line(s) [51 52 53 54 55] of" in err and path in err
    assert "5 malformed so far" in err


def test_a_repeated_dataset_warns_of_each_malformed_line_once(tmp_path, capfd):
    paths = tfps.data.write_criteo(str(tmp_path), num_files=2, rows_per_file=30, seed=4)
    for path, bad in zip(paths, (MALFORMED[:2], MALFORMED[2:])):
        with open(path, "a") as f:
            f.write("\n".join(bad) + "\n")
    dataset = tfps.data.criteo_dataset(paths, 10, repeat=True)
    assert sum(int(tf.size(y)) for _, y in dataset.take(18)) == 180  # three passes over 60 lines
    warnings = [line for line in capfd.readouterr().err.splitlines() if "skipped malformed line(s)" in line]
    assert len(warnings) == 2, warnings
    assert any(f'[31 32] of "{paths[0]}"' in w for w in warnings)
    assert any(f'[31 32 33] of "{paths[1]}"' in w for w in warnings)
    assert "5 malformed so far" in warnings[-1]


def test_malformed_lines_raise_when_asked(tmp_path):
    path = tfps.data.write_criteo(str(tmp_path), num_files=1, rows_per_file=20, seed=1)[0]
    with open(path, "a") as f:
        f.write(MALFORMED[1] + "\n")
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"malformed Criteo line.*\n?.*21"):
        for _ in tfps.data.criteo_dataset([path], 8, malformed="raise"):
            pass
    with pytest.raises(ValueError, match="malformed must be 'skip' or 'raise'"):
        tfps.data.criteo_dataset([path], 8, malformed="ignore")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        tfps.data.criteo_dataset([str(tmp_path / "missing.tsv")], 8)


def test_one_epoch_gives_each_line_to_exactly_one_of_two_workers(tmp_path):
    num_files, rows = 3, 400
    line = 0
    for f in range(num_files):
        with open(tmp_path / f"part-{f}.tsv", "w") as out:
            for _ in range(rows):
                out.write("\t".join(["1", str(line)] + [""] * 12 + ["ab"] * 26) + "\n")
                line += 1
    out = run_cluster_program("data_exactly_once.py", str(tmp_path), str(line))
    counts = np.array(out["counts"])
    np.testing.assert_array_equal(counts, np.ones(line))


def test_gzipped_files_and_a_single_path_read_like_plain_files(tmp_path):
    import gzip
    import shutil
    path = tfps.data.write_criteo(str(tmp_path), num_files=1, rows_per_file=300, seed=2)[0]
    with open(path, "rb") as plain, gzip.open(path + ".gz", "wb") as packed:
        shutil.copyfileobj(plain, packed)

    def rows(files):
        return np.concatenate([y.numpy() for _, y in tfps.data.criteo_dataset(files, 64)])

    np.testing.assert_array_equal(rows(path + ".gz"), rows([path]))
    assert len(rows(path)) == 300
