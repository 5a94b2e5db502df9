"""Train a DLRM-style CTR model on Criteo-format files with tfps.

    python examples/train_ctr.py --data_dir /tmp/criteo            # locally
    tfps-launch --num_ps 2 --num_workers 2 examples/train_ctr.py --data_dir /tmp/criteo

The same program runs locally (no TF_CONFIG) and as every task of a parameter-server
cluster (TF_CONFIG, as tfps-launch or a Kubernetes TFJob sets it): ps and worker tasks
serve, the chief trains, and an evaluator task (tfps-launch --evaluator, with a shared
--checkpoint_dir) evaluates each checkpoint the chief writes. Missing data is generated. In a cluster the chief runs a tf.data
service, so each line is read by exactly one worker per epoch. Logs loss, AUC and
examples/s per epoch, evaluates every line of the eval file once (under PSS too) beside the
best AUC the generated data allows, saves checkpoints (the last 2 epochs'), and exports a SavedModel for serving. Training
backs itself up with tfps.callbacks.IncrementalBackup (--backup_dir), so under
tfps-launch a run whose parameter server dies restarts and resumes from its last backup.
Checkpoints and backups go under --out_dir: by default a directory of this run's own (under
tfps-launch, one per launch that its cluster restarts share), so no other run resumes them.
With --sync the workers train in synchronous steps (tfps.callbacks.SynchronousTraining).
"""

import argparse
import contextlib
import glob
import os
import re
import tempfile
import time

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tf_keras as keras  # noqa: E402
from tensorflow.python.checkpoint import checkpoint_management  # noqa: E402

import tfps  # noqa: E402


def dlrm_towers(dense, embedded, dim):
    """Click probability from dense features [B, 13] and field embeddings [B, 26, dim]: a
    bottom MLP on the dense features, concatenated with the embeddings, then a top MLP."""
    bottom = keras.layers.Dense(dim, activation="relu")(keras.layers.Dense(64, activation="relu")(dense))
    x = keras.layers.Concatenate()([bottom, keras.layers.Flatten()(embedded)])
    for width in (256, 128):
        x = keras.layers.Dense(width, activation="relu")(x)
    return keras.layers.Dense(1, activation="sigmoid")(x)


def table_options(args):
    """The DynamicEmbedding arguments of the command line's table flags."""
    return {"worker_cache_rows": args.worker_cache_rows, "max_staleness_steps": args.max_staleness_steps,
            "transfer_dtype": args.transfer_dtype,
            "admission": tfps.admission.MinCount(args.min_count) if args.min_count else None,
            "eviction": tfps.eviction.TTL(steps=args.ttl_steps) if args.ttl_steps else None,
            "max_rows": args.max_rows or None, "non_finite": args.non_finite,
            "storage": tfps.storage.Tiered(args.tier_dir, memory_rows=args.tier_memory_rows)
            if args.tier_memory_rows else None}


def build_model(strategy, dim, learning_rate, **table_arguments):
    """The model, its table made with `table_arguments` (DynamicEmbedding's; table_options)."""
    clustered = isinstance(strategy, tf.distribute.experimental.ParameterServerStrategy)
    with strategy.scope():
        dense = keras.Input((tfps.data.NUM_DENSE,), name="dense_features")
        categorical = keras.Input((tfps.data.NUM_CATEGORICAL,), dtype=tf.int64, name="categorical_keys")
        # The reader already put each field in its own namespace; one table serves all 26.
        embedded = tfps.keras_layers.DynamicEmbedding(
            dim, optimizer=tfps.optimizers.Adagrad(learning_rate), name="fields", **table_arguments)(categorical)
        model = keras.Model([dense, categorical], dlrm_towers(dense, embedded, dim))
        model.compile(optimizer=keras.optimizers.legacy.Adagrad(learning_rate), loss="binary_crossentropy",
                      metrics=[tfps.metrics.AUC(name="auc"), tfps.metrics.BinaryLogLoss(name="log_loss"),
                               tfps.metrics.CalibrationRatio(name="calibration")],
                      steps_per_execution=10,
                      # Under PSS, evaluate() shards the eval data and visits each batch
                      # exactly once, whichever worker runs it. Each shard reads the whole
                      # eval file and keeps its batches, so one shard per worker.
                      pss_evaluation_shards=strategy._num_workers if clustered else 0)  # pylint: disable=protected-access
    return model


class Throughput(keras.callbacks.Callback):
    def __init__(self, examples_per_epoch):
        super().__init__()
        self.examples_per_epoch = examples_per_epoch

    def on_epoch_begin(self, epoch, logs=None):
        self.start = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        rate = self.examples_per_epoch / (time.perf_counter() - self.start)
        print(f"epoch {epoch + 1}: loss {logs['loss']:.4f}  auc {logs['auc']:.4f}  "
              f"{rate:,.0f} examples/s", flush=True)


LAUNCH_FILE = "launch_id"  # beside the epoch checkpoints: the launch that wrote the latest


def epoch_of(path):
    """The epoch an EpochCheckpoint path holds (weights-EE), or None for any other path."""
    written = re.fullmatch(r"weights-(\d+)", os.path.basename(path or ""))
    return None if written is None else int(written.group(1))


def written_by_this_launch(directory):
    """Whether the latest epoch checkpoint in `directory` is this tfps-launch launch's (its
    TFPS_LAUNCH_ID), not an earlier run's that was given the same directory."""
    launch = os.environ.get("TFPS_LAUNCH_ID")
    path = os.path.join(directory, LAUNCH_FILE)
    if not launch or not tf.io.gfile.exists(path):
        return False
    with tf.io.gfile.GFile(path) as f:
        return f.read() == launch


class EpochCheckpoint(keras.callbacks.Callback):
    """Writes the model's weights (as model.save_weights does, so load_weights reads them)
    to directory/weights-EE at each epoch's end, records the newest as the directory's
    latest (an evaluator's tf.train.checkpoints_iterator watches it) and the launch that
    wrote it, and keeps the last `keep` of this launch's. It writes through
    tfps.checkpoint.TracedWriter: Keras' ModelCheckpoint writes eagerly, which under a
    cluster traces TensorFlow's save function anew every epoch."""

    def __init__(self, directory, keep=2):
        super().__init__()
        self.directory, self.keep, self.written = directory, keep, []

    def on_train_begin(self, logs=None):
        self.writer = tfps.checkpoint.TracedWriter(tf.train.Checkpoint(root=self.model))
        # A restarted cluster keeps counting the checkpoints its launch wrote before.
        state = tf.train.get_checkpoint_state(self.directory)
        self.written = list(state.all_model_checkpoint_paths) if state and written_by_this_launch(
            self.directory) else []

    def on_epoch_end(self, epoch, logs=None):
        path = self.writer.write(os.path.join(self.directory, f"weights-{epoch + 1:02d}"))
        # An epoch that ends again after a restart rewrites its checkpoint: listed once.
        self.written = [p for p in self.written if p != path] + [path]
        dropped, self.written = self.written[:-self.keep], self.written[-self.keep:]
        # What CheckpointManager writes (its public twin is deprecated).
        checkpoint_management.update_checkpoint_state_internal(
            self.directory, path, all_model_checkpoint_paths=self.written, save_relative_paths=True)
        # After the state: a launch never claims another run's latest checkpoint.
        with tf.io.gfile.GFile(os.path.join(self.directory, LAUNCH_FILE), "w") as f:
            f.write(os.environ.get("TFPS_LAUNCH_ID", ""))
        for old in dropped:  # no longer listed, so an evaluator no longer takes them up
            tfps.checkpoint.delete(old)


def resume_from_epoch_checkpoint(model, checkpoint_dir, backup_dir):
    """In a restarted cluster with no backup to resume from (fit deletes its backups when it
    ends, so a fault in the final evaluation or export leaves none; or backups are off),
    loads the newest epoch checkpoint of this launch into the model and returns the epochs
    it holds, so training goes on from there instead of from the beginning. Returns 0 and
    loads nothing otherwise: in the launch's first cluster, or when the latest checkpoint
    in the directory is another run's."""
    if int(os.environ.get("TFPS_CLUSTER_RESTARTS", "0")) == 0 or not written_by_this_launch(checkpoint_dir):
        return 0
    if backup_dir and tfps.callbacks.IncrementalBackup.resume_point(backup_dir) is not None:
        return 0  # the backup is newer than any epoch checkpoint: fit resumes from it
    path = tf.train.latest_checkpoint(checkpoint_dir)
    epochs = epoch_of(path)
    if epochs is None:  # none, or not EpochCheckpoint's
        return 0
    model.load_weights(path)
    print(f"restarted cluster, no backup to resume: resumed from the epoch checkpoint {path} "
          f"({epochs} epoch(s) trained)", flush=True)
    return epochs


def parse_arguments(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--data_dir", default=os.path.join(tempfile.gettempdir(), "tfps-criteo"),
                        help="Criteo-format files (*.tsv, the last held out for evaluation); "
                             "generated here when there are none")
    parser.add_argument("--num_files", type=int, default=4, help="files to generate")
    parser.add_argument("--rows_per_file", type=int, default=25000,
                        help="examples per generated file; small runs learn little (the main "
                             "job, scripts/demo.sh, trains on 3 x 100000 for 8 epochs)")
    parser.add_argument("--epochs", type=int, default=3, help="passes over the training files")
    parser.add_argument("--batch_size", type=int, default=1024, help="examples per step on each worker")
    parser.add_argument("--steps_per_epoch", type=int, default=0, help="0: one pass over the data")
    parser.add_argument("--dim", type=int, default=16, help="embedding width of every field")
    parser.add_argument("--learning_rate", type=float, default=0.3,
                        help="Adagrad's rate, for the table and the dense layers")
    parser.add_argument("--sync", action="store_true",
                        help="synchronous steps (tfps.callbacks.SynchronousTraining): each step takes "
                             "one batch per worker and applies their summed gradient once")
    parser.add_argument("--worker_cache_rows", type=int, default=None,
                        help="keep up to this many hot rows on each worker (docs/keras.md, "
                             "'A worker cache of hot rows'); needs --max_staleness_steps")
    parser.add_argument("--max_staleness_steps", type=int, default=None,
                        help="steps a worker reads a cached row after pulling it")
    parser.add_argument("--transfer_dtype", choices=("float32", "bfloat16"), default="float32",
                        help="what rows and gradients travel as between workers and parameter servers "
                             "(docs/keras.md: bfloat16 halves their bytes)")
    parser.add_argument("--min_count", type=int, default=0,
                        help="admit an ID to the table at its MIN_COUNT-th occurrence (MinCount; 0: "
                             "every ID gets a row)")
    parser.add_argument("--ttl_steps", type=int, default=0,
                        help="evict rows unseen for this many optimizer steps (TTL; 0: none)")
    parser.add_argument("--max_rows", type=int, default=0,
                        help="a cap on the table's rows; a full one evicts rows seen least recently (0: none)")
    parser.add_argument("--tier_memory_rows", type=int, default=0,
                        help="keep the values and slots of at most this many rows in the parameter servers' "
                        "memory and the rest on their local disks (0: all in memory; docs/tiered.md)")
    parser.add_argument("--tier_dir", default=os.path.join(tempfile.gettempdir(), "tfps-tier"),
                        help="with --tier_memory_rows: the directory on each parameter server's own disk")
    parser.add_argument("--non_finite", choices=("refuse", "skip"), default="refuse",
                        help="a step with a NaN or Inf gradient stops training (refuse) or is skipped "
                             "and counted (skip); either way none of it is applied (docs/keras.md)")
    parser.add_argument("--out_dir", default=None,
                        help="where checkpoints and backups go by default (default: a directory of "
                             "this run's own; under tfps-launch, one per launch)")
    parser.add_argument("--checkpoint_dir", default=None, help="default: OUT_DIR/checkpoints")
    parser.add_argument("--backup_dir", default=None,
                        help="IncrementalBackup's directory (default: OUT_DIR/backup): a run that dies "
                             "(a lost parameter server under tfps-launch) resumes from it; '' turns "
                             "backups off")
    parser.add_argument("--backup_every_steps", type=int, default=0,
                        help="steps between backups (default: a quarter of an epoch)")
    parser.add_argument("--export_dir", default=None,
                        help="export a serving SavedModel here, and a few eval examples to "
                             "EXPORT_DIR.samples.npz (examples/serve_export.py serves them)")
    parser.add_argument("--tensorboard_dir", default=None, help="write TensorBoard logs here")
    parser.add_argument("--fault_report", default=None,
                        help="for benchmarks/faults.py: record progress and restores here "
                             "(examples/fault_report.py)")
    parser.add_argument("--fault_hold", choices=["backup", "restore", "after_training"], default=None,
                        help="for benchmarks/faults.py: pause a backup or a restore part way, "
                             "or the run after training")
    parser.add_argument("--evaluator_timeout", type=float, default=3600,
                        help="an evaluator stops after this many seconds without a new checkpoint")
    args = parser.parse_args(argv)
    if args.sync and args.worker_cache_rows:
        # SynchronousTraining refuses it too, but only once the cluster has started.
        parser.error("--sync and --worker_cache_rows exclude each other: in synchronous steps the "
                     "chief applies every step, so a worker's cached copies would never be refreshed")
    return args


def main():
    args = parse_arguments()
    if not (args.checkpoint_dir or args.out_dir or os.environ.get("TFPS_LAUNCH_ID")) and \
            (tfps.distribute.tf_config() or {}).get("task", {}).get("type") == "evaluator":
        raise SystemExit("train_ctr.py: an evaluator task needs --checkpoint_dir or --out_dir (shared "
                         "with the chief)")
    out_dir = args.out_dir or tfps.distribute.run_directory("train-ctr")
    args.checkpoint_dir = args.checkpoint_dir or os.path.join(out_dir, "checkpoints")
    if args.backup_dir is None:
        args.backup_dir = os.path.join(out_dir, "backup")

    strategy = tfps.distribute.strategy_from_tf_config()  # ps/worker tasks serve here
    config = tfps.distribute.tf_config()
    evaluator = bool(config) and config["task"]["type"] == "evaluator"
    options = table_options(args)
    if evaluator:  # its table is its own, in its memory: the tier's directories are the servers'
        options["storage"] = None
    model = build_model(strategy, args.dim, args.learning_rate, **options)
    if evaluator:
        return evaluate_checkpoints(model, args)  # reads the data the chief wrote
    files = sorted(glob.glob(os.path.join(args.data_dir, "*.tsv")))
    if not files:
        print(f"generating {args.num_files} x {args.rows_per_file} rows in {args.data_dir}", flush=True)
        files = tfps.data.write_criteo(args.data_dir, args.num_files, args.rows_per_file, seed=0)
    train_files, eval_files = split_files(files)
    rows = sum(1 for f in train_files for _ in open(f))
    clustered = isinstance(strategy, tf.distribute.experimental.ParameterServerStrategy)
    # A synchronous step reads a batch on every worker.
    step_batches = len(tfps.distribute.tf_config()["cluster"]["worker"]) if args.sync and clustered else 1
    steps = args.steps_per_epoch or max(1, rows // (args.batch_size * step_batches))
    checkpoint_dir = args.checkpoint_dir
    callbacks = [Throughput(steps * args.batch_size * step_batches), EpochCheckpoint(checkpoint_dir)]
    if args.sync:
        callbacks.append(tfps.callbacks.SynchronousTraining())
    if args.tensorboard_dir:
        try:
            import tensorboard  # noqa: F401  (tf.summary writes nothing without it)
            callbacks.append(keras.callbacks.TensorBoard(args.tensorboard_dir, update_freq="epoch"))
        except ImportError:
            print("--tensorboard_dir: TensorBoard is not installed (pip install tensorboard); "
                  "no TensorBoard logs", flush=True)
    if args.backup_dir:
        # Whole every 10th backup, only the rows that changed in between; removed when fit ends.
        callbacks.insert(0, tfps.callbacks.IncrementalBackup(
            args.backup_dir, save_freq=args.backup_every_steps or max(1, steps // 4)))
    if args.fault_report:
        import fault_report  # beside this file
        if args.fault_hold:
            fault_report.install_holds(args.fault_report, args.fault_hold, args.backup_dir)
        callbacks.append(fault_report.FaultReport(args.fault_report, args.backup_dir,
                                                  model.get_layer("fields")))
    trained_epochs = resume_from_epoch_checkpoint(model, checkpoint_dir, args.backup_dir)
    if args.fault_report:
        fault_report.record_checkpoint_restore(args.fault_report, trained_epochs, checkpoint_dir,
                                               model.get_layer("fields"))
    # One reader of the training files (it parses in parallel threads), which so reports
    # each malformed line once; the chief's process holds it.
    with (tfps.data.local_data_service(num_workers=1) if clustered else contextlib.nullcontext()) as service:
        def train_data(_=None):
            data = tfps.data.criteo_dataset(train_files, args.batch_size, shuffle_buffer=8192,
                                            data_service=service, repeat=True)
            return data

        def eval_data(_=None):
            return tfps.data.criteo_dataset(eval_files, args.batch_size)

        if clustered:
            train, evaluate = (keras.utils.experimental.DatasetCreator(f) for f in (train_data, eval_data))
        else:
            train, evaluate = train_data(), eval_data()
        if trained_epochs < args.epochs:
            model.fit(train, epochs=args.epochs, initial_epoch=trained_epochs, steps_per_epoch=steps,
                      callbacks=callbacks, verbose=0)
        if args.fault_report and args.fault_hold == "after_training":
            fault_report.hold_after_training(args.fault_report)
        # Locally, one pass: steps_per_execution > 1 needs the number of batches.
        eval_steps = None if clustered else -(-sum(1 for f in eval_files for _ in open(f)) // args.batch_size)
        results = model.evaluate(evaluate, steps=eval_steps, return_dict=True, verbose=0)
    # The log loss's total weight is the number of examples evaluated (each weighs 1).
    evaluated = int(next(m for m in model.metrics if m.name == "log_loss").total_weight.numpy())
    best = tfps.data.best_auc(eval_files[0]) if len(eval_files) == 1 else None
    print(f"eval over {evaluated:,} examples: loss {float(results['loss']):.4f}  "
          f"auc {float(results['auc']):.4f}  log_loss {float(results['log_loss']):.4f}  "
          f"calibration {float(results['calibration']):.4f}"
          + (f"  (best achievable on this data: auc {best:.4f}, from the generator's true "
             "click probabilities)" if best is not None else ""), flush=True)
    print(f"checkpoints in {checkpoint_dir}; table sizes per PS shard: "
          f"{model.get_layer('fields').table.shard_sizes()}", flush=True)
    if args.non_finite == "skip":
        skipped = model.get_layer("fields").table.stats()["skipped_steps"]
        print(f"steps skipped for a non-finite gradient: {skipped}", flush=True)
    if args.export_dir:
        report = tfps.export.save_for_serving(model, args.export_dir)
        print(f"exported {report['rows']} rows, {report['bytes']:,} bytes to {report['export_dir']}")
        features, labels = next(iter(tfps.data.criteo_dataset(eval_files, 8)))
        np.savez(args.export_dir.rstrip("/") + ".samples.npz", labels=labels.numpy(),
                 **{name: value.numpy() for name, value in features.items()})
    if clustered:
        os._exit(0)  # the ps and worker tasks are stopped by the launcher


PROGRESS_FILE = "evaluated"  # beside the epoch checkpoints: "<launch id> <last epoch evaluated>"


def split_files(files):
    """(training files, the evaluation file): the last file is held out."""
    return files[:-1] or files, files[-1:]


def evaluate_checkpoints(model, args):
    """Sidecar evaluation: every line of the eval file, once, by each of this launch's
    checkpoints in epoch order, up to the last epoch's, which ends it (tfps-launch waits for
    that one). One the chief deleted before its turn (it keeps its last two) is named and
    skipped. The last epoch evaluated is kept beside the checkpoints, so an evaluator of a
    restarted cluster goes on from there."""
    launch = os.environ.get("TFPS_LAUNCH_ID", "")
    progress = os.path.join(args.checkpoint_dir, PROGRESS_FILE)
    evaluated = 0
    if launch and tf.io.gfile.exists(progress):
        with tf.io.gfile.GFile(progress) as f:
            written = f.read().split()
        evaluated = int(written[1]) if len(written) == 2 and written[0] == launch else 0
    idle_since, data, steps = time.monotonic(), None, None

    def evaluate_listed():
        """Evaluates this launch's checkpoints listed past `evaluated`; whether to stop."""
        nonlocal evaluated, data, steps
        # The launch first: the chief names it after the state, so a state read after it is
        # that launch's or newer. Without tfps-launch's launch id (tasks started by hand)
        # every run's count.
        ours = not launch or written_by_this_launch(args.checkpoint_dir)
        state = tf.train.get_checkpoint_state(args.checkpoint_dir)
        if state is not None and ours:
            listed = {epoch_of(path): path for path in state.all_model_checkpoint_paths}
            if data is None:  # the chief wrote any data it generated before its checkpoint
                _, eval_files = split_files(sorted(glob.glob(os.path.join(args.data_dir, "*.tsv"))))
                data = tfps.data.criteo_dataset(eval_files, args.batch_size)
                steps = -(-sum(1 for f in eval_files for _ in open(f)) // args.batch_size)
            for epoch in range(evaluated + 1, max((e for e in listed if e), default=0) + 1):
                results = _evaluated(model, listed.get(epoch), args.checkpoint_dir, data, steps)
                print(f"evaluator: weights-{epoch:02d}: " + (
                    f"loss {results['loss']:.6f}  auc {results['auc']:.6f}" if results else
                    "deleted before it could be evaluated (the chief keeps its last two)"), flush=True)
                evaluated = epoch
                with tf.io.gfile.GFile(progress, "w") as f:
                    f.write(f"{launch} {evaluated}")
        if evaluated >= args.epochs:
            return True
        if time.monotonic() - idle_since > args.evaluator_timeout:
            print(f"evaluator: no new checkpoint for {args.evaluator_timeout:g} s; stopping", flush=True)
            return True
        return False

    # Wakes at a new checkpoint, and every 5 s without one: the chief names its launch
    # just after its checkpoint, and another run's checkpoints in the directory are not ours.
    for _ in tf.train.checkpoints_iterator(args.checkpoint_dir, timeout=5, timeout_fn=evaluate_listed):
        idle_since = time.monotonic()
        if evaluate_listed():
            return


def _evaluated(model, path, checkpoint_dir, data, steps):
    """The evaluation of the checkpoint `path`, or None if it is gone (deleted, or no longer
    listed, as the chief deletes it: a load that fails part way through it)."""
    if path is None:
        return None
    try:
        model.load_weights(path).expect_partial()  # the optimizer's state is not needed
    except tf.errors.OpError:
        state = tf.train.get_checkpoint_state(checkpoint_dir)
        if state is not None and path in state.all_model_checkpoint_paths:
            raise
        return None
    return model.evaluate(data, steps=steps, return_dict=True, verbose=0)


if __name__ == "__main__":
    main()
