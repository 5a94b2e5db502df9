"""examples/train_ctr.py runs end to end for a few steps, locally and on a launched cluster."""

import collections
import importlib.util
import os
import re
import subprocess
import sys

import numpy as np
import tensorflow as tf

from tests.auc_reference import exact_roc_auc, log_linear_buckets

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(ROOT, "examples", "train_ctr.py")
ARGS = ["--num_files", "2", "--rows_per_file", "3000", "--epochs", "2", "--steps_per_epoch", "5",
        "--batch_size", "256"]


def run(cmd, tmp_path):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=ROOT)
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env, cwd=str(tmp_path))
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    return out.stdout


def _train_ctr():
    spec = importlib.util.spec_from_file_location("train_ctr", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_example_trains_evaluates_checkpoints_and_exports_locally(tmp_path):
    out = run([sys.executable, EXAMPLE, "--data_dir", str(tmp_path / "data"), "--checkpoint_dir",
               str(tmp_path / "ckpt"), "--export_dir", str(tmp_path / "export"),
               "--backup_dir", str(tmp_path / "backup"), *ARGS, "--epochs", "3"], tmp_path)
    assert "epoch 3: loss" in out and "examples/s" in out
    # The whole eval file (the last of 2 generated files), each line once, beside the best
    # AUC the generator's true probabilities reach on it.
    assert "eval over 3,000 examples: loss" in out
    best = float(out.split("best achievable on this data: auc ")[1].split(",")[0])
    assert 0.6 < best < 1.0
    assert "exported {'fields':" in out
    # The last 2 epochs' weights, the newest recorded as the latest, read by load_weights.
    assert sorted({name.split(".")[0].split("-tfps")[0] for name in os.listdir(tmp_path / "ckpt")
                   if name.startswith("weights")}) == ["weights-02", "weights-03"]
    latest = tf.train.latest_checkpoint(str(tmp_path / "ckpt"))
    assert latest.endswith("weights-03")
    model = _train_ctr().build_model(tf.distribute.get_strategy(), 16, 0.3)
    model.load_weights(latest).assert_existing_objects_matched()
    assert model.get_layer("fields").table.size() > 0  # the trained rows came back
    assert os.path.exists(tmp_path / "export" / "saved_model.pb")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    env.pop("PYTHONPATH", None)
    served = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "serve_export.py"),
                             str(tmp_path / "export")], capture_output=True, text=True, timeout=300,
                            env=env, cwd=str(tmp_path))
    assert served.returncode == 0, served.stderr[-3000:]
    assert "served 8 examples" in served.stdout and "(tfps imported: False)" in served.stdout
    assert served.stdout.count("click probability") == 8


def test_example_runs_with_worker_caches_beside_backups_and_epoch_checkpoints(tmp_path):
    """On a launched cluster with everything on (benchmarks/faults.py's rounds run it
    plain, with faults)."""
    out = run([sys.executable, "-m", "tfps.launch", "--num_ps", "2", "--num_workers", "2", "--log_dir",
               str(tmp_path / "logs"), EXAMPLE, "--data_dir", str(tmp_path / "data"),
               "--backup_dir", str(tmp_path / "backup"), "--backup_every_steps", "2",
               "--checkpoint_dir", str(tmp_path / "ckpt"), "--worker_cache_rows", "50000",
               "--max_staleness_steps", "3", "--transfer_dtype", "bfloat16", "--min_count", "2",
               "--ttl_steps", "6", "--max_rows", "4000", *ARGS], tmp_path)
    # Exact evaluation: each eval line once, whichever of the 2 workers reads it.
    assert "eval over 3,000 examples: loss" in out and "calibration " in out
    sizes = eval(out.split("table sizes per PS shard: ")[1].split("\n")[0])
    assert len(sizes) == 2 and min(sizes) > 0  # both PS tasks hold keys
    # The cap holds, and binds: 10 steps of 256 examples bring more IDs seen twice.
    assert 3600 <= sum(sizes) <= 4000
    assert tf.train.latest_checkpoint(str(tmp_path / "ckpt")).endswith("weights-02")


def test_a_sidecar_evaluator_evaluates_the_checkpoints_up_to_the_last_epochs(tmp_path):
    """tfps-launch --evaluator: the evaluator task evaluates the chief's checkpoints as they
    come, and the launcher waits for its evaluation of the last one after the chief ends.
    That evaluation equals the model the checkpoint holds, evaluated here independently,
    and the chief's own final evaluation of the same weights."""
    logs = tmp_path / "logs"
    out = run([sys.executable, "-m", "tfps.launch", "--num_ps", "1", "--num_workers", "1", "--evaluator",
               "--log_dir", str(logs), EXAMPLE, "--data_dir", str(tmp_path / "data"),
               "--checkpoint_dir", str(tmp_path / "ckpt"), *ARGS, "--epochs", "3"], tmp_path)
    said = (logs / "evaluator_0.log").read_text()
    evaluated = re.findall(r"evaluator: (weights-\d\d): loss ([\d.]+)  auc ([\d.]+)", said)
    skipped = re.findall(r"evaluator: (weights-\d\d): deleted before it could be evaluated", said)
    # Every epoch's checkpoint in order, each evaluated or named as deleted first.
    assert sorted([name for name, _, _ in evaluated] + skipped) == ["weights-01", "weights-02", "weights-03"]
    assert evaluated[-1][0] == "weights-03", said[-3000:]
    launcher = (logs / "launcher.log").read_text()
    assert "did not finish" not in launcher and "exited with code" not in launcher

    _, loss, auc = evaluated[-1]
    train_ctr = _train_ctr()
    model = train_ctr.build_model(tf.distribute.get_strategy(), 16, 0.3)
    model.load_weights(str(tmp_path / "ckpt" / "weights-03")).assert_existing_objects_matched()
    import tfps
    eval_file = sorted((tmp_path / "data").glob("*.tsv"))[-1]
    data = tfps.data.criteo_dataset([str(eval_file)], 256)
    labels = np.concatenate([y.numpy() for _, y in data]).reshape(-1)
    predictions = model.predict(data, steps=12, verbose=0).reshape(-1).astype(np.float64)
    assert labels.size == 3000 and predictions.size == 3000  # every eval line once
    # The metric's own buckets (1,024 per octave) make the only difference from exact.
    assert abs(float(auc) - exact_roc_auc(labels, log_linear_buckets(predictions))) < 2e-6
    assert abs(float(auc) - exact_roc_auc(labels, predictions)) < 1e-3
    p = np.clip(predictions, 1e-7, 1 - 1e-7)
    assert abs(float(loss) - np.mean(-(labels * np.log(p) + (1 - labels) * np.log(1 - p)))) < 1e-4
    chief_auc = float(re.search(r"eval over 3,000 examples: loss [\d.]+  auc ([\d.]+)", out).group(1))
    assert abs(chief_auc - float(auc)) <= 5e-5 + 1e-6  # printed to 4 places

    # A second launch in the same directory, training another model for 2 epochs: its
    # evaluator waits for its own chief's checkpoints instead of taking the first's.
    logs = tmp_path / "logs2"
    out = run([sys.executable, "-m", "tfps.launch", "--num_ps", "1", "--num_workers", "1", "--evaluator",
               "--log_dir", str(logs), EXAMPLE, "--data_dir", str(tmp_path / "data"),
               "--checkpoint_dir", str(tmp_path / "ckpt"), *ARGS, "--learning_rate", "0.05"], tmp_path)
    said = (logs / "evaluator_0.log").read_text()
    assert "weights-03" not in said, said[-3000:]
    evaluated = re.findall(r"evaluator: weights-(\d\d): loss [\d.]+  auc ([\d.]+)", said)
    assert evaluated[-1][0] == "02", said[-3000:]
    chief_auc = float(re.search(r"eval over 3,000 examples: loss [\d.]+  auc ([\d.]+)", out).group(1))
    assert abs(chief_auc - float(evaluated[-1][1])) <= 5e-5 + 1e-6
    assert abs(chief_auc - float(auc)) > 1e-3  # another model than the first launch's


def test_epoch_checkpoints_resume_only_their_own_launch_and_survive_an_epoch_ended_again(tmp_path, monkeypatch):
    """A restarted cluster with no backup resumes the newest epoch checkpoint its launch
    wrote (tfps-launch's TFPS_LAUNCH_ID), never another run's in the same directory; an
    epoch that ends again after a restart (resumed from a backup taken before its end)
    rewrites its checkpoint and deletes none it keeps."""
    import tf_keras as keras
    train_ctr = _train_ctr()
    directory = str(tmp_path / "ckpt")

    def model_with(value):
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(
            1, kernel_initializer=keras.initializers.Constant(value))])
        model.compile("sgd", "mse")
        return model

    def cluster(model, epochs_ended):
        callback = train_ctr.EpochCheckpoint(directory)
        callback.set_model(model)
        callback.on_train_begin()
        for epoch in epochs_ended:
            callback.on_epoch_end(epoch, {})
        return sorted(os.path.basename(p) for p in callback.written)

    def resumed(model):
        return train_ctr.resume_from_epoch_checkpoint(model, directory, str(tmp_path / "no-backup"))

    monkeypatch.setenv("TFPS_LAUNCH_ID", "earlier")
    monkeypatch.setenv("TFPS_CLUSTER_RESTARTS", "0")
    assert cluster(model_with(1.0), range(3)) == ["weights-02", "weights-03"]
    # A new launch given the same directory: its restart does not resume the earlier run.
    monkeypatch.setenv("TFPS_LAUNCH_ID", "new")
    monkeypatch.setenv("TFPS_CLUSTER_RESTARTS", "1")
    model = model_with(7.0)
    assert resumed(model) == 0 and (model.layers[0].kernel.numpy() == 7.0).all()
    # Its own first cluster ends epochs 1 and 2, a restart ends epoch 2 again, twice.
    monkeypatch.setenv("TFPS_CLUSTER_RESTARTS", "0")
    assert cluster(model_with(2.0), range(2)) == ["weights-01", "weights-02"]
    monkeypatch.setenv("TFPS_CLUSTER_RESTARTS", "1")
    for _ in range(2):
        assert cluster(model_with(3.0), [1]) == ["weights-01", "weights-02"]
    assert tf.train.latest_checkpoint(directory).endswith("weights-02")
    # After training: the restart resumes the launch's own last epoch.
    model = model_with(9.0)
    assert resumed(model) == 2 and (model.layers[0].kernel.numpy() == 3.0).all()


def test_flags_that_exclude_each_other_are_refused_at_parsing(capsys):
    train_ctr = _train_ctr()
    args = train_ctr.parse_arguments(["--sync", "--non_finite", "skip"])
    assert args.sync and train_ctr.table_options(args)["non_finite"] == "skip"
    try:
        train_ctr.parse_arguments(["--sync", "--worker_cache_rows", "100", "--max_staleness_steps", "1"])
    except SystemExit as e:
        assert e.code == 2
    else:
        raise AssertionError("--sync with --worker_cache_rows was accepted")
    assert "--sync and --worker_cache_rows exclude each other" in capsys.readouterr().err


def _warned_lines(text):
    """{(file name, line number): times warned} from the reader's warnings in a log."""
    warned = collections.Counter()
    for numbers, path in re.findall(r'skipped malformed line\(s\) \[([\d ]+)\] of "([^"]+)"', text):
        for number in numbers.split():
            warned[(os.path.basename(path), int(number))] += 1
    return warned


def test_the_main_job_drops_hostile_lines_and_learns_as_from_clean_data(tmp_path):
    """Under tfps-launch, with --non_finite skip: Criteo files with NaN and Inf labels and
    features, over-long numbers, lines and fields, empty, cut-short and binary lines mixed
    in (tests/hostile_input.py) train to the AUC of the same files without them, and the
    reader reports each bad line once per reader."""
    import shutil
    import tfps
    from tests import hostile_input

    clean = tmp_path / "clean"
    # A small ID space, so that a short run learns to its plateau and two runs compare.
    paths = tfps.data.write_criteo(str(clean), num_files=3, rows_per_file=30000, seed=0, vocabulary=300)
    shutil.copytree(clean, tmp_path / "hostile")
    placed = hostile_input.mix_into([str(tmp_path / "hostile" / os.path.basename(p)) for p in paths])
    results = {}
    for name in ("clean", "hostile"):
        out = run([sys.executable, "-m", "tfps.launch", "--num_ps", "2", "--num_workers", "2", "--log_dir",
                   str(tmp_path / f"logs_{name}"), EXAMPLE, "--data_dir", str(tmp_path / name), "--epochs", "4",
                   "--batch_size", "256", "--non_finite", "skip", "--out_dir", str(tmp_path / f"out_{name}")],
                  tmp_path)
        logs = {f: (tmp_path / f"logs_{name}" / f).read_text(errors="replace")
                for f in ("chief_0.log", "worker_0.log", "worker_1.log")}
        results[name] = (float(re.search(r"eval over 30,000 examples: loss [\d.]+  auc ([\d.]+)", out).group(1)),
                         {f: _warned_lines(text) for f, text in logs.items()}, out)
    (clean_auc, clean_warned, _), (auc, warned, out) = results["clean"], results["hostile"]
    assert not any(clean_warned.values())
    assert "steps skipped for a non-finite gradient: 0" in out  # none reached the model
    assert abs(auc - clean_auc) <= 0.005, (auc, clean_auc)
    expected = {(os.path.basename(path), n) for path, numbers in placed.items() for n in numbers}
    training = {key for key in expected if key[0] != "part-00002.tsv"}
    # The chief's one reader of the training files warns of each bad line once in 4 passes;
    # each worker's evaluation shard reads the whole evaluation file and warns of its own.
    assert warned["chief_0.log"] == {key: 1 for key in training}
    for worker in ("worker_0.log", "worker_1.log"):
        assert warned[worker] == {key: 1 for key in expected - training}
