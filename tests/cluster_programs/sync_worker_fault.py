"""examples/custom_loop.py --sync with a worker held in the middle of its add at one step
(tests/test_custom_loop.py kills it there); pss_synchronous_fit.py holds fit's the same way.

At step TFPS_TEST_HOLD_STEP the chief arms the hold before scheduling the step; the worker
that runs contribution 0 of it adds its table gradients, which land on the parameter
servers, then writes the file `held` and "held 1" to the FIFO `events` (both in
TFPS_TEST_HOLD_DIR) and spins before adding its dense gradients, until the test kills
it. The coordinator then runs that function again on a worker, which finds `held` and
does not hold: the step counts the batch once only if the rerun replaces what the killed
attempt landed.
"""

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "examples"))

import custom_loop  # noqa: E402
import tensorflow as tf  # noqa: E402

import tfps  # noqa: E402
from tfps.keras import _optimizer_bridge  # noqa: E402

HOLD_DIR = os.environ["TFPS_TEST_HOLD_DIR"]
HOLD_STEP = int(os.environ["TFPS_TEST_HOLD_STEP"])
ARMED, HELD, EVENTS = (os.path.join(HOLD_DIR, name) for name in ("armed", "held", "events"))
# Turns of the hold, each a file lookup of some microseconds: a test that never kills the
# worker still ends it.
SPIN_LIMIT = 5_000_000


def exists(path):
    # The pattern depends on a stateful op (and is still `path`), so the check runs each
    # time instead of being folded to a constant when the worker optimizes the graph.
    unfolded = tf.strings.join([path, tf.strings.substr(tf.strings.as_string(tf.timestamp()), 0, 0)])
    return tf.size(tf.io.matching_files(unfolded)) > 0


def hold_once():
    """On the worker: when armed and not held before, marks the hold and spins."""
    def hold():
        with tf.control_dependencies([tf.io.write_file(HELD, "1")]):
            with tf.control_dependencies([tf.io.write_file(EVENTS, "held 1\n")]):
                # Each turn looks for the held file, which paces the spin.
                return tf.while_loop(lambda i: tf.logical_and(i < SPIN_LIMIT, exists(HELD)),
                                     lambda i: i + 1, [tf.constant(0)])[0]
    return tf.cond(tf.logical_and(exists(ARMED), tf.logical_not(exists(HELD))), hold, lambda: tf.constant(0))


add = tfps.GradientAccumulator.add


def add_tables_then_hold_then_the_rest(self, gradients, contribution=None):
    gradients = list(gradients)
    of_table = [_optimizer_bridge.owner_of(v) is not None for v in self.variables]
    tables = add(self, [g if t else None for g, t in zip(gradients, of_table)], contribution)
    if contribution != 0:
        return tf.group(tables, add(self, [None if t else g for g, t in zip(gradients, of_table)], contribution))
    with tf.control_dependencies([tables]):
        held = hold_once()
    with tf.control_dependencies([held]):
        return add(self, [None if t else g for g, t in zip(gradients, of_table)], contribution)


def install_hold():
    """Every accumulator's contribution 0 adds its tables' gradients, then holds when armed."""
    tfps.GradientAccumulator.add = add_tables_then_hold_then_the_rest


def arm():
    """The chief, before it schedules the step to hold."""
    open(ARMED, "w").close()


synchronous_step = custom_loop.synchronous_step


def step_armed_at_the_hold_step(*args, **kwargs):
    step = synchronous_step(*args, **kwargs)

    def armed(s):
        if s == HOLD_STEP:
            arm()
        return step(s)
    return armed


if __name__ == "__main__":
    install_hold()
    custom_loop.synchronous_step = step_armed_at_the_hold_step
    custom_loop.main()
