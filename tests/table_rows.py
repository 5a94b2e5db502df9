"""A table's rows (keys, values, slots, metadata) as NumPy arrays in key order, to compare a
table before and after a save, a restore or a recovery."""

import numpy as np


def sorted_rows(table):
    """{field of TableRows: array}, rows in ascending key order."""
    rows = table.export()
    order = np.argsort(rows.keys.numpy())
    return {name: getattr(rows, name).numpy()[order] for name in rows._fields}


def assert_same_rows(a, b):
    assert a.keys() == b.keys()
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)
