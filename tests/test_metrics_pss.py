"""Every tfps metric under ParameterServerStrategy, through every Keras evaluation path:
evaluate() sums every worker's data, each record once where exact evaluation is asked, and
reads what scikit-learn computes on the evaluated predictions."""

import numpy as np
import pytest

from tests.auc_reference import (assert_metrics_read, exact_group_auc, exact_roc_auc, log_linear_buckets,
                                  sklearn_metrics)
from tests.cluster_run import run_cluster_program


@pytest.mark.parametrize("layout", ["whole", "partitioned", "exact", "exact_fresh", "validation"])
def test_evaluate_auc_equals_exact_auc_over_union_of_both_workers_data(layout):
    """whole, partitioned: evaluate with steps= (a dataset without them refused first); exact: evaluate with pss_evaluation_shards
    (each record once) after a fit; exact_fresh: the same freshly compiled; validation:
    fit's validation_data with pss_evaluation_shards."""
    out = run_cluster_program("auc_evaluate.py", layout)
    assert out["auc_histogram_parts"] == (2 if layout == "partitioned" else 1)
    if layout in ("exact", "exact_fresh", "validation"):
        steps = "validation_steps=3" if layout == "validation" else "steps=3"
        assert "pss_evaluation_shards=4" in out["refusal"] and steps in out["refusal"]
        assert out["steps_run_before_refusal"] == 0  # fit refuses validation_steps before a step
        # 2 batches over 4 shards leaves shards empty, which fails inside tf.data.
        data = "validation_data" if layout == "validation" else "evaluate's data"
        assert f"{data} has 2 batches, fewer than the 4 shards" in out["few_batches_refusal"]
    else:  # without steps (it used to end in a raw CancelledError), before any record is read
        assert "evaluate: under ParameterServerStrategy model" in out["refusal"]
        assert "steps=None gives none" in out["refusal"] and "pss_evaluation_shards" in out["refusal"]
        assert "fit's validation_data: " in out["validation_refusal"]
        assert "validation_steps=None gives none" in out["validation_refusal"]
        assert out["steps_run_before_refusal"] == 0
    # Python numbers in every path, as Keras gives them; exact evaluation's were tensors.
    assert out["result_types"] == ["float"]
    counts = np.array(out["record_counts"])
    # Every evaluated record was counted once in the shared state, whichever worker ran it.
    if layout in ("exact", "exact_fresh", "validation"):
        np.testing.assert_array_equal(counts, np.ones_like(counts))
    else:
        assert counts.sum() == out["steps"] * out["batch"]
    ids = np.arange(len(counts))
    labels = (np.mod(ids * 7919, 13) < 4 + ids * 6 // len(counts)).astype(np.float64)
    scores = ((ids + 0.5) / len(counts)).astype(np.float32)
    exact = exact_roc_auc(labels, scores, weights=counts)
    assert 0.55 < exact < 0.95
    assert out["results"]["auc"] == pytest.approx(exact, abs=1e-6)
    # GroupAUC in compile, its groups fed by FeedGroups, uint64 keys split over the PS tasks:
    # the exact GAUC of the bucketed predictions, over the records both workers evaluated.
    assert out["group_auc_shards"] == (2 if layout == "partitioned" else 1)
    groups = np.mod(ids, 37)
    exact_group = exact_group_auc(groups, labels, log_linear_buckets(scores, *out["group_auc_buckets"]), weights=counts)
    assert 0.55 < exact_group < 0.95
    assert out["results"]["group_auc"] == pytest.approx(exact_group, abs=1e-6)
    # Against scikit-learn on the evaluated predictions: AUC within its documented 1e-4,
    # GroupAUC within 1e-3, the sums to float32 rounding.
    expected = sklearn_metrics(labels, scores, groups, counts)
    assert_metrics_read(out["results"], expected, sums_rel=1e-5)
