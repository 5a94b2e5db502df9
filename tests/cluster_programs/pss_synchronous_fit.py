"""model.fit with tfps.callbacks.SynchronousTraining (tests/test_synchronous_fit.py): the
model of examples/custom_loop.py, every worker's data one fixed batch of examples 0 to
B - 1 over and over, so whichever worker reads which batch, a synchronous step's gradient
is that batch's and training equals one process's on it. Writes what custom_loop's
--rows_out does, plus the optimizer's iterations and the table's clocks.

With --backup_workers b, every worker reads the same stream of distinct batches (examples
0 to B - 1, then B to 2B - 1, ...), at its own pace; the callback records the IDs of
each step's applied and dropped batches, written as step_ids and dropped_ids for the
NumPy model to replay.

With TFPS_TEST_HOLD_DIR set, contribution 0 of step TFPS_TEST_HOLD_STEP holds after its
table gradients have landed (sync_worker_fault.py), for the test to kill the workers.
"""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                "examples"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import custom_loop  # noqa: E402
import tensorflow as tf  # noqa: E402
import tf_keras as keras  # noqa: E402

import tfps  # noqa: E402


class ArmTheHold(keras.callbacks.Callback):
    """At the epoch that starts at `step` (fit under ParameterServerStrategy refuses
    batch-level callbacks)."""

    def __init__(self, step):
        super().__init__()
        self.step = step

    def on_epoch_begin(self, epoch, logs=None):
        if int(self.model.optimizer.iterations) == self.step:
            import sync_worker_fault
            sync_worker_fault.arm()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps_per_epoch", type=int, default=10)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--steps_per_execution", type=int, default=2)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--rows_out", required=True)
    parser.add_argument("--async_fit", action="store_true", help="without SynchronousTraining")
    parser.add_argument("--backup_workers", type=int, default=0)
    parser.add_argument("--record_batches", action="store_true",
                        help="the distinct batches and records of --backup_workers, with or without them")
    parser.add_argument("--refit", action="store_true",
                        help="the last epoch in a second fit after compiling again (a new optimizer)")
    args = parser.parse_args()
    args.dim, args.table_lr, args.dense_lr, args.seed = 4, 0.3, 0.5, 11  # custom_loop's
    holding = "TFPS_TEST_HOLD_DIR" in os.environ
    recording = args.backup_workers or args.record_batches
    if holding:
        import sync_worker_fault
        sync_worker_fault.install_hold()

    strategy = tfps.distribute.strategy_from_tf_config()

    def compile_model():
        with strategy.scope():
            model.compile(optimizer=keras.optimizers.SGD(args.dense_lr),
                          loss=keras.losses.BinaryCrossentropy(from_logits=True),
                          metrics=[keras.metrics.BinaryAccuracy(threshold=0.0)],
                          steps_per_execution=args.steps_per_execution)

    with strategy.scope():
        model, embedding, head = custom_loop.build(args)
    compile_model()
    kernel_start = head.kernel.numpy().ravel().tolist()

    def dataset_fn(_):
        if recording:
            return custom_loop.batches(args.batch_size)
        ids = custom_loop.example_ids(tf.range(args.batch_size, dtype=tf.int64))
        return tf.data.Dataset.from_tensors((ids, custom_loop.example_labels(ids))).repeat()

    synchronous = (tfps.callbacks.SynchronousTraining(args.backup_workers, batch_key=lambda x, y: x)
                   if recording else tfps.callbacks.SynchronousTraining())
    callbacks = [] if args.async_fit else [synchronous]
    if holding:
        callbacks.append(ArmTheHold(int(os.environ["TFPS_TEST_HOLD_STEP"])))
    data = keras.utils.experimental.DatasetCreator(dataset_fn)
    epochs = args.epochs
    steps = []  # with backup workers, each step's applied and dropped batches, over the fits
    if args.refit:
        model.fit(data, epochs=1, steps_per_epoch=args.steps_per_epoch, callbacks=callbacks, verbose=0)
        steps += synchronous.steps
        compile_model()
        epochs -= 1
    history = model.fit(data, epochs=epochs, steps_per_epoch=args.steps_per_epoch, callbacks=callbacks,
                        verbose=0)
    args.steps = args.epochs * args.steps_per_epoch
    custom_loop.report(args, embedding, head, kernel_start, global_batch=args.batch_size)
    with open(args.rows_out) as f:
        out = json.load(f)
    out.update(examples="fixed", iterations=int(model.optimizer.iterations),
               clocks=[int(c) for c in embedding.table.clocks().numpy()],
               accuracy=history.history["binary_accuracy"],
               examples_in_last_epoch=int(next(m for m in model.metrics if m.name == "binary_accuracy").count))
    if recording:
        steps += synchronous.steps
        out.update(step_ids=[step["applied"] for step in steps], dropped_ids=[step["dropped"] for step in steps],
                   dropped_batches=synchronous.dropped_batches,
                   logged_dropped_batches=history.history["dropped_batches"])
    with open(args.rows_out, "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
