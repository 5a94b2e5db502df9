"""Micro-batch accumulation with the default tfps.GradientAccumulator under
ParameterServerStrategy with one worker (tests/test_custom_loop.py): each scheduled step
adds the gradients of `--micro_batches` batches of examples/custom_loop.py's recipe (the
loss averaged over all of them) and applies their sum once, so the run trains as one
process with batches of micro_batches x batch_size. Writes what custom_loop's --rows_out
does."""

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                "examples"))

import custom_loop  # noqa: E402
import tensorflow as tf  # noqa: E402
import tf_keras as keras  # noqa: E402

import tfps  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--micro_batches", type=int, default=2)
    parser.add_argument("--rows_out", required=True)
    args = parser.parse_args()
    args.dim, args.table_lr, args.dense_lr, args.seed = 4, 0.3, 0.5, 11  # custom_loop's
    step_examples = args.batch_size * args.micro_batches

    strategy = tfps.distribute.strategy_from_tf_config()
    with strategy.scope():
        model, embedding, head = custom_loop.build(args)
        optimizer = keras.optimizers.SGD(args.dense_lr)
        accumulator = tfps.GradientAccumulator(model.trainable_variables)
    kernel_start = head.kernel.numpy().ravel().tolist()

    def accumulate_and_apply(first_example):
        for i in range(args.micro_batches):
            start = first_example + i * args.batch_size
            ids = custom_loop.example_ids(tf.range(start, start + args.batch_size))
            with tf.GradientTape() as tape:
                loss = custom_loop.batch_loss(model, ids, custom_loop.example_labels(ids), global_batch=step_examples)
            accumulator.add(tape.gradient(loss, model.trainable_variables))
        accumulator.apply_to(optimizer)

    @tf.function
    def step(first_example):
        strategy.run(accumulate_and_apply, args=(first_example,))

    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    for s in range(args.steps):
        coordinator.schedule(step, args=(tf.constant(s * step_examples, tf.int64),))
    coordinator.join()
    custom_loop.report(args, embedding, head, kernel_start, global_batch=step_examples)


if __name__ == "__main__":
    main()
