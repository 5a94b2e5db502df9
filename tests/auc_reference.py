"""Exact, sort-based AUC references written independently of tfps.metrics."""

import numpy as np


def exact_roc_auc(labels, scores, weights=None):
    """Weighted Mann-Whitney AUC; a positive and a negative with equal scores count 1/2."""
    labels = np.asarray(labels, np.float64)
    scores = np.asarray(scores, np.float64)
    weights = np.ones_like(scores) if weights is None else np.asarray(weights, np.float64)
    pos_w, neg_w = weights * labels, weights * (1 - labels)
    order = np.argsort(scores, kind="stable")
    scores, pos_w, neg_w = scores[order], pos_w[order], neg_w[order]
    unique, start = np.unique(scores, return_index=True)
    pos_per = np.add.reduceat(pos_w, start)
    neg_per = np.add.reduceat(neg_w, start)
    neg_below = np.cumsum(neg_per) - neg_per
    wins = np.sum(pos_per * (neg_below + 0.5 * neg_per))
    total = pos_w.sum() * neg_w.sum()
    return wins / total if total > 0 else 0.5


def exact_group_auc(groups, labels, scores, weights=None):
    """GAUC: each group's exact ROC AUC weighted by its total weight, over the groups that
    have both classes; 0.5 when none has."""
    groups, labels, scores = np.asarray(groups), np.asarray(labels, np.float64), np.asarray(scores)
    weights = np.ones_like(labels) if weights is None else np.asarray(weights, np.float64)
    total = weighted = 0.0
    for group in np.unique(groups):
        mask = groups == group
        positives = np.sum(weights[mask] * labels[mask])
        negatives = np.sum(weights[mask] * (1 - labels[mask]))
        if positives > 0 and negatives > 0:
            weighted += (positives + negatives) * exact_roc_auc(labels[mask], scores[mask], weights[mask])
            total += positives + negatives
    return weighted / total if total > 0 else 0.5


def exact_average_precision(labels, scores, weights=None):
    """Average precision with one threshold per distinct score (sklearn's definition)."""
    labels = np.asarray(labels, np.float64)
    scores = np.asarray(scores, np.float64)
    weights = np.ones_like(scores) if weights is None else np.asarray(weights, np.float64)
    order = np.argsort(-scores, kind="stable")
    scores, labels, weights = scores[order], labels[order], weights[order]
    unique, start = np.unique(-scores, return_index=True)
    tp = np.cumsum(np.add.reduceat(weights * labels, start))
    fp = np.cumsum(np.add.reduceat(weights * (1 - labels), start))
    total_pos = tp[-1] if len(tp) else 0.0
    if total_pos <= 0:
        return 0.0
    recall = tp / total_pos
    precision = tp / (tp + fp)
    return float(np.sum(np.diff(np.concatenate([[0.0], recall])) * precision))


def log_linear_buckets(scores, buckets_per_octave=1024, octaves=16):
    """The bucket tfps.metrics.AUC documents for each score, from frexp in float64.

    d = min(p, 1 - p); octave k of d is [2^-(octaves + 1 - k), 2^-(octaves - k)), split into
    buckets_per_octave equal parts; d below octave 0 joins bucket 0, d = 1/2 the last one
    of its side; scores >= 1/2 mirror the lower side.
    """
    scores = np.asarray(scores, np.float32).astype(np.float64)
    distance = np.minimum(scores, 1.0 - scores)
    mantissa, exponent = np.frexp(distance)  # distance = mantissa * 2^exponent, mantissa in [1/2, 1)
    octave = exponent + octaves  # [1/4, 1/2) has exponent -1: octave octaves - 1
    within = np.floor((2 * mantissa - 1) * buckets_per_octave)
    per_side = octaves * buckets_per_octave
    side = np.where(distance > 0, octave * buckets_per_octave + within, 0)
    side = np.clip(side, 0, per_side - 1).astype(np.int64)
    return np.where(scores < 0.5, side, 2 * per_side - 1 - side)


def sklearn_metrics(labels, scores, groups, weights=None):
    """What every tfps metric should read for these predictions, by scikit-learn: ROC AUC,
    average precision, GAUC (per-group ROC AUC weighted by the group's weight, over groups
    with both classes), log loss and calibration (predicted over actual clicks)."""
    from sklearn import metrics
    labels, scores = np.asarray(labels, np.float64), np.asarray(scores, np.float64)
    weights = np.ones_like(labels) if weights is None else np.asarray(weights, np.float64)
    groups = np.asarray(groups)
    total = weighted = 0.0
    for group in np.unique(groups):
        mask = (groups == group) & (weights > 0)
        if len(np.unique(labels[mask])) == 2:
            weighted += weights[mask].sum() * metrics.roc_auc_score(labels[mask], scores[mask],
                                                                    sample_weight=weights[mask])
            total += weights[mask].sum()
    return {"auc": metrics.roc_auc_score(labels, scores, sample_weight=weights),
            "pr_auc": metrics.average_precision_score(labels, scores, sample_weight=weights),
            "group_auc": weighted / total if total > 0 else 0.5,
            "log_loss": metrics.log_loss(labels, scores, sample_weight=weights),
            "calibration": np.sum(weights * scores) / np.sum(weights * labels)}


def bucketed_metrics(labels, scores, groups, weights=None, auc=(1024, 16), group_auc=(64, 16)):
    """What the histogram metrics read exactly: ROC AUC, average precision and GAUC of each
    prediction's documented bucket (log_linear_buckets with the metric's buckets per octave
    and octaves), so that a pair in one bucket counts one half."""
    buckets = log_linear_buckets(scores, *auc)
    return {"auc": exact_roc_auc(labels, buckets, weights),
            "pr_auc": exact_average_precision(labels, buckets, weights),
            "group_auc": exact_group_auc(groups, labels, log_linear_buckets(scores, *group_auc), weights)}


def assert_metrics_read(results, expected, sums_rel=1e-4, loss=True, bucketed=None):
    """results (tfps metrics' values by name) against sklearn_metrics' `expected`: ROC AUC
    within its documented 1e-4, average precision within 3e-4 (keras.md's predictions
    crowded into one range read 2.9e-4 off), GroupAUC (spread predictions) within 1e-3, the sums
    (log loss, calibration) to `sums_rel`, and with `loss` the compiled loss (Keras' clipped
    binary cross-entropy, unweighted) to 10 x that. With `bucketed` (bucketed_metrics of the
    same examples) the three areas must also equal it to float32 rounding (2e-7; halving
    the buckets moves ROC AUC by 2e-6 here): every example counted once in its own bucket."""
    import pytest
    for name, value in (bucketed or {}).items():
        assert results[name] == pytest.approx(value, abs=2e-7), (name, results, bucketed)
    assert results["auc"] == pytest.approx(expected["auc"], abs=1e-4)
    assert results["pr_auc"] == pytest.approx(expected["pr_auc"], abs=3e-4)
    assert results["group_auc"] == pytest.approx(expected["group_auc"], abs=1e-3)
    assert results["log_loss"] == pytest.approx(expected["log_loss"], rel=sums_rel)
    assert results["calibration"] == pytest.approx(expected["calibration"], rel=sums_rel)
    if loss:
        assert results["loss"] == pytest.approx(expected["log_loss"], rel=10 * sums_rel)
