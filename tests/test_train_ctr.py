"""examples/train_ctr.py runs end to end for a few steps, locally and on a launched cluster."""

import importlib.util
import os
import subprocess
import sys

import tensorflow as tf

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(ROOT, "examples", "train_ctr.py")
ARGS = ["--num_files", "2", "--rows_per_file", "3000", "--epochs", "2", "--steps_per_epoch", "5",
        "--batch_size", "256"]


def run(cmd, tmp_path):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=ROOT)
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env, cwd=str(tmp_path))
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    return out.stdout


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
    spec = importlib.util.spec_from_file_location("train_ctr", EXAMPLE)
    train_ctr = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(train_ctr)
    model = train_ctr.build_model(tf.distribute.get_strategy(), 16, 0.3)
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
               "--max_staleness_steps", "3", *ARGS], tmp_path)
    # Exact evaluation: each eval line once, whichever of the 2 workers reads it.
    assert "eval over 3,000 examples: loss" in out
    sizes = eval(out.split("table sizes per PS shard: ")[1].split("\n")[0])
    assert len(sizes) == 2 and min(sizes) > 0  # both PS tasks hold keys
    assert tf.train.latest_checkpoint(str(tmp_path / "ckpt")).endswith("weights-02")
