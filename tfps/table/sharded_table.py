"""A dynamic table split into shards, one per parameter-server task."""

import collections
import concurrent.futures

import tensorflow as tf
from tensorflow.python.saved_model import registration
from tensorflow.python.trackable import base as trackable_base

from tfps.table import _stock_ops as stock_ops
from tfps.table import eviction as eviction_lib
from tfps.table import keys as keys_lib
from tfps.table import storage as storage_lib
from tfps.table.dynamic_table import DynamicTable, TableRows, config_from_proto, config_proto, payload_bytes

_SHARD_PREFIX = "shard_"
# What training's rows and gradients may cross between a worker and the parameter servers
# as. float16 is not offered: a step's gradient of a row is often below its smallest
# normal number (6e-5), where its precision runs out; bfloat16 has float32's range.
TRANSFER_DTYPES = (tf.float32, tf.bfloat16)


def check_transfer_dtype(value, owner):
    """`value` as one of TRANSFER_DTYPES, or ValueError naming it."""
    try:
        dtype = tf.as_dtype(value)
    except TypeError:
        dtype = None
    if dtype not in TRANSFER_DTYPES:
        raise ValueError(f"{owner}: transfer_dtype must be float32 or bfloat16, got {value!r}"
                         + (" (float16 would lose small gradients: use bfloat16)"
                            if dtype == tf.float16 else ""))
    return dtype


def task_devices(job, strategy=None):
    """The CPU devices of a ParameterServerStrategy's tasks of `job` ("ps" or "worker");
    [None] (this process) for any other strategy."""
    strategy = strategy or tf.distribute.get_strategy()
    if not isinstance(strategy, tf.distribute.experimental.ParameterServerStrategy):
        return [None]
    # extended.parameter_devices names the coordinator in ParameterServerStrategyV2.
    count = getattr(strategy.extended, {"ps": "_num_ps", "worker": "_num_workers"}[job], None)
    if count is None:
        count = strategy.extended._cluster_spec.num_tasks(job)  # pylint: disable=protected-access
    return [f"/job:{job}/replica:0/task:{i}/device:CPU:0" for i in range(count)]


def parameter_server_devices(strategy=None):
    """Devices of the PS tasks of a ParameterServerStrategy; [None] for any other strategy."""
    return task_devices("ps", strategy)


def on_every_shard(calls):
    """Runs each shard's op-building call; their results in order. Eagerly, each op blocks
    until its parameter server is done, so the shards' calls run in threads of their own,
    every shard working at once; in a graph the runtime runs them in parallel anyway."""
    if len(calls) < 2 or not tf.executing_eagerly():
        return [call() for call in calls]
    with concurrent.futures.ThreadPoolExecutor(len(calls)) as pool:
        return list(pool.map(lambda call: call(), calls))


class Routing(collections.namedtuple("Routing", ["shard", "positions", "shard_keys"])):
    """Of int64 keys [n]: each one's shard (int32 [n]; None with one shard), and per shard
    the positions of its keys among them and those keys."""


@registration.register_serializable(package="tfps", name="ShardedTable")
class ShardedTable(tf.__internal__.tracking.Trackable):
    """One DynamicTable per device; keys go to shard `keys.shard_of(key, num_shards)`.

    Calls partition their keys on the calling device (a worker, under
    ParameterServerStrategy) and issue one op per shard, which runs on that shard's
    device. A checkpoint holds every row of every shard, each shard written by its own
    device (tfps.checkpoint); restoring re-partitions the rows over however many shards
    the table has now.

    Args:
      dim, optimizer, initializer, seed, name, admission, eviction: as for DynamicTable.
      max_rows: a cap on the table's rows, split evenly over the shards (None: none).
      storage: as for DynamicTable; a Tiered budget is split evenly over the shards, each of
        which keeps its disk tier on its own parameter server's disk.
      devices: one device per shard; None means the current strategy's PS tasks (one
        local shard when there are none).
      transfer_dtype: what training's rows (find_or_insert) and gradients (apply_gradients)
        travel as between the calling device and the shards: float32, or bfloat16 (half the
        bytes; the rows a training lookup returns and the gradients the shards apply are
        rounded to it, the shards keep float32). find, export and serving stay float32.
    """

    def __init__(self, dim, optimizer="adagrad", initializer=None, seed=0, name="table",
                 devices=None, admission=None, eviction=None, max_rows=None,
                 transfer_dtype=tf.float32, storage=None):
        self.transfer_dtype = check_transfer_dtype(transfer_dtype, "ShardedTable")
        self._devices = list(devices) if devices is not None else parameter_server_devices()
        max_rows = eviction_lib.check_max_rows(max_rows, "ShardedTable", eviction_lib.get(eviction))
        shard_caps = eviction_lib.split_max_rows(max_rows, len(self._devices))
        self._storage = storage_lib.get(storage) or storage_lib.InMemory()
        shard_storage = self._storage.shares(payload_bytes(dim, optimizer), len(self._devices))
        self._shards = []
        for i, (device, cap) in enumerate(zip(self._devices, shard_caps)):
            with tf.init_scope(), tf.device(device):
                self._shards.append(DynamicTable(dim, optimizer=optimizer, initializer=initializer,
                                                 seed=seed, name=f"{name}_shard{i}",
                                                 admission=admission, eviction=eviction,
                                                 max_rows=cap or None, storage=shard_storage[i]))
        for shard in self._shards:
            shard.in_sharded_table = True
        self._dim = dim
        self._name = name

    # In a SavedModel the shards are the table's children, so that the functions that use
    # them find their resources; a checkpoint has none, since the table's saver
    # (tfps.checkpoint) writes every shard's rows and restores them into any number of shards.
    def _trackable_children(self, save_type=trackable_base.SaveType.CHECKPOINT, **kwargs):
        if save_type != trackable_base.SaveType.SAVEDMODEL:
            return {}
        return {f"{_SHARD_PREFIX}{i}": shard for i, shard in enumerate(self._shards)}

    def _lookup_dependency(self, name, cached_dependencies=None):
        index = name[len(_SHARD_PREFIX):] if name.startswith(_SHARD_PREFIX) else ""
        return self._shards[int(index)] if index.isdigit() and int(index) < len(self._shards) else None

    def _add_trackable_child(self, name, value):
        # A SavedModel being loaded hands back its shards; a table that has its own (a
        # Keras layer rebuilt from its config) keeps them, and the rows come from the saver.
        if name.startswith(_SHARD_PREFIX) and int(name[len(_SHARD_PREFIX):]) == len(self._shards):
            value.in_sharded_table = True
            self._shards.append(value)
            self._devices.append(None)

    def _serialize_to_proto(self, object_proto=None, **kwargs):
        return config_proto({"dim": self._dim, "name": self._name})

    @classmethod
    def _deserialize_from_proto(cls, proto=None, **kwargs):
        config = config_from_proto(proto, "ShardedTable")
        return cls(config["dim"], name=config["name"], devices=[])

    @property
    def dim(self):
        return self._dim

    @property
    def shards(self):
        return list(self._shards)

    @property
    def devices(self):
        """The device of each shard (None: the current device)."""
        return list(self._devices)

    @property
    def num_shards(self):
        return len(self._shards)

    @property
    def num_slots(self):
        return self._shards[0].num_slots

    def route(self, keys):
        """Where each of int64 `keys` [n] goes: a Routing that per_shard takes for these keys
        again, so a lookup's update partitions only its gradients and sends its parameter
        servers the very key tensors the lookup sent (the runtime transfers each once)."""
        keys = as_int64_keys(keys)
        if self.num_shards == 1:
            return Routing(None, [None], [keys])
        shard = keys_lib.shard_of(keys, self.num_shards)
        return Routing(shard, *stock_ops.partition_by_shard(keys, shard, self.num_shards))

    def _partition(self, keys, *tensors, routing=None):
        """Per shard: (positions in keys, keys, *tensors) of the keys routed to it."""
        routing = routing or self.route(keys)
        if routing.shard is None:
            return [(None, routing.shard_keys[0]) + tensors]
        parts = [tf.dynamic_partition(t, routing.shard, self.num_shards) for t in tensors]
        return [(routing.positions[i], routing.shard_keys[i]) + tuple(p[i] for p in parts)
                for i in range(self.num_shards)]

    def per_shard(self, fn, keys, *tensors, routing=None):
        """fn(shard table, its keys, *its slices of tensors) on each shard's device: the
        results, and the positions of each shard's keys in `keys` (None: all of them).
        routing: `keys`' Routing from route(), if the caller has it."""
        results, positions = [], []
        for table, device, (shard_positions, *parts) in zip(
                self._shards, self._devices, self._partition(keys, *tensors, routing=routing)):
            with tf.device(device):
                results.append(fn(table, *parts))
            positions.append(shard_positions)
        return results, positions

    def _gather_back(self, positions, pieces):
        return pieces[0] if positions[0] is None else tf.dynamic_stitch(positions, pieces)

    def find_or_insert(self, keys, occurrences=None, return_admitted=False, routing=None):
        """Rows of integer keys of any shape S, inserting new ones: float32 S + [dim]; each
        key's count grows by its `occurrences` (int64 S) or by 1. With `return_admitted`,
        also a bool S mask of the keys that have a row (see DynamicTable.find_or_insert).
        routing: route() of the keys (flattened), if the caller keeps it for the update."""
        flat, shape = _flattened(keys)
        counts = () if occurrences is None else (tf.reshape(tf.cast(occurrences, tf.int64), [-1]),)

        def sent(table, shard_keys, *shard_counts):
            rows, admitted = table.find_or_insert(shard_keys, *shard_counts, return_admitted=True)
            return tf.cast(rows, self.transfer_dtype), admitted

        found, positions = self.per_shard(sent, flat, *counts, routing=routing)
        rows = tf.cast(self._gather_back(positions, [rows for rows, _ in found]), tf.float32)
        values = self._shaped(rows, shape)
        if not return_admitted:
            return values
        return values, tf.reshape(self._gather_back(positions, [a for _, a in found]), shape)

    def find(self, keys, return_exists=False):
        """Rows of integer keys of any shape S without inserting (float32 S + [dim]), and
        optionally the exists mask (bool S)."""
        flat, shape = _flattened(keys)
        found, positions = self.per_shard(lambda t, k: t.find(k, return_exists=True), flat)
        values = self._shaped(self._gather_back(positions, [rows for rows, _ in found]), shape)
        if not return_exists:
            return values
        return values, tf.reshape(self._gather_back(positions, [exists for _, exists in found]), shape)

    def _shaped(self, rows, shape):
        return tf.reshape(rows, tf.concat([shape, [self._dim]], 0))

    def apply_gradients(self, keys, gradients, step=-1, learning_rate=None, routing=None):
        """Applies each shard's optimizer to its unique keys [n] with gradients [n, dim]
        (at `learning_rate`, None: the optimizer's own), sent as `transfer_dtype`.
        routing: route() of these keys, if the caller has it (a lookup's)."""
        return tf.group(self.per_shard(
            lambda t, k, g: t.apply_gradients(k, tf.cast(g, tf.float32), step, learning_rate),
            keys, tf.cast(gradients, self.transfer_dtype), routing=routing)[0])

    def insert(self, keys, values):
        return tf.group(self.per_shard(lambda t, k, v: t.insert(k, v), keys, values)[0])

    def remove(self, keys):
        """Removes `keys` [n]; returns how many were present (int64 scalar)."""
        return tf.add_n(self.per_shard(lambda t, k: t.remove(k), keys)[0])

    def size(self):
        return tf.add_n([table.size() for table in self._shards])

    def shard_sizes(self):
        """Keys per shard (eager: a list of ints)."""
        return [int(table.size()) for table in self._shards]

    def clear(self):
        return tf.group([table.clear() for table in self._shards])

    # Statistics every shard counts alike, of which the table's is the largest, not the sum.
    _STATS_OF_EVERY_SHARD = ("clock", "skipped_steps")

    def stats(self):
        """The table's statistics: each shard's (DynamicTable.stats, on its own device) under
        "shards", and their sums (the clock and skipped steps: the largest) at the top level
        (eager)."""
        shards = [table.stats() for table in self._shards]
        totals = {name: (max if name in self._STATS_OF_EVERY_SHARD else sum)(s[name] for s in shards)
                  for name in DynamicTable.STATS}
        return {**totals, "shards": shards}

    def count_skipped_step(self):
        """Counts a skipped optimizer step on every shard (DynamicTable.count_skipped_step)."""
        return tf.group([table.count_skipped_step() for table in self._shards])

    def evict(self):
        """Sweeps every shard now (each on its own device), removing the rows the eviction
        policy says go; returns how many went (int64 scalar)."""
        return tf.add_n([table.evict() for table in self._shards])

    def clocks(self):
        """Each shard's clock (int64 [num_shards]): its count of apply_gradients calls."""
        return tf.stack([table.clock() for table in self._shards])

    def set_clocks(self, clock):
        """Sets every shard's clock to `clock` (a scalar: the latest of a saved table's)."""
        return tf.group([table.set_clock(clock) for table in self._shards])

    def export(self):
        """Every row of every shard as one TableRows."""
        parts = [table.export() for table in self._shards]
        return TableRows(*(tf.concat([getattr(p, f) for p in parts], 0) for f in TableRows._fields))

    def export_chunks(self, max_rows=65536):
        """Yields TableRows chunks of at most max_rows rows, shard after shard (eager)."""
        for table in self._shards:
            yield from table.export_chunks(max_rows)

    def import_rows(self, rows):
        return tf.group(self.per_shard(
            lambda t, keys, values, slots, metadata: t.import_rows(TableRows(keys, values, slots, metadata)),
            rows.keys, rows.values, rows.slots, rows.metadata)[0])


def as_int64_keys(keys, what="ShardedTable: keys"):
    """Keys as int64 for routing and the shards' ops: narrower ints widen, uint64 keeps its
    bits (the table reads both as the same 64-bit key). `what` names them in the error."""
    keys = tf.convert_to_tensor(keys) if not isinstance(keys, tf.Tensor) else keys
    if keys.dtype == tf.uint64:
        return tf.bitcast(keys, tf.int64)
    if keys.dtype == tf.int64:
        return keys
    if keys.dtype.is_integer:
        return tf.cast(keys, tf.int64)
    raise TypeError(f"{what} must be integers (int64, uint64 or narrower), got {keys.dtype.name}")


def _flattened(keys):
    """(int64 keys [n], the shape they came in)."""
    keys = as_int64_keys(keys)
    return tf.reshape(keys, [-1]), tf.shape(keys)
