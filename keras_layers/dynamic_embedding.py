"""DynamicEmbedding: a Keras embedding whose table grows with the data and is trained by
the parameter servers."""

import tensorflow as tf
import tf_keras as keras

from tfps import initializers as initializers_lib
from tfps import keys as keys_lib
from tfps import optimizers as optimizers_lib
from tfps import stock_ops
from tfps.sharded_table import ShardedTable

COMBINERS = (None, "sum", "mean", "sqrtn")
UNSEEN = ("zeros", "initial")


class DynamicEmbedding(keras.layers.Layer):
    """Embeds 64-bit IDs with a dynamic table sharded over the parameter servers.

    In training (model.fit) a lookup inserts new IDs and the backward pass sends the
    summed gradient of each unique ID to its shard, where the table's own optimizer
    updates the row; the Keras optimizer given to compile trains only dense variables. In
    inference (predict, evaluate, training=False) nothing is inserted or updated, and an ID
    never seen reads as zeros (unseen="zeros") or as its initial value ("initial").

    Inputs (call(inputs, namespace=None)):
      - dense int32/int64/uint64/string tensor of shape S: output S + [dim], or with a
        combiner, multi-hot along the last axis (rank >= 2): S[:-1] + [dim];
      - RaggedTensor [batch, (k)]: with a combiner [batch, dim] (an empty row gives zeros),
        without one a ragged [batch, (k), dim];
      - SparseTensor [batch, k] (needs a combiner): [batch, dim].
    `namespace` (an int) mixes a feature number into the keys, so several features share
    one table without colliding; namespace="columns" gives column j of a [batch, k] input
    namespace j + 1 (26 Criteo fields in one call and one table).

    Args:
      dim: embedding width.
      combiner: None, "sum", "mean" or "sqrtn".
      initializer: tfps.initializers instance or name (default uniform(-0.05, 0.05)).
      optimizer: tfps.optimizers instance or name, applied on the parameter servers.
      key_dtype: dtype of integer IDs the layer expects (int32, int64 or uint64) or string.
      seed: seed of the initial values.
      unseen: "zeros" or "initial": what inference returns for an ID never trained.
    """

    def __init__(self, dim, combiner=None, initializer=None, optimizer="adagrad",
                 key_dtype=tf.int64, seed=0, unseen="zeros", **kwargs):
        super().__init__(**kwargs)
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1:
            raise ValueError(f"DynamicEmbedding: dim must be a positive int, got {dim!r}")
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
        # Created here, where the user's strategy scope is current: Keras builds layers of a
        # functional model inside its own graph, where the strategy is not visible.
        with tf.init_scope():
            self.table = ShardedTable(dim, optimizer=self.optimizer, initializer=self.initializer,
                                      seed=seed, name=self.name)
        # Set by tfps.export while it traces the serving graph: lookups then use this frozen
        # table and stock ops only.
        self._serving_table = None

    def build(self, input_shape):
        # The lookup's gradient function reaches the tape through this variable; its
        # gradient is always zero, and computing it is what sends the sparse update.
        self.apply_trigger = self.add_weight("apply_trigger", shape=(), initializer="zeros",
                                             trainable=True)
        super().build(input_shape)

    def call(self, inputs, training=None, namespace=None):
        if isinstance(inputs, tf.RaggedTensor):
            if inputs.ragged_rank != 1 or inputs.shape.rank != 2:
                raise ValueError("DynamicEmbedding: ragged input must be [batch, (k)], got shape "
                                 f"{inputs.shape} with ragged_rank {inputs.ragged_rank}")
            if namespace == "columns":
                raise ValueError("DynamicEmbedding: namespace='columns' needs dense or sparse "
                                 "[batch, k] IDs, not ragged ones")
            rows = self._embed(inputs.values, training, namespace)
            if self.combiner is None:
                return tf.RaggedTensor.from_row_splits(rows, inputs.row_splits)
            return self._combine(rows, inputs.value_rowids(), inputs.nrows())
        if isinstance(inputs, tf.SparseTensor):
            if inputs.shape.rank != 2:
                raise ValueError(f"DynamicEmbedding: sparse input must be [batch, k], got rank {inputs.shape.rank}")
            if self.combiner is None:
                raise ValueError("DynamicEmbedding: sparse input needs a combiner (sum, mean or sqrtn)")
            rows = self._embed(inputs.values, training, namespace, column=inputs.indices[:, 1])
            return self._combine(rows, inputs.indices[:, 0], inputs.dense_shape[0])
        inputs = tf.convert_to_tensor(inputs)
        if self.combiner is not None and inputs.shape.rank is not None and inputs.shape.rank < 2:
            raise ValueError("DynamicEmbedding: a combiner needs multi-hot input of rank >= 2 "
                             f"(IDs along the last axis), got shape {inputs.shape}")
        rows = self._embed(inputs, training, namespace)
        if self.combiner is None:
            return rows
        summed = tf.reduce_sum(rows, axis=-2)
        if self.combiner == "sum":
            return summed
        k = tf.cast(tf.shape(inputs)[-1], tf.float32)
        return tf.math.divide_no_nan(summed, k if self.combiner == "mean" else tf.sqrt(k))

    def _keys(self, ids, namespace, column=None):
        """Table keys of ids; column (int64, shape of ids) is needed for namespace='columns'."""
        if namespace == "columns":
            if column is None:
                if ids.shape.rank != 2:
                    raise ValueError("DynamicEmbedding: namespace='columns' needs [batch, k] IDs, "
                                     f"got shape {ids.shape}")
                column = tf.broadcast_to(tf.range(tf.shape(ids)[1], dtype=tf.int64), tf.shape(ids))
            namespace = column + 1
        elif namespace is not None and (isinstance(namespace, bool) or not isinstance(namespace, int)):
            raise ValueError(f"DynamicEmbedding: namespace must be an int or 'columns', got {namespace!r}")
        return keys_lib.ids_to_keys(ids, 0 if namespace is None else namespace, owner="DynamicEmbedding",
                                    stock_ops=self._serving_table is not None)

    def _embed(self, ids, training, namespace, column=None):
        keys = self._keys(ids, namespace, column)
        unique, index = tf.unique(tf.reshape(keys, [-1]), out_idx=tf.int64)
        if training and self._serving_table is None:
            rows = self._train_lookup(unique)
        elif self._serving_table is not None:
            rows, exists = self._serving_table.find(unique)
            if self.unseen == "initial":
                initial = stock_ops.initial_rows(unique, self.dim, self.seed, self.initializer)
                rows = tf.where(exists[:, None], rows, initial)
        else:
            values, exists = self.table.find(unique, return_exists=True)
            rows = values if self.unseen == "initial" else tf.where(exists[:, None], values, 0.0)
        return tf.reshape(tf.gather(rows, index), tf.concat([tf.shape(keys), [self.dim]], 0))

    def _train_lookup(self, unique):
        # Each shard records its own apply count as the last-seen step: a global step
        # variable would cost every training step a round trip to a parameter server.
        step = tf.constant(-1, tf.int64)

        @tf.custom_gradient
        def lookup(keys, trigger):
            rows = self.table.find_or_insert(keys)

            def push(row_gradients):
                applied = self.table.apply_gradients(keys, tf.convert_to_tensor(row_gradients), step)
                with tf.control_dependencies([applied]):
                    return None, tf.zeros_like(trigger)

            return rows, push

        return lookup(unique, self.apply_trigger)

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

    def get_config(self):
        return {**super().get_config(), "dim": self.dim, "combiner": self.combiner,
                "initializer": initializers_lib.serialize(self.initializer),
                "optimizer": optimizers_lib.serialize(self.optimizer),
                "key_dtype": self.key_dtype.name, "seed": self.seed, "unseen": self.unseen}

