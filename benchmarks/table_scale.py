"""A table's memory per row and its training step's time as it grows.

    python benchmarks/table_scale.py                       # 1M .. 50M rows (about 10 GB at 50M)
    python benchmarks/table_scale.py --sizes 1,4 --dims 16  # a quick look

1. Memory per row: tables of each `--dims` with Adagrad filled with N uniform 64-bit keys;
   prints stats()["memory_bytes"] / rows (values, slots, index, metadata and change
   stamps) against the bytes of the values and the slot alone, and the process RSS growth
   per row. Targets: at most 1.5x the values and slots at dim 16, 1.25x at dim 64.
2. Step time as the table grows: one training step's table calls (find_or_insert of
   STEP_KEYS unique keys, 7/8 of them with rows, then apply_gradients), median of REPEATS
   after WARM_UP untimed steps, on one dim-16 Adagrad table grown to each of `--sizes`
   million rows in turn (TFPS_HUGE_PAGES=1: rows on transparent huge pages). Target: at
   the largest size within 1.2x of the smallest.

Each part runs in its own child process, so the memory of one does not weigh on the next.
Prints one JSON line per measurement and a summary line per target.
"""

import argparse
import json
import os
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

STEP_KEYS, WARM_UP, REPEATS, FILL_BATCH = 8192, 20, 100, 1 << 20


def fill(table, keys):
    import tensorflow as tf
    for start in range(0, len(keys), FILL_BATCH):
        table.find_or_insert(tf.constant(keys[start:start + FILL_BATCH]))


def memory_per_row(dim, million_rows):
    import tfps
    keys = common.uniform_keys(million_rows * 1_000_000, seed=dim)
    before = common.rss_bytes()
    table = tfps.DynamicTable(dim, optimizer="adagrad")
    fill(table, keys)
    stats = table.stats()
    payload = dim * 4 * (1 + table.num_slots)  # the values and Adagrad's accumulator
    common.emit({"part": "memory", "dim": dim, "rows": stats["rows"],
                 "bytes_per_row": round(stats["memory_bytes"] / stats["rows"], 1),
                 "values_and_slots_bytes": payload,
                 "ratio": round(stats["memory_bytes"] / stats["rows"] / payload, 3),
                 "rss_growth_per_row": round((common.rss_bytes() - before) / stats["rows"], 1)})


def step_time(sizes):
    import tensorflow as tf
    import tfps
    rng = np.random.default_rng(1)
    table = tfps.DynamicTable(16, optimizer="adagrad")
    grads = tf.random.uniform([STEP_KEYS, 16], -1e-3, 1e-3)

    @tf.function
    def step(keys):
        table.find_or_insert(keys)
        table.apply_gradients(keys, grads[:tf.size(keys)], step=-1)

    inserted = 0
    all_keys = common.uniform_keys(sizes[-1] * 1_000_000 + len(sizes) * (WARM_UP + REPEATS) * STEP_KEYS, seed=2)
    fresh = sizes[-1] * 1_000_000  # keys from here on are new to the table
    for million in sizes:
        fill(table, all_keys[inserted:million * 1_000_000])
        inserted = million * 1_000_000
        batches = []
        for r in range(WARM_UP + REPEATS):
            old = all_keys[rng.integers(0, inserted, STEP_KEYS - STEP_KEYS // 8)]
            new = all_keys[fresh + r * (STEP_KEYS // 8):fresh + (r + 1) * (STEP_KEYS // 8)]
            batches.append(tf.constant(np.unique(np.concatenate([old, new]))))
        for keys in batches[:WARM_UP]:  # traced, and the first steps' index growth done
            step(keys)
        times = []
        with common.gc_paused():
            for keys in batches[WARM_UP:]:
                start = common.time.perf_counter()
                step(keys)
                times.append(common.time.perf_counter() - start)
        common.emit({"part": "step", "rows": int(table.size()), "step_keys": STEP_KEYS,
                     "median_ms": round(1e3 * float(np.median(times)), 3),
                     "p90_ms": round(1e3 * float(np.percentile(times, 90)), 3)})
        fresh += (WARM_UP + REPEATS) * (STEP_KEYS // 8)  # the next size's steps bring other new keys


def child(args):
    out = subprocess.run([sys.executable, os.path.abspath(__file__)] + args, capture_output=True, text=True,
                         timeout=3600)
    if out.returncode != 0:
        sys.stderr.write(out.stderr[-3000:])
        raise SystemExit(f"benchmark child {args} failed")
    records = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    for record in records:
        print(json.dumps(record), flush=True)
    return records


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1,10,20,50", help="million rows, ascending")
    parser.add_argument("--dims", default="16,64")
    parser.add_argument("--memory_million_rows", type=int, default=4)
    parser.add_argument("--child", choices=["memory", "step"])
    parser.add_argument("--dim", type=int)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    if args.child == "memory":
        return memory_per_row(args.dim, args.memory_million_rows)
    if args.child == "step":
        return step_time(sizes)
    records = []
    for dim in (int(d) for d in args.dims.split(",")):
        records += child(["--child", "memory", "--dim", str(dim), "--memory_million_rows",
                          str(args.memory_million_rows)])
    records += child(["--child", "step", "--sizes", args.sizes])
    targets = {16: 1.5, 64: 1.25}
    for r in records:
        if r["part"] == "memory" and r["dim"] in targets:
            print(json.dumps({"summary": f"memory per row at dim {r['dim']} <= {targets[r['dim']]}x values + slots",
                              "ratio": r["ratio"], "met": r["ratio"] <= targets[r["dim"]]}))
    steps = [r for r in records if r["part"] == "step"]
    if len(steps) > 1:
        ratio = steps[-1]["median_ms"] / steps[0]["median_ms"]
        print(json.dumps({"summary": f"step time at {steps[-1]['rows']:,} rows <= 1.2x at {steps[0]['rows']:,}",
                          "ratio": round(ratio, 3), "met": ratio <= 1.2}))


if __name__ == "__main__":
    main()
