"""Streaming CTR training with feature admission and eviction.

    python examples/stream_ctr.py                                   # locally
    tfps-launch --num_ps 2 --num_workers 2 examples/stream_ctr.py  # a local cluster

Trains on an endless generated stream whose IDs drift (tfps.stream.DriftingStream: new IDs
keep appearing, old ones stop, many are seen once), chunk by chunk: one fit over the whole
stream, whose epochs are the chunks. Before each chunk it evaluates the model on the
chunk's first examples, which it has not trained on yet (a rolling AUC on the next unseen
data), then trains on the chunk; after each it logs the table's statistics: rows, rows
admitted, keys waiting for admission, occurrences rejected, rows evicted, and the memory of
the table and (with --pid_dir under tfps-launch) of every task. The table admits an ID
after --min_count occurrences and evicts rows unseen for --ttl_steps optimizer steps; 0
turns either off. One fit reads the stream through one dataset (under tfps-launch, one job
of tf.data service), so no task's memory grows with the chunks.

It backs itself up with tfps.callbacks.IncrementalBackup under --out_dir (by default a
directory per tfps-launch launch, which its restarts share; run on its own, a fresh
directory per run, so give --out_dir to resume one): a run whose task dies resumes at the
chunk and step of its last backup, with the stream from the example there. The backups
are deleted when the stream ends. The chunks are whole batches: --examples and --chunk
round down to multiples of --batch_size.

With --serving_dir it keeps a serving model base path fresh while it trains
(tfps.callbacks.ExportForServing): a version every --export_every_seconds, each after the
first holding the rows changed since the one before. examples/serve_stream.py serves those
versions from a process without tfps and measures how soon a new ID is served.
"""

import argparse
import contextlib
import json
import os
import time

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402
import tf_keras as keras  # noqa: E402

import tfps  # noqa: E402

EXAMPLE_INDEX = "example_index"  # with --trained_log, a feature the training step takes out


def build_model(strategy, stream, args):
    clustered = isinstance(strategy, tf.distribute.experimental.ParameterServerStrategy)
    admission = tfps.admission.MinCount(args.min_count, sketch_bytes=args.sketch_mb << 20) if args.min_count else None
    eviction = tfps.eviction.TTL(steps=args.ttl_steps) if args.ttl_steps else None
    with strategy.scope():
        ids = keras.Input((stream.fields,), dtype=tf.int64, name="ids")
        # Keras averages the loss over the batch, so a row's gradient is its examples' over
        # the batch size: Adagrad's usual initial accumulator (0.1) would dwarf it for long.
        embedded = tfps.keras_layers.DynamicEmbedding(
            args.dim, optimizer=tfps.optimizers.Adagrad(args.learning_rate, initial_accumulator_value=1e-8),
            name="ids_table",
            admission=admission, eviction=eviction, max_rows=args.max_rows or None)(ids, namespace="columns")
        x = keras.layers.Dense(64, activation="relu")(keras.layers.Flatten()(embedded))
        model = (RecordsTrainedBatches if args.trained_log else keras.Model)(
            ids, keras.layers.Dense(1, activation="sigmoid")(x))
        if args.trained_log:
            model.trained_log = os.path.abspath(args.trained_log)
        model.compile(optimizer=keras.optimizers.legacy.Adam(1e-3), loss="binary_crossentropy",
                      metrics=[tfps.metrics.AUC(name="auc")], steps_per_execution=10,
                      pss_evaluation_shards=strategy._num_workers if clustered else 0)  # pylint: disable=protected-access
    return model


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def task_memory(pid_dir):
    """RSS in MiB of every task that wrote a pid file to pid_dir (all on this machine)."""
    if not pid_dir:
        return {"this_process": round(rss_mib(os.getpid()), 1)}
    found = {}
    for name in sorted(os.listdir(pid_dir)):
        if name.endswith(".pid"):
            with open(os.path.join(pid_dir, name)) as f:
                try:
                    found[name[:-4]] = round(rss_mib(int(f.read())), 1)
                except (OSError, ValueError):
                    pass
    return found


def backup_callbacks(args, model, chunk_batches):
    """IncrementalBackup and the fault suite's report, as asked."""
    if not args.backup_dir:
        return None, []
    backup = tfps.callbacks.IncrementalBackup(
        args.backup_dir, save_freq=args.backup_every_steps or max(1, chunk_batches // 4))
    callbacks = [backup]
    if args.fault_report:
        import fault_report  # beside this file
        if args.fault_hold:
            fault_report.install_holds(args.fault_report, args.fault_hold, args.backup_dir)
        callbacks.append(fault_report.FaultReport(args.fault_report, args.backup_dir,
                                                  model.get_layer("ids_table")))
    return backup, callbacks


class RecordsTrainedBatches(keras.Model):
    """A model whose every training step appends a line "first example's index, time" for
    its batch to `trained_log`, written by the task that ran the step (a worker under
    tfps-launch) once the step's updates are issued. The coordinator's step count cannot say
    when a batch trained: each worker prefetches from the shared stream, so one may train a
    batch well before or after the count reaches it."""

    trained_log = None

    def train_step(self, data):
        features, labels = data
        features = dict(features)
        indices = features.pop(EXAMPLE_INDEX)
        logs = super().train_step((features, labels))
        with tf.control_dependencies(tf.nest.flatten(logs)):
            line = tf.strings.join([tf.strings.as_string(indices[0]),
                                    tf.strings.as_string(tf.timestamp(), precision=3)], " ")
            tf.print(line, output_stream="file://" + self.trained_log)
        return logs


class ChunkLog(keras.callbacks.Callback):
    """Each chunk (an epoch of the fit): before it trains, the rolling AUC on the chunk's
    first examples; after, one record of the table's statistics and every task's memory,
    printed and (with --tensorboard_dir) written as scalars."""

    def __init__(self, args, stream, table, writer, chunk_batches, eval_batches, clustered,
                 first_chunk, first_step, resumed):
        super().__init__()
        self.args, self.stream, self.table, self.writer = args, stream, table, writer
        self.chunk_batches, self.eval_batches, self.clustered = chunk_batches, eval_batches, clustered
        self.first_chunk, self.first_step, self.resumed = first_chunk, first_step, resumed
        self.record = None
        self._auc, self._began = None, 0.0

    def _rolling_auc(self, chunk):
        start = chunk * self.chunk_batches * self.args.batch_size

        def eval_data(_=None):
            return self.stream.dataset(start, self.args.batch_size, num_batches=self.eval_batches)
        data = keras.utils.experimental.DatasetCreator(eval_data) if self.clustered else eval_data()
        results = self.model.evaluate(data, steps=None if self.clustered else self.eval_batches,
                                      return_dict=True, verbose=0)
        self.model.reset_metrics()  # the training metrics share these objects: start the chunk clean
        return round(float(results["auc"]), 5)

    def on_epoch_begin(self, epoch, logs=None):
        # The first chunk has no model to evaluate yet; a resumed one was partly trained on.
        fresh = epoch > self.first_chunk or (epoch > 0 and not self.resumed)
        self._auc = self._rolling_auc(epoch) if fresh else None
        self._began = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        seconds = time.perf_counter() - self._began
        steps = self.chunk_batches - (self.first_step if epoch == self.first_chunk else 0)
        stats = self.table.stats()
        record = {"chunk": epoch, "examples": (epoch + 1) * self.chunk_batches * self.args.batch_size,
                  "rolling_auc": self._auc, "examples_per_s": round(steps * self.args.batch_size / seconds),
                  **{k: stats[k] for k in ("rows", "admitted", "pending", "rejected", "evicted")},
                  "table_mib": round(stats["memory_bytes"] / (1 << 20), 1),
                  "rss_mib": task_memory(self.args.pid_dir)}
        self.record = record
        if self.args.json:
            print("STREAM " + json.dumps(record), flush=True)
        else:
            auc = "-" if record["rolling_auc"] is None else f"{record['rolling_auc']:.4f}"
            print(f"{record['examples']:>11,} examples  next-chunk auc {auc}  "
                  f"rows {stats['rows']:,} (admitted {stats['admitted']:,}, evicted {stats['evicted']:,}, "
                  f"pending ~{stats['pending']:,}, rejected {stats['rejected']:,})  "
                  f"{record['examples_per_s']:,}/s  table MiB {record['table_mib']}  "
                  f"rss MiB {record['rss_mib']}", flush=True)
        if self.writer is not None:
            with self.writer.as_default(step=record["examples"]):
                for name in ("rolling_auc", "rows", "admitted", "pending", "rejected", "evicted", "table_mib"):
                    if record[name] is not None:
                        tf.summary.scalar(name, record[name])


def parse_arguments(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=4_000_000, help="examples to train on")
    parser.add_argument("--chunk", type=int, default=500_000, help="examples between evaluations")
    parser.add_argument("--eval_examples", type=int, default=51_200)
    parser.add_argument("--batch_size", type=int, default=1024)
    parser.add_argument("--dim", type=int, default=8)
    parser.add_argument("--learning_rate", type=float, default=0.1)
    parser.add_argument("--min_count", type=int, default=2, help="MinCount admission (0: admit every ID)")
    parser.add_argument("--sketch_mb", type=int, default=8, help="MinCount's sketch per parameter server")
    parser.add_argument("--ttl_steps", type=int, default=2000, help="TTL eviction in steps (0: none)")
    parser.add_argument("--max_rows", type=int, default=0, help="a cap on the table's rows (0: none)")
    parser.add_argument("--pid_dir", default=None, help="every task writes its pid here; the chief "
                        "reports each one's RSS (tasks on one machine, as under tfps-launch)")
    parser.add_argument("--tensorboard_dir", default=None)
    parser.add_argument("--json", action="store_true", help="one JSON line per chunk")
    parser.add_argument("--out_dir", default=None,
                        help="where backups go by default (default: a directory of this run's own; "
                             "under tfps-launch, one per launch)")
    parser.add_argument("--backup_dir", default=None,
                        help="IncrementalBackup's directory (default: OUT_DIR/backup); '' turns backups off")
    parser.add_argument("--backup_every_steps", type=int, default=0,
                        help="steps between backups (default: a quarter of a chunk)")
    parser.add_argument("--fault_report", default=None,
                        help="for benchmarks/faults.py: record progress and restores here "
                             "(examples/fault_report.py)")
    parser.add_argument("--fault_hold", choices=["backup", "restore"], default=None,
                        help="for benchmarks/faults.py: pause a backup or a restore part way")
    parser.add_argument("--serving_dir", default=None,
                        help="a model base path to keep fresh while training (ExportForServing)")
    parser.add_argument("--export_every_seconds", type=float, default=30.0)
    parser.add_argument("--max_change_layers", type=int, default=8)
    parser.add_argument("--max_layered_rows", type=float, default=1.25)
    parser.add_argument("--keep_versions", type=int, default=None, help="delete older versions")
    parser.add_argument("--whole_at_end", action="store_true", help="the last version is whole")
    parser.add_argument("--trained_log", default=None,
                        help="for examples/serve_stream.py: every task appends when it trained each batch")
    args = parser.parse_args(argv)
    for flag in ("examples", "chunk", "eval_examples"):
        if getattr(args, flag) < args.batch_size:
            parser.error(f"--{flag}={getattr(args, flag)} is less than one batch (--batch_size={args.batch_size})")
    return args


def main():
    args = parse_arguments()
    if args.backup_dir is None:
        args.backup_dir = os.path.join(args.out_dir or tfps.distribute.run_directory("stream-ctr"), "backup")

    config = tfps.distribute.tf_config()
    if args.pid_dir:
        os.makedirs(args.pid_dir, exist_ok=True)
        task = config["task"] if config else {"type": "local", "index": 0}
        with open(os.path.join(args.pid_dir, f"{task['type']}_{task['index']}.pid"), "w") as f:
            f.write(str(os.getpid()))
    strategy = tfps.distribute.strategy_from_tf_config()  # ps and worker tasks serve here
    clustered = isinstance(strategy, tf.distribute.experimental.ParameterServerStrategy)
    stream = tfps.stream.DriftingStream()
    model = build_model(strategy, stream, args)
    table = model.get_layer("ids_table").table
    writer = tf.summary.create_file_writer(args.tensorboard_dir) if args.tensorboard_dir else None
    chunk_batches, eval_batches = args.chunk // args.batch_size, args.eval_examples // args.batch_size
    backup, callbacks = backup_callbacks(args, model, chunk_batches)
    # A restarted run resumes at the chunk (the fit's epoch) and step of its last backup.
    resume = tfps.callbacks.IncrementalBackup.resume_point(args.backup_dir) if backup else None
    first_chunk, first_step = (resume.epoch, resume.step) if resume else (0, 0)
    if resume:
        print(f"resuming at chunk {first_chunk}, step {first_step} from the backups in {args.backup_dir}",
              flush=True)
    chunk_examples = chunk_batches * args.batch_size
    chunks = max(1, args.examples // chunk_examples)
    if (chunks * chunk_examples, chunk_examples) != (args.examples, args.chunk):
        print(f"training {chunks} chunks of {chunk_examples} examples ({chunk_batches} batches of "
              f"{args.batch_size}): --examples and --chunk round down to whole batches", flush=True)
    chunk_log = ChunkLog(args, stream, table, writer, chunk_batches, eval_batches, clustered,
                         first_chunk, first_step, resumed=resume is not None)
    if args.serving_dir:
        callbacks.append(tfps.callbacks.ExportForServing(
            args.serving_dir, every_seconds=args.export_every_seconds, max_change_layers=args.max_change_layers,
            max_layered_rows=args.max_layered_rows,
            keep_versions=args.keep_versions, whole_at_end=args.whole_at_end))
    with (tfps.data.local_data_service() if clustered else contextlib.nullcontext()) as service:
        def train_data(_=None):
            return stream.dataset(first_chunk * chunk_examples + first_step * args.batch_size,
                                  args.batch_size, data_service=service,
                                  index_feature=EXAMPLE_INDEX if args.trained_log else None)

        if first_chunk < chunks:
            model.fit(keras.utils.experimental.DatasetCreator(train_data) if clustered else train_data(),
                      initial_epoch=first_chunk, epochs=chunks, steps_per_epoch=chunk_batches,
                      callbacks=callbacks + [chunk_log], verbose=0)
    record = chunk_log.record
    if backup:
        backup.delete_backups()  # fit deleted them, unless a restart found nothing left to train
    print(f"stream done: {chunks * chunk_examples:,} examples, rows {record['rows']:,} at the end"
          if record else "stream done: nothing left to train", flush=True)
    if clustered:
        os._exit(0)  # the ps and worker tasks are stopped by the launcher


if __name__ == "__main__":
    main()
