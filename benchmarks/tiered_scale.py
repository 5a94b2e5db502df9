"""A tiered table far larger than its memory budget: trained, checkpointed and checked.

    python benchmarks/tiered_scale.py                          # 100M rows, a 2 GiB budget
    python benchmarks/tiered_scale.py --million_rows 2 --budget_mib 64 --dir /tmp/x  # a look

One dim-16 Adagrad table with tfps.storage.Tiered(memory_bytes=budget) grows by
`--step_keys` new IDs a step (find_or_insert, then apply_gradients of one gradient row
each) to `--million_rows` rows, then trains `--hot_steps` steps of Zipf(1.1) IDs drawn from
every row, and writes a checkpoint of every row. Prints rows, rows in memory, the process's
peak and final RSS, the disk tier's bytes (its directory on disk) and the checkpoint's,
steps/s and rows/s while growing, the hot steps' RAM hit rate, and the checkpoint's time.
Checks the values: `--check_keys` keys sampled from every step get the same calls on a
small table in memory, whose rows (values, slots, metadata) the tiered table's must equal
bit for bit. Needs `--dir` on a disk
with room for the tier and the checkpoint (about 170 bytes a row each).
"""

import argparse
import json
import os
import shutil
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


def peak_rss_bytes():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def directory_bytes(path):
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.path.getsize(os.path.join(root, name))
            except FileNotFoundError:
                pass  # a file RocksDB compacted away meanwhile
    return total


def rows_of(table, keys):
    """(values, slots, metadata) of `keys` (sorted, all present), read chunk by chunk so
    that no copy of the whole table is made."""
    keys = np.sort(keys)
    values = np.zeros((len(keys), table.dim), np.float32)
    slots = np.zeros((len(keys), table.num_slots, table.dim), np.float32)
    metadata = np.zeros((len(keys), 4), np.int64)
    for chunk in table.export_chunks(1 << 20):
        chunk_keys = chunk.keys.numpy()
        mine = np.isin(chunk_keys, keys)
        at = np.searchsorted(keys, chunk_keys[mine])
        values[at] = chunk.values.numpy()[mine]
        slots[at] = chunk.slots.numpy()[mine]
        metadata[at] = chunk.metadata.numpy()[mine]
    return values, slots, metadata


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--million_rows", type=float, default=100)
    parser.add_argument("--budget_mib", type=int, default=2048, help="the table's memory budget of payloads")
    parser.add_argument("--step_keys", type=int, default=1 << 20)
    parser.add_argument("--hot_steps", type=int, default=20)
    parser.add_argument("--check_keys", type=int, default=64, help="sampled keys per step checked exactly")
    parser.add_argument("--dir", default="/var/tmp/tfps-tiered-scale", help="for the tier and the checkpoint")
    args = parser.parse_args()
    import tensorflow as tf
    import tfps
    shutil.rmtree(args.dir, ignore_errors=True)
    os.makedirs(args.dir)
    dim, rows = 16, int(args.million_rows * 1e6)
    storage = tfps.storage.Tiered(os.path.join(args.dir, "tier"), memory_bytes=args.budget_mib << 20)
    table = tfps.DynamicTable(dim, optimizer=tfps.optimizers.Adagrad(0.1), seed=3, storage=storage)
    reference = tfps.DynamicTable(dim, optimizer=tfps.optimizers.Adagrad(0.1), seed=3)
    rng = np.random.default_rng(0)
    checked = []
    grow_start = time.perf_counter()
    steps = 0
    for start in range(0, rows, args.step_keys):
        keys = common.scramble(np.arange(start, min(rows, start + args.step_keys), dtype=np.uint64))
        grads = rng.standard_normal((len(keys), dim), dtype=np.float32)
        table.find_or_insert(tf.constant(keys))
        table.apply_gradients(tf.constant(keys), tf.constant(grads))
        pick = rng.choice(len(keys), args.check_keys, replace=False)
        reference.find_or_insert(tf.constant(keys[pick]))
        reference.apply_gradients(tf.constant(keys[pick]), tf.constant(grads[pick]))
        checked.append(keys[pick])
        steps += 1
        if steps % 10 == 0:
            stats = table.stats()
            print(json.dumps({"step": steps, "rows": stats["rows"], "rows_in_memory": stats["rows_in_memory"],
                              "rss_gib": round(common.rss_bytes() / 2 ** 30, 2),
                              "seconds": round(time.perf_counter() - grow_start, 1)}), flush=True)
    grow_seconds = time.perf_counter() - grow_start
    # Hot steps: Zipf IDs over every row, read and updated (the reference gets the checked ones).
    found_before, read_before = table.stats()["lookup_hits"], table.stats()["lookup_misses"]
    hot_start = time.perf_counter()
    for _ in range(args.hot_steps):
        ranks = np.minimum(rng.zipf(1.1, args.step_keys), rows) - 1
        keys = np.unique(common.scramble(ranks.astype(np.uint64)))
        grads = rng.standard_normal((len(keys), dim), dtype=np.float32)
        table.find_or_insert(tf.constant(keys))
        table.apply_gradients(tf.constant(keys), tf.constant(grads))
        every = np.concatenate(checked)
        mine = np.isin(keys, every)
        reference.find_or_insert(tf.constant(keys[mine]))
        reference.apply_gradients(tf.constant(keys[mine]), tf.constant(grads[mine]))
    hot_seconds = time.perf_counter() - hot_start
    stats = table.stats()
    found, read = stats["lookup_hits"] - found_before, stats["lookup_misses"] - read_before
    checkpoint_start = time.perf_counter()
    path = tf.train.Checkpoint(table=table).write(os.path.join(args.dir, "checkpoint", "ckpt"))
    checkpoint_seconds = time.perf_counter() - checkpoint_start
    sample = np.unique(np.concatenate(checked))
    exact = all(np.array_equal(a, b) for a, b in zip(rows_of(table, sample), rows_of(reference, sample)))
    summary = {
        "rows": stats["rows"], "rows_in_memory": stats["rows_in_memory"], "budget_mib": args.budget_mib,
        "payload_memory_gib": round(stats["payload_memory_bytes"] / 2 ** 30, 2),
        "table_memory_gib": round(stats["memory_bytes"] / 2 ** 30, 2),
        "key_bytes_per_row": round((stats["memory_bytes"] - stats["payload_memory_bytes"]) / stats["rows"], 1),
        "peak_rss_gib": round(peak_rss_bytes() / 2 ** 30, 2), "rss_gib": round(common.rss_bytes() / 2 ** 30, 2),
        "tier_disk_gib": round(directory_bytes(os.path.join(args.dir, "tier")) / 2 ** 30, 2),
        "checkpoint_gib": round(directory_bytes(os.path.join(args.dir, "checkpoint")) / 2 ** 30, 2),
        "grow_steps_per_s": round(steps / grow_seconds, 3), "grow_rows_per_s": round(rows / grow_seconds),
        "hot_steps_per_s": round(args.hot_steps / hot_seconds, 3), "hot_hit_rate": round(found / max(1, found + read), 4),
        "checkpoint_seconds": round(checkpoint_seconds, 1), "checkpoint_rows_per_s": round(stats["rows"] / checkpoint_seconds),
        "checked_rows": len(sample), "checked_rows_exact": bool(exact), "checkpoint": path}
    print(json.dumps(summary), flush=True)
    shutil.rmtree(args.dir, ignore_errors=True)
    return 0 if exact else 1


if __name__ == "__main__":
    sys.exit(main())
