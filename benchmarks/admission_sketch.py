"""How often MinCount(2)'s count-min sketch admits a key by mistake, or misses one.

    python benchmarks/admission_sketch.py [--once 2000000] [--twice 1000000] [--gaps 1,0.1]

One table shard (what each parameter server holds) sees a stream of `once` keys that
occur once and `twice` keys that occur twice, the second occurrence anywhere later in the
stream or within a gap, in training lookups of BATCH keys. Under MinCount(2) a key seen once must not
get a row, and a key seen twice should. For each sketch size, and for exact counts
(sketch_bytes=0, which must make no mistake), prints:
- false_admission_rate: keys seen once that got a row (their counters were shared with
  other keys);
- missed_admission_rate: keys seen twice that got no row (the sketch halved its counters
  between the two occurrences, as it does whenever half of them are in use, which
  forgets a count of 1);
- table_mib: the shard's memory (index, rows and counts).
"""

import argparse
import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tfps  # noqa: E402

BATCH = 65536
SKETCH_MIB = (1, 4, 16, 64)


def stream_of(once, twice, gap, seed):
    """Keys in order of time: every key first at a uniform time in [0, 1); a key seen twice
    again a uniform time later, up to `gap` (a share of the stream; 1: anywhere later)."""
    rng = np.random.default_rng(seed)
    keys = rng.choice(1 << 62, once + twice, replace=False).astype(np.int64)
    first = rng.random(once + twice)
    second = first[once:] + rng.random(twice) * np.minimum(gap, 1.0 - first[once:])
    times = np.concatenate([first, second])
    return keys[:once], keys[once:], np.concatenate([keys, keys[once:]])[np.argsort(times)]


def measure(sketch_bytes, once_keys, twice_keys, stream):
    table = tfps.DynamicTable(8, admission=tfps.admission.MinCount(2, sketch_bytes=sketch_bytes))
    for start in range(0, len(stream), BATCH):
        table.find_or_insert(tf.constant(stream[start:start + BATCH]))
    _, once_admitted = table.find(tf.constant(once_keys), return_exists=True)
    _, twice_admitted = table.find(tf.constant(twice_keys), return_exists=True)
    stats = table.stats()
    return {"sketch_mib": sketch_bytes / (1 << 20) if sketch_bytes else "exact",
            "false_admission_rate": round(float(np.mean(once_admitted.numpy())), 5),
            "missed_admission_rate": round(1.0 - float(np.mean(twice_admitted.numpy())), 5),
            "table_mib": round(stats["memory_bytes"] / (1 << 20), 1)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--once", type=int, default=2_000_000, help="keys that occur once")
    parser.add_argument("--twice", type=int, default=1_000_000, help="keys that occur twice")
    parser.add_argument("--gaps", default="1,0.1", help="how far apart a key's two occurrences may "
                        "be, as shares of the stream (1: anywhere)")
    args = parser.parse_args()
    for gap in map(float, args.gaps.split(",")):
        once_keys, twice_keys, stream = stream_of(args.once, args.twice, gap, seed=0)
        print(json.dumps({"distinct_keys": args.once + args.twice, "occurrences": len(stream),
                          "max_gap": gap}), flush=True)
        for sketch_bytes in [0] + [mib << 20 for mib in SKETCH_MIB]:
            print(json.dumps({"max_gap": gap, **measure(sketch_bytes, once_keys, twice_keys, stream)}), flush=True)


if __name__ == "__main__":
    main()
