"""Data for the examples, tests and benchmarks: a Criteo-format generator and reader
(criteo, whose names this package exports) and a drifting stream of IDs (stream)."""

from tfps.data.criteo import *  # noqa: F401,F403
from tfps.data.criteo import __all__  # noqa: F401
