"""A custom training loop under ParameterServerStrategy, the counterpart of model.fit:
ClusterCoordinator schedules each step on a free worker, and the Keras optimizer's
apply_gradients updates the dense variables and, through the table's own optimizer, the
rows of the DynamicEmbedding on the parameter servers (one gradient per ID, summed).

    tfps-launch --num_ps 2 --num_workers 2 examples/custom_loop.py
    python examples/custom_loop.py        # no TF_CONFIG: the same loop in this process

Workers train asynchronously, as under model.fit: a step reads the rows and variables as
they are when it runs, and its update is applied when it arrives, never lost or split. With
one worker the steps run in order, so the result is exactly that of sequential training;
with more it depends on the order the steps happened to run in.

--sync trains synchronously instead: each step, every worker computes the gradient of its
own batch from the same rows and variables and adds it to a tfps.GradientAccumulator
shared by the workers; once all have (ClusterCoordinator.join), one apply updates the
table and the head with their sum. So N workers with batches of B train exactly as one
process with batches of N x B, whatever order the workers run in, and a worker that fails
mid-step does not count its batch twice (each batch is a numbered contribution to the step,
which a rerun replaces). Each step waits for its slowest worker.

--rows_out writes every trained row with its optimizer slots, the dense head before and
after, and the batches' recipe, as JSON (tests/test_custom_loop.py compares them with a
NumPy model of the same training).
"""

import argparse
import json
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tf_keras as keras  # noqa: E402

import tfps  # noqa: E402

FIELDS, VOCAB = 3, 500


def example_ids(index):
    """The IDs [n, FIELDS] of examples number `index` [n] (int64): a fixed recipe, so that any
    worker and a NumPy model make the same batches."""
    index = tf.convert_to_tensor(index, tf.int64)[:, None]
    fields = tf.range(FIELDS, dtype=tf.int64)[None, :]
    return (index * 2654435761 + fields * 40503 + (index // 7) * fields) % VOCAB


def example_labels(ids):
    """A click when the example's IDs' hidden scores (ID * 37 mod 11, less 5) sum above 0
    (float32 [n]): what a row per ID can learn."""
    return tf.cast(tf.reduce_sum((ids * 37) % 11 - 5, 1) > 0, tf.float32)


def batches(batch_size, data_service=None):
    """Batch after batch of (ids, labels). With a tf.data service address, each batch goes
    to exactly one of the workers that read it (distributed_epoch); without one, every
    worker would read the whole stream and train each batch once per worker."""
    dataset = (tf.data.Dataset.range(1 << 40).batch(batch_size)
               .map(lambda index: (example_ids(index), example_labels(example_ids(index)))))
    if data_service is not None:
        dataset = dataset.apply(tf.data.experimental.service.distribute(
            processing_mode="distributed_epoch", service=data_service, job_name="custom_loop"))
    return dataset


def batch_loss(model, ids, labels, global_batch):
    """The batch's binary cross-entropy, its per-example sum over `global_batch` examples
    (all workers' batches of a step): in a custom loop under a strategy, Keras' default
    reduction is refused."""
    per_example = keras.losses.BinaryCrossentropy(from_logits=True, reduction="none")(
        labels[:, None], model(ids, training=True)[:, None])
    return tf.nn.compute_average_loss(per_example, global_batch_size=global_batch)


def build(args):
    ids = keras.Input((FIELDS,), dtype=tf.int64, name="ids")
    embedding = tfps.keras_layers.DynamicEmbedding(
        args.dim, combiner="sum", optimizer=tfps.optimizers.Adagrad(args.table_lr),
        seed=args.seed, name="ids_embedding")
    head = keras.layers.Dense(1, kernel_initializer=keras.initializers.RandomNormal(seed=args.seed),
                              name="head")
    model = keras.Model(ids, tf.squeeze(head(embedding(ids)), -1))
    return model, embedding, head


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--dim", type=int, default=4)
    parser.add_argument("--table_lr", type=float, default=0.3, help="the table's Adagrad rate")
    parser.add_argument("--dense_lr", type=float, default=0.5, help="the Keras SGD rate of the head")
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--sync", action="store_true",
                        help="synchronous steps: every worker's gradient of a step summed, then applied once")
    parser.add_argument("--rows_out", help="a JSON file for the trained rows (see above)")
    args = parser.parse_args()

    strategy = tfps.distribute.strategy_from_tf_config()  # ps and worker tasks serve here
    clustered = isinstance(strategy, tf.distribute.experimental.ParameterServerStrategy)
    num_workers = len(tfps.distribute.tf_config()["cluster"]["worker"]) if clustered else 1
    with strategy.scope():
        model, embedding, head = build(args)
        optimizer = keras.optimizers.SGD(args.dense_lr)
        if args.sync:  # its sums live on the parameter servers
            # One numbered contribution per worker's batch: a function run again after its
            # worker failed replaces what its first attempt added instead of adding twice.
            accumulator = tfps.GradientAccumulator(model.trainable_variables, shared_by_workers=True,
                                                   contributions=num_workers)
    kernel_start = head.kernel.numpy().ravel().tolist()
    if args.sync:
        train_synchronously(args, strategy, clustered, model, optimizer, accumulator, num_workers)
        report(args, embedding, head, kernel_start, global_batch=args.batch_size * num_workers)
        return
    def replica_step(ids, labels):
        with tf.GradientTape() as tape:
            loss = batch_loss(model, ids, labels, global_batch=args.batch_size)
        variables = model.trainable_variables  # the table's stand-in among them
        optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
        return loss

    @tf.function
    def train_step(iterator):
        return strategy.run(replica_step, args=next(iterator))

    if clustered:
        coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
        # The chief serves the data: one tf.data service worker keeps the stream's order.
        with tfps.data.local_data_service(num_workers=1) as service:
            iterator = iter(coordinator.create_per_worker_dataset(lambda: batches(args.batch_size, service)))
            for step in range(args.steps):
                loss = coordinator.schedule(train_step, args=(iterator,))
                if (step + 1) % 50 == 0:  # fetching waits for that step only
                    print(f"step {step + 1}: loss {loss.fetch():.4f}", flush=True)
            coordinator.join()
    else:
        iterator = iter(batches(args.batch_size))
        for step in range(args.steps):
            loss = train_step(iterator)
            if (step + 1) % 50 == 0:
                print(f"step {step + 1}: loss {float(loss):.4f}", flush=True)
    report(args, embedding, head, kernel_start, global_batch=args.batch_size)


def synchronous_step(args, strategy, clustered, model, optimizer, accumulator, num_workers):
    """A function that trains step s synchronously and returns its workers' losses. Batch i
    of num_workers holds examples (s * num_workers + i) * batch_size on; the loss is
    averaged over all of them, the global batch."""
    def replica_gradients(first_example, contribution):
        ids = example_ids(tf.range(first_example, first_example + args.batch_size))
        with tf.GradientTape() as tape:
            loss = batch_loss(model, ids, example_labels(ids), global_batch=args.batch_size * num_workers)
        accumulator.add(tape.gradient(loss, model.trainable_variables), contribution=contribution)
        return loss

    @tf.function
    def add_gradients(first_example, contribution):  # traced once per contribution (an int)
        return strategy.run(replica_gradients, args=(first_example, contribution))

    @tf.function
    def apply_sum():
        accumulator.apply_to(optimizer)

    if clustered:
        coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
        run, wait = coordinator.schedule, coordinator.join
    else:
        run, wait = (lambda fn, args=(): fn(*args)), (lambda: None)

    def step(s):
        losses = [run(add_gradients, args=(tf.constant((s * num_workers + i) * args.batch_size, tf.int64), i))
                  for i in range(num_workers)]
        wait()  # every worker's gradient of this step is in the sum
        # The chief applies it: a function scheduled on a worker that failed would run again
        # elsewhere, and an apply must run once.
        apply_sum()
        return losses
    return step


def train_synchronously(args, strategy, clustered, model, optimizer, accumulator, num_workers):
    step = synchronous_step(args, strategy, clustered, model, optimizer, accumulator, num_workers)
    for s in range(args.steps):
        losses = step(s)
        if (s + 1) % 50 == 0:
            loss = sum(float(l.fetch() if hasattr(l, "fetch") else l) for l in losses)
            print(f"step {s + 1}: loss {loss:.4f}", flush=True)


def report(args, embedding, head, kernel_start, global_batch):
    print(f"trained {args.steps} steps; the table holds {int(embedding.table.size())} rows", flush=True)
    if args.rows_out:
        rows = embedding.table.export()
        with open(args.rows_out, "w") as f:
            json.dump({"keys": rows.keys.numpy().tolist(), "values": rows.values.numpy().tolist(),
                       "slots": rows.slots.numpy().tolist(), "kernel_start": kernel_start,
                       "kernel": head.kernel.numpy().ravel().tolist(),
                       "bias": float(np.asarray(head.bias.numpy()).ravel()[0]),
                       "steps": args.steps, "batch_size": global_batch, "dim": args.dim,
                       "table_lr": args.table_lr, "dense_lr": args.dense_lr, "seed": args.seed}, f)


if __name__ == "__main__":
    main()
