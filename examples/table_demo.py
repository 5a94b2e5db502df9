"""A short demo of the dynamic table: learn per-ID click rates from a stream of IDs.

Each step draws a batch of power-law IDs from a huge ID space (the table grows as new IDs
arrive), looks up their rows, computes a logistic loss in TensorFlow, and pushes the
gradient of the unique rows back with `apply_gradients`, where the table's own Adagrad
updates them. Then it checkpoints the table and restores it into a fresh one.

    python examples/table_demo.py --steps 200
"""

import argparse
import os
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tfps  # noqa: E402


def id_stream(batch, seed):
    """Power-law IDs scrambled over the 64-bit space; an ID's click rate depends on it."""
    rng = np.random.default_rng(seed)
    while True:
        ranks = rng.zipf(1.2, size=batch).astype(np.uint64)
        ids = (ranks * np.uint64(0x9E3779B97F4A7C15)).view(np.int64)
        true_rate = 1.0 / (1.0 + np.exp(-np.sin(ranks.astype(np.float64))))
        labels = (rng.random(batch) < true_rate).astype(np.float32)
        yield ids, labels


def make_train_step(table, readout):
    """A tf.function step: the logistic loss of each ID's row . readout against its label,
    whose gradient for each unique ID's row goes to the table's own optimizer."""

    @tf.function
    def train_step(ids, labels, step):
        unique, position = tf.unique(ids)
        rows = table.find_or_insert(unique)
        with tf.GradientTape() as tape:
            tape.watch(rows)
            logits = tf.linalg.matvec(tf.gather(rows, position), readout)
            loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels, logits))
        # The gather's gradient holds one slice per occurrence; dense, it sums them per row.
        table.apply_gradients(unique, tf.convert_to_tensor(tape.gradient(loss, rows)), step=step)
        return loss

    return train_step


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch", type=int, default=4096)
    parser.add_argument("--dim", type=int, default=8)
    args = parser.parse_args()

    table = tfps.DynamicTable(args.dim, optimizer=tfps.optimizers.Adagrad(0.2),
                              initializer=tfps.initializers.TruncatedNormal(stddev=0.01), seed=7)
    train_step = make_train_step(table, tf.ones([args.dim]) / args.dim)
    stream = id_stream(args.batch, seed=1)
    start = time.perf_counter()
    for step in range(1, args.steps + 1):
        ids, labels = next(stream)
        loss = train_step(tf.constant(ids), tf.constant(labels), tf.constant(step, tf.int64))
        if step % max(1, args.steps // 10) == 0 or step == 1:
            print(f"step {step:5d}  loss {float(loss):.4f}  table size {int(table.size()):8d}")
    elapsed = time.perf_counter() - start
    print(f"{args.steps * args.batch / elapsed:,.0f} examples/s")

    with tempfile.TemporaryDirectory() as tmp:
        path = tf.train.Checkpoint(table=table).save(os.path.join(tmp, "table"))
        restored = tfps.DynamicTable(args.dim, optimizer=tfps.optimizers.Adagrad(0.2),
                                     initializer=tfps.initializers.TruncatedNormal(stddev=0.01), seed=7)
        tf.train.Checkpoint(table=restored).restore(path).assert_consumed()
        probe = next(stream)[0]
        same = np.array_equal(table.find(probe).numpy(), restored.find(probe).numpy())
        print(f"checkpoint restored {int(restored.size())} keys; rows identical: {same}")
        if not same:
            raise SystemExit("restored table differs from the trained one")


if __name__ == "__main__":
    main()
