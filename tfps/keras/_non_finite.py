"""An optimizer step of a model with tables is applied whole or not at all.

The table shards, the dense variables and the optimizer's iterations are updated by
separate ops, on separate parameter servers under ParameterServerStrategy; a shard that
refused a NaN gradient left the others updated. So every gradient a step would apply is
checked first, where the step runs (a worker under ParameterServerStrategy, before
anything is sent): each table's per-key sums and every other variable's gradient. If one
holds NaN or Inf, no update of the step runs anywhere. The tables' layers say what then
(`non_finite`): "refuse" (the default) fails the step with an error naming it and the
variables whose gradients were not finite, which ends training; "skip" drops the step,
counts it in every table of the step (stats()["skipped_steps"], on each shard) and training
goes on. A step whose tables do not all skip is refused.

A skipped step is left out of fit's metrics too (tfps.keras._step_metrics), so an epoch's
logs are those of the steps it trained.

A loss-scale optimizer already skips non-finite steps and lowers its scale; its inner
optimizer is reached only by finite steps, so this check never fires there.
"""

import logging
import weakref

import tensorflow as tf

POLICIES = ("refuse", "skip")
# What became of the step being built (in a graph: that graph's), which the train step that
# builds it reads for its metrics (tfps.keras._step_metrics).
_outcomes = weakref.WeakKeyDictionary()
_EAGER = type("Eager", (), {})()  # the key of steps run eagerly


def check_policy(value, owner):
    """`value` if it is one of POLICIES, else ValueError naming `owner`."""
    if not isinstance(value, str) or value not in POLICIES:
        raise ValueError(f"{owner}: non_finite must be 'refuse' or 'skip' (what an optimizer step "
                         f"with a NaN or Inf gradient does), got {value!r}")
    return value


def _all_finite(tensor):
    values = tensor.values if isinstance(tensor, tf.IndexedSlices) else tensor
    return tf.reduce_all(tf.math.is_finite(values))


def gated(apply_step, gradients, owners, iterations):
    """Runs `apply_step()` (every update of one optimizer step) if all `gradients` are
    finite; otherwise refuses or skips the step as `owners` (the step's table layers) say.

    Args:
      apply_step: builds (or, eagerly, runs) the step's updates; its result is returned.
      gradients: (name, tensor or IndexedSlices) pairs: what the step would apply.
      owners: the table layers whose gradients are among them.
      iterations: the optimizer's step counter, which names the step in the error.
    Returns:
      apply_step()'s result; for a skipped step (in a graph, for either outcome when the
      step may be skipped), the optimizer's iterations after the step.
    """
    names = [name for name, _ in gradients]
    finite = tf.stack([_all_finite(tensor) for _, tensor in gradients])
    skips = all(owner.non_finite == "skip" for owner in owners)
    counter, iterations = iterations, tf.convert_to_tensor(iterations)  # a Keras 3 variable, too
    if tf.executing_eagerly():
        if bool(tf.reduce_all(finite)):
            return apply_step()
        bad = ", ".join(name for name, ok in zip(names, finite.numpy()) if not ok)
        if not skips:
            raise tf.errors.InvalidArgumentError(None, None, _refusal(int(iterations) + 1, bad))
        for owner in owners:
            owner.table.count_skipped_step()
        logging.warning("tfps: skipped optimizer step %d: non-finite gradient of %s", int(iterations) + 1, bad)
        _outcomes[_EAGER] = False
        return iterations
    bad = tf.strings.reduce_join(tf.boolean_mask(tf.constant(names), tf.logical_not(finite)), separator=", ")
    step_finite = tf.reduce_all(finite)
    graph = tf.compat.v1.get_default_graph()
    if not skips:
        head, middle, tail = _refusal("\0", "\0").split("\0")
        message = tf.strings.join([head, tf.strings.as_string(iterations + 1), middle, bad, tail])
        checked = tf.debugging.Assert(step_finite, [message])
        _outcomes[graph] = checked
        with tf.control_dependencies([checked]):
            return apply_step()

    def applied():
        with tf.control_dependencies([op for op in tf.nest.flatten(apply_step()) if op is not None]):
            return tf.constant(True)

    def skipped():
        counted = [owner.table.count_skipped_step() for owner in owners]
        logged = tf.print(tf.strings.join(["tfps: skipped optimizer step ", tf.strings.as_string(iterations + 1),
                                           ": non-finite gradient of ", bad]))
        with tf.control_dependencies(counted + [logged]):
            return tf.constant(False)

    done = tf.cond(step_finite, applied, skipped)
    _outcomes[graph] = done
    with tf.control_dependencies([done]):
        return tf.convert_to_tensor(counter)  # read after the step


def all_finite(gradients):
    """Whether every gradient (tensors or IndexedSlices; None skipped) is finite: a bool tensor."""
    return tf.reduce_all(tf.stack([_all_finite(g) for g in gradients if g is not None]))


def take_outcome():
    """The outcome of the step just built here: whether it was applied (a bool tensor in a
    graph, False eagerly) where it may be skipped, the check it was refused by where it may
    be refused (in a graph), or None (no such step since the last call)."""
    return _outcomes.pop(_EAGER if tf.executing_eagerly() else tf.compat.v1.get_default_graph(), None)


def _refusal(step, names):
    """The refused step's error, for optimizer step `step` (its iterations + 1). No quotes:
    tf.debugging.Assert would print them escaped."""
    return (f"tfps: optimizer step {step} has a non-finite gradient (NaN or Inf) of {names}; none "
            "of its updates ran: no table row value or slot, no variable and not the optimizer "
            "iterations changed. With non_finite=skip on the DynamicEmbedding layers such steps "
            "are skipped and counted instead")
