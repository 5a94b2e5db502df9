"""The route of a training lookup, found again from the keys its gradient arrives with, so
that a table's update reuses what its lookup computed: the batch's distinct keys in the
lookup's order, and their partition over the table's shards. A lookup is attached to its
own keys tensors, so it is matched by identity, never by equal values, and lives as long
as its keys do (a graph's tensors, as long as the graph)."""

import weakref

import tensorflow as tf

from tfps.table import keys as keys_lib

_PER_OCCURRENCE = "_tfps_lookup"  # on the lookup's keys, one per occurrence: the Lookup
_DISTINCT = "_tfps_distinct_keys_of"  # on its distinct keys: a weak reference to it


class Lookup:
    """What an update needs of its lookup: the table, `unique` (the distinct keys of the
    lookup's keys in order of first occurrence, which is the order of tfps's per-key sums,
    keys.sum_by_key) and `routing` (table.route(unique))."""

    __slots__ = ("table", "unique", "routing", "__weakref__")

    def __init__(self, table, unique, routing):
        self.table, self.unique, self.routing = table, unique, routing


def record(table, keys, unique, routing):
    """Records a lookup of `keys` (one per occurrence) in `table`. The distinct keys refer
    to it weakly: a strong reference there would make a cycle through them."""
    lookup = Lookup(table, unique, routing)
    setattr(keys, _PER_OCCURRENCE, lookup)
    setattr(unique, _DISTINCT, weakref.ref(lookup))


def lookup_of(indices):
    """(the lookup, whether `indices` are its distinct keys rather than one per occurrence)
    for a gradient's indices, or (None, False) where they are neither."""
    # Optimizers and strategies pass a gradient's indices through tf.identity.
    while not isinstance(indices, tf.__internal__.EagerTensor) and indices.op.type == "Identity":
        indices = indices.op.inputs[0]
    lookup = getattr(indices, _PER_OCCURRENCE, None)
    if lookup is not None:
        return lookup, False
    distinct = getattr(indices, _DISTINCT, None)
    lookup = distinct() if distinct is not None else None
    return (lookup, True) if lookup is not None else (None, False)


def summed_per_key(gradient):
    """(the lookup, the gradient's values summed per key in the order of the lookup's
    distinct keys) for IndexedSlices over the keys of a recorded lookup, or (None, None)
    for any other."""
    lookup, summed = lookup_of(gradient.indices)
    if lookup is None:
        return None, None
    if summed:
        return lookup, gradient.values
    return lookup, keys_lib.sum_by_key(gradient.indices, gradient.values)[1]
