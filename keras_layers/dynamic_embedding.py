"""DynamicEmbedding: a Keras embedding whose table grows with the data and is trained by
the parameter servers."""

import numpy as np
import tensorflow as tf
import tf_keras as keras

from tfps.table import admission as admission_lib
from tfps import _arguments as arguments
from tfps.table import checkpoint as checkpoint_lib
from tfps.table import eviction as eviction_lib
from tfps.table import initializers as initializers_lib
from tfps.keras import _keras3_guard as keras3_guard
from tfps.table import keys as keys_lib
from tfps.keras import _optimizer_bridge as optimizer_bridge
from tfps.table import optimizers as optimizers_lib
from tfps.table import _stock_ops as stock_ops
from tfps.table.sharded_table import ShardedTable
from tfps.table.dynamic_table import TableRows
from tfps.table import _worker_cache as worker_cache_lib

try:
    from tensorflow.python.eager.record import could_possibly_record
except ImportError:  # TensorFlow before 2.13
    from tensorflow.python.eager.tape import could_possibly_record

COMBINERS = (None, "sum", "mean", "sqrtn")
UNSEEN = ("zeros", "initial")


def _checked_namespace(namespace):
    """namespace as the layer uses it: None, "columns", a Python int or an int64 tensor."""
    if namespace is None or (isinstance(namespace, str) and namespace == "columns"):
        return namespace
    if tf.is_tensor(namespace) and namespace.dtype.is_integer:
        return tf.cast(namespace, tf.int64)
    if arguments.is_int(namespace) and -(1 << 63) <= namespace < (1 << 63):
        return int(namespace)
    raise ValueError("DynamicEmbedding: namespace must be an int in [-2^63, 2^63), an integer tensor "
                     f"or 'columns', got {namespace!r}")


@keras.utils.register_keras_serializable(package="tfps")
class DynamicEmbedding(keras.layers.Layer):
    """Embeds 64-bit IDs with a dynamic table sharded over the parameter servers.

    A training lookup (model.fit, training=True, or a plain call under a GradientTape)
    inserts new IDs; its gradient reaches the Keras optimizer through the layer's
    zero-size `table_proxy` variable, and the optimizer's apply step sends it to the table,
    whose own optimizer (`optimizer` below) updates the rows on the parameter servers. So
    the table trains once per optimizer step, with every use of the layer in the step
    summed, after loss-scale unscaling and clipping, and not when the layer is frozen
    (trainable=False) or a step is skipped. In inference (predict, evaluate,
    training=False) nothing is inserted or updated, and an ID never seen reads as zeros
    (unseen="zeros") or as its initial value ("initial").

    Inputs (call(inputs, namespace=None)):
      - dense int32/int64/uint64/string tensor of shape S: output S + [dim], or with a
        combiner, multi-hot along the last axis (rank >= 2): S[:-1] + [dim];
      - RaggedTensor [batch, (k)]: with a combiner [batch, dim] (an empty row gives zeros),
        without one a ragged [batch, (k), dim];
      - SparseTensor [batch, k] (needs a combiner): [batch, dim].
    `namespace` (an int, or an integer tensor of one per ID: of the IDs' shape, or of a
    ragged or sparse input's values) mixes a feature number into the keys, so several
    features share one table without colliding; namespace="columns" gives column j of a
    [batch, k] input namespace j + 1 (26 Criteo fields in one call and one table).

    Args:
      dim: embedding width.
      combiner: None, "sum", "mean" or "sqrtn".
      initializer: tfps.initializers instance or name (default uniform(-0.05, 0.05)).
      optimizer: tfps.optimizers instance or name, applied on the parameter servers.
      key_dtype: the IDs the layer takes. An integer dtype (int32, int64 or uint64; the
        default): integer IDs, and string IDs too, keyed by their fingerprints, so one table
        can serve a string feature and integer ones in other namespaces. "7" and 7 are then
        different keys: a feature that changes kind trains new rows. tf.string: string IDs
        only; integer IDs are refused.
      seed: seed of the initial values; default: one derived from the layer's name, so
        the tables of two layers start independent (an ID's rows are unrelated) and a
        model rebuilt with the same layer names starts from the same rows.
      unseen: "zeros" or "initial": what inference returns for an ID never trained.
      embeddings_regularizer: a Keras regularizer of the rows a training step looks up
        (each distinct row once), added to the layer's losses; a stock Embedding's
        regularizes its whole matrix, which a table of every ID ever seen cannot afford.
      admission: a `tfps.admission` policy: an ID gets a row only once admitted (say
        after MinCount(2) occurrences); until then training reads it as `unseen` says
        and drops its gradient. None: every ID trained gets a row.
      eviction: a `tfps.eviction` policy (TTL, DecayedFrequency; LRU or LFU order a cap).
      max_rows: a cap on the table's rows, split over the parameter servers (None: none).
      worker_cache_rows, max_staleness_steps: a GEO-style cache of up to worker_cache_rows
        rows on each worker (None: no cache). A worker pulls a row once per cycle of
        max_staleness_steps + 1 steps and reads and trains its copy for the rest of the
        cycle; the gradients of cached rows are summed on the worker and pushed in the
        cycle's last step (tfps.table._worker_cache). Fewer bytes to the parameter servers
        for hot IDs, at copies up to max_staleness_steps steps behind them; 0 trains
        exactly as without a cache. model.fit pushes what the caches hold at the end of
        every epoch; a custom loop calls flush_worker_cache().
    """

    def __init__(self, dim, combiner=None, initializer=None, optimizer="adagrad",
                 key_dtype=tf.int64, seed=None, unseen="zeros", embeddings_regularizer=None,
                 admission=None, eviction=None, max_rows=None, worker_cache_rows=None,
                 max_staleness_steps=None, **kwargs):
        super().__init__(**kwargs)
        dim = arguments.positive_int(dim, "dim", "DynamicEmbedding")
        seed = arguments.seed(seed if seed is not None else arguments.seed_of_name(self.name),
                              "DynamicEmbedding")
        if combiner not in COMBINERS:
            raise ValueError(f"DynamicEmbedding: combiner must be one of {COMBINERS}, got {combiner!r}")
        if unseen not in UNSEEN:
            raise ValueError(f"DynamicEmbedding: unseen must be one of {UNSEEN}, got {unseen!r}")
        self.key_dtype = tf.as_dtype(key_dtype)
        if self.key_dtype not in keys_lib.ID_DTYPES:
            raise ValueError(f"DynamicEmbedding: key_dtype must be int32, int64, uint64 or string, "
                             f"got {self.key_dtype.name}")
        self.dim = dim
        self.combiner = combiner
        self.initializer = initializers_lib.get(
            initializer if initializer is not None else initializers_lib.RandomUniform())
        self.optimizer = optimizers_lib.get(optimizer)
        self.seed = seed
        self.unseen = unseen
        self.embeddings_regularizer = keras.regularizers.get(embeddings_regularizer)
        self.admission = admission_lib.get(admission)
        self.eviction = eviction_lib.get(eviction)
        self.max_rows = eviction_lib.check_max_rows(max_rows, "DynamicEmbedding", self.eviction)
        self.worker_cache_rows, self.max_staleness_steps = worker_cache_lib.check_arguments(
            worker_cache_rows, max_staleness_steps, self.eviction, f"DynamicEmbedding '{self.name}'")
        optimizer_bridge.check_strategy(tf.distribute.get_strategy(), self.name)
        # Created here, where the user's strategy scope is current: Keras builds layers of a
        # functional model inside its own graph, where the strategy is not visible.
        with tf.init_scope():
            self.table = ShardedTable(dim, optimizer=self.optimizer, initializer=self.initializer,
                                      seed=seed, name=self.name, admission=self.admission,
                                      eviction=self.eviction, max_rows=self.max_rows)
        self.worker_cache = None if self.worker_cache_rows is None else worker_cache_lib.WorkerCache(
            self.table, self.worker_cache_rows, self.max_staleness_steps, self.name)
        # Set by tfps.export while it traces the serving graph (use_serving_table): lookups
        # then use this frozen table and stock ops only.
        self._serving_table = None

    def build(self, input_shape):
        # The table's stand-in among the model's variables: zero-size, so saving or applying
        # it costs nothing. Its gradient carries the table's gradient to the Keras optimizer,
        # whose apply step hands it to the table (tfps.keras._optimizer_bridge).
        self.table_proxy = self.add_weight("table_proxy", shape=(0, self.dim), initializer="zeros",
                                           trainable=True, experimental_autocast=False)
        optimizer_bridge.register_proxy(self.table_proxy, self)
        super().build(input_shape)

    def __call__(self, inputs, *args, **kwargs):
        keras3_guard.refuse_keras3(f"DynamicEmbedding '{self.name}'", tf.nest.flatten(inputs))
        return super().__call__(inputs, *args, **kwargs)

    def call(self, inputs, training=None, namespace=None):
        namespace = _checked_namespace(namespace)
        trains = self._trains(training)
        return self._to_compute_dtype(self._lookup(inputs, trains, namespace))

    def use_serving_table(self, frozen):
        """Lookups read `frozen` (a table tfps.export froze) with stock ops, or the table
        again with None. Kept out of Keras' tracking: a model saved after an export must
        not save the frozen table as part of the layer."""
        object.__setattr__(self, "_serving_table", frozen)

    def _trains(self, training):
        """Whether this call looks up for training: inserts new IDs and carries a gradient."""
        if not self.trainable or self._serving_table is not None:
            return False
        if tf.is_tensor(training):
            training = tf.get_static_value(training)
        if training is None:
            # A custom loop that calls model(x) under a GradientTape trains a stock Embedding;
            # it trains this table too.
            return could_possibly_record()
        return bool(training)

    def _to_compute_dtype(self, outputs):
        # As a stock Embedding does under a mixed-precision policy.
        if self.compute_dtype is None or outputs.dtype == self.compute_dtype:
            return outputs
        return tf.cast(outputs, self.compute_dtype)

    def _lookup(self, inputs, trains, namespace):
        if isinstance(inputs, tf.RaggedTensor):
            if inputs.ragged_rank != 1 or inputs.shape.rank != 2:
                raise ValueError("DynamicEmbedding: ragged input must be [batch, (k)], got shape "
                                 f"{inputs.shape} with ragged_rank {inputs.ragged_rank}")
            if isinstance(namespace, str):
                raise ValueError("DynamicEmbedding: namespace='columns' needs dense or sparse "
                                 "[batch, k] IDs, not ragged ones")
            rows = self._embed(inputs.values, trains, namespace)
            if self.combiner is None:
                return tf.RaggedTensor.from_row_splits(rows, inputs.row_splits)
            return self._combine(rows, inputs.value_rowids(), inputs.nrows())
        if isinstance(inputs, tf.SparseTensor):
            if inputs.shape.rank != 2:
                raise ValueError(f"DynamicEmbedding: sparse input must be [batch, k], got rank {inputs.shape.rank}")
            if self.combiner is None:
                raise ValueError("DynamicEmbedding: sparse input needs a combiner (sum, mean or sqrtn)")
            rows = self._embed(inputs.values, trains, namespace, column=inputs.indices[:, 1])
            return self._combine(rows, inputs.indices[:, 0], inputs.dense_shape[0])
        inputs = tf.convert_to_tensor(inputs)
        if self.combiner is not None and inputs.shape.rank is not None and inputs.shape.rank < 2:
            raise ValueError("DynamicEmbedding: a combiner needs multi-hot input of rank >= 2 "
                             f"(IDs along the last axis), got shape {inputs.shape}")
        rows = self._embed(inputs, trains, namespace)
        if self.combiner is None:
            return rows
        summed = tf.reduce_sum(rows, axis=-2)
        if self.combiner == "sum":
            return summed
        k = tf.cast(tf.shape(inputs)[-1], tf.float32)
        return tf.math.divide_no_nan(summed, k if self.combiner == "mean" else tf.sqrt(k))

    def _keys(self, ids, namespace, column=None):
        """Table keys of ids; column (int64, shape of ids) is needed for namespace='columns'."""
        if self.key_dtype == tf.string and ids.dtype != tf.string and ids.dtype in keys_lib.ID_DTYPES:
            # Integer IDs key differently from their strings: "7" and 7 are other rows, so a
            # string feature fed as integers would silently train rows serving never reads.
            raise TypeError(f"DynamicEmbedding '{self.name}' was made for string IDs (key_dtype), "
                            f"got {ids.dtype.name} IDs; pass the strings, or make the layer with "
                            "an integer key_dtype")
        if isinstance(namespace, str):  # "columns"
            if column is None:
                if ids.shape.rank != 2:
                    raise ValueError("DynamicEmbedding: namespace='columns' needs [batch, k] IDs, "
                                     f"got shape {ids.shape}")
                column = tf.broadcast_to(tf.range(tf.shape(ids)[1], dtype=tf.int64), tf.shape(ids))
            namespace = column + 1
        return keys_lib.ids_to_keys(ids, 0 if namespace is None else namespace, owner="DynamicEmbedding",
                                    stock_ops=self._serving_table is not None)

    def _embed(self, ids, trains, namespace, column=None):
        keys = tf.reshape(self._keys(ids, namespace, column), [-1])
        unique, index, occurrences = keys_lib.unique_keys(keys, stock_ops=self._serving_table is not None)
        if trains:
            # Counts are of occurrences, so they do not depend on how the data is batched.
            if self.worker_cache is not None:
                found, admitted = self.worker_cache.lookup(unique, occurrences)
            else:
                found, admitted = self.table.find_or_insert(unique, occurrences, return_admitted=True)
            if self.admission is None:
                admitted = None  # every key has a row: nothing to mask
            elif self.unseen == "zeros":
                found = tf.where(admitted[:, None], found, 0.0)
            rows = self._with_table_gradient(
                tf.gather(found, index), keys, None if admitted is None else tf.gather(admitted, index))
            if self.embeddings_regularizer is not None:
                self.add_loss(self.embeddings_regularizer(
                    self._with_table_gradient(found, unique, admitted)))
        elif self._serving_table is not None:
            rows, exists = self._serving_table.find(unique)
            if self.unseen == "initial":
                initial = stock_ops.initial_rows(unique, self.dim, self.seed, self.initializer)
                rows = tf.where(exists[:, None], rows, initial)
            rows = tf.gather(rows, index)
        else:
            values, exists = self.table.find(unique, return_exists=True)
            rows = values if self.unseen == "initial" else tf.where(exists[:, None], values, 0.0)
            rows = tf.gather(rows, index)
        return tf.reshape(rows, tf.concat([tf.shape(ids), [self.dim]], 0))

    def _with_table_gradient(self, rows, keys, admitted=None):
        """`rows` [m, dim] of `keys` [m], whose gradient reaches table_proxy as IndexedSlices
        over the keys (one slice per occurrence, like a stock Embedding's gather), leaving
        out keys not `admitted` (bool [m]; None: all are), which have no row to train."""
        proxy = self.table_proxy
        dense_shape = tf.constant([0, self.dim], tf.int64)

        @tf.custom_gradient
        def rows_of_table(r):
            proxy.value()  # the read lets the tape route the gradient to the proxy

            def gradient(dy, variables=None):
                slice_keys = keys
                if admitted is not None:
                    dy, slice_keys = tf.boolean_mask(dy, admitted), tf.boolean_mask(keys, admitted)
                return None, [tf.IndexedSlices(dy, slice_keys, dense_shape) for _ in variables]

            return tf.identity(r), gradient

        return rows_of_table(rows)

    def apply_table_gradient(self, gradient, unique, iterations):
        """Applies the proxy's gradient (IndexedSlices over keys) to the table at the table
        optimizer's learning rate for the Keras optimizer's step `iterations`; called by the
        Keras optimizer's apply step through tfps.keras._optimizer_bridge."""
        return optimizer_bridge.apply_to_table(self.worker_cache or self.table, gradient, unique,
                                               self.optimizer.learning_rate_at(iterations))

    def flush_worker_cache(self, iterations=None):
        """Pushes the gradient sums every worker's cache holds to the parameter servers and
        empties the caches (eager, between steps); the learning rate is the table
        optimizer's at Keras optimizer step `iterations` (None: its initial one). model.fit
        does this at the end of every epoch. Without a cache, nothing."""
        if self.worker_cache is not None:
            self.worker_cache.flush(None if iterations is None else self.optimizer.learning_rate_at(iterations))

    def _combine(self, rows, segment_ids, num_segments):
        summed = tf.math.unsorted_segment_sum(rows, segment_ids, num_segments)
        if self.combiner == "sum":
            return summed
        counts = tf.math.unsorted_segment_sum(tf.ones_like(segment_ids, tf.float32), segment_ids,
                                              num_segments)
        scale = counts if self.combiner == "mean" else tf.sqrt(counts)
        return tf.math.divide_no_nan(summed, scale[:, None])

    def compute_output_shape(self, input_shape):
        input_shape = tf.TensorShape(input_shape)
        if self.combiner is None:
            return input_shape.concatenate([self.dim])
        return input_shape[:-1].concatenate([self.dim])

    # The .keras format: Keras hands each layer an entry of the archive's weights file.
    # Each shard's row file (rows, slots, metadata, clock, and the admission and eviction
    # state, as docs/checkpoints.md lays out) goes there as bytes, through this process,
    # beside the proxy variable; tables larger than memory belong in tf.train.Checkpoint,
    # which every PS writes itself. Archives of tfps before row files hold rows as arrays.
    _FILE_ROWS = "table_file_rows"
    _ROW_FIELDS = tuple(f"table_{field}" for field in TableRows._fields)

    def save_own_variables(self, store):
        super().save_own_variables(store)
        files = checkpoint_lib.snapshot(self.table)
        store[self._FILE_ROWS] = np.array([rows for _, rows in files], np.int64)
        for i, (data, _) in enumerate(files):
            store[f"table_file_{i}"] = np.frombuffer(data, np.uint8)

    def load_own_variables(self, store):
        names = set(store.keys())
        if self._FILE_ROWS not in names and not set(self._ROW_FIELDS) <= names:
            raise ValueError(f"DynamicEmbedding '{self.name}': the saved layer has no table rows "
                             f"({self._FILE_ROWS} missing); it was not saved by this tfps layer")
        self.table_proxy.assign(tf.constant(store["0"][...]))
        if self._FILE_ROWS not in names:
            self._load_row_arrays(store)
            return
        files = [(store[f"table_file_{i}"][...].tobytes(), int(rows))
                 for i, rows in enumerate(store[self._FILE_ROWS][...])]
        try:
            checkpoint_lib.restore_snapshot(self.table, files)
        except tf.errors.OpError as e:
            raise ValueError(f"DynamicEmbedding '{self.name}' (dim {self.dim}, {self.optimizer!r}) cannot "
                             f"load the saved table: {e.message}") from e

    def _load_row_arrays(self, store):
        rows = TableRows(*(tf.constant(store[name][...]) for name in self._ROW_FIELDS))
        if rows.values.shape[1:] != (self.dim,) or rows.slots.shape[1:] != (self.table.num_slots, self.dim):
            raise ValueError(
                f"DynamicEmbedding '{self.name}': the saved table has rows {rows.values.shape[1:]} and "
                f"slots {rows.slots.shape[1:]}, but this layer has dim {self.dim} and "
                f"{self.table.num_slots} optimizer slots ({self.optimizer!r})")
        self.table.clear()
        self.table.import_rows(rows)
        self.table.set_clocks(tf.constant(store["table_clock"][...], tf.int64))

    def get_config(self):
        return {**super().get_config(), "dim": self.dim, "combiner": self.combiner,
                "initializer": initializers_lib.serialize(self.initializer),
                "optimizer": optimizers_lib.serialize(self.optimizer),
                "key_dtype": self.key_dtype.name, "seed": self.seed, "unseen": self.unseen,
                "embeddings_regularizer": keras.regularizers.serialize(self.embeddings_regularizer)
                if self.embeddings_regularizer is not None else None,
                "admission": admission_lib.serialize(self.admission),
                "eviction": eviction_lib.serialize(self.eviction), "max_rows": self.max_rows,
                "worker_cache_rows": self.worker_cache_rows,
                "max_staleness_steps": self.max_staleness_steps}

