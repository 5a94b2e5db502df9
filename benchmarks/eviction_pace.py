"""Continuous eviction under streams of new and returning IDs: the table's rows beside a
NumPy simulation of the policy applied exactly at every step, and what the sweep costs per
step (a step's find_or_insert with the policy, and without one, on the same stream).

    python benchmarks/eviction_pace.py [--steps 600] [--keys 5000]

Prints one JSON line per (policy, share of new IDs) and a markdown table.
"""

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import benchmarks.common  # noqa: E402,F401  (sets TensorFlow's environment)
import numpy as np  # noqa: E402

import tfps  # noqa: E402
from tests.eviction_streams import run  # noqa: E402

POLICIES = {"TTL(steps=50)": lambda: tfps.eviction.TTL(steps=50),
            "DecayedFrequency(0.95, 0.05)": lambda: tfps.eviction.DecayedFrequency(0.95, 0.05),
            "none": lambda: None}


def timed_run(policy, fraction, steps, keys):
    """(rows at the end, rows the simulation keeps, median ms of find_or_insert per step
    over the second half)."""
    times = []
    original = tfps.DynamicTable.find_or_insert

    def find_or_insert(self, *args, **kwargs):
        start = time.perf_counter()
        result = original(self, *args, **kwargs)
        times.append(time.perf_counter() - start)
        return result
    tfps.DynamicTable.find_or_insert = find_or_insert
    try:
        table, simulation, rows = run(policy, fraction, steps=steps, keys_per_step=keys)
    finally:
        tfps.DynamicTable.find_or_insert = original
    kept = len(simulation.kept(simulation.clock - 1)) if policy is not None else rows[-1]
    return rows[-1], kept, 1e3 * float(np.median(times[steps // 2:]))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--keys", type=int, default=5000, help="keys per step")
    args = parser.parse_args()
    results = []
    for fraction in (1.0, 0.99, 0.9, 0.5, 0.0):
        baseline = None
        for name in ("none", "TTL(steps=50)", "DecayedFrequency(0.95, 0.05)"):
            rows, kept, ms = timed_run(POLICIES[name](), fraction, args.steps, args.keys)
            baseline = ms if name == "none" else baseline
            result = {"policy": name, "new_fraction": fraction, "rows": rows, "policy_keeps": kept,
                      "rows_over_policy": round(rows / max(1, kept), 3), "find_or_insert_ms": round(ms, 3),
                      "over_no_eviction": round(ms / baseline, 2)}
            results.append(result)
            print(json.dumps(result), flush=True)
    print("\n| policy | new IDs | rows | policy keeps | rows / policy | find_or_insert ms/step | vs no eviction |")
    print("|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['policy']} | {r['new_fraction']:.0%} | {r['rows']:,} | {r['policy_keeps']:,} | "
              f"{r['rows_over_policy']} | {r['find_or_insert_ms']} | {r['over_no_eviction']}x |")


if __name__ == "__main__":
    main()
