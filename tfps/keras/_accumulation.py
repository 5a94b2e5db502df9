"""Gradient accumulation over micro-batches for models with dynamic tables.

A table's gradient is IndexedSlices over 64-bit table keys carried by a zero-size proxy
variable (tfps.keras._optimizer_bridge), so it has no dense form: `tf.add_n` of two of them, `+`,
and variable accumulators of the proxy's shape would all densify it, and fail. The
accumulator here keeps a table's micro-batch gradients as slices (their keys and rows
appended, which sums them, as the table sums a key's slices when it applies them) and
every other variable's gradient densely, then applies the sums in one optimizer step:
exactly what a stock Embedding gets from accumulating and applying its gradients, short
of clipping (clipvalue clips each appended slice, clipnorm takes one norm over them all).
tfps.keras._patches makes the forms that cannot work say so and name this one.
"""

import numpy as np
import tensorflow as tf
from tensorflow.python.framework import tensor_util

from tfps import _arguments as arguments
from tfps.keras import _optimizer_bridge as optimizer_bridge
from tfps.table import optimizers
from tfps.table.sharded_table import ShardedTable, task_devices

_REFUSAL = ("the gradient of a DynamicEmbedding table (IndexedSlices over 64-bit table keys, dense shape "
            "{shape}) has no dense form, so {what} cannot sum it; accumulate gradients over "
            "micro-batches with tfps.GradientAccumulator(model.trainable_variables): add(gradients) "
            "per micro-batch, apply_to(optimizer) once")


def _table_gradient_shape(value):
    """The dense shape of a table proxy's gradient ([0, dim]: slices with no dense rows), or
    None for any other IndexedSlices (and for a table gradient with no slices, which
    densifies harmlessly to [0, dim])."""
    shape = value.dense_shape
    shape = None if shape is None else (shape.numpy() if hasattr(shape, "numpy") else
                                        tensor_util.constant_value(shape))
    if shape is None or len(shape) != 2 or shape[0] != 0 or value.values.shape[:1] == [0]:
        return None
    return [int(d) for d in np.asarray(shape)]


def refuse_densifying(value, dtype=None, name=None, as_ref=False):  # pylint: disable=unused-argument
    shape = _table_gradient_shape(value)
    if shape is None:
        return NotImplemented  # TensorFlow's own conversion follows
    message = _REFUSAL.format(shape=shape, what="tf.add_n, a dense accumulator or any conversion to a Tensor")
    if tf.executing_eagerly():
        raise TypeError(message)
    # In a graph, TensorFlow turns a conversion's error for an op's list input (tf.add_n's)
    # into "NOT CONVERTIBLE TO TENSOR": the conversion fails when it runs instead.
    with tf.control_dependencies([tf.debugging.Assert(False, [message])]):
        return tf.zeros(shape, value.dtype, name=name)


def refusing_table_gradient_add(original_add):
    """IndexedSlices.__add__ (tfps.keras._patches): a table's gradient cannot be summed densely."""
    def add(self, other):
        shape = _table_gradient_shape(self)
        if shape is not None:
            raise TypeError(_REFUSAL.format(shape=shape, what="+"))
        return original_add(self, other) if original_add is not None else NotImplemented
    return add


class _Slices:
    """A table's gradients kept as slices, their keys and rows: appended by `add` (the table
    sums a key's slices when it applies them; an append is a read and a write, so one
    process adds at a time) or replaced whole by `set`."""

    def __init__(self, dim, dtype=tf.float32):
        # Of unknown rank: a worker's function that captures a variable of shape [None]
        # crashes the worker (its remote handle's shape is sent with a -1).
        self._dim = dim
        self._keys = tf.Variable(tf.zeros([0], tf.int64), shape=tf.TensorShape(None), trainable=False)
        self._rows = tf.Variable(tf.zeros([0, dim], dtype), shape=tf.TensorShape(None), trainable=False)

    def add(self, gradient):
        rows, keys = self.read()
        return tf.group(self._keys.assign(tf.concat([keys, tf.cast(gradient.indices, tf.int64)], 0)),
                        self._rows.assign(tf.concat([rows, tf.cast(gradient.values, rows.dtype)], 0)))

    def set(self, gradient):
        return tf.group(self._keys.assign(tf.cast(gradient.indices, tf.int64)),
                        self._rows.assign(tf.cast(gradient.values, self._rows.dtype)))

    def read(self):
        """(rows [n, dim], keys [n])."""
        return tf.reshape(self._rows, [-1, self._dim]), tf.reshape(self._keys, [-1])

    def reset(self):
        return tf.group(self._keys.assign(tf.zeros([0], tf.int64)),
                        self._rows.assign(tf.zeros([0, self._dim], self._rows.dtype)))


class _SummedSlices:
    """A table's gradients summed per key in an SGD table at rate 1, applied to the negated
    gradients (each row is the exact running sum), sharded over the parameter servers like
    the tables: an add is atomic per row, so every worker may add at once. A table refuses
    NaN and Inf, so a non-finite gradient is counted instead and makes the sums read as NaN:
    the optimizer then sees it as without accumulation (a loss-scale optimizer skips the
    step)."""

    def __init__(self, dim):
        self._sums = ShardedTable(dim, optimizer=optimizers.SGD(1.0), initializer="zeros",
                                  name="gradient_sums")
        self._non_finite_adds = tf.Variable(0, dtype=tf.int64, trainable=False)

    def add(self, gradient):
        values = tf.cast(gradient.values, tf.float32)
        finite = tf.reduce_all(tf.math.is_finite(values))
        return tf.group(
            self._sums.apply_gradients(tf.cast(gradient.indices, tf.int64),
                                       -tf.where(finite, values, tf.zeros_like(values))),
            self._non_finite_adds.assign_add(tf.cast(tf.logical_not(finite), tf.int64)))

    def read(self):
        rows = self._sums.export()
        return tf.where(self._non_finite_adds > 0, float("nan"), rows.values), rows.keys

    def reset(self):
        return tf.group(self._sums.clear(), self._non_finite_adds.assign(0))


_TABLE_SUMS = (_Slices, _SummedSlices)


class _Contributions:
    """One variable's gradient of a step as `count` numbered contributions, kept apart (a
    dense variable's each in a variable of its shape, a table's as its slices) and set, not
    added: a worker's function that the coordinator runs again after its worker failed
    replaces what its first attempt had landed, so its batch counts once. Read as their
    sum, in contribution order (a table's slices one after another, as one process's batch
    of every contribution would give them, so clipping sees the same slices), which does
    not depend on which worker ran which contribution or when."""

    def __init__(self, variable, count, table_dim=None):
        self.of_table = table_dim is not None
        self._parts = [_Slices(table_dim) if self.of_table
                       else tf.Variable(tf.zeros(variable.shape, variable.dtype), trainable=False)
                       for _ in range(count)]

    def set(self, contribution, gradient):
        part = self._parts[contribution]
        if self.of_table:
            return part.set(gradient)
        return part.assign(tf.cast(tf.convert_to_tensor(gradient), part.dtype))

    def read(self, chosen=None):
        """The sum: a tensor, or a table's (rows, keys) slices. With `chosen` (a bool tensor,
        one per contribution), the sum of the chosen contributions only: the others' slices
        are left out whole, so an ID only they hold gets no row."""
        if not self.of_table:
            return tf.add_n([tf.identity(part) if chosen is None else
                             tf.where(chosen[i], tf.identity(part), tf.zeros_like(part))
                             for i, part in enumerate(self._parts)])
        reads = []
        for i, part in enumerate(self._parts):
            rows, keys = part.read()
            if chosen is not None:  # (slicing to a computed length kept every slice on the chief)
                kept = tf.fill(tf.shape(keys), chosen[i])
                rows, keys = tf.boolean_mask(rows, kept), tf.boolean_mask(keys, kept)
            reads.append((rows, keys))
        return tf.concat([rows for rows, _ in reads], 0), tf.concat([keys for _, keys in reads], 0)

    def reset(self, chosen=None):
        """Empties every contribution, or only the chosen ones (a contribution left out of a
        step may still be written by its late worker)."""
        resets = []
        for i, part in enumerate(self._parts):
            reset = part.reset if self.of_table else (lambda part=part: part.assign(tf.zeros_like(part)))
            resets.append(reset() if chosen is None else tf.cond(chosen[i], lambda r=reset: tf.group(r()),
                                                                   tf.no_op))
        return tf.group(resets)


def _refuse_worker_caches(variables):
    """A shared accumulator is applied by the chief, but a worker cache's copies are
    trained, pushed and refreshed by the applies of the worker that holds them: its
    copies would never be refreshed, and every step would read the rows of the first."""
    for variable in variables:
        owner = optimizer_bridge.owner_of(variable)
        if getattr(owner, "worker_cache", None) is not None:
            raise ValueError(
                f"Synchronous training: DynamicEmbedding '{owner.name}' has a worker cache "
                f"(worker_cache_rows={owner.worker_cache.capacity}), whose copies each worker "
                "refreshes when it applies a step; in synchronous steps (tfps.callbacks."
                "SynchronousTraining, or a GradientAccumulator with shared_by_workers=True) the "
                "chief applies every step, so the workers would read their first copies forever. "
                "Train synchronously without a worker cache")


def _of_table(total):
    """Whether an accumulator's sum of one variable is a table's (read as (rows, keys))."""
    return isinstance(total, _TABLE_SUMS) or (isinstance(total, _Contributions) and total.of_table)


class GradientAccumulator:
    """Sums gradients of `variables` over calls to `add`, applied by `apply_to`.

    Works eagerly and inside `tf.function` (its sums live in variables and, for tables
    shared by workers, in tables on the parameter servers).

        accumulator = tfps.GradientAccumulator(model.trainable_variables)
        for x, y in micro_batches:                       # k of them
            with tf.GradientTape() as tape:
                loss = loss_fn(y, model(x, training=True))
            accumulator.add(tape.gradient(loss, model.trainable_variables))
        accumulator.apply_to(optimizer)                  # one step, the summed gradient

    Under a ParameterServerStrategy of several workers, `shared_by_workers=True` makes one
    sum of every worker's adds, for synchronous training: each step, every worker adds
    its gradients, and once all have (ClusterCoordinator.join), one apply applies their
    sum (docs/cluster.md, examples/custom_loop.py --sync). Every add is then atomic: a
    variable's slices (a stock Embedding's gradient) are added densely, under the
    variable's lock, which costs a dense add of its whole shape. A table's sums are kept
    per key, so the optimizer's clipping sees each key's summed row (clipvalue clips the
    sums, clipnorm's norm is taken over them), as for a stock Embedding's dense
    accumulator; by default each micro-batch's slices are kept, so clipvalue clips each
    slice (clipnorm takes one norm over all of them either way). A non-finite gradient
    reaches the optimizer either way (a loss-scale optimizer skips that step).

    A worker that fails while it adds makes the coordinator run its function again, and
    what its first attempt had added would count twice. With `contributions=N` each step
    is N numbered contributions instead: `add(gradients, contribution=i)` sets
    contribution i of each variable it has a gradient for, replacing what an earlier
    attempt had set, so a step in which a worker fails still counts each batch once, and
    `apply_to` refuses a step in which a contribution was not set. Each contribution is
    kept apart until the apply, which takes them in contribution order, so a step's
    gradient is the same whichever worker ran which: a table's slices one after another,
    as one process's batch of all of them would give them (so clipping is the same too),
    a dense variable's sum (N copies of its shape on the parameter servers; a stock
    Embedding's slices are summed densely, so clipping sees its summed rows).

    Args:
      variables: the variables whose gradients `add` takes, in that order (table proxies
        of DynamicEmbedding layers included).
      shared_by_workers: one sum for every worker's adds (see above).
      contributions: with shared_by_workers, the number of numbered contributions to a
        step (one per batch a step sums), or None to sum every add.
    """

    def __init__(self, variables, shared_by_workers=False, contributions=None):
        shared_by_workers = arguments.boolean(shared_by_workers, "shared_by_workers", "GradientAccumulator")
        if contributions is not None:
            contributions = arguments.positive_int(contributions, "contributions", "GradientAccumulator")
            if not shared_by_workers:
                raise ValueError(
                    f"GradientAccumulator: contributions={contributions} numbers the workers' adds "
                    "to a step of a shared accumulator; pass shared_by_workers=True as well")
        self.contributions = contributions
        workers = len(task_devices("worker"))
        if workers > 1 and not shared_by_workers:
            raise ValueError(
                f"GradientAccumulator: under a ParameterServerStrategy of {workers} workers its sums "
                "would live on the parameter servers and take every worker's micro-batches, and "
                "one worker's apply would apply and clear another's; accumulate in one process "
                "or with one worker, or, to train synchronously (every worker's gradients of a "
                "step summed and applied once), pass shared_by_workers=True and contributions=<the "
                "number of batches a step sums>")
        self.variables = list(variables)
        if shared_by_workers:
            _refuse_worker_caches(self.variables)
        self.shared_by_workers = shared_by_workers
        self._sums = []
        with tf.init_scope():
            # Micro-batches added since the last apply: an apply of none would still be an
            # optimizer step (its iterations, Adam's moments), so it is refused.
            self._added = tf.Variable(0, dtype=tf.int64, trainable=False)
            # Which numbered contributions were set since the last apply: an apply without
            # one of them would leave its batch out of the step.
            self._contributed = (tf.Variable(tf.zeros([contributions], tf.int64), trainable=False)
                                 if contributions is not None else None)
            for variable in self.variables:
                of_table = optimizer_bridge.owner_of(variable) is not None
                if contributions is not None:
                    self._sums.append(_Contributions(variable, contributions,
                                                     int(variable.shape[-1]) if of_table else None))
                elif of_table:
                    dim = int(variable.shape[-1])
                    self._sums.append(_SummedSlices(dim) if shared_by_workers
                                      else _Slices(dim, variable.dtype))
                else:
                    self._sums.append(tf.Variable(tf.zeros(variable.shape, variable.dtype), trainable=False))

    def add(self, gradients, contribution=None):
        """Adds one micro-batch's gradients (a list in the order of `variables`; None for a
        variable the loss does not reach). With `contributions`, sets contribution number
        `contribution` (an int) of the step instead."""
        gradients = list(gradients)
        if len(gradients) != len(self.variables):
            raise ValueError(f"GradientAccumulator.add: got {len(gradients)} gradients for "
                             f"{len(self.variables)} variables")
        self._check_contribution(contribution)
        updates = []
        for gradient, variable, total in zip(gradients, self.variables, self._sums):
            if gradient is None:
                continue
            of_table = _of_table(total)
            if of_table and not isinstance(gradient, tf.IndexedSlices):
                raise TypeError(f"GradientAccumulator.add: the gradient of table proxy {variable.name} "
                                f"must be the IndexedSlices the tape gives, got {type(gradient).__name__}")
            if isinstance(total, _Contributions):
                updates.append(total.set(contribution, gradient))
            elif of_table:
                updates.append(total.add(gradient))
            elif isinstance(gradient, tf.IndexedSlices) and not self.shared_by_workers:
                updates.append(total.scatter_add(gradient))
            else:
                # assign_add holds the variable's lock alone, where scatter_add shares it:
                # workers' adds of slices to one row at once would lose one of them.
                updates.append(total.assign_add(tf.cast(tf.convert_to_tensor(gradient), total.dtype)))
        if updates:  # a micro-batch whose loss reached no variable adds nothing to apply
            updates.append(self._added.assign_add(1))
        if self._contributed is not None:
            updates.append(self._contributed.scatter_update(
                tf.IndexedSlices(tf.ones([1], tf.int64), tf.constant([contribution]))))
        return tf.group(updates)

    def gradients(self, chosen=None):
        """The sums so far, in the order of `variables` (IndexedSlices for table proxies);
        with `chosen` (see apply_to), the chosen contributions' sums."""
        out = []
        for variable, total in zip(self.variables, self._sums):
            if _of_table(total):
                rows, keys = total.read(chosen) if isinstance(total, _Contributions) else total.read()
                out.append(tf.IndexedSlices(rows, keys, tf.constant(variable.shape.as_list(), tf.int64)))
            else:
                out.append(total.read(chosen) if isinstance(total, _Contributions) else tf.identity(total))
        return out

    def apply_to(self, optimizer, chosen=None):
        """Applies the sums with `optimizer` in one step, then starts over. Refused
        (InvalidArgumentError, nothing applied) when nothing was added since the last apply.

        With `contributions`, `chosen` (a bool tensor of shape [contributions], or None for
        all) applies the chosen contributions only, for backup workers: each of them must
        have been set since the last apply; the others are left as they are (not emptied,
        and not required), since a worker left out of a step may still be writing its own.
        Only the chosen ones are emptied."""
        if chosen is not None:
            if self._contributed is None:
                raise ValueError("GradientAccumulator.apply_to: chosen= picks numbered contributions "
                                 "of an accumulator made with contributions=<number of them per step>")
            chosen = tf.reshape(tf.convert_to_tensor(chosen, tf.bool), [self.contributions])
        something_added = tf.debugging.assert_positive(
            self._added, message="GradientAccumulator.apply_to: no gradients were added since the "
                                 "last apply, so there is nothing to apply (an apply of none would "
                                 "still count an optimizer step)")
        checks = [something_added]
        if self._contributed is not None:
            unset = tf.equal(self._contributed, 0)
            if chosen is not None:
                unset = tf.logical_and(unset, chosen)
            missing = tf.reshape(tf.where(unset), [-1])
            checks.append(tf.debugging.Assert(
                tf.equal(tf.size(missing), 0),
                ["GradientAccumulator.apply_to: contributions", missing, "were not set since the last "
                 f"apply (of contributions=0..{self.contributions - 1}), so their batches would be "
                 "left out of the step"]))
        with tf.control_dependencies(checks):
            applied = optimizer.apply_gradients(zip(self.gradients(chosen), self.variables))
        with tf.control_dependencies([applied] if applied is not None else []):
            return self.reset(chosen)

    def reset(self, chosen=None):
        """Starts over (with `chosen`, see apply_to: empties only the chosen contributions)."""
        resets = [self._added.assign(0)]
        if self._contributed is not None:
            resets.append(self._contributed.assign(
                tf.zeros_like(self._contributed) if chosen is None
                else tf.where(chosen, tf.zeros_like(self._contributed), self._contributed)))
        for total in self._sums:
            if isinstance(total, _Contributions):
                resets.append(total.reset(chosen))
            else:
                resets.append(total.reset() if isinstance(total, _TABLE_SUMS) else total.assign(tf.zeros_like(total)))
        return tf.group(resets)

    def _check_contribution(self, contribution):
        if self.contributions is None:
            if contribution is not None:
                raise ValueError(f"GradientAccumulator.add: contribution={contribution!r} needs an "
                                 "accumulator made with contributions=<number of them per step>")
            return
        if not arguments.is_int(contribution) or not 0 <= contribution < self.contributions:
            raise ValueError(f"GradientAccumulator.add: contribution must be a Python int in [0, "
                             f"{self.contributions}) (each step's numbered contributions; a tensor "
                             f"cannot pick where its gradient is kept), got {contribution!r}")
