"""Sends a dynamic table's gradient from the Keras optimizer's apply step to the table.

A DynamicEmbedding owns a zero-size trainable variable, its table proxy. The training
lookup gives the proxy a gradient of IndexedSlices whose indices are the table keys, one
slice per looked-up ID, as a stock Embedding's gradient has one slice per looked-up row. So
whatever a Keras optimizer does to gradients before it applies them happens to the table's
gradient as to a stock Embedding's: loss-scale unscaling and skipped steps, clipnorm,
global_clipnorm and clipvalue, summing the uses of a layer called twice, leaving out
variables that are not trainable. Where the optimizer would update the proxy, this module
sums the slices of each key and applies them to the table instead, whose own optimizer
updates the rows on the parameter servers; the table changes only when an optimizer step
that includes it runs, once per step.

Both tf_keras optimizer families are bridged where they hand (gradient, variable) pairs to
the distribution strategy: `Optimizer._distributed_apply_gradients_fn` (the current ones)
and `OptimizerV2._distributed_apply` (`keras.optimizers.legacy`). `install()` patches both
classes once, when tfps is imported; every other variable goes through the original code.
TensorFlow's v1 optimizers (tf.compat.v1.train), which cannot carry the gradient, refuse it
instead of updating the proxy.
"""

import collections
import functools
import weakref

import tensorflow as tf

from tfps.keras import _non_finite as non_finite
from tfps.table import _lookup_routes as lookup_routes
from tfps.table import keys as keys_lib

_OWNER_ATTRIBUTE = "_tfps_table_owner"


def register_proxy(proxy, owner):
    """Marks `proxy` as the table proxy of `owner`, which has `table_update(slices, unique,
    iterations)` and `apply_table_update(update)`. The proxy holds the owner weakly, so the
    layer and its table can be freed."""
    setattr(proxy, _OWNER_ATTRIBUTE, weakref.ref(owner))


def check_strategy(strategy, owner_name):
    """Raises for a strategy under which the table would not train as one variable would:
    each replica of a mirrored strategy would apply its own gradient to the shared table."""
    supported = (tf.distribute.experimental.ParameterServerStrategy, tf.distribute.OneDeviceStrategy)
    if tf.distribute.has_strategy() and not isinstance(strategy, supported):
        raise ValueError(
            f"DynamicEmbedding '{owner_name}': {type(strategy).__name__} is not supported; use "
            "tf.distribute.ParameterServerStrategy (tfps.distribute.strategy_from_tf_config()) "
            "or no strategy")
    if strategy.num_replicas_in_sync != 1:
        raise ValueError(
            f"DynamicEmbedding '{owner_name}': {type(strategy).__name__} has "
            f"{strategy.num_replicas_in_sync} replicas per worker; tfps supports one")


def owner_of(variable):
    """The layer whose table proxy `variable` is, or None."""
    ref = getattr(variable, _OWNER_ATTRIBUTE, None) if variable is not None else None
    return ref() if ref is not None else None


class TableUpdate(collections.namedtuple("TableUpdate", ["keys", "sums", "learning_rate", "routing"])):
    """One optimizer step's update of a table: distinct `keys` [n] with their gradient `sums`
    [n, dim], at `learning_rate` (None: the table optimizer's own), along `routing` (the
    keys' ShardedTable.route, or None)."""


def summed_update(gradient, unique, learning_rate=None):
    """The TableUpdate of IndexedSlices over table keys: each key once, its slices summed.

    unique: the optimizer has already summed repeated keys (the current tf_keras optimizers
    do, before clipping's results reach the variables).
    """
    if not isinstance(gradient, tf.IndexedSlices):
        raise TypeError(
            "tfps: a DynamicEmbedding's table proxy received a dense gradient "
            f"({type(gradient).__name__}); something between the tape and the optimizer "
            "converted its IndexedSlices, which the table cannot take")
    keys, values = gradient.indices, gradient.values
    if not unique:
        keys, values = keys_lib.sum_by_key(keys, values)
    return TableUpdate(keys, values, learning_rate, None)


def _split_table_pairs(grads_and_vars):
    """(table pairs as (gradient, owner), the other pairs)."""
    table_pairs, others = [], []
    for gradient, variable in grads_and_vars:
        owner = owner_of(variable)
        if owner is None:
            others.append((gradient, variable))
        elif gradient is not None:
            table_pairs.append((gradient, variable, owner))
    return table_pairs, others


def check_current_optimizer(optimizer, table_pairs):
    """Refuses what a current optimizer would do to a stock Embedding but not to a table."""
    for _, variable, owner in table_pairs:
        refuse_what_misses_the_rows(optimizer, variable, owner)


def refuse_what_misses_the_rows(optimizer, proxy, owner):
    """Raises for an optimizer (tf_keras's current ones or Keras 3's) that would weight-decay
    or average `owner`'s table as a variable, which cannot reach its rows."""
    if optimizer.weight_decay and optimizer._use_weight_decay(proxy):  # pylint: disable=protected-access
        raise ValueError(
            f"tfps: {type(optimizer).__name__}(weight_decay={optimizer.weight_decay}) would "
            f"decay every row of a stock Embedding each step, but it cannot reach the rows of "
            f"DynamicEmbedding '{owner.name}'. Exclude the table explicitly with "
            f"optimizer.exclude_from_weight_decay(var_names=['{owner.table_proxy.name}']) "
            "before training, or use an optimizer without weight_decay")
    if optimizer.use_ema:
        raise ValueError(
            f"tfps: {type(optimizer).__name__}(use_ema=True) keeps moving averages of "
            f"variables, which DynamicEmbedding '{owner.name}' does not have: its rows live "
            "in a table; use an optimizer without use_ema")


def described(variable):
    """A variable as errors name it: a table proxy by its layer (DynamicEmbedding <name>)."""
    owner = owner_of(variable)
    return f"DynamicEmbedding {owner.name}" if owner is not None else getattr(variable, "path", variable.name)


def apply_step(optimizer, table_pairs, unique, others, apply_others):
    """Applies one optimizer step of a model with tables, whole or not at all: each table
    pair's TableUpdate (`unique`: the optimizer summed each key's slices), then `apply_others()` (every other variable's update and the
    optimizer's iterations), only if every gradient the step would apply is finite
    (tfps.keras._non_finite says what happens otherwise)."""
    # The Keras optimizer's step, before this apply counts: a schedule of the table's own
    # optimizer is evaluated where the Keras optimizer evaluates its own.
    updates = [(owner, owner.table_update(gradient, unique=unique, iterations=optimizer.iterations))
               for gradient, _, owner in table_pairs]

    def apply_all():
        applied = [owner.apply_table_update(update) for owner, update in updates]
        with tf.control_dependencies(applied):
            return apply_others()

    checked = ([(described(proxy), update.sums) for (_, proxy, _), (_, update) in zip(table_pairs, updates)]
               + [(described(variable), gradient) for gradient, variable in others if gradient is not None])
    return non_finite.gated(apply_all, checked, [owner for owner, _ in updates], optimizer.iterations)


def bridged(original, unique, check=None):
    """Wraps a distributed-apply method whose third argument is grads_and_vars."""

    @functools.wraps(original)
    def apply(self, distribution, grads_and_vars, *args, **kwargs):
        grads_and_vars = list(grads_and_vars)
        table_pairs, others = _split_table_pairs(grads_and_vars)
        if not table_pairs:
            return original(self, distribution, grads_and_vars, *args, **kwargs)
        if check is not None:
            check(self, table_pairs)
        return apply_step(self, table_pairs, unique, others,
                          lambda: original(self, distribution, others, *args, **kwargs))

    return apply


def deduplicating(original):
    """Wraps a current optimizer's _deduplicate_sparse_grad: a table's gradient over the
    keys of its lookup is summed per key in one pass (bit for bit as tf.unique with
    unsorted_segment_sum) and carries the lookup's distinct keys, so that its update
    reuses the lookup's routing; every other gradient is deduplicated as before."""

    @functools.wraps(original)
    def deduplicate(self, grads):
        deduplicated = []
        for grad in grads:
            lookup, sums = (lookup_routes.summed_per_key(grad) if isinstance(grad, tf.IndexedSlices)
                            else (None, None))
            deduplicated.append(original(self, [grad])[0] if lookup is None
                                else tf.IndexedSlices(sums, lookup.unique, grad.dense_shape))
        return deduplicated

    return deduplicate


def refusing(original):
    """Wraps an optimizer's apply_gradients that cannot carry a table's gradient."""

    @functools.wraps(original)
    def apply_gradients(self, grads_and_vars, *args, **kwargs):
        grads_and_vars = list(grads_and_vars)
        table_pairs, _ = _split_table_pairs(grads_and_vars)
        if table_pairs:
            raise TypeError(
                f"tfps: {type(self).__name__} cannot apply the gradient of DynamicEmbedding "
                f"'{table_pairs[0][2].name}' to its table; use a tf_keras optimizer "
                "(keras.optimizers or keras.optimizers.legacy)")
        return original(self, grads_and_vars, *args, **kwargs)

    return apply_gradients
