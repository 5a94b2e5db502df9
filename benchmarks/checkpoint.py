"""Checkpoint save and restore of a sharded table against stock variables of the same
bytes, in a multi-process cluster (tfps-launch: chief, 1 worker, 2 parameter servers).

    python benchmarks/checkpoint.py [--keys 1,4,16] [--dir DIR]

For each table size (millions of keys, dim 16, Adagrad, every row applied once so slots and
metadata are real) one cluster runs: the parameter servers fill their shards themselves,
then the chief times a full tfps save (`tf.train.Checkpoint.write`), stock `tf.Variable`s
of the same bytes per parameter server (created on those tasks) saved the same way, and
the restores of both into the running tables and variables after 1% of the rows changed
(and, for tfps, once more into emptied tables, as a new process restores); then 1% of the rows change and a save of changes runs
(`tfps.checkpoint.changes_only()`), beside the time any checkpoint write takes here (one
one-element variable); then the table alone and the whole model are written as
IncrementalBackup writes (`tfps.checkpoint.TracedWriter`, which traces its save function
once), whole and of 1% changes; then `save_for_serving`
exports the table, and after 1% of the rows changed exports its changes. Before each
operation (saves and restores: the median of 3 runs, tfps and stock taking turns) the
page cache's dirty pages are written out (os.sync), so each time is the operation's own,
and every process's peak RSS is reset (/proc/PID/clear_refs) and read back (VmHWM),
so "extra" is the peak above the RSS before (for restores, above the RSS after as well:
the rows a restore brings back are not extra), measured in each process itself. Prints one JSON line per size and a summary
against the targets: save >= 1.0x stock's bytes/s, restore >= 0.7x, chief extra <= 64 MiB,
each PS extra <= 64 MiB + 2% of the table, a 1% delta <= 5% of a full save's time.
"""

import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

DIM, FILL_BATCH, REPEATS = 16, 1 << 20, 3
MIB = 1 << 20
SAVED_BYTES_PER_ROW = 8 + 4 * DIM * 2 + 8 * 3  # key, value, Adagrad slot, metadata


def rss_fields(pid):
    """(current RSS, peak RSS) of a process in bytes."""
    fields = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            name, _, value = line.partition(":")
            fields[name] = value
    return int(fields["VmRSS"].split()[0]) * 1024, int(fields["VmHWM"].split()[0]) * 1024


def measured(pids, fn, keeps_memory=False):
    """Runs fn(); returns (seconds, {name: peak RSS above the RSS before}), or with
    keeps_memory (a restore, whose rows stay) the peak above both the RSS before and after."""
    os.sync()  # earlier writes' dirty pages go to disk first, not during this operation
    before = {}
    for name, pid in pids.items():
        with open(f"/proc/{pid}/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current RSS
        before[name] = rss_fields(pid)[0]
    start = time.perf_counter()
    fn()
    seconds = time.perf_counter() - start
    extra = {}
    for name, pid in pids.items():
        after, peak = rss_fields(pid)
        extra[name] = peak - (max(before[name], after) if keeps_memory else before[name])
    return seconds, extra


def run_cluster_task(args):
    """The program tfps-launch runs in every task."""
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    import numpy as np
    import tensorflow as tf
    import tfps

    task = tfps.distribute.tf_config()["task"]
    with open(os.path.join(args.dir, f"{task['type']}_{task['index']}.pid"), "w") as f:
        f.write(str(os.getpid()))
    import tf_keras as keras

    strategy = tfps.distribute.strategy_from_tf_config()  # ps and worker tasks serve here
    devices = tfps.table.sharded_table.parameter_server_devices(strategy)
    with strategy.scope():
        ids = keras.Input((1,), dtype=tf.int64)
        layer = tfps.keras_layers.DynamicEmbedding(DIM, optimizer="adagrad", name="bench")
        model = keras.Model(ids, keras.layers.Dense(1)(keras.layers.Flatten()(layer(ids))))
    table = layer.table

    @tf.function
    def fill(start, count, stride):
        """Applies a gradient to keys start, start + stride, ... (count of them), each on its
        shard's parameter server, so no key or row passes through the chief."""
        for i, (shard, device) in enumerate(zip(table.shards, devices)):
            with tf.device(device):
                keys = tf.range(start, start + count * stride, stride, dtype=tf.int64) * -7046029254386353131
                mine = tf.boolean_mask(keys, tf.equal(tfps.keys.shard_of(keys, len(devices)), i))
                shard.apply_gradients(mine, tf.random.uniform([tf.size(mine), DIM], -1.0, 1.0), step=-1)

    num_keys = args.keys_millions << 20
    for start in range(0, num_keys, FILL_BATCH):
        fill(tf.constant(start, tf.int64), FILL_BATCH, 1)
    shard_rows = table.shard_sizes()
    stock = []
    for rows, device in zip(shard_rows, devices):
        with tf.device(device):
            stock.append(tf.Variable(tf.random.uniform([rows, SAVED_BYTES_PER_ROW // 4])))
    pids = {"chief": os.getpid()}
    for i in range(len(devices)):
        with open(os.path.join(args.dir, f"ps_{i}.pid")) as f:
            pids[f"ps{i}"] = int(f.read())

    def timed(name, fn):
        seconds, extra = measured(pids, fn, keeps_memory="restore" in name)
        return {f"{name}_s": round(seconds, 3), **{f"{name}_{p}_extra_mib": round(b / MIB, 1)
                                                   for p, b in extra.items()}}

    record = {"keys": sum(shard_rows), "dim": DIM, "shard_rows": shard_rows,
              "saved_bytes": sum(shard_rows) * SAVED_BYTES_PER_ROW,
              "table_bytes_per_ps": [r * SAVED_BYTES_PER_ROW for r in shard_rows]}
    table_ckpt, stock_ckpt = tf.train.Checkpoint(table=table), tf.train.Checkpoint(v=stock)
    table_path, stock_path = os.path.join(args.dir, "table"), os.path.join(args.dir, "stock")

    def clear_stock():
        for v in stock:
            v.assign(tf.zeros_like(v))

    # Each figure is the median of REPEATS runs, tfps and stock taking turns (the first run
    # of each also traces its function); the first runs' times are kept as *_first_s.
    runs = {name: [] for name in ("tfps_save", "stock_save", "tfps_restore", "stock_restore")}
    expected = table.export_chunks(4096).__next__()
    for repeat in range(REPEATS):
        last = repeat == REPEATS - 1
        runs["tfps_save"].append(timed("tfps_save", lambda: table_ckpt.write(table_path)))
        runs["stock_save"].append(timed("stock_save", lambda: stock_ckpt.write(stock_path)))
        # Restores go into the running tables and variables (a rollback), after 1% of the
        # rows changed, which the restore must undo; the stock variables keep their buffers.
        fill(tf.constant(repeat + 1, tf.int64), num_keys // 100, 100)
        runs["tfps_restore"].append(timed("tfps_restore", lambda: table_ckpt.read(table_path).assert_consumed()))
        clear_stock()
        runs["stock_restore"].append(timed("stock_restore", lambda: stock_ckpt.read(stock_path).assert_consumed()))
        if not last:  # dirty pages of deleted files need no writeback
            for path in glob.glob(table_path + "*") + glob.glob(stock_path + "*"):
                os.remove(path)
    for name, results in runs.items():
        record[f"{name}_first_s"] = results[0][f"{name}_s"]
        record.update(median_run(name, results))
    got = table.find(expected.keys)
    record["restored_rows_equal"] = bool(table.shard_sizes() == shard_rows and
                                         np.array_equal(got.numpy(), expected.values.numpy()))
    # Into empty tables, as a new process restores: every row's memory is fresh.
    table.clear()
    record.update(timed("tfps_restore_into_empty", lambda: table_ckpt.read(table_path).assert_consumed()))
    # 1% of the rows change; a save of changes writes just those (median of REPEATS, each
    # after its own 1%). Beside it, the floor of any checkpoint write in this cluster: one
    # one-element variable on a parameter server.
    def change_one_percent(repeat):
        fill(tf.constant(repeat, tf.int64), num_keys // 100, 100)
        table.shard_sizes()  # the fill has run on every parameter server before any timing

    deltas = []
    for repeat in range(REPEATS):
        change_one_percent(repeat)
        with tfps.checkpoint.changes_only():
            deltas.append(timed("tfps_delta_save", lambda: table_ckpt.write(f"{table_path}-delta{repeat}")))
    record.update(median_run("tfps_delta_save", deltas))
    record["delta_bytes"] = sum(os.path.getsize(p) for p in glob.glob(table_path + "-delta0-tfps*"))

    def whole_then_delta(kind, writer, first_change):
        """Through a TracedWriter, as IncrementalBackup writes: a whole write, then one of
        changes after 1% of the rows changed (medians; one pair first traces both)."""
        runs = {f"{kind}_whole": [], f"{kind}_delta": []}
        for repeat in range(REPEATS + 1):
            whole = timed(f"{kind}_whole", lambda: writer.write(f"{table_path}-{kind}{repeat}"))
            change_one_percent(first_change + repeat)
            delta = timed(f"{kind}_delta", lambda: writer.write(f"{table_path}-{kind}{repeat}-delta",
                                                                changes_only=True))
            if repeat > 0:
                runs[f"{kind}_whole"].append(whole)
                runs[f"{kind}_delta"].append(delta)
            for path in glob.glob(f"{table_path}-{kind}{repeat}*"):
                os.remove(path)
        for name, results in runs.items():
            record.update(median_run(name, results))
    # The table alone, then the whole model (table, dense layers, optimizer).
    whole_then_delta("traced_table", tfps.checkpoint.TracedWriter(table_ckpt), 10)
    whole_then_delta("backup", tfps.checkpoint.TracedWriter(tf.train.Checkpoint(model=model)), 20)
    with tf.device(devices[0]):
        tiny = tf.train.Checkpoint(v=tf.Variable([0.0]))
    floor = sorted(timed("floor", lambda: tiny.write(os.path.join(args.dir, f"tiny{i}")))["floor_s"]
                   for i in range(REPEATS))
    record["checkpoint_write_floor_s"] = floor[len(floor) // 2]
    export_dir = os.path.join(args.dir, "export")
    record.update(timed("export", lambda: tfps.export.save_for_serving(model, export_dir)))
    # An export of changes after 1% of the rows changed: it writes those rows and reuses
    # the export's (hard links).
    change_one_percent(30)
    record.update(timed("export_changes", lambda: tfps.export.save_for_serving(
        model, os.path.join(args.dir, "export-changes"), changes_since=export_dir)))
    print("RESULT " + json.dumps(record), flush=True)


def median_run(name, results):
    """Of runs timed as `name`, the one of median time (its memory figures with it)."""
    return sorted(results, key=lambda r: r[f"{name}_s"])[len(results) // 2]


def summarize(record):
    ratio = lambda a, b: round(record[b] / record[a], 2)  # noqa: E731  stock time / tfps time
    table_mib = max(record["table_bytes_per_ps"]) / MIB
    ps_extra = max(v for k, v in record.items()
                   if k.startswith(("tfps_save_", "tfps_restore_")) and "_ps" in k and k.endswith("_extra_mib"))
    return {"keys": record["keys"],
            "save_speed_vs_stock": ratio("tfps_save_s", "stock_save_s"),
            "restore_speed_vs_stock": ratio("tfps_restore_s", "stock_restore_s"),
            "chief_extra_mib": max(record["tfps_save_chief_extra_mib"],
                                   record["tfps_restore_chief_extra_mib"]),
            "delta_1pct_vs_full_save_time": round(record["tfps_delta_save_s"] / record["tfps_save_s"], 3),
            "delta_1pct_s": record["tfps_delta_save_s"],
            "traced_delta_1pct_vs_whole_time": round(record["traced_table_delta_s"] /
                                                     record["traced_table_whole_s"], 3),
            "traced_whole_s": record["traced_table_whole_s"],
            "traced_delta_1pct_s": record["traced_table_delta_s"],
            "backup_delta_1pct_vs_whole_time": round(record["backup_delta_s"] / record["backup_whole_s"], 3),
            "backup_whole_s": record["backup_whole_s"], "backup_delta_1pct_s": record["backup_delta_s"],
            "checkpoint_write_floor_s": record["checkpoint_write_floor_s"],
            "export_s": record["export_s"], "export_chief_extra_mib": record["export_chief_extra_mib"],
            "export_changes_1pct_s": record["export_changes_s"],
            "export_changes_1pct_vs_whole_time": round(record["export_changes_s"] / record["export_s"], 3),
            "export_ps_extra_mib": max(v for k, v in record.items() if k.startswith("export_ps")),
            "ps_extra_mib": ps_extra, "ps_extra_limit_mib": round(64 + 0.02 * table_mib, 1),
            "restored_rows_equal": record["restored_rows_equal"]}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", default="1,4,16", help="table sizes in millions of keys (2^20)")
    parser.add_argument("--dir", help="where checkpoints go (default: a temporary directory)")
    parser.add_argument("--task", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--keys_millions", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.task:
        run_cluster_task(args)
        return
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for millions in (int(k) for k in args.keys.split(",")):
        work = tempfile.mkdtemp(prefix=f"tfps-ckpt-bench-{millions}M-", dir=args.dir)
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", TF_USE_LEGACY_KERAS="1")
        out = subprocess.run(
            [sys.executable, "-m", "tfps.launch", "--num_ps", "2", "--num_workers", "1",
             "--log_dir", os.path.join(work, "logs"), os.path.abspath(__file__), "--task",
             "--keys_millions", str(millions), "--dir", work],
            capture_output=True, text=True, env=env, cwd=root)
        lines = [l for l in out.stdout.splitlines() if l.startswith("RESULT ")]
        if out.returncode != 0 or not lines:
            sys.exit(f"cluster for {millions}M keys failed ({out.returncode}):\n{out.stderr[-3000:]}")
        record = json.loads(lines[-1][len("RESULT "):])
        print(json.dumps(record), flush=True)
        print(json.dumps({"summary": summarize(record)}), flush=True)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
