"""Helpers shared by the benchmark scripts: key generators, timing, JSON-line output."""

import contextlib
import gc
import json
import os
import statistics
import sys
import time

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")


def scramble(ranks):
    """Spreads small integers over the 64-bit space (MurmurHash3 finalizer)."""
    from tfps.table.keys import mix64_numpy
    return mix64_numpy(ranks).view(np.int64)


def uniform_keys(n, seed=0):
    return np.random.default_rng(seed).integers(-(2 ** 63), 2 ** 63 - 1, size=n, dtype=np.int64)


def zipf_keys(n, a=1.1, seed=0):
    """Power-law IDs: Zipf(a) ranks scrambled over the 64-bit space (many repeats)."""
    return scramble(np.random.default_rng(seed).zipf(a, size=n))


def rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def flush_deferred_frees():
    tf = sys.modules.get("tensorflow")
    if tf is not None:
        tf.constant(0)  # deallocating an eager tensor empties TF's deferred-decref cache


@contextlib.contextmanager
def gc_paused():
    """Python's garbage collector off while timing, as timeit does: with TensorFlow loaded a
    full collection takes tens of milliseconds and would land in whichever call it hit.

    TensorFlow's deferred frees run first too. It hands the numpy arrays behind tensors it
    released back to Python only when an eager tensor is next deallocated, so the first
    timed call of the growth run used to free its key batches' conversion arrays (32 MB,
    4-5 ms)."""
    gc.collect()
    flush_deferred_frees()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def median_seconds(fn, repeats=5, setup=None):
    """Median wall time of fn() over `repeats` runs; setup() runs untimed before each.

    The repeats run back to back, as in timeit and as a training loop calls the ops: one
    full collection before the series, none between repeats. A collection before every
    repeat (about 150 ms of single-threaded Python on a 2-core VM) left the op's pool
    threads idle and the caches full of Python objects, so every timed call was a cold one:
    a 1M-key tfps find at dim 8 took 11 ms back to back, 15 ms after 30 ms of sleep and
    19 ms after a collection.

    Eager CPU ops finish inside the call, so fn() needs no .numpy(): converting a large
    result and freeing the previous one adds noise of its own (seen: up to 0.9 s at 256 MB).
    """
    times = []
    with gc_paused():
        for _ in range(repeats):
            if setup is not None:
                setup()
            flush_deferred_frees()
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def emit(record):
    print(json.dumps(record, default=lambda o: o.item() if hasattr(o, "item") else str(o)), flush=True)


def machine():
    import platform
    cpu = "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version()}
