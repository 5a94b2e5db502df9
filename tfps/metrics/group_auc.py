"""GroupAUC (per-group AUC, weighted by each group's examples) and FeedGroups, the layer that
hands each batch's groups to it inside fit and evaluate."""

import weakref

import tensorflow as tf
import tf_keras as keras
from tf_keras.src.utils import tf_utils

from tfps.keras import _keras3_guard as keras3_guard
from tfps._ops import ops
from tfps.metrics import base


MAX_GROUP_BUCKETS = 1 << 15  # the table's widest row is 2^16 floats


@keras.utils.register_keras_serializable(package="tfps")
class GroupAUC(base.Metric):
    """Impression-weighted mean of per-group ROC AUCs (GAUC, e.g. per user), over 64-bit
    group keys, summed over all workers.

    Each group's state is a row of a dynamic table (sharded over the parameter servers
    under ParameterServerStrategy): its positive and negative weight per prediction bucket,
    with AUC's log-linear buckets, so predictions around a 0.1% click rate are ordered as
    finely as those around 30%. An update sends the batch's examples to the parameter
    servers holding their groups (Tfps>GroupAucUpdate), which add them to the rows under
    each row's lock, so concurrent workers lose nothing; `result()` runs on each parameter
    server over its rows a chunk at a time (Tfps>GroupAucSum) and sends back two scalars.
    Groups with only one class are left out, as is usual for GAUC; with no such group the
    result is 0.5. A group's positive and negative in the same bucket count one half, so
    a group's AUC is off by at most half the share of its pairs that share a bucket. A
    group's predictions crowd together (around that user's click rate), so coarse buckets
    pull its AUC toward 0.5: the default's 64 per octave of d (AUC's has 1024) are 0.0039
    wide for p in [0.25, 0.5), and in each octave below 1/64 of its lower end, and read
    GAUCs within 1e-3 of exact for predictions spread by 0.02 around each user's rate
    (tests/test_metrics.py).

    Memory: 8 * num_buckets bytes per group seen (16 KiB at the default); `result()` reads
    every bucket of every group. With many groups, fewer buckets cost accuracy as above
    (256 buckets read 0.012 under the exact GAUC in that test). Counts are
    float32: a bucket of one group counts exactly up to 2^24 examples, and past that each
    batch's count is added with a relative rounding error of at most 2^-24 of the bucket.

    Groups reach the metric in one of two ways:
    - `update_state(y_true, y_pred, sample_weight=None, groups=...)`, called directly;
    - in `compile(metrics=[gauc])`, through a `tfps.metrics.FeedGroups(gauc)` layer that the
      model's prediction passes through: `p = FeedGroups(gauc)([p, inputs["user_id"]])`.
      Keras calls a compiled metric with labels and predictions only; the layer hands it the
      batch's groups in the same step (fit, evaluate, any strategy).

    Args:
      num_buckets: prediction buckets per group, 2 * octaves times a power of two, at most
        2^15 (a group's row holds 2 * num_buckets counts).
      name: metric name.
      octaves: halvings of d = min(p, 1 - p) resolved below 1/2, as for AUC.
    """

    def __init__(self, num_buckets=2048, name="group_auc", octaves=16, dtype=None, **kwargs):
        super().__init__(name=name, dtype=dtype, **kwargs)
        self.buckets_per_octave = base.buckets_per_octave("tfps.metrics.GroupAUC", num_buckets, octaves)
        if num_buckets > MAX_GROUP_BUCKETS:
            raise ValueError(f"tfps.metrics.GroupAUC: num_buckets must be at most {MAX_GROUP_BUCKETS} "
                             f"(a group's row holds 2 * num_buckets counts), got {num_buckets}")
        self.num_buckets, self.octaves = int(num_buckets), int(octaves)
        # Keras' exact evaluation (pss_evaluation_shards) clones each metric per data shard
        # and merges the clones through `metric.weights`; a GroupAUC's state is a table, not
        # weights, so its clone adds straight into the table of the metric it clones.
        original = _live_group_aucs.get(name) if tf_utils.in_local_vars_context() else None
        if original is not None and (original.num_buckets, original.octaves) == (self.num_buckets, self.octaves):
            self.histograms = original.histograms
            return
        from tfps.table.sharded_table import ShardedTable  # the op library is needed only here
        from tfps.table import initializers
        from tfps.table import optimizers
        with tf.init_scope():
            self.histograms = ShardedTable(2 * num_buckets, optimizer=optimizers.SGD(1.0),
                                           initializer=initializers.Zeros(), name=f"{name}_histograms")
        _live_group_aucs[name] = self

    @property
    def _metric_name(self):
        return f"tfps.metrics.GroupAUC({self.name})"

    @base.straight_line
    def update_state(self, y_true, y_pred, sample_weight=None, groups=None):
        from tfps.table.sharded_table import as_int64_keys
        if groups is None:
            groups = self._fed_groups()
        weights = base.example_weights(self._metric_name, sample_weight, y_pred)
        y_pred, y_true = base.as_float_vector(y_pred), base.as_float_vector(y_true)
        groups = tf.reshape(as_int64_keys(groups, self._metric_name + ": groups"), [-1])
        tensors = (y_true, y_pred) if weights is None else (y_true, y_pred, weights)
        checks = []
        if self.histograms.num_shards > 1:  # partitioning needs equal sizes; one shard's op checks them
            checks = [tf.debugging.assert_equal(tf.size(t), tf.size(groups), message=(
                f"{self._metric_name}: groups, labels, predictions and sample_weight must have "
                "one element per example")) for t in tensors]
        no_weights = tf.zeros([0], tf.float32)

        def update(table, shard_groups, labels, predictions, shard_weights=no_weights):
            return ops.tfps_group_auc_update(
                table.resource_handle, shard_groups, labels, predictions, shard_weights,
                buckets_per_octave=self.buckets_per_octave, octaves=self.octaves,
                metric_name=self._metric_name)
        with tf.control_dependencies(checks):
            return tf.group(self.histograms.per_shard(update, groups, *tensors)[0])

    def _fed_groups(self):
        groups = _groups_fed_in_this_step().get(self.name)
        if groups is None:
            raise ValueError(
                f"{self._metric_name} has no groups for this batch: call update_state(..., "
                "groups=...), or in compile(metrics=...) pass the model's prediction through "
                "tfps.metrics.FeedGroups(metric)([prediction, group_ids])")
        return groups

    def feed_groups(self, groups):
        """Groups for the next update_state without groups= in the same step (FeedGroups)."""
        _groups_fed_in_this_step()[self.name] = groups

    def result(self):
        weighted, impressions = [], []
        for table, device in zip(self.histograms.shards, self.histograms.devices):
            with tf.device(device):
                shard_weighted, shard_impressions = ops.tfps_group_auc_sum(
                    table.resource_handle, num_buckets=self.num_buckets, metric_name=self._metric_name)
            weighted.append(shard_weighted)
            impressions.append(shard_impressions)
        weighted, impressions = tf.add_n(weighted), tf.add_n(impressions)
        value = tf.where(impressions > 0, weighted / tf.maximum(impressions, 1e-300),
                         tf.constant(0.5, tf.float64))
        return tf.cast(value, self.dtype)

    def reset_state(self):
        self.histograms.clear()

    def get_config(self):
        return {**super().get_config(), "num_buckets": self.num_buckets, "octaves": self.octaves}


# The GroupAUCs made outside a metric-cloning scope, by name, for their clones (held weakly).
_live_group_aucs = weakref.WeakValueDictionary()

# The groups FeedGroups handed over, by metric name, per graph a step is traced into (held
# weakly: they go with the step's function), and for eager steps. By name, not by object, so
# the link outlives saving: a loaded model's FeedGroups and its compiled GroupAUC are new objects.
_groups_fed_by_graph = weakref.WeakKeyDictionary()
_groups_fed_eagerly = {}


def _groups_fed_in_this_step():
    if tf.executing_eagerly():
        return _groups_fed_eagerly
    return _groups_fed_by_graph.setdefault(tf.compat.v1.get_default_graph(), {})


@keras.utils.register_keras_serializable(package="tfps")
class FeedGroups(keras.layers.Layer):
    """Passes predictions through unchanged and hands each GroupAUC the batch's groups, so a
    GroupAUC works in `compile(metrics=...)`: `p = FeedGroups(gauc)([p, inputs["user_id"]])`.

    Args:
      metrics: a GroupAUC or a list of them (or their names: a GroupAUC is fed by name, so
        a saved and loaded model's FeedGroups feeds its loaded GroupAUC).
    """

    def __init__(self, metrics=(), **kwargs):
        kwargs.setdefault("autocast", False)  # predictions leave as they came
        super().__init__(**kwargs)
        metrics = list(metrics) if isinstance(metrics, (list, tuple)) else [metrics]
        for metric in metrics:
            if not isinstance(metric, (GroupAUC, str)):
                raise TypeError(f"tfps.metrics.FeedGroups feeds GroupAUC metrics (or their names), got {metric!r}")
        self.metric_names = tuple(m if isinstance(m, str) else m.name for m in metrics)

    def __call__(self, inputs, *args, **kwargs):
        keras3_guard.refuse_keras3(f"FeedGroups '{self.name}'", tf.nest.flatten(inputs))
        return super().__call__(inputs, *args, **kwargs)

    def call(self, inputs):
        if not isinstance(inputs, (list, tuple)) or len(inputs) != 2:
            raise ValueError("tfps.metrics.FeedGroups takes [predictions, groups]")
        predictions, groups = inputs
        fed = _groups_fed_in_this_step()
        for name in self.metric_names:
            fed[name] = groups
        return tf.identity(predictions)

    def get_config(self):
        return {**super().get_config(), "metrics": list(self.metric_names)}
