"""The table lookup both Keras layers share (tf_keras's DynamicEmbedding and Keras 3's,
tfps.keras_layers.keras3): arguments, the table and its worker cache, keys, the training
and inference lookups, the gradient that reaches the layer's zero-size table proxy, the
combiners, and the rows a .keras archive carries. A layer class mixes it in before its
Keras' Layer and supplies the Keras-specific parts: the proxy variable, reading it, and
how regularizers and strategies are checked."""

import numpy as np
import tensorflow as tf

from tfps.table import admission as admission_lib
from tfps import _arguments as arguments
from tfps.table import checkpoint as checkpoint_lib
from tfps.table import eviction as eviction_lib
from tfps.table import initializers as initializers_lib
from tfps.table import keys as keys_lib
from tfps.keras import _non_finite as non_finite_lib
from tfps.keras import _optimizer_bridge as optimizer_bridge
from tfps.table import optimizers as optimizers_lib
from tfps.table import storage as storage_lib
from tfps.table import _stock_ops as stock_ops
from tfps.table.sharded_table import ShardedTable, check_transfer_dtype
from tfps.table.dynamic_table import TableRows
from tfps.table import _worker_cache as worker_cache_lib
from tfps.table import _lookup_routes as lookup_routes

try:
    from tensorflow.python.eager.record import could_possibly_record
except ImportError:  # TensorFlow before 2.13
    from tensorflow.python.eager.tape import could_possibly_record

COMBINERS = (None, "sum", "mean", "sqrtn")
UNSEEN = ("zeros", "initial")


def _weights_like(weights, ids):
    """`weights` of each ID in `ids` as float32 values matching them: for ragged IDs ragged
    weights with the same row lengths, for sparse IDs sparse weights at the same indices
    (their values returned), for dense IDs weights of the same shape; None stays None."""
    if weights is None:
        return None
    if isinstance(ids, tf.RaggedTensor):
        if not isinstance(weights, tf.RaggedTensor) or weights.shape.rank != 2 or weights.ragged_rank != 1:
            raise TypeError("DynamicEmbedding: ragged IDs need ragged [batch, (k)] weights, got "
                            f"{type(weights).__name__} of shape {weights.shape}")
        check = _assert_same(weights.row_splits, tf.cast(ids.row_splits, weights.row_splits.dtype),
                             "DynamicEmbedding: weights must have the IDs' row lengths")
        values = weights.values
    elif isinstance(ids, tf.SparseTensor):
        if not isinstance(weights, tf.SparseTensor):
            raise TypeError(f"DynamicEmbedding: sparse IDs need sparse weights, got {type(weights).__name__}")
        check = _assert_same(weights.indices, ids.indices, "DynamicEmbedding: weights must be at the IDs' indices")
        values = weights.values
    else:
        if isinstance(weights, (tf.RaggedTensor, tf.SparseTensor)):
            raise TypeError(f"DynamicEmbedding: dense IDs need dense weights, got {type(weights).__name__}")
        values = tf.convert_to_tensor(weights)
        check = _assert_same(tf.shape(values), tf.shape(ids), "DynamicEmbedding: weights must have the IDs' shape")
    if not (values.dtype.is_floating or values.dtype.is_integer):
        raise TypeError(f"DynamicEmbedding: weights must be numbers, got {values.dtype.name}")
    with tf.control_dependencies([check]):
        return tf.cast(values, tf.float32)


def _assert_same(a, b, message):
    """An assertion that integer tensors `a` and `b` are equal, shapes included."""
    same_size = tf.equal(tf.size(a), tf.size(b))
    same = tf.cond(same_size, lambda: tf.reduce_all(tf.equal(tf.reshape(a, [-1]), tf.reshape(b, [-1]))),
                   lambda: tf.constant(False))
    return tf.debugging.Assert(tf.logical_and(same, tf.equal(tf.rank(a), tf.rank(b))), [message])


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


def table_layers(model):
    """The DynamicEmbedding layers (tf_keras's or Keras 3's) of a model or layer, nested
    models included, each once, in the model's order."""
    layers = model._flatten_layers(include_self=True, recursive=True)  # pylint: disable=protected-access
    return [layer for layer in layers if isinstance(layer, TableLookup)]


class TableLookup:
    """What a DynamicEmbedding layer does with its table, whichever Keras it belongs to.

    The layer class sets `_keras` (the Keras module whose regularizers it takes), calls
    `_init_table_lookup` from its __init__ after Keras' Layer.__init__, creates
    `table_proxy` in build and registers it, and implements `_read_proxy()`: a read of the
    proxy inside the lookup's custom gradient, so the tape sends the gradient there."""

    _keras = None

    def _init_table_lookup(self, dim, combiner, initializer, optimizer, key_dtype, seed, unseen,
                           embeddings_regularizer, admission, eviction, max_rows,
                           worker_cache_rows, max_staleness_steps, transfer_dtype, non_finite,
                           storage=None):
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
        self.embeddings_regularizer = self._keras.regularizers.get(embeddings_regularizer)
        self.admission = admission_lib.get(admission)
        self.eviction = eviction_lib.get(eviction)
        self.max_rows = eviction_lib.check_max_rows(max_rows, "DynamicEmbedding", self.eviction)
        self.storage = storage_lib.get(storage) or storage_lib.InMemory()
        self.worker_cache_rows, self.max_staleness_steps = worker_cache_lib.check_arguments(
            worker_cache_rows, max_staleness_steps, self.eviction, f"DynamicEmbedding '{self.name}'")
        self.transfer_dtype = check_transfer_dtype(transfer_dtype, f"DynamicEmbedding '{self.name}'")
        self.non_finite = non_finite_lib.check_policy(non_finite, f"DynamicEmbedding '{self.name}'")
        self._check_strategy(tf.distribute.get_strategy())
        # Created here, where the user's strategy scope is current: Keras builds layers of a
        # functional model inside its own graph, where the strategy is not visible.
        with tf.init_scope():
            self.table = ShardedTable(dim, optimizer=self.optimizer, initializer=self.initializer,
                                      seed=seed, name=self.name, admission=self.admission,
                                      eviction=self.eviction, max_rows=self.max_rows,
                                      transfer_dtype=self.transfer_dtype, storage=self.storage)
        self.worker_cache = None if self.worker_cache_rows is None else worker_cache_lib.WorkerCache(
            self.table, self.worker_cache_rows, self.max_staleness_steps, self.name)
        # Set by tfps.export while it traces the serving graph (use_serving_table): lookups
        # then use this frozen table and stock ops only.
        self._serving_table = None

    def call(self, inputs, training=None, namespace=None, weights=None):
        namespace = _checked_namespace(namespace)
        trains = self._trains(training)
        return self._to_compute_dtype(self._lookup(inputs, trains, namespace, weights))

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

    def _lookup(self, inputs, trains, namespace, weights=None):
        if weights is not None and self.combiner is None:
            raise ValueError("DynamicEmbedding: weights weigh each ID in a combiner (sum, mean or "
                             "sqrtn); this layer has none")
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
            return self._combine(rows, inputs.value_rowids(), inputs.nrows(), _weights_like(weights, inputs))
        if isinstance(inputs, tf.SparseTensor):
            if inputs.shape.rank != 2:
                raise ValueError(f"DynamicEmbedding: sparse input must be [batch, k], got rank {inputs.shape.rank}")
            if self.combiner is None:
                raise ValueError("DynamicEmbedding: sparse input needs a combiner (sum, mean or sqrtn)")
            rows = self._embed(inputs.values, trains, namespace, column=inputs.indices[:, 1])
            return self._combine(rows, inputs.indices[:, 0], inputs.dense_shape[0], _weights_like(weights, inputs))
        inputs = tf.convert_to_tensor(inputs)
        if self.combiner is not None and inputs.shape.rank is not None and inputs.shape.rank < 2:
            raise ValueError("DynamicEmbedding: a combiner needs multi-hot input of rank >= 2 "
                             f"(IDs along the last axis), got shape {inputs.shape}")
        rows = self._embed(inputs, trains, namespace)
        if self.combiner is None:
            return rows
        weights = _weights_like(weights, inputs)
        if weights is not None:
            rows = rows * weights[..., None]
        summed = tf.reduce_sum(rows, axis=-2)
        if self.combiner == "sum":
            return summed
        if weights is None:
            k = tf.cast(tf.shape(inputs)[-1], tf.float32)
            return tf.math.divide_no_nan(summed, k if self.combiner == "mean" else tf.sqrt(k))
        scale = (tf.reduce_sum(weights, -1) if self.combiner == "mean"
                 else tf.sqrt(tf.reduce_sum(tf.square(weights), -1)))
        return tf.math.divide_no_nan(summed, scale[..., None])

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
                routing = self.table.route(unique)
                found, admitted = self.table.find_or_insert(unique, occurrences, return_admitted=True,
                                                            routing=routing)
                if self.admission is None:  # the gradient's keys are `keys` themselves
                    lookup_routes.record(self.table, keys, unique, routing)
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
        dense_shape = tf.constant([0, self.dim], tf.int64)

        @tf.custom_gradient
        def rows_of_table(r):
            self._read_proxy()  # the read lets the tape route the gradient to the proxy

            def gradient(dy, variables=None):
                slice_keys = keys
                if admitted is not None:
                    dy, slice_keys = tf.boolean_mask(dy, admitted), tf.boolean_mask(keys, admitted)
                return None, [tf.IndexedSlices(dy, slice_keys, dense_shape) for _ in variables]

            return tf.identity(r), gradient

        return rows_of_table(rows)

    def table_update(self, gradient, unique, iterations):
        """What the optimizer step sends the table for the proxy's gradient (IndexedSlices
        over keys): a TableUpdate of each key once with its slices summed, at the table
        optimizer's learning rate for the Keras optimizer's step `iterations`. `unique`: the
        optimizer has summed repeated keys already. Built before anything of the step is
        applied, so the sums can be checked first (tfps.keras._non_finite)."""
        learning_rate = self.optimizer.learning_rate_at(iterations)
        lookup, sums = lookup_routes.summed_per_key(gradient) if self.worker_cache is None else (None, None)
        if lookup is not None and lookup.table is self.table:
            # The gradient of one lookup: the update goes where the lookup went, its keys not
            # partitioned or sent to the parameter servers again.
            return optimizer_bridge.TableUpdate(lookup.unique, sums, learning_rate, lookup.routing)
        return optimizer_bridge.summed_update(gradient, unique, learning_rate)

    def apply_table_update(self, update):
        """Applies a table_update() to the table (through the worker cache, if any)."""
        if self.worker_cache is not None:
            return self.worker_cache.apply_gradients(update.keys, update.sums, update.learning_rate)
        return self.table.apply_gradients(update.keys, update.sums, learning_rate=update.learning_rate,
                                          routing=update.routing)

    def flush_worker_cache(self, iterations=None):
        """Pushes the gradient sums every worker's cache holds to the parameter servers and
        empties the caches (eager, between steps); the learning rate is the table
        optimizer's at Keras optimizer step `iterations` (None: its initial one). model.fit
        does this at the end of every epoch. Without a cache, nothing."""
        if self.worker_cache is not None:
            self.worker_cache.flush(None if iterations is None else self.optimizer.learning_rate_at(iterations))

    def _combine(self, rows, segment_ids, num_segments, weights=None):
        """Each segment's rows combined; with weights (one per row), as
        tf.nn.embedding_lookup_sparse with sp_weights: the weighted sum, over the sum of the
        weights for mean and over the root of the sum of their squares for sqrtn."""
        if weights is None:
            weights = tf.ones_like(segment_ids, tf.float32)
        else:
            rows = rows * weights[:, None]
        summed = tf.math.unsorted_segment_sum(rows, segment_ids, num_segments)
        if self.combiner == "sum":
            return summed
        scale = (tf.math.unsorted_segment_sum(weights, segment_ids, num_segments) if self.combiner == "mean"
                 else tf.sqrt(tf.math.unsorted_segment_sum(tf.square(weights), segment_ids, num_segments)))
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

    def _lookup_config(self):
        return {"dim": self.dim, "combiner": self.combiner,
                "initializer": initializers_lib.serialize(self.initializer),
                "optimizer": optimizers_lib.serialize(self.optimizer),
                "key_dtype": self.key_dtype.name, "seed": self.seed, "unseen": self.unseen,
                "embeddings_regularizer": self._keras.regularizers.serialize(self.embeddings_regularizer)
                if self.embeddings_regularizer is not None else None,
                "admission": admission_lib.serialize(self.admission),
                "eviction": eviction_lib.serialize(self.eviction), "max_rows": self.max_rows,
                "worker_cache_rows": self.worker_cache_rows,
                "max_staleness_steps": self.max_staleness_steps,
                "transfer_dtype": self.transfer_dtype.name, "non_finite": self.non_finite,
                "storage": storage_lib.serialize(self.storage)}
