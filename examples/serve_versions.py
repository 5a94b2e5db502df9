"""Serves the newest version under a model base path, as TensorFlow Serving does, in a
process that never imports tfps, and records when each probe ID is first served with a
trained row.

    python examples/serve_versions.py BASE_DIR PROBES.npz OUT.json [--once]

Every --poll_seconds it looks for a newer numbered version under BASE_DIR and loads it,
releasing the one before first (TensorFlow Serving's resource-preserving policy: one
version in memory at a time); then it sends one request holding every probe. A probe is
a (field, ID) pair: its example holds the ID in that field and, in every other field, an
ID no one trained (-1), so it is served with a trained row exactly when its prediction
differs from the prediction for an example of untrained IDs only. It stops once it gets
SIGUSR1 (or with --once at once) and the newest version has been served, and fails after
--max_seconds without one; it writes OUT.json: per probe the time
(seconds since the epoch) of the first request that served its row (None: never), each
version's load, and the process's memory (VmRSS before the first load, VmHWM at the end).
examples/serve_stream.py runs it beside a training job.
"""

import argparse
import ctypes
import gc
import json
import os
import signal
import sys
import threading
import time

# Installed before TensorFlow loads, so a stop sent early is not fatal.
STOP_REQUESTED = threading.Event()
signal.signal(signal.SIGUSR1, lambda *_: STOP_REQUESTED.set())
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

UNTRAINED_ID = -1
UNTRAINED_TOLERANCE = 1e-5  # of a prediction


def return_freed_tensors_to_the_system():
    """Large allocations (a version's tensors) from mmap, so a released version's memory goes
    back to the system at once; glibc otherwise raises its mmap threshold after the first
    large free and keeps later versions' freed tensors in its heap."""
    try:
        ctypes.CDLL("libc.so.6").mallopt(-3, 1 << 20)  # M_MMAP_THRESHOLD: 1 MiB
    except (OSError, AttributeError):
        pass  # not glibc: its allocator's own policy applies


def memory_mib(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return 0.0


def newest_version(base_dir):
    versions = [int(name) for name in os.listdir(base_dir) if name.isdigit()] if os.path.isdir(base_dir) else []
    return max(versions, default=None)


def probe_batch(fields, probe_fields, probe_ids):
    """int64 [probes + 1, fields]: one example per probe, then one of untrained IDs only."""
    batch = np.full((len(probe_ids) + 1, fields), UNTRAINED_ID, np.int64)
    batch[np.arange(len(probe_ids)), probe_fields] = probe_ids
    return tf.constant(batch)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("base_dir")
    parser.add_argument("probes", help=".npz with int64 arrays 'fields' and 'ids', and 'num_fields'")
    parser.add_argument("out")
    parser.add_argument("--once", action="store_true", help="serve the newest version once and stop")
    parser.add_argument("--poll_seconds", type=float, default=0.5)
    parser.add_argument("--max_seconds", type=float, default=3600.0)
    args = parser.parse_args()
    if args.once:
        STOP_REQUESTED.set()
    deadline = time.monotonic() + args.max_seconds
    return_freed_tensors_to_the_system()
    probes = np.load(args.probes)
    batch = probe_batch(int(probes["num_fields"]), probes["fields"], probes["ids"])
    first_served = np.full(len(probes["ids"]), np.nan)
    tf.constant(1.0) + 1.0  # the runtime's own memory comes before the baseline
    baseline_rss = memory_mib("VmRSS")
    versions, served_version, serve, requests = [], None, None, 0
    while True:
        stopping = STOP_REQUESTED.is_set()
        version = newest_version(args.base_dir)
        if version is not None and version != served_version:
            began = time.time()
            serve = None
            gc.collect()
            serve = tf.saved_model.load(os.path.join(args.base_dir, str(version))).signatures["serving_default"]
            served_version = version
            versions.append({"version": version, "loaded_at": time.time(), "load_seconds": time.time() - began,
                             "rss_mib": round(memory_mib("VmRSS"), 1)})
        if serve is not None:
            outputs = serve(ids=batch)
            prediction = next(iter(outputs.values())).numpy().reshape(len(batch), -1)[:, 0]
            now = time.time()
            requests += 1
            # Not `!=`: the dense layers' kernels block rows, so the same untrained example can
            # differ in its last bits by its place in the batch; a trained row moves the
            # prediction far more than this.
            trained = (np.abs(prediction[:-1] - prediction[-1]) > UNTRAINED_TOLERANCE) & np.isnan(first_served)
            first_served[trained] = now
        if stopping and version == served_version:
            break
        if time.monotonic() > deadline:
            raise SystemExit(f"serve_versions: no stop after {args.max_seconds} s")
        STOP_REQUESTED.wait(args.poll_seconds)  # the next poll, or at once when stopped
    report = {"first_served": [None if np.isnan(t) else float(t) for t in first_served],
              "versions": versions, "requests": requests, "baseline_rss_mib": round(baseline_rss, 1),
              "peak_rss_mib": round(memory_mib("VmHWM"), 1), "tfps_imported": "tfps" in sys.modules}
    with open(args.out, "w") as f:
        json.dump(report, f)


if __name__ == "__main__":
    main()
