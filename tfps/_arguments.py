"""Checks of user arguments shared by tables, layers, optimizers and metrics: Python and
NumPy numbers are accepted alike (np.float32(0.1), np.int64(16)); booleans are not numbers
here. Paths are str or os.PathLike."""

import hashlib
import numbers
import os

import numpy as np

_U64 = 1 << 64


def is_int(value):
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_number(value):
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def positive_int(value, name, owner):
    """`value` as a Python int >= 1, or ValueError naming it."""
    if not is_int(value) or value < 1:
        raise ValueError(f"{owner}: {name} must be a positive int, got {value!r}")
    return int(value)


def path(value, name, owner):
    """`value` (str or os.PathLike) as a str, or ValueError naming it."""
    if not isinstance(value, (str, os.PathLike)):
        raise ValueError(f"{owner}: {name} must be a path (str or os.PathLike), got {value!r}")
    return os.fspath(value)


def boolean(value, name, owner):
    """`value` as a Python bool (True, False or a NumPy bool), or ValueError naming it."""
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{owner}: {name} must be True or False, got {value!r}")
    return bool(value)


def number_at_least(value, least, name, owner):
    """`value` as a Python float >= least, or ValueError naming it."""
    if not is_number(value) or not value >= least:
        raise ValueError(f"{owner}: {name} must be a number >= {least}, got {value!r}")
    return float(value)


def seed(value, owner):
    """A seed of the 64-bit space, as the int64 that stands for it: seeds in [2^63, 2^64)
    (a uint64 seed) wrap to negative ints, as the table reads its seed as uint64."""
    if not is_int(value) or not -(1 << 63) <= value < _U64:
        raise ValueError(f"{owner}: seed must be an int in [-2^63, 2^64), got {value!r}")
    value = int(value)
    return value - _U64 if value >= (1 << 63) else value


def seed_of_name(name):
    """A seed that depends on `name` only (stable across processes and runs)."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "little", signed=True)
