"""How soon a new ID is served: streaming training exports its changes every few seconds.

A process without tfps serves each new version, and this script measures the time from
the step that trains an ID to the first prediction served with its row.

    python examples/serve_stream.py [--examples 6000000] [--export_every_seconds 10]

Trains examples/stream_ctr.py under tfps-launch (2 parameter servers, 2 workers) with
--serving_dir: a SavedModel version every --export_every_seconds, each after the first
holding only the rows changed since the one before. Beside it, examples/serve_versions.py,
which never imports tfps, loads the newest version as TensorFlow Serving would and
requests predictions for --probes (field, ID) pairs whose IDs first appear during the run,
recording when each is first served with a trained row. The stream is a function of the
example's index (tfps.stream.DriftingStream), so this script finds the step that first
trained each probe (at the latest the batch of its second example, under MinCount(2)
admission; counted from the first), and leaves out IDs seen once, which are never
admitted. The
training job logs when each block of steps was handed to the workers and, every 100
steps, by when it had run. A probe's latency runs from the handing over of its first
step to the first served prediction that used its row. Each worker prefetches batches from
the stream, so one that runs ahead of the other can train a batch a few blocks before the
step count reaches it: a single probe may then read early (even negative under load),
while the median and 95th percentile hold.
Prints the median and 95th percentile, the probes never served, the versions, and the
serving process's memory (its peak over what it held before loading a model) against that
of a fresh process serving only the last version, which is whole.
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def first_occurrences(stream, probe_fields, probe_ids, num_examples, chunk=1 << 20):
    """The indices of the first and second examples holding each probe's ID in its field
    (-1: none), [probes, 2]."""
    import tensorflow as tf
    found = [[] for _ in probe_ids]
    for start in range(0, num_examples, chunk):
        indices = tf.range(start, min(num_examples, start + chunk), dtype=tf.int64)
        ids = stream.examples(indices)[0]["ids"].numpy()
        for field in range(stream.fields):
            waiting = [i for i in np.flatnonzero(probe_fields == field) if len(found[i]) < 2]
            column = ids[:, field]
            hits = np.flatnonzero(np.isin(column, probe_ids[waiting]))
            by_id = {}
            for position in hits[:]:
                by_id.setdefault(int(column[position]), []).append(start + int(position))
            for i in waiting:
                found[i] = (found[i] + by_id.get(int(probe_ids[i]), []))[:2]
    return np.array([f + [-1] * (2 - len(f)) for f in found], np.int64)


def choose_probes(stream, num_examples, count, seed=0):
    """(fields, IDs): IDs that enter the stream's window during the run, spread over it."""
    newest_at_end = int(num_examples * stream.new_ids_per_example) + stream.live_ids - 1
    rng = np.random.default_rng(seed)
    ids = np.linspace(stream.live_ids, newest_at_end, count).astype(np.int64)
    return rng.integers(0, stream.fields, count).astype(np.int64), ids


def step_times(step_log):
    """(steps, the times they were handed to the workers) from stream_ctr.py's --step_log."""
    with open(step_log) as f:
        records = [json.loads(line) for line in f if line.strip()]
    return (np.array([r["step"] for r in records], np.int64), np.array([r["scheduled"] for r in records]),
            sum("done" in r for r in records))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=6_000_000)
    parser.add_argument("--chunk", type=int, default=1_000_000)
    parser.add_argument("--batch_size", type=int, default=1024)
    parser.add_argument("--export_every_seconds", type=float, default=10.0)
    parser.add_argument("--max_change_layers", type=int, default=8)
    parser.add_argument("--max_layered_rows", type=float, default=1.25,
                        help="a shard's versions are layers of changes until they hold this many times its rows")
    parser.add_argument("--probes", type=int, default=2000)
    parser.add_argument("--num_ps", type=int, default=2)
    parser.add_argument("--num_workers", type=int, default=2)
    parser.add_argument("--out_dir", default=None, help="default: a new temporary directory")
    parser.add_argument("--json", action="store_true", help="print the summary as one JSON line")
    args = parser.parse_args()
    out_dir = args.out_dir or tempfile.mkdtemp(prefix="tfps-serve-stream-")
    os.makedirs(out_dir, exist_ok=True)
    base_dir, step_log = os.path.join(out_dir, "serving"), os.path.join(out_dir, "steps.jsonl")
    probes_path, served_path = os.path.join(out_dir, "probes.npz"), os.path.join(out_dir, "served.json")

    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    sys.path.insert(0, ROOT)
    import tfps
    stream = tfps.stream.DriftingStream()
    # As stream_ctr.py trains: whole chunks of whole batches.
    chunk_examples = args.chunk // args.batch_size * args.batch_size
    examples = max(1, args.examples // chunk_examples) * chunk_examples
    probe_fields, probe_ids = choose_probes(stream, examples, args.probes)
    np.savez(probes_path, fields=probe_fields, ids=probe_ids, num_fields=stream.fields)

    server_env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    server = subprocess.Popen([sys.executable, os.path.join(HERE, "serve_versions.py"), base_dir, probes_path,
                               served_path], env=server_env, cwd=out_dir)
    train_env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    began = time.time()
    training = subprocess.run(
        [sys.executable, "-m", "tfps.launch", "--num_ps", str(args.num_ps), "--num_workers", str(args.num_workers),
         "--log_dir", os.path.join(out_dir, "logs"), os.path.join(HERE, "stream_ctr.py"),
         "--examples", str(examples), "--chunk", str(args.chunk), "--batch_size", str(args.batch_size),
         "--serving_dir", base_dir, "--export_every_seconds", str(args.export_every_seconds),
         "--max_change_layers", str(args.max_change_layers), "--max_layered_rows", str(args.max_layered_rows),
         "--whole_at_end", "--step_log", step_log,
         "--out_dir", os.path.join(out_dir, "train")], env=train_env, cwd=out_dir)
    trained_seconds = time.time() - began
    server.send_signal(signal.SIGUSR1)  # serve the newest version, then stop
    if server.wait(timeout=600) != 0 or training.returncode != 0:
        raise SystemExit(f"serve_stream: training exited {training.returncode}, serving {server.returncode}")

    with open(served_path) as f:
        served = json.load(f)
    assert not served["tfps_imported"], "the serving process imported tfps"
    # The reference: a fresh serving process that loads only the last version, a whole one.
    reference_path = os.path.join(out_dir, "served_whole.json")
    subprocess.run([sys.executable, os.path.join(HERE, "serve_versions.py"), base_dir, probes_path,
                    reference_path, "--once"], env=server_env, cwd=out_dir, check=True)
    with open(reference_path) as f:
        reference = json.load(f)
    occurrences = first_occurrences(stream, probe_fields, probe_ids, examples)
    first_example = occurrences[:, 0]
    steps, scheduled, waits = step_times(step_log)
    first_step = first_example // args.batch_size + 1
    # The block holding the probe's first step was handed over at the first logged step at
    # or after it (a worker that prefetched ahead may have trained it a little earlier).
    handed = scheduled[np.minimum(np.searchsorted(steps, first_step), len(steps) - 1)]
    first_served = np.array([np.nan if t is None else t for t in served["first_served"]])
    # An ID seen once is never admitted (MinCount 2): no step trains its row.
    seen = occurrences[:, 1] >= 0
    latency = (first_served - handed)[seen & ~np.isnan(first_served)]
    versions = sorted(int(v) for v in os.listdir(base_dir) if v.isdigit())
    last = os.path.join(base_dir, str(versions[-1]), "variables")
    last_bytes = sum(os.path.getsize(os.path.join(last, f)) for f in os.listdir(last))
    model_mib = served["peak_rss_mib"] - served["baseline_rss_mib"]
    whole_mib = reference["peak_rss_mib"] - reference["baseline_rss_mib"]
    summary = {
        "examples": int(examples), "train_seconds": round(trained_seconds, 1), "versions": len(versions),
        "versions_loaded": len(served["versions"]), "requests": served["requests"],
        "probes": int(seen.sum()), "probes_never_served": int((seen & np.isnan(first_served)).sum()),
        "probes_seen_once": int((~seen).sum()),
        "latency_median_s": round(float(np.median(latency)), 1) if len(latency) else None,
        "latency_p95_s": round(float(np.percentile(latency, 95)), 1) if len(latency) else None,
        "latency_min_s": round(float(np.min(latency)), 1) if len(latency) else None,
        "latency_max_s": round(float(np.max(latency)), 1) if len(latency) else None,
        "step_waits": waits, "last_version_mib": round(last_bytes / (1 << 20), 1),
        "serving_mib": round(model_mib, 1), "serving_one_whole_version_mib": round(whole_mib, 1),
        "serving_memory_over_one_whole_version": round(model_mib / whole_mib, 2),
        "load_seconds_median": round(float(np.median([v["load_seconds"] for v in served["versions"]])), 2),
        "out_dir": out_dir}
    if args.json:
        print("SERVE_STREAM " + json.dumps(summary), flush=True)
    else:
        for key, value in summary.items():
            print(f"{key:>28}: {value}")


if __name__ == "__main__":
    main()
