"""A worker's cache of a sharded table's rows, GEO-style: hot rows read and trained
locally for a few steps, their gradients summed locally and pushed once.

Time on a worker runs in cycles of `max_staleness_steps + 1` optimizer steps. The first
training lookup of a key in a cycle pulls its row from the parameter servers, as without a
cache, and keeps a copy while room remains (`capacity` rows); later lookups in the cycle
read the copy. Each step's gradient of a kept row trains the copy with the table's own
optimizer (from fresh slots: the worker sees its own steps at once) and adds to the row's
sum. A copy stands for the row the worker's next pull will bring, which every worker's
steps move, and other workers' gradients of a hot row resemble this one's: so the copy
trains at the number of workers times the table's learning rate. Only the true sums
reach the parameter servers. The last step of the cycle sends each sum in that step's
one apply call to the parameter servers, whose optimizer applies it once, at that
step's learning rate, and empties the cache. So the parameter servers' rows and slots
change once per cycle per row, and a worker sees other workers' pushes from its next
cycle on: a copy lags the parameter servers by at most `max_staleness_steps` steps. Keys
the cache has no room for, and keys not admitted yet, go to the parameter servers every
step, as without a cache. With max_staleness_steps=0 every row is pulled and pushed in its
own step and training is exactly uncached training; every step still makes one apply call
per parameter server (the tables' clocks count steps as without a cache).

The cache is two tfps tables in the memory of the task that runs the step (a worker under
ParameterServerStrategy, the process otherwise), found by name on each run: the copies
(with the table's optimizer), and the gradient sums (an SGD table at learning rate 1
applied to negated gradients, so each row is the exact running sum). The step counter is
the sums table's clock, which counts the apply calls. `flush()` pushes what every worker
holds, at the end of training.
"""

import itertools
import logging
import weakref

import tensorflow as tf

from tfps import _arguments as arguments
from tfps._ops import ops
from tfps.table import eviction as eviction_lib
from tfps.table.sharded_table import task_devices

_INT64_MAX = (1 << 63) - 1
_ROWS, _SUMS = "rows", "sums"
_cache_ids = itertools.count()


def check_arguments(capacity, max_staleness_steps, eviction, owner):
    """(capacity, max_staleness_steps) checked; None, None without a cache."""
    if capacity is None:
        if max_staleness_steps is not None:
            raise ValueError(f"{owner}: max_staleness_steps={max_staleness_steps!r} needs "
                             "worker_cache_rows (the cache's size in rows)")
        return None, None
    capacity = arguments.positive_int(capacity, "worker_cache_rows", owner)
    if max_staleness_steps is None:
        raise ValueError(f"{owner}: worker_cache_rows={capacity} needs max_staleness_steps, how "
                         "many steps a worker may read a cached row after pulling it (0: rows "
                         "are pulled every step, as without a cache)")
    if not arguments.is_int(max_staleness_steps) or max_staleness_steps < 0:
        raise ValueError(f"{owner}: max_staleness_steps must be an int >= 0, got {max_staleness_steps!r}")
    if isinstance(eviction, (eviction_lib.DecayedFrequency, eviction_lib.LFU)):
        raise ValueError(
            f"{owner}: eviction={eviction!r} scores rows by their occurrences, but a worker cache "
            "reads a cached row without the parameter servers counting it; use TTL or LRU")
    if (isinstance(eviction, eviction_lib.TTL) and eviction.steps is not None
            and eviction.steps <= max_staleness_steps + 1):
        raise ValueError(
            f"{owner}: eviction=TTL(steps={eviction.steps}) would evict rows a worker cache is "
            f"still training: a cached row is seen by the parameter servers once every "
            f"max_staleness_steps + 1 = {max_staleness_steps + 1} steps; give a longer TTL")
    return capacity, int(max_staleness_steps)


class WorkerCache:
    """The cache of `table` (a ShardedTable) on each worker; see the module's docstring.

    Args:
      table: the ShardedTable whose rows are cached.
      capacity: rows the cache holds at most, per worker.
      max_staleness_steps: a cycle's steps less one: how far a copy lags at most.
      name: the start of the name each worker finds its cache by (made unique here).
    Made under the strategy whose workers hold the cache.
    """

    def __init__(self, table, capacity, max_staleness_steps, name):
        self.table = table
        self.capacity = capacity
        self.max_staleness_steps = max_staleness_steps
        self._name = f"{name}_{next(_cache_ids)}_{id(self):x}/worker_cache"
        self._handles_by_graph = weakref.WeakKeyDictionary()
        self._devices = task_devices("worker")  # the workers' memory holds the caches
        self.copy_rate_scale = len(self._devices)  # the copies' learning rate over the table's

    @property
    def cycle_steps(self):
        return self.max_staleness_steps + 1

    def _handles(self):
        """The (rows, sums) tables' handles, made once per graph: ops on one handle tensor
        run in program order, which ops on two handles of one table would not."""
        if tf.executing_eagerly():
            return self._create(_ROWS), self._create(_SUMS)
        graph = tf.compat.v1.get_default_graph()
        if graph not in self._handles_by_graph:
            self._handles_by_graph[graph] = (self._create(_ROWS), self._create(_SUMS))
        return self._handles_by_graph[graph]

    def _create(self, part):
        if part == _ROWS:  # trains the copies as the table trains its rows
            optimizer = self.table.shards[0].optimizer
            params = optimizer.op_params()
            return ops.tfps_table_create(
                dim=self.table.dim, optimizer=optimizer.op_name, learning_rate=optimizer.learning_rate,
                optimizer_params=list(params.values()), optimizer_param_names=list(params),
                initializer="zeros", shared_name=f"{self._name}/{part}")
        return ops.tfps_table_create(dim=self.table.dim, optimizer="sgd", learning_rate=1.0,
                                     initializer="zeros", shared_name=f"{self._name}/{part}")

    def lookup(self, unique, occurrences):
        """Training rows of `unique` keys [n] with their `occurrences` [n]: (rows [n, dim],
        admitted bool [n]), as ShardedTable.find_or_insert(..., return_admitted=True)."""
        rows_table, _ = self._handles()
        dim = self.table.dim
        cached_rows, hit = ops.tfps_table_find(rows_table, unique, dim=dim)
        missed = tf.reshape(tf.where(tf.logical_not(hit)), [-1])
        missed_keys = tf.gather(unique, missed)
        pulled, admitted = self.table.find_or_insert(missed_keys, tf.gather(occurrences, missed),
                                                     return_admitted=True)
        room = tf.maximum(self.capacity - ops.tfps_table_size(rows_table), 0)
        kept = tf.reshape(tf.where(admitted), [-1])[:room]
        kept_insert = ops.tfps_table_insert(rows_table, tf.gather(missed_keys, kept),
                                            tf.gather(pulled, kept), dim=dim)
        with tf.control_dependencies([kept_insert]):
            at = missed[:, None]
            rows = tf.tensor_scatter_nd_update(cached_rows, at, pulled)
            return rows, tf.tensor_scatter_nd_update(hit, at, admitted)

    def apply_gradients(self, keys, gradients, learning_rate):
        """One optimizer step's gradient of unique `keys` [n]: cached keys' into their
        copies and sums, the others to the parameter servers, with every sum at the cycle's
        last step."""
        rows_table, sums_table = self._handles()
        dim = self.table.dim
        _, cached = ops.tfps_table_find(rows_table, keys, dim=dim)
        cached_keys, cached_gradients = tf.boolean_mask(keys, cached), tf.boolean_mask(gradients, cached)
        summed = ops.tfps_table_apply_gradients(sums_table, cached_keys, -cached_gradients,
                                                tf.constant(-1, tf.int64), tf.constant(1.0), dim=dim)
        # The copies train as the table's rows do (clipped per row), at copy_rate_scale
        # times this step's rate.
        local = ops.tfps_table_apply_gradients(
            rows_table, cached_keys, self.table.shards[0].optimizer.clipped(cached_gradients),
            tf.constant(-1, tf.int64), self._copy_rate(learning_rate), dim=dim)
        with tf.control_dependencies([summed, local]):
            cycle_ends = tf.equal(ops.tfps_table_clock(sums_table) % self.cycle_steps, 0)
            sum_keys, sums = tf.cond(cycle_ends, lambda: self._sums(sums_table),
                                     lambda: self._no_sums(keys))
        direct = tf.logical_not(cached)
        applied = self.table.apply_gradients(
            tf.concat([tf.boolean_mask(keys, direct), sum_keys], 0),
            tf.concat([tf.boolean_mask(gradients, direct), sums], 0), learning_rate=learning_rate)
        with tf.control_dependencies([applied]):
            return tf.cond(cycle_ends, lambda: self._emptied(rows_table, sums_table), tf.no_op)

    def _copy_rate(self, learning_rate):
        """The copies' learning rate; negative: the table optimizer's own (as created)."""
        if learning_rate is None:
            if self.copy_rate_scale == 1:
                return tf.constant(-1.0)
            learning_rate = self.table.shards[0].optimizer.learning_rate
        return tf.cast(learning_rate, tf.float32) * self.copy_rate_scale

    def _sums(self, sums_table):
        keys, values, _, _, _ = ops.tfps_table_export(
            sums_table, tf.constant(0, tf.int64), tf.constant(_INT64_MAX, tf.int64),
            dim=self.table.dim, num_slots=0)
        return keys, values

    def _no_sums(self, keys):
        return tf.zeros([0], keys.dtype), tf.zeros([0, self.table.dim], tf.float32)

    @staticmethod
    def _emptied(rows_table, sums_table):
        # Each cycle refills the tables to about the same size: they keep their memory.
        return tf.group(ops.tfps_table_clear(rows_table, keep_memory=True),
                        ops.tfps_table_clear(sums_table, keep_memory=True))

    def flush(self, learning_rate=None):
        """Pushes every worker's pending sums to the parameter servers now, at
        `learning_rate` (None: the table optimizer's own), and empties the caches (eager;
        after the steps that fill them have finished)."""
        rate = tf.constant(-1.0) if learning_rate is None else tf.cast(learning_rate, tf.float32)
        for device in self._devices:
            try:
                with tf.device(device):
                    self._flush_here(rate)
            except (tf.errors.UnavailableError, tf.errors.InvalidArgumentError) as e:
                # A worker that died (and is restarting) is unreachable or not yet known
                # again; its cache went with it, and a restarted worker's is empty.
                missing = ("unknown device", "Could not satisfy device specification")
                if isinstance(e, tf.errors.InvalidArgumentError) and not any(m in str(e) for m in missing):
                    raise
                logging.warning("tfps: the worker cache on %s was not pushed (%s): a worker that "
                                "failed loses the gradient sums its cache held", device,
                                type(e).__name__)

    @tf.function(autograph=False)
    def _flush_here(self, learning_rate):
        # A negative rate is the table optimizer's own (Tfps>TableApplyGradients).
        rows_table, sums_table = self._create(_ROWS), self._create(_SUMS)
        keys, sums = self._sums(sums_table)
        pushed = tf.cond(tf.size(keys) > 0,
                         lambda: self.table.apply_gradients(keys, sums, learning_rate=learning_rate),
                         tf.no_op)
        with tf.control_dependencies([pushed]):
            self._emptied(rows_table, sums_table)
