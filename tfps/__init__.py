"""tfps: parameter-server training of dynamic embedding tables for TensorFlow.

The package by layer: table/ (the table library over the ops, no Keras), keras/ (what ties
it to tf_keras), metrics/, cluster/ (TF_CONFIG strategy and the local launcher) and data/
(the examples' data); in each, a module whose name starts with _ is internal. The public modules keep their short names (tfps.optimizers,
tfps.checkpoint, tfps.callbacks, ...), which _PUBLIC_MODULES maps onto the layers; the
modules' paths before this layout (tfps.table as the table module, tfps.sharded_table, ...)
still import, as aliases."""

import importlib as _importlib
import os as _os
import sys as _sys

# Installed, keras_layers/ is the subpackage tfps.keras_layers. In a source checkout it
# sits beside tfps/, so let the package look there too.
_checkout = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
if not _os.path.isdir(_os.path.join(__path__[0], "keras_layers")) and _os.path.isfile(
        _os.path.join(_checkout, "keras_layers", "dynamic_embedding.py")):
    __path__.append(_checkout)

# tfps.<name>: the module it is.
_PUBLIC_MODULES = {
    "admission": "tfps.table.admission",
    "eviction": "tfps.table.eviction",
    "storage": "tfps.table.storage",
    "initializers": "tfps.table.initializers",
    "optimizers": "tfps.table.optimizers",
    "keys": "tfps.table.keys",
    "checkpoint": "tfps.table.checkpoint",
    "accumulation": "tfps.keras._accumulation",
    "callbacks": "tfps.keras.callbacks",
    "export": "tfps.keras.export",
    "distribute": "tfps.cluster.distribute",
    "stream": "tfps.data.stream",
}
# Paths of modules before the layout, importable still (tfps.table is now the package;
# its DynamicTable and TableRows are the old module's names).
_OLD_PATHS = {
    "tfps.sharded_table": "tfps.table.sharded_table",
    "tfps.configurable": "tfps.table._configurable",
    "tfps.stock_ops": "tfps.table._stock_ops",
    "tfps.arguments": "tfps._arguments",
    "tfps.keras_saving": "tfps.keras._saving",
    "tfps.optimizer_bridge": "tfps.keras._optimizer_bridge",
    "tfps.keras3_guard": "tfps.keras._keras3_guard",
    "tfps.exact_evaluation": "tfps.keras._exact_evaluation",
    "tfps.patches": "tfps.keras._patches",
    "tfps.early_stopping": "tfps.keras._early_stopping",
    "tfps.incremental_backup": "tfps.keras._incremental_backup",
    "tfps.task_health": "tfps.cluster._task_health",
}


def _in_the_launchers_process():
    """The process of `tfps-launch` or `python -m tfps.launch` starts and watches the
    tasks' processes and uses none of TensorFlow: importing it there would only delay
    every task's start and the message for a bad flag."""
    if _os.path.basename(_sys.argv[0]) == "tfps-launch":
        return True
    if _sys.argv[0] != "-m":  # it is "-m" while runpy imports the package of -m's module
        return False
    argv = getattr(_sys, "orig_argv", [])
    for i, argument in enumerate(argv[1:], 1):
        if argument.startswith("-m"):
            module = argument[2:] or (argv[i + 1] if i + 1 < len(argv) else "")
            return module in ("tfps.launch", "tfps.cluster.launch")
    return False


def _register_keras3_layer():
    """Registers the Keras 3 layer (tfps.keras_layers.keras3) where Keras 3 is in use, so
    that keras.models.load_model finds it in a process that imported tfps only: where
    tf.keras is Keras 3 (TF_USE_LEGACY_KERAS unset), or Keras 3 is imported already."""
    legacy = _os.environ.get("TF_USE_LEGACY_KERAS", "") in ("1", "true", "True")
    if legacy and "keras" not in _sys.modules:
        return
    try:
        import keras
    except ImportError:
        return
    if keras.__version__.startswith("3.") and keras.backend.backend() == "tensorflow":
        _importlib.import_module("tfps.keras_layers.keras3")


if not _in_the_launchers_process():
    for _name, _path in _PUBLIC_MODULES.items():
        globals()[_name] = _sys.modules[f"tfps.{_name}"] = _importlib.import_module(_path)
    for _old, _path in _OLD_PATHS.items():
        globals()[_old[len("tfps."):]] = _sys.modules[_old] = _importlib.import_module(_path)

    from tfps import data
    from tfps import keras_layers
    from tfps import metrics
    from tfps.keras import _patches as patches
    from tfps.keras._accumulation import GradientAccumulator
    from tfps.table import DynamicTable, ShardedTable, TableRows

    patches.apply()
    _register_keras3_layer()

__version__ = "0.1.0"

__all__ = ["DynamicTable", "GradientAccumulator", "ShardedTable", "TableRows", "admission", "callbacks",
           "checkpoint", "data", "distribute", "eviction", "export", "initializers", "keras_layers", "keys",
           "metrics", "optimizers", "stream"]
