"""Streaming training with and without admission and eviction, and what the policies cost.

    python benchmarks/streaming.py [--examples 20000000] [--chunk 1000000]

1. The cost of the policies on a table's own calls, in this process: a training step's
   lookup (find_or_insert of STEP_KEYS unique keys of a table of TABLE_ROWS rows, dim 8)
   plus its apply, with TTL's sweep running (a TTL too long to remove anything, so both
   tables keep the same rows) against no eviction; and a lookup of keys that all have rows
   under MinCount(2) against no admission. Medians of REPEATS alternating runs.
2. examples/stream_ctr.py under tfps-launch (2 parameter servers, 2 workers), twice over the
   same drifting stream: with MinCount(2) and TTL(steps=2000), and with neither (every ID
   kept forever). Each chunk prints the rolling AUC on the next unseen chunk, the table's
   rows, and each parameter server's RSS, read in its own process.

Prints JSON lines and a summary against the targets: rows with the policies at most 40% of
the unbounded table's; parameter-server RSS flat within 5% after warm-up (the first quarter
of the stream), and (the "memory" line, with the policies) the table's memory and every
task's RSS, the chief's and the workers' too, each flat within 5% after warm-up; rolling AUC within 0.003 of the unbounded table's (mean over the chunks
after warm-up); the sweep at most 5% of a step's table time; lookups of admitted keys no
slower than without admission.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TABLE_ROWS, STEP_KEYS, REPEATS = 4 << 20, 8192, 200


def policy_costs():
    """Seconds per call of each table, median over alternating runs."""
    import numpy as np
    import tensorflow as tf
    import tfps

    rng = np.random.default_rng(0)
    rows = rng.integers(-(1 << 62), 1 << 62, TABLE_ROWS, dtype=np.int64)
    tables = {"plain": tfps.DynamicTable(8, optimizer="adagrad"),
              "ttl_sweeping": tfps.DynamicTable(8, optimizer="adagrad", eviction=tfps.eviction.TTL(steps=1 << 30)),
              "min_count": tfps.DynamicTable(8, optimizer="adagrad", admission=tfps.admission.MinCount(2))}
    for table in tables.values():
        for start in range(0, TABLE_ROWS, 1 << 20):
            chunk = tf.constant(rows[start:start + (1 << 20)])
            table.find_or_insert(chunk, tf.fill(tf.shape(chunk), tf.constant(2, tf.int64)))
    batches = [tf.constant(rng.choice(rows, STEP_KEYS, replace=False)) for _ in range(16)]
    occurrences = tf.ones([STEP_KEYS], tf.int64)
    grads = tf.random.uniform([STEP_KEYS, 8], -1e-3, 1e-3)
    calls = {name: tf.function(lambda keys, t=t: t.find_or_insert(keys, occurrences)) for name, t in tables.items()}
    def step(table, keys):
        rows = table.find_or_insert(keys, occurrences)
        with tf.control_dependencies([table.apply_gradients(keys, grads, step=-1)]):
            return tf.identity(rows)

    steps = {name: tf.function(lambda keys, t=t: step(t, keys)) for name, t in tables.items()}
    counter = iter(range(1 << 30))
    times = {}
    for label, fns, names in (("step", steps, ("plain", "ttl_sweeping")),
                              ("lookup", calls, ("plain", "min_count"))):
        runs = {name: [] for name in names}
        for _ in range(5):  # alternate, so drift in the machine's speed falls on both alike
            for name in names:
                runs[name].append(common.median_seconds(
                    lambda: fns[name](batches[next(counter) % len(batches)]), REPEATS // 5))
        for name in names:
            times[f"{label}_{name}_ms"] = round(1e3 * sorted(runs[name])[2], 3)
    assert tables["ttl_sweeping"].stats()["evicted"] == 0
    return times


def stream_run(args, policies):
    work = tempfile.mkdtemp(prefix="tfps-stream-bench-")
    command = [sys.executable, "-m", "tfps.launch", "--num_ps", "2", "--num_workers", "2", "--log_dir",
               os.path.join(work, "logs"), os.path.join(ROOT, "examples", "stream_ctr.py"), "--json",
               "--examples", str(args.examples), "--chunk", str(args.chunk), "--eval_examples", str(args.eval_examples),
               "--pid_dir", os.path.join(work, "pids")]
    if not policies:
        command += ["--min_count", "0", "--ttl_steps", "0"]
    records = []
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", TF_USE_LEGACY_KERAS="1")
    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT) as process:
        for line in process.stdout:
            if line.startswith("STREAM "):
                record = json.loads(line[len("STREAM "):])
                record["ps_rss_mib"] = round(sum(v for k, v in record["rss_mib"].items() if k.startswith("ps")), 1)
                record["policies"] = policies
                records.append(record)
                print(json.dumps(record), flush=True)
    if process.returncode != 0 or not records:
        sys.exit(f"the stream run {'with' if policies else 'without'} policies failed ({process.returncode}); "
                 f"logs in {work}/logs")
    return records


def spread(values):
    return round((max(values) - min(values)) / min(values), 4)


def memory_summary(records, warm_up):
    """After warm-up: the rows' range, and the spread of the table's memory and of each
    task's RSS (the targets: each within 5% while the rows are flat)."""
    after = [r for r in records if r["examples"] > warm_up]
    tasks = sorted(after[0]["rss_mib"])
    return {
        "chunks_after_warm_up": len(after),
        "rows_after_warm_up": [min(r["rows"] for r in after), max(r["rows"] for r in after)],
        "table_mib_after_warm_up": [min(r["table_mib"] for r in after), max(r["table_mib"] for r in after)],
        "table_mib_spread": spread([r["table_mib"] for r in after]),
        "rss_spread_by_task": {t: spread([r["rss_mib"][t] for r in after]) for t in tasks},
        "rss_mib_by_task": {t: [min(r["rss_mib"][t] for r in after), max(r["rss_mib"][t] for r in after)]
                            for t in tasks},
        "targets": "table memory and every task's RSS spread <= 0.05 after warm-up, rows flat",
    }


def summarize(costs, with_policies, unbounded, warm_up):
    after = [r for r in with_policies if r["examples"] > warm_up]
    base = {r["chunk"]: r for r in unbounded}
    rss = [r["ps_rss_mib"] for r in after]
    auc_gap = [r["rolling_auc"] - base[r["chunk"]]["rolling_auc"] for r in after if r["chunk"] in base]
    return {
        "rows_vs_unbounded": round(with_policies[-1]["rows"] / unbounded[-1]["rows"], 4),
        "rows": [with_policies[-1]["rows"], unbounded[-1]["rows"]],
        "ps_rss_spread_after_warm_up": spread(rss),
        "ps_rss_mib_after_warm_up": [min(rss), max(rss)],
        "unbounded_ps_rss_mib": [unbounded[0]["ps_rss_mib"], unbounded[-1]["ps_rss_mib"]],
        "rolling_auc_mean_gap": round(sum(auc_gap) / len(auc_gap), 5),
        "rolling_auc_gap_range": [round(min(auc_gap), 5), round(max(auc_gap), 5)],
        "sweep_share_of_step": round(costs["step_ttl_sweeping_ms"] / costs["step_plain_ms"] - 1, 4),
        "admitted_lookup_vs_plain": round(costs["lookup_min_count_ms"] / costs["lookup_plain_ms"], 3),
        "examples_per_s": [with_policies[-1]["examples_per_s"], unbounded[-1]["examples_per_s"]],
        "targets": "rows <= 0.40; rss spread <= 0.05; |auc gap| <= 0.003; sweep <= 0.05; lookup <= 1.0 (noise aside)",
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=20_000_000)
    parser.add_argument("--chunk", type=int, default=1_000_000)
    parser.add_argument("--eval_examples", type=int, default=102_400, help="rolling AUC's examples per chunk")
    parser.add_argument("--skip_costs", action="store_true")
    parser.add_argument("--only", choices=["costs", "policies", "unbounded"],
                        help="measure only the policies' cost, or run one of the two streams")
    args = parser.parse_args()
    costs = {} if args.skip_costs else policy_costs()
    print(json.dumps({"policy_costs": costs}), flush=True)
    if args.only == "costs":
        return
    with_policies = stream_run(args, policies=True) if args.only != "unbounded" else None
    unbounded = stream_run(args, policies=False) if args.only != "policies" else None
    if with_policies:
        print(json.dumps({"memory": memory_summary(with_policies, args.examples // 4)}), flush=True)
    if costs and with_policies and unbounded:
        print(json.dumps({"summary": summarize(costs, with_policies, unbounded, args.examples // 4)}), flush=True)


if __name__ == "__main__":
    main()
