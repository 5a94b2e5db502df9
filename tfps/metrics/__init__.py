"""Ranking and calibration metrics for CTR training, exact enough to compare runs by.

Every metric's state is a set of sums, so under ParameterServerStrategy each worker adds
into the same variables and `result()` covers all workers' data, in `fit` and `evaluate`.
Labels may be soft: a label y in [0, 1] counts as y positive and 1 - y negative examples.
"""

from tfps.metrics.auc import AUC
from tfps.metrics.calibration import BinaryLogLoss, CalibrationRatio
from tfps.metrics.group_auc import FeedGroups, GroupAUC

__all__ = ["AUC", "BinaryLogLoss", "CalibrationRatio", "FeedGroups", "GroupAUC"]
