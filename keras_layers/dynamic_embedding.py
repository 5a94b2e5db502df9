"""DynamicEmbedding: a Keras embedding whose table grows with the data and is trained by
the parameter servers."""

import tensorflow as tf
import tf_keras as keras

from tfps.keras import _keras3_guard as keras3_guard
from tfps.keras import _optimizer_bridge as optimizer_bridge
from tfps.keras_layers._table_lookup import TableLookup


@keras.utils.register_keras_serializable(package="tfps")
class DynamicEmbedding(TableLookup, keras.layers.Layer):
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

    Inputs (call(inputs, namespace=None, weights=None)):
      - dense int32/int64/uint64/string tensor of shape S: output S + [dim], or with a
        combiner, multi-hot along the last axis (rank >= 2): S[:-1] + [dim];
      - RaggedTensor [batch, (k)]: with a combiner [batch, dim] (an empty row gives zeros),
        without one a ragged [batch, (k), dim];
      - SparseTensor [batch, k] (needs a combiner): [batch, dim].
    `weights` (with a combiner) weigh each ID, in the IDs' form: dense of their shape, ragged
    with their row lengths, sparse at their indices; as tf.nn.embedding_lookup_sparse's
    sp_weights, "sum" gives the weighted sum, "mean" divides it by the sum of the weights
    and "sqrtn" by the root of the sum of their squares.
    `namespace` (an int, or an integer tensor of one per ID: of the IDs' shape, or of a
    ragged or sparse input's values) mixes a feature number into the keys, so several
    features share one table without colliding; namespace="columns" gives column j of a
    [batch, k] input namespace j + 1 (26 Criteo fields in one call and one table).

    Args:
      dim: embedding width.
      combiner: None, "sum", "mean" or "sqrtn".
      initializer: tfps.initializers instance or name (default uniform(-0.05, 0.05)).
      optimizer: tfps.optimizers instance or name, applied on the parameter servers; the
        table's own, not model.compile's ("adagrad", the default, is Adagrad() at
        learning rate 0.001: give one sized for the model).
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
      storage: `tfps.storage.Tiered(path=..., memory_rows=...)`: rows beyond a memory
        budget (split over the parameter servers) keep their values and slots on each
        parameter server's local disk, hot rows in memory (docs/tiered.md). None: all in
        memory.
      worker_cache_rows, max_staleness_steps: a GEO-style cache of up to worker_cache_rows
        rows on each worker (None: no cache). A worker pulls a row once per cycle of
        max_staleness_steps + 1 steps and reads and trains its copy for the rest of the
        cycle; the gradients of cached rows are summed on the worker and pushed in the
        cycle's last step (tfps.table._worker_cache). Fewer bytes to the parameter servers
        for hot IDs, at copies up to max_staleness_steps steps behind them; 0 trains
        exactly as without a cache. model.fit pushes what the caches hold at the end of
        every epoch; a custom loop calls flush_worker_cache().
      transfer_dtype: what a training step's rows and gradients travel as between a worker
        and the parameter servers: "float32" (the default, exact) or "bfloat16", half the
        bytes per row each way. Training then reads rows rounded to bfloat16 (8 significant
        bits) and the parameter servers apply gradients rounded so; the tables keep float32,
        and inference, checkpoints and exports read them exactly. With a worker cache, the
        copies start from the rounded rows and the pushed sums are rounded.
      non_finite: what an optimizer step with a NaN or Inf gradient does: "refuse" (the
        default; the step fails naming itself and the variables) or "skip" (the step is
        dropped and counted, stats()["skipped_steps"]). Either way none of it is applied:
        no table, variable or iterations changes (docs/keras.md).
    """

    _keras = keras

    def __init__(self, dim, combiner=None, initializer=None, optimizer="adagrad",
                 key_dtype=tf.int64, seed=None, unseen="zeros", embeddings_regularizer=None,
                 admission=None, eviction=None, max_rows=None, worker_cache_rows=None,
                 max_staleness_steps=None, transfer_dtype="float32", non_finite="refuse", storage=None,
                 **kwargs):
        # IDs are not activations: as a stock Embedding, no cast to the compute dtype, so a
        # float ID tensor reaches the lookup's check as the dtype the caller gave.
        kwargs["autocast"] = False
        super().__init__(**kwargs)
        self._init_table_lookup(dim, combiner, initializer, optimizer, key_dtype, seed, unseen,
                                embeddings_regularizer, admission, eviction, max_rows,
                                worker_cache_rows, max_staleness_steps, transfer_dtype, non_finite,
                                storage)

    def _check_strategy(self, strategy):
        optimizer_bridge.check_strategy(strategy, self.name)

    def build(self, input_shape):
        # The table's stand-in among the model's variables: zero-size, so saving or applying
        # it costs nothing. Its gradient carries the table's gradient to the Keras optimizer,
        # whose apply step hands it to the table (tfps.keras._optimizer_bridge).
        self.table_proxy = self.add_weight("table_proxy", shape=(0, self.dim), initializer="zeros",
                                           trainable=True, experimental_autocast=False)
        optimizer_bridge.register_proxy(self.table_proxy, self)
        super().build(input_shape)

    def _read_proxy(self):
        return self.table_proxy.value()

    def __call__(self, inputs, *args, **kwargs):
        keras3_guard.refuse_keras3(f"DynamicEmbedding '{self.name}'", tf.nest.flatten(inputs))
        return super().__call__(inputs, *args, **kwargs)

    def get_config(self):
        return {**super().get_config(), **self._lookup_config()}
