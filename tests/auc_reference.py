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
