"""DLRM-like training under ParameterServerStrategy: tfps DynamicEmbedding against stock
tf_keras Hashing(2^20) + Embedding over a partitioned variable.

    python benchmarks/train_pss.py [--steps 500] [--repeats 3] [--parts timing,traffic]

Synthetic Criteo-shaped data (13 dense features, 26 categorical fields with power-law IDs
over the 64-bit space, a label the IDs predict), batch 1024, steps_per_execution 10.

timing: in-process cluster of 2 workers and 2 PS. Each model trains in its own process;
examples/s is measured on an epoch after a warm-up epoch, AUC by evaluate() on fresh
batches. Both models train once per seed (data, dense initial values and table initial
values follow the seed) and are compared seed by seed.

dense: the same dense layers over an all-zero embedding, timed beside them: what the
dense layers, the metric and the runtime cost alone, so its examples/s over stock's is the
ceiling of any embedding's ratio on this machine. From it and the models' examples/s the
timing part prints what an embedding may cost at the target, beside what the table's own
work costs in one process with no cluster.

tfps_cached: the tfps model with a GEO-style worker cache (--cache_rows rows per worker,
rows up to --staleness steps old, rows and gradients sent as --transfer_dtype), timed and
counted beside the others: its AUC is held against the uncached tfps model's, its table
bytes against the uncached model's.

traffic: each model, and the dense one, trains under tfps-launch (2 workers, 2 PS, a
process each); per parameter server and per step it prints the remote calls and the bytes
sent and received (benchmarks/traffic.py says how they are counted). The table's bytes are
the model's less the dense model's; tfps's are held against the step's unique keys: per
key, its 8 bytes into the PS and its row out for the lookup, its gradient into the PS for
the update. It also prints each task's CPU time per step (with the RPC logging on, which
adds to each).
"""

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time

import numpy as np

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples"))
import common  # noqa: E402
import traffic  # noqa: E402

BATCH, FIELDS, DENSE, DIM, HASH_BINS = 1024, 26, 13, 16, 1 << 20
LEARNING_RATE = 0.2  # the same for the tfps table, the stock embedding and dense layers
GOLDEN = 0x9E3779B97F4A7C15 - (1 << 64)
SPEED_TARGET, AUC_TOLERANCE, BYTES_TARGET, CACHE_BYTES_TARGET = 1.5, 0.002, 1.1, 0.5
KINDS = ("tfps", "tfps_cached", "stock", "dense")
# --cache_rows, --staleness, --transfer_dtype: with bfloat16 transfers, the least staleness
# whose bytes meet the target with a margin (docs/performance.md: bytes and AUC against k).
CACHE = {"worker_cache_rows": 1 << 18, "max_staleness_steps": 2, "transfer_dtype": "bfloat16"}


def cache_flags():
    """The worker cache's flags, for the processes that run one model."""
    return ["--cache_rows", str(CACHE["worker_cache_rows"]), "--staleness", str(CACHE["max_staleness_steps"]),
            "--transfer_dtype", CACHE["transfer_dtype"]]


def criteo_like(seed=None):
    """Infinite batches of (dense [B, 13], ids [B, 26] int64) and labels [B]."""
    import tensorflow as tf

    def batch(r):
        u = tf.random.stateless_uniform([BATCH, FIELDS + DENSE + 1], seed=tf.stack([r, r // 7 + 1]))
        ranks = tf.cast(tf.floor(tf.exp(u[:, :FIELDS] * tf.math.log(5e3))), tf.int64)  # Zipf-like
        field = tf.range(FIELDS, dtype=tf.int64)
        ids = (ranks * 31 + field) * GOLDEN  # spread over the 64-bit space
        effect = tf.sin(tf.cast(ranks, tf.float32) * 12.9898 + tf.cast(field, tf.float32) * 78.233)
        dense = -tf.math.log(1.0 - 0.999 * u[:, FIELDS:FIELDS + DENSE])
        logit = 2.5 * tf.reduce_sum(effect[:, :4], 1) + 0.3 * (dense[:, 0] - 1.0) - 0.8
        label = tf.cast(u[:, -1] < tf.sigmoid(logit), tf.float32)
        return {"dense_features": dense, "categorical_ids": ids}, label

    return tf.data.Dataset.random(seed=seed).map(batch).prefetch(2)


def build_model(kind, strategy, seed):
    import tensorflow as tf
    import tf_keras as keras
    import tfps
    from train_ctr import dlrm_towers
    with strategy.scope():
        dense_in = keras.Input((DENSE,), name="dense_features")
        ids_in = keras.Input((FIELDS,), dtype=tf.int64, name="categorical_ids")
        if kind.startswith("tfps"):
            emb = tfps.keras_layers.DynamicEmbedding(
                DIM, optimizer=tfps.optimizers.Adagrad(LEARNING_RATE), seed=seed,
                **(CACHE if kind == "tfps_cached" else {}))(ids_in, namespace="columns")
        elif kind == "dense":  # no table: what the dense layers and metrics move alone
            emb = keras.layers.Lambda(lambda ids: tf.zeros(tf.concat([tf.shape(ids), [DIM]], 0)))(ids_in)
        else:
            hashed = keras.layers.Hashing(HASH_BINS)(ids_in)
            emb = keras.layers.Embedding(HASH_BINS, DIM)(hashed)
        # The stock embedding's initial values came from Keras' random state and the table's
        # do not: reseeded, every model's dense layers start from the same values.
        keras.utils.set_random_seed(seed)
        model = keras.Model([dense_in, ids_in], dlrm_towers(dense_in, emb, DIM))  # the example's model
        model.compile(optimizer=keras.optimizers.legacy.Adagrad(LEARNING_RATE), loss="binary_crossentropy",
                      metrics=[tfps.metrics.AUC(name="auc")], steps_per_execution=10)
    return model


def embedding_partitioner(shape, dtype):
    """Splits the stock embedding table over the 2 PS and nothing else: partitioned dense
    layers would start from other initial values (each part is initialized on its own)
    than the tfps model's, and that alone moved AUC by about 0.01."""
    del dtype
    return [2] + [1] * (len(shape) - 1) if shape[0] >= HASH_BINS else [1] * len(shape)


def cluster(kind, launched):
    """The strategy's context: tfps-launch's cluster (whose PS and worker tasks serve from
    here on and never return), or an in-process one."""
    import tfps
    partitioner = embedding_partitioner if kind == "stock" else None
    if launched:
        return contextlib.nullcontext(tfps.distribute.strategy_from_tf_config(partitioner))
    return tfps.distribute.local_cluster(num_workers=2, num_ps=2, variable_partitioner=partitioner)


def run_one(kind, steps, seed, launched=False):
    """One model trained on the data of `seed`, its dense layers (and the stock embedding)
    initialized from `seed`, and the tfps table's initial values drawn with `seed`. Under
    tfps-launch (`launched`) it counts the parameter servers' traffic instead of timing."""
    import tf_keras as keras
    keras.utils.set_random_seed(seed)
    with cluster(kind, launched) as strategy:
        model = build_model(kind, strategy, seed)
        # Each worker reads its own stream, the same for both models.
        data = keras.utils.experimental.DatasetCreator(
            lambda context: criteo_like(seed=1000 * seed + context.input_pipeline_id))
        model.fit(data, epochs=1, steps_per_epoch=20, verbose=0)  # warm-up: tracing, first inserts
        if launched:
            common.emit(count_traffic(model, data, steps, kind, seed))
            sys.stdout.flush()
            os._exit(0)
        start = time.perf_counter()
        history = model.fit(data, epochs=1, steps_per_epoch=steps, verbose=0)
        seconds = time.perf_counter() - start
        evaluation = model.evaluate(keras.utils.experimental.DatasetCreator(lambda _: criteo_like(seed=77)),
                                    steps=30, return_dict=True, verbose=0)
    common.emit({"model": kind, "steps": steps, "batch": BATCH, "seconds": round(seconds, 2),
                 "examples_per_s": round(steps * BATCH / seconds), "train_loss": history.history["loss"][-1],
                 "eval_auc": evaluation["auc"], "eval_loss": evaluation["loss"]})
    sys.stdout.flush()
    os._exit(0)


def count_traffic(model, data, steps, kind, seed):
    """Each PS process's TCP bytes over `steps` training steps, the window's wall-clock
    bounds (for the calls in the tasks' logs) and, for tfps, the unique keys per step."""
    import tfps
    cluster_spec = tfps.distribute.tf_config()["cluster"]
    tasks = {f"{job}_{i}": traffic.listening_pid(int(address.rsplit(":", 1)[1]))
             for job in ("ps", "worker") for i, address in enumerate(cluster_spec[job])}
    tasks["chief_0"] = os.getpid()
    ps_pids = [tasks[f"ps_{i}"] for i in range(len(cluster_spec["ps"]))]
    before = [traffic.socket_bytes(pid) for pid in ps_pids]
    cpu_before = {task: traffic.cpu_seconds(pid) for task, pid in tasks.items()}
    start = time.time()
    model.fit(data, epochs=1, steps_per_epoch=steps, verbose=0)
    end = time.time()
    cpu = {task: traffic.cpu_seconds(pid) - cpu_before[task] for task, pid in tasks.items()}
    moved = [traffic.bytes_between(b, traffic.socket_bytes(pid)) for b, pid in zip(before, ps_pids)]
    record = {"model": kind, "steps": steps, "start": start, "end": end,
              "cpu_ms_per_step": {task: round(1000 * seconds / steps, 2) for task, seconds in cpu.items()},
              "ps_bytes": [{"sent": sent, "received": received} for sent, received in moved]}
    ports = cluster_spec["ps"]
    if kind.startswith("tfps"):
        record["unique_keys_per_shard"] = unique_keys_per_step(1000 * seed, len(ports))
    return record


def unique_keys_per_step(data_seed, num_shards, batches=50):
    """The mean over the first `batches` batches of the stream of the table keys of a
    batch, unique within it (as the layer looks them up), that fall on each shard. Every
    worker reads this same stream (under ParameterServerStrategy the dataset function runs
    once, with input_pipeline_id 0), and its batches are alike throughout."""
    import tensorflow as tf
    import tfps
    per_shard = np.zeros(num_shards)
    for features, _ in criteo_like(seed=data_seed).take(batches):
        ids = features["categorical_ids"]
        column = tf.broadcast_to(tf.range(FIELDS, dtype=tf.int64), tf.shape(ids))
        keys, _ = tf.unique(tf.reshape(tfps.keys.ids_to_keys(ids, column + 1), [-1]))
        per_shard += np.bincount(tfps.keys.shard_of(keys, num_shards).numpy(), minlength=num_shards)
    return (per_shard / batches).tolist()


def cycle_floor(data_seed, cycle_steps, cycles=12):
    """The mean distinct keys of a cycle of `cycle_steps` batches of the stream over
    `cycle_steps` times a batch's: the share of a step's keys that any cache pulling and
    pushing each row once per cycle sends."""
    import tensorflow as tf
    import tfps
    batches = criteo_like(seed=data_seed).take(cycles * cycle_steps)
    keys = [np.unique(tfps.keys.ids_to_keys(ids, tf.broadcast_to(tf.range(1, FIELDS + 1, dtype=tf.int64),
                                                                   tf.shape(ids))).numpy())
            for ids in (features["categorical_ids"] for features, _ in batches)]
    per_cycle = [np.unique(np.concatenate(keys[i:i + cycle_steps])).size for i in range(0, len(keys), cycle_steps)]
    return float(np.mean(per_cycle) / (cycle_steps * np.mean([k.size for k in keys])))


def table_work_per_step(seed, steps=100, warm_steps=50):
    """CPU milliseconds per step of a table's own work on the benchmark's stream, in one
    process with no cluster: the lookup's keys, their distinct keys and counts, the rows
    found and spread to their occurrences, the gradient summed per key and applied. Every
    dynamic embedding does this work, wherever its tasks run; the rows of the first
    `warm_steps` batches are in the table already, as after a warm-up."""
    import tensorflow as tf
    import tfps
    table = tfps.DynamicTable(DIM, optimizer=tfps.optimizers.Adagrad(LEARNING_RATE), seed=seed)
    column = tf.range(1, FIELDS + 1, dtype=tf.int64)

    @tf.function
    def step(ids):
        keys = tfps.keys.ids_to_keys(ids, tf.broadcast_to(column, tf.shape(ids)))
        distinct, position, counts = tfps.keys.unique_keys(tf.reshape(keys, [-1]))
        rows = tf.gather(table.find_or_insert(distinct, occurrences=counts), position)
        summed_keys, summed = tfps.keys.sum_by_key(tf.reshape(keys, [-1]), 0.001 * rows)
        table.apply_gradients(summed_keys, summed)

    batches = [features["categorical_ids"] for features, _ in criteo_like(seed=1000 * seed).take(warm_steps + steps)]
    for ids in batches[:warm_steps]:
        step(ids)
    start = time.process_time()
    for ids in batches[warm_steps:]:
        step(ids)
    return 1000 * (time.process_time() - start) / steps


def traffic_of(kind, steps, seed):
    """One model's traffic record under tfps-launch, with each PS's calls from the logs."""
    import tempfile
    log_dir = tempfile.mkdtemp(prefix=f"train_pss_traffic_{kind}_")
    out = subprocess.run([sys.executable, "-m", "tfps.launch", "--num_ps", "2", "--num_workers", "2",
                          "--log_dir", log_dir, os.path.abspath(__file__), "--model", kind, "--steps",
                          str(steps), "--seed", str(seed), "--launched", *cache_flags()],
                         capture_output=True, text=True, timeout=3000, env=dict(os.environ, **traffic.RPC_LOG_ENV))
    records = [json.loads(line) for line in out.stdout.splitlines() if line.startswith('{"model"')]
    if out.returncode != 0 or not records:
        sys.stderr.write(out.stdout[-2000:] + out.stderr[-3000:])
        raise SystemExit(f"{kind} traffic run failed; task logs in {log_dir}")
    record = records[-1]
    calls = traffic.calls_per_ps(log_dir, record["start"], record["end"])
    record["ps_calls"] = [calls.get(i, 0) for i in range(len(record["ps_bytes"]))]
    return record


def report_traffic(steps, seed):
    """Per PS and per step: calls and bytes of each model; then the table's share, summed
    over the PS (the dense layers' variables land on other PS in each model), against the
    unique keys' own bytes."""
    records = {kind: traffic_of(kind, steps, seed) for kind in KINDS}
    totals = {}
    for kind, record in records.items():
        per_ps = [{"calls": calls / steps, "sent": b["sent"] / steps, "received": b["received"] / steps}
                  for calls, b in zip(record["ps_calls"], record["ps_bytes"])]
        for ps, figures in enumerate(per_ps):
            common.emit({"traffic": kind, "ps": ps, "per_step": {k: round(v, 1) for k, v in figures.items()}})
        totals[kind] = {k: sum(figures[k] for figures in per_ps) for k in per_ps[0]}
        cpu = record["cpu_ms_per_step"]
        common.emit({"cpu_ms_per_step": kind, **cpu, "all_tasks": round(sum(cpu.values()), 2),
                     "note": "with TensorFlow's RPC logging on, which adds to every task"})
    # A key's own bytes in a step: the key once (the update reuses the lookup's keys on
    # the PS), its row out and its gradient in.
    key_bytes = 8 + 2 * 4 * DIM
    unique = sum(records["tfps"]["unique_keys_per_shard"])
    table_bytes = {}
    for kind in ("tfps", "tfps_cached", "stock"):
        table = {k: totals[kind][k] - totals["dense"][k] for k in totals[kind]}
        table_bytes[kind] = table["sent"] + table["received"]
        line = {"table_traffic": kind, "all_ps_per_step": {k: round(v, 1) for k, v in table.items()},
                "unique_keys": round(unique, 1), "unique_key_bytes": round(unique * key_bytes),
                "bytes_ratio": round((table["sent"] + table["received"]) / (unique * key_bytes), 3)}
        common.emit(line)
    tfps_ratio = (totals["tfps"]["sent"] + totals["tfps"]["received"] - totals["dense"]["sent"]
                  - totals["dense"]["received"]) / (unique * key_bytes)
    common.emit({"summary": f"table bytes per step <= {BYTES_TARGET}x the unique keys' bytes",
                 "ratio": round(tfps_ratio, 3), "met": tfps_ratio <= BYTES_TARGET})
    cache_ratio = table_bytes["tfps_cached"] / table_bytes["tfps"]
    all_bytes = {kind: totals[kind]["sent"] + totals[kind]["received"] for kind in totals}
    # What caching alone can save on this data; bfloat16 transfers halve each row's bytes
    # on top (a key's 8 bytes each way stay).
    # A cache sends a key with its pull and again with its push, and its row and gradient
    # in the transfer dtype.
    cached_key_bytes = 2 * 8 + 2 * (2 if CACHE["transfer_dtype"] == "bfloat16" else 4) * DIM
    floor = cycle_floor(1000 * seed, CACHE["max_staleness_steps"] + 1) * cached_key_bytes / key_bytes
    common.emit({"summary": f"worker cache ({CACHE}): table bytes per step <= "
                 f"{CACHE_BYTES_TARGET}x the uncached table's", "ratio": round(cache_ratio, 3),
                 "all_ps_bytes_ratio": round(all_bytes["tfps_cached"] / all_bytes["tfps"], 3),
                 "floor_of_one_pull_per_cycle": round(floor, 3), "met": cache_ratio <= CACHE_BYTES_TARGET})


def run_in_child(kind, steps, seed):
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--model", kind, "--steps",
                          str(steps), "--seed", str(seed), *cache_flags()], capture_output=True, text=True,
                         timeout=3000)
    if out.returncode != 0:
        sys.stderr.write(out.stderr[-3000:])
        raise SystemExit(f"{kind} run with seed {seed} failed")
    return json.loads([line for line in out.stdout.splitlines() if line.startswith("{")][-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--repeats", type=int, default=3,
                        help="seeds to train both models with; AUC differs between seeds by more "
                        "than between the models, so they are compared seed by seed")
    parser.add_argument("--parts", default="timing,traffic")
    parser.add_argument("--traffic_steps", type=int, default=100)
    parser.add_argument("--model", choices=KINDS)
    parser.add_argument("--launched", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help="the first seed")
    parser.add_argument("--cache_rows", type=int, default=CACHE["worker_cache_rows"],
                        help="tfps_cached: the worker cache's rows per worker")
    parser.add_argument("--staleness", type=int, default=CACHE["max_staleness_steps"],
                        help="tfps_cached: max_staleness_steps, how many steps a cached row may lag")
    parser.add_argument("--transfer_dtype", choices=("float32", "bfloat16"), default=CACHE["transfer_dtype"],
                        help="tfps_cached: what its rows and gradients travel as")
    args = parser.parse_args()
    if args.cache_rows < 1 or args.staleness < 0:
        parser.error(f"--cache_rows must be >= 1 and --staleness >= 0, got {args.cache_rows} and {args.staleness}")
    CACHE.update(worker_cache_rows=args.cache_rows, max_staleness_steps=args.staleness,
                 transfer_dtype=args.transfer_dtype)
    if args.model:
        return run_one(args.model, args.steps, args.seed, args.launched)
    parts = args.parts.split(",")
    if set(parts) - {"timing", "traffic"}:
        parser.error(f"--parts: timing and/or traffic, got {args.parts}")
    common.emit({"machine": common.machine()})
    if "traffic" in parts:
        report_traffic(args.traffic_steps, args.seed)
    if "timing" not in parts:
        return
    runs = {kind: [] for kind in ("tfps", "tfps_cached", "stock", "dense")}
    for seed in range(args.seed, args.seed + args.repeats):
        for kind in runs:  # alternating, seed by seed
            runs[kind].append(run_in_child(kind, args.steps, seed))
            common.emit({"seed": seed, **runs[kind][-1]})
    for kind, than in (("tfps", "stock"), ("tfps_cached", "stock"), ("dense", "stock")):
        ratios = [a["examples_per_s"] / b["examples_per_s"] for a, b in zip(runs[kind], runs[than])]
        speed = float(np.median(ratios))
        figures = {"ratio": round(speed, 3), "ratios": [round(r, 3) for r in ratios]}
        if kind == "dense":  # no target: the ratio no embedding, however cheap, can pass here
            common.emit({"summary": "ceiling: the dense layers over an all-zero embedding, examples/s "
                         "over stock (median over seeds)", **figures})
            emit_budget(runs, args.seed)
        else:
            common.emit({"summary": f"{kind} examples/s >= {SPEED_TARGET}x stock Hashing+Embedding "
                         "(median over seeds)", **figures, "met": speed >= SPEED_TARGET})
    for kind, than in (("tfps", "stock"), ("tfps_cached", "tfps")):
        emit_auc_difference(kind, than, [a["eval_auc"] - b["eval_auc"] for a, b in zip(runs[kind], runs[than])])


def emit_budget(runs, seed):
    """What an embedding may add to the dense model's step at the speed target, beside what
    tfps's and stock's add: wall milliseconds per step of BATCH examples, medians over
    seeds. Beside them, the CPU milliseconds per step of the table's own work in one
    process with no cluster (table_work_per_step): a cluster whose every core is busy pays
    at least that over the cores in wall time."""
    def step_ms(examples_per_s):
        return 1000 * BATCH / examples_per_s

    def added_ms(fn):
        return round(float(np.median([fn(t, s) - step_ms(d["examples_per_s"]) for t, s, d in zip(
            runs["tfps"], runs["stock"], runs["dense"])])), 2)

    common.emit({
        "summary": f"wall ms per step an embedding may add to the dense model's at {SPEED_TARGET}x stock "
                   "(median over seeds), beside what each model's adds",
        "budget": added_ms(lambda t, s: step_ms(SPEED_TARGET * s["examples_per_s"])),
        "tfps": added_ms(lambda t, s: step_ms(t["examples_per_s"])),
        "stock": added_ms(lambda t, s: step_ms(s["examples_per_s"])),
        "table_work_cpu_ms_in_one_process": round(table_work_per_step(seed), 2), "cores": os.cpu_count()})


def emit_auc_difference(kind, than, differences):
    """The mean over seeds of kind's AUC less than's, with its standard error."""
    difference = float(np.mean(differences))
    standard_error = float(np.std(differences, ddof=1) / np.sqrt(len(differences))) \
        if len(differences) > 1 else None
    common.emit({"summary": f"{kind} AUC at most {AUC_TOLERANCE} below {than} (mean over seeds of "
                 f"{kind} - {than})", "mean_difference": round(difference, 5),
                 "standard_error": standard_error, "differences": [round(d, 5) for d in differences],
                 "met": difference >= -AUC_TOLERANCE})


if __name__ == "__main__":
    main()
