"""The routes of recent training lookups, found again from the keys a gradient arrives
with, so that a table's update reuses what its lookup computed: the batch's distinct keys
in the lookup's order, and their partition over the table's shards. Matched by tensor
identity, never by value: what matches is the lookup's own keys."""

import collections
import weakref

import tensorflow as tf

from tfps.table import keys as keys_lib

# What an update needs of its lookup: the table, `unique` (the distinct keys of the
# lookup's keys in order of first occurrence, which is the order of tfps's per-key sums,
# keys.sum_by_key) and `routing` (table.route(unique)).
Lookup = collections.namedtuple("Lookup", ["table", "unique", "routing"])


class LookupRoutes:
    """Lookups by the identity of their keys tensors: the keys of each occurrence, and the
    distinct keys a gradient summed per key carries. Tensors are held weakly: an entry
    lives while its keys do (a graph's tensors, while the graph does), and only the latest
    `capacity` entries are kept."""

    def __init__(self, capacity=256):
        self._capacity = capacity
        self._entries = collections.OrderedDict()

    def add(self, table, keys, unique, routing):
        """Records a lookup of `keys` (one per occurrence) in `table`."""
        for key in [key for key, (ref, _, _) in self._entries.items() if ref() is None]:
            del self._entries[key]
        lookup = Lookup(table, unique, routing)
        self._entries[id(keys)] = (weakref.ref(keys), lookup, False)
        self._entries[id(unique)] = (weakref.ref(unique), lookup, True)
        while len(self._entries) > self._capacity:
            self._entries.popitem(last=False)

    def of(self, keys):
        """(the lookup, whether `keys` are its distinct keys rather than one per
        occurrence) for a gradient's indices `keys`, or (None, False) where they are
        neither."""
        # Optimizers and strategies pass a gradient's indices through tf.identity.
        while not isinstance(keys, tf.__internal__.EagerTensor) and keys.op.type == "Identity":
            keys = keys.op.inputs[0]
        entry = self._entries.get(id(keys))
        if entry is None or entry[0]() is not keys:
            return None, False
        return entry[1], entry[2]


ROUTES = LookupRoutes()


def summed_per_key(gradient):
    """(the lookup, the gradient's values summed per key in the order of the lookup's
    distinct keys) for IndexedSlices over the keys of a lookup ROUTES knows, or (None,
    None) for any other."""
    lookup, summed = ROUTES.of(gradient.indices)
    if lookup is None:
        return None, None
    if summed:
        return lookup, gradient.values
    return lookup, keys_lib.sum_by_key(gradient.indices, gradient.values)[1]
