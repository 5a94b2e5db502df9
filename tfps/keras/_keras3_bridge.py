"""Sends a Keras 3 DynamicEmbedding's gradient from the Keras 3 optimizer's apply to its table.

As in tf_keras (tfps.keras._optimizer_bridge), the lookup gives the layer's zero-size table
proxy an IndexedSlices gradient over table keys, one slice per looked-up ID. Keras 3 works
on gradients with its ops: loss-scale unscaling and its finiteness check, clipnorm,
global_clipnorm and clipvalue act on IndexedSlices' values (per slice, as for a stock
Embedding), and whatever densifies them sums the slices into the rows of the dense shape,
which a [0, dim] proxy cannot hold. So where an apply starts, each table gradient's indices
become positions among its distinct keys, with a dense shape of [distinct keys, dim]:
Keras treats it exactly as a stock Embedding's gradient over a vocabulary of those keys.
The keys wait beside it for this apply; where the optimizer then updates its variables
(`_backend_update_step`, after unscaling, clipping and the finiteness check), each key's
sum goes to its table, whose own optimizer updates the rows, and every other variable goes
through Keras' own code. A step the loss-scale optimizer skips never reaches that point,
and a frozen layer's proxy has no gradient, so the table changes only in an optimizer step
that includes it, once per step.

tfps.keras._patches installs these on Keras 3's BaseOptimizer.apply,
LossScaleOptimizer.apply and the TensorFlow backend's `_backend_update_step` when the Keras 3
layer is imported.
"""

import functools
import threading

import tensorflow as tf

from tfps.keras import _non_finite as non_finite
from tfps.keras import _optimizer_bridge as optimizer_bridge

# The keys of each table gradient in the apply under way, by id of the proxy variable.
_applying = threading.local()


def _table_keys():
    return getattr(_applying, "keys", None)


def check_optimizer(optimizer, owners):
    """Refuses what a Keras 3 optimizer would do to a stock Embedding but cannot do to a table."""
    for owner in owners:
        optimizer_bridge.refuse_what_misses_the_rows(optimizer, owner.table_proxy, owner)
        if optimizer.gradient_accumulation_steps:
            raise ValueError(
                f"tfps: {type(optimizer).__name__}(gradient_accumulation_steps="
                f"{optimizer.gradient_accumulation_steps}) accumulates gradients in variables of "
                f"each variable's shape, which cannot hold the gradient of DynamicEmbedding "
                f"'{owner.name}'; use larger batches, or an optimizer without it")


def _positional(grads, variables):
    """(grads with each table gradient's indices replaced by positions among its distinct
    keys, {id(proxy): (distinct keys [n], owner)})."""
    out, keys = [], {}
    for gradient, variable in zip(grads, variables):
        owner = optimizer_bridge.owner_of(variable)
        if owner is None or gradient is None:
            out.append(gradient)
            continue
        if not isinstance(gradient, tf.IndexedSlices):
            raise TypeError(
                f"tfps: the table proxy of DynamicEmbedding '{owner.name}' received a dense "
                f"gradient ({type(gradient).__name__}); something between the tape and the "
                "optimizer converted its IndexedSlices, which the table cannot take")
        unique, position = tf.unique(gradient.indices, out_idx=tf.int64)
        dense_shape = tf.stack([tf.size(unique, tf.int64), tf.constant(owner.dim, tf.int64)])
        keys[id(variable)] = (unique, owner)
        out.append(tf.IndexedSlices(gradient.values, position, dense_shape))
    return out, keys


def bridged_apply(original):
    @functools.wraps(original)
    def apply(self, grads, trainable_variables=None):
        if _table_keys() is not None:  # an inner optimizer's apply: the sums are made
            return original(self, grads, trainable_variables)
        grads = list(grads)
        variables = list(trainable_variables) if trainable_variables is not None else list(
            getattr(self, "_trainable_variables", []))
        positional, keys = _positional(grads, variables)
        if not keys:
            return original(self, grads, trainable_variables)
        inner = getattr(self, "inner_optimizer", self)
        owners = [owner for _, owner in keys.values()]
        check_optimizer(inner, owners)

        def apply_all():
            _applying.keys = keys
            try:
                return original(self, positional, trainable_variables)
            finally:
                _applying.keys = None

        if inner is not self:  # a loss-scale optimizer skips non-finite steps itself
            return apply_all()
        if not self.built:  # as Keras' apply does, but before a step that may be skipped
            from keras.src import backend  # Keras 3 is imported by the layer that uses this
            with backend.name_scope(self.name, caller=self):
                self.build(variables)
            self.built = True
        checked = [(optimizer_bridge.described(variable), gradient)
                   for gradient, variable in zip(positional, variables) if gradient is not None]
        return non_finite.gated(apply_all, checked, owners, self.iterations)

    return apply


def bridged_update_step(original):
    @functools.wraps(original)
    def update_step(self, grads, trainable_variables, learning_rate):
        keys = _table_keys()
        if not keys:
            return original(self, grads, trainable_variables, learning_rate)
        applied, other_grads, other_variables = [], [], []
        for gradient, variable in zip(grads, trainable_variables):
            entry = keys.get(id(variable))
            if entry is None:
                other_grads.append(gradient)
                other_variables.append(variable)
                continue
            unique, owner = entry
            sums = tf.convert_to_tensor(gradient)  # sums each key's slices, if still sliced
            applied.append(owner.apply_table_update(owner.table_update(
                tf.IndexedSlices(sums, unique), unique=True, iterations=self.iterations)))
        with tf.control_dependencies(applied):
            return original(self, other_grads, other_variables, learning_rate)

    return update_step
