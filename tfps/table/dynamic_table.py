"""DynamicTable: a growable hash-table embedding with a server-side optimizer."""

import collections
import itertools
import json
import os

import tensorflow as tf
from google.protobuf import wrappers_pb2
from tensorflow.python.saved_model import registration

from tfps.table import admission as admission_lib
from tfps import _arguments as arguments
from tfps.table import eviction as eviction_lib
from tfps.table import initializers as initializers_lib
from tfps.table import optimizers as optimizers_lib
from tfps.table import storage as storage_lib
from tfps._ops import ops


class TableRows(collections.namedtuple("TableRows", ["keys", "values", "slots", "metadata"])):
    """Rows of a table, as exported and imported.

    keys: int64 [n]. values: float32 [n, dim]. slots: float32 [n, num_slots, dim].
    metadata: int64 [n, 4], columns (occurrence count: how often training looked the key
    up, each occurrence in a batch counting; last-seen step of the table's clock; optimizer
    step; the DecayedFrequency score as of the last-seen step, as the bits of a float32, 0
    without that policy: `scores` reads it; at clock c it has decayed to score *
    decay^(c - last-seen step)). Rows exported before scores existed have 3 columns;
    import_rows takes both.
    """

    __slots__ = ()

    @property
    def scores(self):
        """The DecayedFrequency scores (float32 [n]; 0 where the table keeps none)."""
        if self.metadata.shape[-1] == 3:
            return tf.zeros(tf.shape(self.metadata)[:1], tf.float32)
        return tf.bitcast(tf.cast(self.metadata[:, 3], tf.uint32), tf.float32)


def payload_bytes(dim, optimizer):
    """Bytes of a row's value and slots in a table of `dim` with `optimizer`."""
    return 4 * dim * (1 + optimizers_lib.get(optimizer).num_slots)


_INT64_MAX = (1 << 63) - 1
_table_ids = itertools.count()


def config_proto(config):
    """A SavedModel's record of a table's constructor arguments (JSON in a StringValue)."""
    return wrappers_pb2.StringValue(value=json.dumps(config, sort_keys=True))


def config_from_proto(proto, what):
    if not proto.Is(wrappers_pb2.StringValue.DESCRIPTOR):
        raise ValueError(f"tfps: the SavedModel's {what} holds no tfps configuration")
    unpacked = wrappers_pb2.StringValue()
    proto.Unpack(unpacked)
    return json.loads(unpacked.value)


@registration.register_serializable(package="tfps", name="DynamicTable")
class DynamicTable(tf.saved_model.experimental.TrackableResource):
    """Maps 64-bit keys to float rows; grows as keys arrive; applies its own optimizer.

    Every key of the 64-bit space is an ordinary key. A key that is absent reads as its
    initial value, a function of (seed, key) only. The table is a TF2 trackable:
    `tf.train.Checkpoint` saves and restores every key, value, slot and metadata, and the
    table's clock, streamed to a file of its own (tfps.checkpoint).

    Args:
      dim: width of each row.
      optimizer: a `tfps.optimizers` instance or name; applied by `apply_gradients`.
      initializer: a `tfps.initializers` instance or name.
      seed: seed of the initial values.
      name: prefix of the table's resource name.
      huge_pages: keep rows on transparent huge pages: faster growth on bare metal, but
        on virtual machines a fresh huge page can stall for a long time. Default: the
        environment variable TFPS_HUGE_PAGES=1, else off.
      admission: a `tfps.admission` policy (None: every key looked up gets a row).
      eviction: a `tfps.eviction` policy (None: rows stay until removed).
      max_rows: a cap on this table's rows (None: none); inserts beyond it evict rows, in
        the eviction policy's order (least recently seen by default).
      storage: `tfps.storage.Tiered(path=..., memory_rows=...)` keeps the payloads of the
        rows beyond a memory budget on local disk (None or `tfps.storage.InMemory()`: every
        row in memory).
    """

    def __init__(self, dim, optimizer="adagrad", initializer=None, seed=0,
                 name="dynamic_table", huge_pages=None, admission=None, eviction=None,
                 max_rows=None, storage=None):
        dim = arguments.positive_int(dim, "dim", "DynamicTable")
        seed = arguments.seed(seed, "DynamicTable")
        self._dim = dim
        self._optimizer = optimizers_lib.get(optimizer)
        self._initializer = initializers_lib.get(
            initializer if initializer is not None else initializers_lib.RandomUniform())
        self._seed = seed
        self._name = name
        self._admission = admission_lib.get(admission)
        self._eviction = eviction_lib.get(eviction)
        self._max_rows = eviction_lib.check_max_rows(max_rows, "DynamicTable", self._eviction)
        self._storage = storage_lib.get(storage) or storage_lib.InMemory()
        if huge_pages is None:
            huge_pages = os.environ.get("TFPS_HUGE_PAGES", "0") == "1"
        self._huge_pages = bool(huge_pages)
        self._shared_name = f"{name}_{next(_table_ids)}_{id(self):x}"
        self._tier_directory = self._storage.claim_directory(self, name)
        # A shard of a ShardedTable, whose checkpoint saver writes this table's rows.
        self.in_sharded_table = False
        super().__init__()
        with tf.init_scope():
            self._resource_handle = self._create_resource()

    @property
    def dim(self):
        return self._dim

    @property
    def optimizer(self):
        return self._optimizer

    @property
    def initializer(self):
        return self._initializer

    @property
    def seed(self):
        return self._seed

    @property
    def name(self):
        return self._name

    @property
    def num_slots(self):
        return self._optimizer.num_slots

    @property
    def admission(self):
        return self._admission

    @property
    def eviction(self):
        return self._eviction

    @property
    def max_rows(self):
        return self._max_rows

    @property
    def storage(self):
        return self._storage

    @property
    def payload_bytes(self):
        """Bytes of a row's value and optimizer slots (what a tiered table moves to disk)."""
        return payload_bytes(self._dim, self._optimizer)

    def _create_resource(self):
        hyperparameters = self._optimizer.op_params()
        return ops.tfps_table_create(
            dim=self._dim,
            optimizer=self._optimizer.op_name,
            learning_rate=self._optimizer.learning_rate,
            optimizer_params=list(hyperparameters.values()),
            optimizer_param_names=list(hyperparameters),
            initializer=self._initializer.op_name,
            initializer_params=self._initializer.op_params(),
            seed=self._seed,
            huge_pages=self._huge_pages,
            shared_name=self._shared_name,
            **admission_lib.op_attrs(self._admission),
            **eviction_lib.op_attrs(self._eviction, self._max_rows or 0),
            **self._storage.op_attrs(self._tier_directory, self.payload_bytes))

    def get_config(self):
        return {"dim": self._dim, "optimizer": optimizers_lib.serialize(self._optimizer),
                "initializer": initializers_lib.serialize(self._initializer), "seed": self._seed,
                "name": self._name, "huge_pages": self._huge_pages,
                "admission": admission_lib.serialize(self._admission),
                "eviction": eviction_lib.serialize(self._eviction), "max_rows": self._max_rows,
                "storage": storage_lib.serialize(self._storage)}

    # A SavedModel revives the table from its arguments, so that loading needs tfps's
    # Python classes (whose ops the table's functions use anyway) and not a traced create
    # function; the rows come back through the checkpoint (tfps.checkpoint).
    def _serialize_to_proto(self, object_proto=None, **kwargs):
        return config_proto(self.get_config())

    @classmethod
    def _deserialize_from_proto(cls, proto=None, **kwargs):
        return cls(**config_from_proto(proto, "DynamicTable"))

    def _destroy_resource(self):
        # Without this, an eager table would live in the resource manager until the
        # process ends, as TensorFlow's own tables do.
        tf.raw_ops.DestroyResourceOp(resource=self.resource_handle, ignore_lookup_error=True)

    # Lookups and updates.

    def find(self, keys, return_exists=False):
        """Rows of `keys` without inserting; absent keys read as their initial value.

        Args:
          keys: int64/uint64 (int32 is widened) tensor of any shape S.
          return_exists: also return a bool tensor of shape S, true where the key is present.

        Returns:
          float32 [*S, dim], and the exists mask if asked for.
        """
        keys = _as_keys(keys, "find")
        values, exists = ops.tfps_table_find(self.resource_handle, keys, dim=self._dim)
        return (values, exists) if return_exists else values

    def find_or_insert(self, keys, occurrences=None, return_admitted=False):
        """Rows of `keys`, inserting absent keys with their initial value: float32 [*S, dim].

        Each key's occurrence count (metadata column 0) grows by its entry of `occurrences`
        (int64, the keys' shape: how often the key occurred in the data a caller deduplicated)
        or by 1 per entry of `keys`, and its last-seen step becomes the table's clock. Under
        an admission policy an absent key is only counted until admitted, and reads its
        initial value; `return_admitted` also returns a bool tensor of shape S, true where
        the key had a row when this call looked it up (a `max_rows` cap may evict it for a
        later key of the same call). Then sweeps a few rows for eviction."""
        keys = _as_keys(keys, "find_or_insert")
        occurrences = (tf.zeros([0], tf.int64) if occurrences is None
                       else tf.cast(occurrences, tf.int64))
        values, admitted = ops.tfps_table_find_or_insert(self.resource_handle, keys, occurrences,
                                                         dim=self._dim)
        return (values, admitted) if return_admitted else values

    def apply_gradients(self, keys, gradients, step=-1, learning_rate=None):
        """Applies the optimizer to each key's row, atomically per row.

        Args:
          keys: [n] unique keys (a repeated key is updated once per occurrence).
          gradients: float32 [n, dim], already summed per key.
          step: int64 scalar recorded as each key's last-seen step; negative (the
            default) records the table's clock, its own count of apply calls, as a
            training lookup does.
          learning_rate: float scalar for this call (e.g. a schedule's value); None: the
            optimizer's learning rate the table was created with.

        Raises:
          InvalidArgumentError: if a gradient is NaN or Inf (no row is changed), or shapes
            do not match.
        """
        keys = _as_keys(keys, "apply_gradients")
        gradients = self._optimizer.clipped(_as_float(gradients, "apply_gradients", "gradients"))
        step = tf.cast(step, tf.int64)
        rate = tf.constant(-1.0) if learning_rate is None else tf.cast(learning_rate, tf.float32)
        return ops.tfps_table_apply_gradients(self.resource_handle, keys, gradients, step, rate,
                                              dim=self._dim)

    def insert(self, keys, values):
        """Sets the value rows of `keys` [n] to `values` [n, dim]; slots are kept."""
        keys = _as_keys(keys, "insert")
        values = _as_float(values, "insert", "values")
        return ops.tfps_table_insert(self.resource_handle, keys, values, dim=self._dim)

    def remove(self, keys):
        """Removes `keys` [n]; returns how many were present (int64 scalar)."""
        return ops.tfps_table_remove(self.resource_handle, _as_keys(keys, "remove"))

    def size(self):
        """Number of keys (int64 scalar)."""
        return ops.tfps_table_size(self.resource_handle)

    def clock(self):
        """How many apply_gradients calls the table has run: the step it records for a
        negative `step` (int64 scalar). Saved and restored with the rows."""
        return ops.tfps_table_clock(self.resource_handle)

    STATS = ("rows", "memory_bytes", "row_memory_bytes", "clock", "admitted", "pending",
             "rejected", "evicted", "skipped_steps", "rows_in_memory", "payload_memory_bytes",
             "disk_bytes", "lookup_hits", "lookup_misses", "payloads_read", "payloads_demoted")

    def stats(self):
        """The table's statistics as ints, read in one op where the table lives (eager):
        rows; memory_bytes (index, rows as backed, and the counts of keys waiting for
        admission); row_memory_bytes (the rows' part); clock; admitted (rows created by training lookups and
        applies); pending (keys waiting for admission, estimated for a sketch); rejected
        (occurrences of keys looked up without a row: their gradients dropped); evicted
        (rows removed by eviction); skipped_steps (optimizer steps that included the table
        and were skipped for a non-finite gradient, DynamicEmbedding(non_finite="skip")).
        Tiers (tfps.storage.Tiered; a table in memory has every row in memory and zeros):
        rows_in_memory (rows whose value and slots are in memory); payload_memory_bytes
        (their blocks, part of memory_bytes, which also counts the disk store's caches);
        disk_bytes (the disk tier's files); lookup_hits and lookup_misses (rows training
        lookups and finds found with their payloads in memory, and read from disk: the RAM
        hit rate is hits / (hits + misses); new keys count in neither); payloads_read (read
        from disk by any call: lookups, updates, saves, exports); payloads_demoted (moved to
        disk to keep within the budget)."""
        return dict(zip(self.STATS, ops.tfps_table_stats(self.resource_handle).numpy().tolist()))

    def count_skipped_step(self):
        """Counts an optimizer step that included the table and was skipped for a non-finite
        gradient (stats()["skipped_steps"]); no row changes."""
        return ops.tfps_table_count_skipped_step(self.resource_handle)

    def evict(self):
        """Sweeps the whole table now, removing the rows the eviction policy says go (TTL,
        DecayedFrequency); returns how many went (int64 scalar)."""
        return ops.tfps_table_evict(self.resource_handle)

    def set_clock(self, clock):
        return ops.tfps_table_set_clock(self.resource_handle, tf.cast(clock, tf.int64))

    def clear(self):
        return ops.tfps_table_clear(self.resource_handle)

    # Export and import.

    def export_chunk(self, cursor, max_rows):
        """Up to `max_rows` rows from `cursor` (0 starts): (TableRows, next_cursor).

        next_cursor is -1 when the table is exhausted. Usable in tf.function.
        """
        keys, values, slots, metadata, next_cursor = ops.tfps_table_export(
            self.resource_handle, tf.cast(cursor, tf.int64), tf.cast(max_rows, tf.int64),
            dim=self._dim, num_slots=self.num_slots)
        return TableRows(keys, values, slots, metadata), next_cursor

    def export_chunks(self, max_rows=65536):
        """Yields TableRows of at most `max_rows` rows until every row was seen (eager)."""
        cursor = 0
        while cursor >= 0:
            rows, next_cursor = self.export_chunk(cursor, max_rows)
            cursor = int(next_cursor)
            if int(tf.size(rows.keys)) > 0:
                yield rows

    def export(self):
        """Every row of the table as one TableRows (one copy of the table)."""
        rows, _ = self.export_chunk(0, _INT64_MAX)
        return rows

    def import_rows(self, rows):
        """Writes `TableRows` (keys, values, slots, metadata) into the table."""
        keys = _as_keys(rows.keys, "import_rows")
        return ops.tfps_table_import(
            self.resource_handle, tf.cast(keys, tf.int64),
            _as_float(rows.values, "import_rows", "values"),
            _as_float(rows.slots, "import_rows", "slots"),
            tf.cast(rows.metadata, tf.int64), dim=self._dim, num_slots=self.num_slots)


def _as_keys(keys, method):
    if not isinstance(keys, (tf.Tensor, tf.Variable)) and not hasattr(keys, "dtype"):
        keys = tf.convert_to_tensor(keys, dtype=tf.int64)
    elif not isinstance(keys, tf.Tensor):
        keys = tf.convert_to_tensor(keys)
    if keys.dtype in (tf.int64, tf.uint64):
        return keys
    if keys.dtype in (tf.int32, tf.uint32, tf.int16, tf.uint16, tf.int8, tf.uint8):
        return tf.cast(keys, tf.int64)
    raise TypeError(f"DynamicTable.{method}: keys must be an integer tensor (int64, uint64 or "
                    f"narrower ints), got {keys.dtype.name}")


def _as_float(x, method, what):
    x = tf.convert_to_tensor(x)
    if x.dtype == tf.float32:
        return x
    if x.dtype.is_floating or x.dtype.is_integer:
        return tf.cast(x, tf.float32)
    raise TypeError(f"DynamicTable.{method}: {what} must be float32, got {x.dtype.name}")
