"""Hostile lines mixed into Criteo-format files, as logged data brings them: NaN and Inf
labels and features, numbers too long for an int64, empty lines, over-long lines (a huge
field, thousands of columns), a line cut short, and bytes that are not text. The reader
(tfps.data.criteo_dataset) must drop every one of them, count it and warn of it once."""

import os

import numpy as np

NUM_DENSE, NUM_CATEGORICAL = 13, 26


def _line(label="1", dense=None, categorical=None):
    dense = dense if dense is not None else ["3"] * NUM_DENSE
    categorical = categorical if categorical is not None else ["0a1b2c3d"] * NUM_CATEGORICAL
    return "\t".join([label] + dense + categorical)


def hostile_lines():
    """One of each kind of bad line (each a str without its newline)."""
    return [
        _line(label="nan"), _line(label="inf"), _line(label="-inf"), _line(label="NaN"),
        _line(dense=["nan"] + ["3"] * 12), _line(dense=["3"] * 6 + ["inf"] + ["3"] * 6),
        _line(dense=["1e309"] + ["3"] * 12), _line(dense=["99999999999999999999"] + ["3"] * 12),
        _line(dense=["3.5"] + ["3"] * 12), _line(label="0.5"),
        "",  # an empty line
        _line(categorical=["ab" * 400_000] + ["0a"] * 25),  # an over-long field (800 KB)
        "\t".join(["1"] * 5000),  # thousands of columns
        _line()[:40],  # cut short
        _line(categorical=["0a\x00\x01"] + ["0a"] * 25),  # control bytes
    ]


def mix_into(paths, copies=2, seed=0):
    """Inserts `copies` of every hostile line at random places in each file (in place);
    returns {path: sorted 1-based line numbers of the hostile lines}."""
    rng = np.random.default_rng(seed)
    placed = {}
    for path in paths:
        with open(path) as f:
            lines = f.read().split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        bad = hostile_lines() * copies
        positions = np.sort(rng.choice(len(lines) + len(bad), size=len(bad), replace=False))
        order = rng.permutation(len(bad))
        out, good, numbers = [], iter(lines), []
        bad_at = dict(zip(positions.tolist(), (bad[i] for i in order)))
        for n in range(len(lines) + len(bad)):
            if n in bad_at:
                out.append(bad_at[n])
                numbers.append(n + 1)
            else:
                out.append(next(good))
        with open(path + ".tmp", "w") as f:
            f.write("\n".join(out) + "\n")
        os.replace(path + ".tmp", path)
        placed[path] = numbers
    return placed
