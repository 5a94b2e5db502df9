"""tfps: parameter-server training of dynamic embedding tables for TensorFlow."""

from tfps import distribute
from tfps import initializers
from tfps import metrics
from tfps import optimizers
from tfps.table import DynamicTable, TableRows

__version__ = "0.1.0"

__all__ = ["DynamicTable", "TableRows", "distribute", "initializers", "metrics", "optimizers"]
