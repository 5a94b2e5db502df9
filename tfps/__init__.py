"""tfps: parameter-server training of dynamic embedding tables for TensorFlow."""

import os as _os

# Installed, keras_layers/ is the subpackage tfps.keras_layers. In a source checkout it
# sits beside tfps/, so let the package look there too.
_checkout = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
if not _os.path.isdir(_os.path.join(__path__[0], "keras_layers")) and _os.path.isfile(
        _os.path.join(_checkout, "keras_layers", "dynamic_embedding.py")):
    __path__.append(_checkout)

from tfps import admission
from tfps import callbacks
from tfps import checkpoint
from tfps import data
from tfps import distribute
from tfps import eviction
from tfps import export
from tfps import initializers
from tfps import keras_layers
from tfps import metrics
from tfps import optimizers
from tfps import stream
from tfps import accumulation
from tfps.accumulation import GradientAccumulator
from tfps.table import DynamicTable, TableRows
from tfps import patches

patches.apply()

__version__ = "0.1.0"

__all__ = ["DynamicTable", "GradientAccumulator", "TableRows", "admission", "callbacks", "checkpoint", "data", "distribute",
           "eviction", "export", "initializers", "keras_layers", "metrics", "optimizers", "stream"]
