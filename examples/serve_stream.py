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
example's index (tfps.stream.DriftingStream), so this script finds the batches holding each
probe's first two occurrences; under MinCount(2) admission the row is created and first
trained by whichever of them trains second (or, should the admission sketch over-count,
by the first: a probe served between the two counts from the first). IDs seen once are
never admitted and are left out. The training tasks record when they trained each batch
(stream_ctr.py --trained_log, written by the worker that ran the step), and a probe's
latency runs from that training step to the first served prediction that used its row. A probe served before either of
its batches trained would mean a wrong clock or record: it is counted, and must be 0.
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


def batch_training_times(trained_log, batch_size):
    """(first example of each trained batch, sorted; when it trained) from stream_ctr.py's
    --trained_log. A batch trained twice (a restarted task) counts from its first time."""
    firsts, times = np.loadtxt(trained_log, dtype=np.float64, ndmin=2).T
    firsts = firsts.astype(np.int64)
    if np.any(firsts % batch_size):
        raise SystemExit(f"serve_stream: {trained_log} holds batches that do not start at a multiple of "
                         f"{batch_size}")
    order = np.lexsort((times, firsts))
    firsts, times = firsts[order], times[order]
    first_time = np.concatenate([[True], firsts[1:] != firsts[:-1]])
    return firsts[first_time], times[first_time]


def trained_at(examples, firsts, times, batch_size):
    """When the batch holding each example index trained: NaN for -1 (no such occurrence)
    and for a batch no step trained (a worker had prefetched it when training ended)."""
    at = np.full(examples.shape, np.nan)
    batch_first = examples // batch_size * batch_size
    position = np.minimum(np.searchsorted(firsts, batch_first), len(firsts) - 1)
    trained = (examples >= 0) & (firsts[position] == batch_first)
    at[trained] = times[position[trained]]
    return at


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
    base_dir, trained_log = os.path.join(out_dir, "serving"), os.path.join(out_dir, "trained_batches.txt")
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
         "--whole_at_end", "--trained_log", trained_log,
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
    firsts, times = batch_training_times(trained_log, args.batch_size)
    occurrence_trained = trained_at(occurrences, firsts, times, args.batch_size)
    first_served = np.array([np.nan if t is None else t for t in served["first_served"]])
    # An ID seen once is never admitted (MinCount 2): no step trains its row.
    seen = occurrences[:, 1] >= 0
    # Each worker prefetches from the shared stream, so when training ends a few batches
    # near the end have not trained; a probe whose first two occurrences did not both
    # train is left out of the latency.
    untrained = seen & np.isnan(occurrence_trained).any(axis=1)
    earlier = np.fmin(occurrence_trained[:, 0], occurrence_trained[:, 1])
    later = np.fmax(occurrence_trained[:, 0], occurrence_trained[:, 1])
    admitted = np.where(first_served >= later, later, earlier)
    latency = (first_served - admitted)[seen & ~untrained & ~np.isnan(first_served)]
    served_untrained = int(np.sum(first_served < earlier))
    versions = sorted(int(v) for v in os.listdir(base_dir) if v.isdigit())
    last = os.path.join(base_dir, str(versions[-1]), "variables")
    last_bytes = sum(os.path.getsize(os.path.join(last, f)) for f in os.listdir(last))
    model_mib = served["peak_rss_mib"] - served["baseline_rss_mib"]
    whole_mib = reference["peak_rss_mib"] - reference["baseline_rss_mib"]
    summary = {
        "examples": int(examples), "train_seconds": round(trained_seconds, 1), "versions": len(versions),
        "versions_loaded": len(served["versions"]), "requests": served["requests"],
        "probes": int(seen.sum()), "probes_never_served": int((seen & ~untrained & np.isnan(first_served)).sum()),
        "probes_untrained_at_end": int(untrained.sum()),
        "probes_seen_once": int((~seen).sum()),
        "latency_median_s": round(float(np.median(latency)), 1) if len(latency) else None,
        "latency_p95_s": round(float(np.percentile(latency, 95)), 1) if len(latency) else None,
        "latency_min_s": round(float(np.min(latency)), 1) if len(latency) else None,
        "latency_max_s": round(float(np.max(latency)), 1) if len(latency) else None,
        "probes_served_before_training": served_untrained, "last_version_mib": round(last_bytes / (1 << 20), 1),
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
