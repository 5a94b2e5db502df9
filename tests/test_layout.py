"""tfps/ is organised by layer, and every module path a user may have imported before the
layout still imports, as the same module object (so isinstance and registries agree)."""

import importlib
import os
import subprocess
import sys

import tfps

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Written out here rather than read from tfps/__init__, so a dropped alias fails.
BEFORE_THE_LAYOUT = {
    "tfps.admission": "tfps.table.admission", "tfps.eviction": "tfps.table.eviction",
    "tfps.initializers": "tfps.table.initializers", "tfps.optimizers": "tfps.table.optimizers",
    "tfps.keys": "tfps.table.keys", "tfps.checkpoint": "tfps.table.checkpoint",
    "tfps.sharded_table": "tfps.table.sharded_table", "tfps.configurable": "tfps.table._configurable",
    "tfps.stock_ops": "tfps.table._stock_ops", "tfps.arguments": "tfps._arguments",
    "tfps.accumulation": "tfps.keras._accumulation", "tfps.callbacks": "tfps.keras.callbacks",
    "tfps.export": "tfps.keras.export", "tfps.keras_saving": "tfps.keras._saving",
    "tfps.optimizer_bridge": "tfps.keras._optimizer_bridge", "tfps.keras3_guard": "tfps.keras._keras3_guard",
    "tfps.exact_evaluation": "tfps.keras._exact_evaluation", "tfps.patches": "tfps.keras._patches",
    "tfps.early_stopping": "tfps.keras._early_stopping",
    "tfps.incremental_backup": "tfps.keras._incremental_backup",
    "tfps.distribute": "tfps.cluster.distribute", "tfps.task_health": "tfps.cluster._task_health",
    "tfps.stream": "tfps.data.stream",
}


def test_every_path_before_the_layout_imports_the_module_now_in_its_layer():
    for old, new in BEFORE_THE_LAYOUT.items():
        module = importlib.import_module(old)
        assert module is importlib.import_module(new), old
        assert getattr(tfps, old.split(".")[1]) is module, old
    # tfps.table was the table's module; its names come from the package now.
    from tfps.table import DynamicTable, TableRows  # noqa: F401
    assert tfps.data.write_criteo is importlib.import_module("tfps.data.criteo").write_criteo
    assert tfps.eviction.TTL(steps=3) == tfps.table.eviction.get({"class_name": "TTL",
                                                                  "config": {"steps": 3, "seconds": None}})


def test_the_package_folder_shows_its_layers():
    entries = {name for name in os.listdir(os.path.join(ROOT, "tfps"))
               if not name.startswith("__pycache__") and not name.endswith(".so")}
    assert entries == {"__init__.py", "_ops.py", "_arguments.py", "_durable.py", "launch.py",
                       "table", "keras", "metrics", "cluster", "data"}
    # A layer's modules without a leading underscore are its public ones; helpers are private.
    public = {"table": {"dynamic_table", "sharded_table", "keys", "initializers", "optimizers",
                        "admission", "eviction", "storage", "checkpoint"},
              "keras": {"callbacks", "export"}, "cluster": {"distribute", "launch"},
              "data": {"criteo", "stream"}, "metrics": {"auc", "base", "calibration", "group_auc"}}
    for layer, modules in public.items():
        names = {name[:-3] for name in os.listdir(os.path.join(ROOT, "tfps", layer))
                 if name.endswith(".py") and not name.startswith("_")}
        assert names == modules, layer


def test_python_m_tfps_launch_still_runs_the_launcher():
    out = subprocess.run([sys.executable, "-m", "tfps.launch", "--help"], capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")))
    assert out.returncode == 0 and "--num_ps" in out.stdout, out.stderr[-2000:]
