"""tfps.metrics against exact sort-based references, eagerly and in tf.function."""

import os

import numpy as np
import pytest
import tensorflow as tf
import tf_keras as keras
from tensorflow.core.protobuf import trackable_object_graph_pb2

import tfps
from tests.auc_reference import exact_average_precision, exact_group_auc, exact_roc_auc, log_linear_buckets


def evaluate(metric, run, y_true, y_pred, sample_weight=None, batch=8192, **kwargs):
    update = lambda t, p, w: metric.update_state(t, p, sample_weight=w, **kwargs)  # noqa: E731
    for start in range(0, len(y_pred), batch):
        sl = slice(start, start + batch)
        w = None if sample_weight is None else tf.constant(sample_weight[sl])
        run(update, tf.constant(y_true[sl]), tf.constant(y_pred[sl]), w)
    return float(metric.result())


def data(kind, n, seed=0):
    rng = np.random.default_rng(seed)
    if kind == "random":
        labels = (rng.random(n) < 0.3).astype(np.float32)
        scores = np.clip(rng.normal(0.45 + 0.15 * labels, 0.2), 0, 1).astype(np.float32)
    elif kind == "tied":  # few distinct scores, all on bucket boundaries
        labels = (rng.random(n) < 0.4).astype(np.float32)
        level = rng.integers(0, 11, n) + (labels > 0) * (rng.random(n) < 0.5)
        scores = (np.minimum(level, 10) / 10).astype(np.float32)
    elif kind == "skewed":  # 1% positives
        labels = (rng.random(n) < 0.01).astype(np.float32)
        scores = rng.beta(1 + 3 * labels, 8).astype(np.float32)
    elif kind == "extremes":  # exactly 0 and 1 (1.0 lands in the last bucket), bucket edges
        labels = (rng.random(n) < 0.5).astype(np.float32)
        scores = rng.choice(np.array([0.0, 1.0, 0.5, 2 ** -16], np.float32), n)
    return labels, scores


# Results are float32, like every Keras metric: "exact" means within 1e-7.
@pytest.mark.parametrize("kind,tolerance", [("random", 1e-4), ("tied", 1e-7), ("skewed", 1e-4),
                                            ("extremes", 1e-7)])
def test_roc_auc_matches_exact(run, kind, tolerance):
    labels, scores = data(kind, 200_000)
    got = evaluate(tfps.metrics.AUC(), run, labels, scores)
    assert abs(got - exact_roc_auc(labels, scores)) <= tolerance


def test_million_well_spread_predictions_within_1e4():
    labels, scores = data("random", 1_000_000, seed=5)
    metric = tfps.metrics.AUC()
    got = evaluate(metric, lambda f, *a: f(*a), labels, scores, batch=1 << 17)
    assert abs(got - exact_roc_auc(labels, scores)) <= 1e-4


def test_adversarial_narrow_range_stays_within_the_documented_tie_bound():
    # Every prediction in a band 4 buckets wide: the histogram cannot order most pairs,
    # but its error never exceeds half the fraction of pos/neg pairs sharing a bucket.
    rng = np.random.default_rng(2)
    labels = (rng.random(100_000) < 0.5).astype(np.float32)
    scores = (0.3 + 4 * 2 ** -12 * rng.random(100_000) ** (1 - 0.5 * labels)).astype(np.float32)
    metric = tfps.metrics.AUC()
    got = evaluate(metric, lambda f, *a: f(*a), labels, scores)
    buckets = log_linear_buckets(scores)
    assert len(np.unique(buckets)) <= 5
    pos = np.bincount(buckets, labels, minlength=metric.num_buckets)
    neg = np.bincount(buckets, 1 - labels, minlength=metric.num_buckets)
    bound = 0.5 * np.sum(pos * neg) / (pos.sum() * neg.sum())
    exact = exact_roc_auc(labels, scores)
    assert abs(exact - 0.5) > 0.05  # the data really is separable at fine resolution
    assert abs(got - exact) <= bound + 1e-12


@pytest.mark.parametrize("buckets_per_octave,octaves", [(1024, 16), (4, 3), (1, 1)])
def test_each_prediction_lands_in_its_documented_bucket(run, buckets_per_octave, octaves):
    rng = np.random.default_rng(7)
    near_an_end = 2.0 ** -rng.uniform(1, 24, 30_000)  # log-uniform distances to 0 or 1
    edges = [0.0, 1.0, 0.5, 0.25, 0.75, 2 ** -17, 2 ** -16, 1 - 2 ** -16, np.nextafter(0.5, 0),
             np.float32(2 ** -17) * (1 + 2 ** -10), 2 ** -126, 2 ** -149, -0.0]
    scores = np.concatenate([near_an_end, 1 - near_an_end, rng.random(30_000), edges]).astype(np.float32)
    labels = (rng.random(len(scores)) < 0.4).astype(np.float32)
    metric = tfps.metrics.AUC(num_buckets=2 * octaves * buckets_per_octave, octaves=octaves)
    evaluate(metric, run, labels, scores)
    buckets = log_linear_buckets(scores, buckets_per_octave, octaves)
    want = np.stack([np.bincount(buckets, labels, minlength=metric.num_buckets),
                     np.bincount(buckets, 1 - labels, minlength=metric.num_buckets)], 1)
    np.testing.assert_array_equal(metric.histogram.numpy(), want)


def test_low_ctr_predictions_keep_their_order():
    # Predictions around 2e-4 (a conversion rate): 65536 equal-width buckets hold them in
    # about 800 buckets and miss the exact AUC by 5.8e-5 on this data.
    rng = np.random.default_rng(8)
    logit = rng.normal(np.log(2e-4), 1.0, 1_000_000)
    labels = (rng.random(logit.size) < 1 / (1 + np.exp(-logit))).astype(np.float32)
    scores = (1 / (1 + np.exp(-(logit + rng.normal(0, 0.5, logit.size))))).astype(np.float32)
    exact = exact_roc_auc(labels, scores)
    equal_width = np.minimum((scores * 2 ** 16).astype(np.int64), 2 ** 16 - 1)
    pos, neg = np.bincount(equal_width, labels), np.bincount(equal_width, 1 - labels)
    equal_width_auc = np.sum(pos * (np.cumsum(neg) - 0.5 * neg)) / (pos.sum() * neg.sum())
    assert abs(equal_width_auc - exact) > 5e-5  # the data really needs the finer buckets
    got = evaluate(tfps.metrics.AUC(), lambda f, *a: f(*a), labels, scores, batch=1 << 17)
    assert abs(got - exact) <= 1e-5


def test_sample_weight_and_soft_labels(run):
    labels, scores = data("random", 50_000, seed=3)
    weights = np.random.default_rng(4).exponential(size=len(scores)).astype(np.float32)
    got = evaluate(tfps.metrics.AUC(), run, labels, scores, sample_weight=weights)
    assert abs(got - exact_roc_auc(labels, scores, weights)) <= 1e-4
    # A soft label y is y positive plus (1 - y) negative examples.
    soft = np.array([0.25, 1.0, 0.0], np.float32)
    preds = np.array([0.9, 0.6, 0.2], np.float32)
    got = evaluate(tfps.metrics.AUC(), run, soft, preds)
    hard = exact_roc_auc([1, 0, 1, 0], [0.9, 0.9, 0.6, 0.2], [0.25, 0.75, 1.0, 1.0])
    assert got == pytest.approx(hard, abs=1e-7)


def test_weighted_soft_labels_match_their_expansion_into_hard_examples(run):
    rng = np.random.default_rng(6)
    n = 40_000
    soft = np.where(rng.random(n) < 0.5, rng.random(n), rng.integers(0, 2, n)).astype(np.float32)
    scores = np.clip(rng.normal(0.4 + 0.2 * soft, 0.2), 0, 1).astype(np.float32)
    weights = rng.exponential(size=n).astype(np.float32)
    got = evaluate(tfps.metrics.AUC(), run, soft, scores, sample_weight=weights)
    expanded_labels = np.concatenate([np.ones(n), np.zeros(n)])
    expanded_weights = np.concatenate([weights * soft, weights * (1 - soft)])
    want = exact_roc_auc(expanded_labels, np.concatenate([scores, scores]), expanded_weights)
    assert abs(got - want) <= 1e-4


# docs/keras.md's claim, "exact to about 1e-4", holds for PR too (seeds 0-4: up to 6.0e-5 random,
# 9.9e-5 skewed).
@pytest.mark.parametrize("kind,tolerance", [("random", 1e-4), ("tied", 1e-7), ("skewed", 1e-4)])
def test_pr_auc_matches_exact_average_precision(run, kind, tolerance):
    labels, scores = data(kind, 100_000)
    got = evaluate(tfps.metrics.AUC(curve="PR"), run, labels, scores)
    assert abs(got - exact_average_precision(labels, scores)) <= tolerance


def test_degenerate_inputs_have_documented_values(run):
    ones = np.ones(10, np.float32)
    assert evaluate(tfps.metrics.AUC(), run, ones, np.linspace(0, 1, 10).astype(np.float32)) == 0.5
    assert evaluate(tfps.metrics.AUC(), run, 0 * ones, 0.3 * ones) == 0.5
    labels = np.array([1, 0, 1, 0, 0], np.float32)
    assert evaluate(tfps.metrics.AUC(), run, labels, np.full(5, 0.7, np.float32)) == 0.5
    assert evaluate(tfps.metrics.AUC(curve="PR"), run, labels, np.full(5, 0.7, np.float32)) == pytest.approx(0.4)
    assert evaluate(tfps.metrics.AUC(curve="PR"), run, 0 * ones, 0.3 * ones) == 0.0
    assert float(tfps.metrics.AUC().result()) == 0.5  # nothing seen yet


@pytest.mark.parametrize("bad_pred,message", [(1.5, "predictions must be probabilities"),
                                              (-0.1, "predictions must be probabilities"),
                                              (np.nan, "predictions must be probabilities")])
def test_out_of_range_predictions_are_rejected(run, bad_pred, message):
    for metric in (tfps.metrics.AUC(), tfps.metrics.BinaryLogLoss(), tfps.metrics.CalibrationRatio()):
        with pytest.raises(tf.errors.InvalidArgumentError, match=message):
            run(lambda t, p: metric.update_state(t, p), tf.constant([1.0, 0.0]),
                tf.constant([0.5, bad_pred], tf.float32))


def test_bad_labels_weights_and_arguments_are_rejected(run):
    metric = tfps.metrics.AUC()
    with pytest.raises(tf.errors.InvalidArgumentError, match="labels must be in"):
        run(lambda t, p: metric.update_state(t, p), tf.constant([2.0]), tf.constant([0.5]))
    with pytest.raises(tf.errors.InvalidArgumentError, match="sample_weight must be >= 0"):
        run(lambda t, p, w: metric.update_state(t, p, w), tf.constant([1.0]), tf.constant([0.5]),
            tf.constant([-1.0]))
    for bad_weights in (tfps.metrics.AUC(), tfps.metrics.BinaryLogLoss(), tfps.metrics.GroupAUC()):
        groups = {"groups": [1, 2, 3, 4]} if isinstance(bad_weights, tfps.metrics.GroupAUC) else {}
        with pytest.raises(ValueError, match=r"sample_weight of shape \(3,\) does not match predictions of "
                                             r"shape \(4, 1\): give one weight per example or per prediction"):
            bad_weights.update_state(tf.ones([4, 1]), tf.fill([4, 1], 0.5), tf.ones([3]), **groups)
    # With 16 octaves: 32, 64, 128, ..., 2**24.
    for bad in (0, -32, 16, 48, 200, 65536 + 32, 1 << 25, 32768.0, True, "32768"):
        with pytest.raises(ValueError, match=r"num_buckets must be 2 \* octaves times a power of two, at most "
                                             r"2\*\*24 \(with 16 octaves: 32, 64, 128, 256, \.\.\., 16777216\), got"):
            tfps.metrics.AUC(num_buckets=bad)
    with pytest.raises(ValueError, match=r"with 3 octaves: 6, 12, 24, 48, \.\.\., 12582912\), got 32768"):
        tfps.metrics.AUC(octaves=3)
    for bad in (0, 126, 1.5, False):
        with pytest.raises(ValueError, match=r"octaves must be an int in \[1, 125\]"):
            tfps.metrics.AUC(octaves=bad)
    with pytest.raises(ValueError, match="curve must be 'ROC' or 'PR'"):
        tfps.metrics.AUC(curve="lift")


def test_reset_state_and_config_round_trip():
    metric = tfps.metrics.AUC(num_buckets=1024, octaves=8, curve="PR", name="pr")
    metric.update_state([1.0, 0.0], [0.9, 0.1])
    assert float(metric.result()) == 1.0
    metric.reset_state()
    assert float(metric.result()) == 0.0
    clone = tfps.metrics.AUC.from_config(metric.get_config())
    assert (clone.num_buckets, clone.octaves, clone.curve, clone.name) == (1024, 8, "PR", "pr")
    assert clone.buckets_per_octave == 64 and clone.histogram.shape[0] == 1024
    for cls in (tfps.metrics.BinaryLogLoss, tfps.metrics.CalibrationRatio, tfps.metrics.GroupAUC):
        m = cls(name="x")
        assert cls.from_config(m.get_config()).get_config() == m.get_config()


def test_checkpoint_after_eager_updates_holds_just_the_histogram(tmp_path):
    metric = tfps.metrics.AUC(num_buckets=1024, octaves=8)
    metric.update_state([1.0, 0.0, 1.0], [0.9, 0.3, 0.2])  # eagerly, twice: the kept constants
    metric.update_state([0.0], [0.1])
    path = tf.train.Checkpoint(metric=metric).save(str(tmp_path / "auc"))
    graph = trackable_object_graph_pb2.TrackableObjectGraph()
    graph.ParseFromString(tf.train.load_checkpoint(path).get_tensor("_CHECKPOINTABLE_OBJECT_GRAPH"))
    metric_node = graph.nodes[next(c.node_id for c in graph.nodes[0].children if c.local_name == "metric")]
    assert [c.local_name for c in metric_node.children] == ["histogram"]
    restored = tfps.metrics.AUC(num_buckets=1024, octaves=8)
    tf.train.Checkpoint(metric=restored).restore(path).assert_consumed()
    expected = exact_roc_auc(np.array([1, 0, 1, 0]), np.array([0.9, 0.3, 0.2, 0.1]))
    assert float(restored.result()) == pytest.approx(expected, abs=1e-7)


def test_log_loss_and_calibration_against_numpy(run):
    labels, scores = data("random", 30_000, seed=9)
    weights = np.random.default_rng(1).random(len(scores)).astype(np.float32)
    p = np.clip(scores.astype(np.float64), 1e-7, 1 - 1e-7)
    expected_loss = np.sum(weights * -(labels * np.log(p) + (1 - labels) * np.log(1 - p))) / weights.sum()
    got = evaluate(tfps.metrics.BinaryLogLoss(), run, labels, scores, sample_weight=weights)
    assert got == pytest.approx(expected_loss, rel=1e-6)
    expected_ratio = np.sum(weights * scores) / np.sum(weights * labels)
    got = evaluate(tfps.metrics.CalibrationRatio(), run, labels, scores, sample_weight=weights)
    assert got == pytest.approx(expected_ratio, rel=1e-6)


@pytest.mark.parametrize("group_dtype", [np.int64, np.uint64, np.int32])
def test_group_auc_equals_the_exact_gauc_of_its_documented_buckets(run, group_dtype):
    rng = np.random.default_rng(6)
    n = 20_000
    groups = rng.integers(0, 300, n).astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    groups = groups.astype(group_dtype) if group_dtype != np.uint64 else groups  # uint64: above 2^63
    labels = (rng.random(n) < 0.3).astype(np.float32)
    labels[::7] = rng.random(len(labels[::7])).astype(np.float32)  # some soft labels
    scores = np.clip(rng.lognormal(np.log(0.05) + 0.8 * labels, 1.2), 0, 1).astype(np.float32)
    weights = rng.random(n).astype(np.float32) * 2
    metric = tfps.metrics.GroupAUC(num_buckets=64, octaves=8)
    for start in range(0, n, 4096):
        sl = slice(start, start + 4096)
        run(lambda t, p, w, g: metric.update_state(t, p, sample_weight=w, groups=g), tf.constant(labels[sl]),
            tf.constant(scores[sl]), tf.constant(weights[sl]), tf.constant(groups[sl]))
    bucketed = log_linear_buckets(scores, buckets_per_octave=4, octaves=8)
    expected = exact_group_auc(groups, labels, bucketed, weights)
    assert 0.6 < expected < 0.9
    assert float(metric.result()) == pytest.approx(expected, abs=1e-6)
    metric.reset_state()
    assert float(metric.result()) == 0.5


@pytest.mark.parametrize("click_rate", [0.0026, 0.001])
def test_group_auc_is_within_1e3_of_the_exact_gauc_at_low_click_rates(click_rate):
    # 400K impressions of 50 users, calibrated predictions around the click rate, each
    # user's own level and spread; equal-width buckets put them all in bucket 0.
    rng = np.random.default_rng(int(click_rate * 1e4))
    n, users = 400_000, 50
    groups = rng.integers(0, users, n)
    logit = np.log(click_rate) + rng.normal(0, 0.5, users)[groups] + rng.normal(0, 1.0, n)
    scores = 1 / (1 + np.exp(-logit))
    scores = (scores * click_rate / scores.mean()).astype(np.float32)
    labels = (rng.random(n) < scores * np.exp(rng.normal(0, 0.5, n) - 0.125)).astype(np.float32)
    metric = tfps.metrics.GroupAUC()
    for start in range(0, n, 1 << 16):
        sl = slice(start, start + (1 << 16))
        metric.update_state(labels[sl], scores[sl], groups=groups[sl])
    expected = exact_group_auc(groups, labels, scores)
    assert 0.6 < expected < 0.9 and labels.mean() == pytest.approx(click_rate, rel=0.15)
    assert abs(float(metric.result()) - expected) <= 1e-3


def test_group_auc_resolves_predictions_crowded_around_each_users_rate():
    # Each user's predictions lie within about 0.02 of that user's own rate (0.2 to 0.4),
    # as a model's do once it has learnt the users: the order inside that narrow range is
    # all a GAUC measures, and coarse buckets tie most of it.
    rng = np.random.default_rng(0)
    n, users = 20_000, 200
    user = rng.integers(0, users, n)
    rate = rng.uniform(0.2, 0.4, users)[user]
    scores = np.clip(rate + 0.02 * rng.standard_normal(n), 0.01, 0.99).astype(np.float32)
    labels = (rng.random(n) < scores + 3 * (scores - rate)).astype(np.float32)
    expected = exact_group_auc(user, labels, scores)
    read = {}
    for num_buckets in (256, None):
        metric = tfps.metrics.GroupAUC() if num_buckets is None else tfps.metrics.GroupAUC(num_buckets)
        metric.update_state(labels, scores, groups=user)
        read[num_buckets] = float(metric.result())
    assert 0.55 < expected < 0.7
    assert abs(read[None] - expected) <= 1e-3
    assert expected - read[256] > 5e-3  # ties pull a coarse histogram's GAUC towards 0.5


def test_group_auc_refuses_rows_wider_than_a_table_holds():
    with pytest.raises(ValueError, match=r"GroupAUC: num_buckets must be at most 32768 \(a group's row holds "
                                         r"2 \* num_buckets counts\), got 1048576"):
        tfps.metrics.GroupAUC(num_buckets=1 << 20)


def _two_input_click_model(group_auc):
    features = keras.Input(shape=(4,), name="features")
    user = keras.Input(shape=(), dtype=tf.int64, name="user")
    prediction = keras.layers.Dense(1, activation="sigmoid")(features)
    return keras.Model({"features": features, "user": user},
                       tfps.metrics.FeedGroups(group_auc)([prediction, user]))


@pytest.mark.parametrize("run_eagerly", [False, True])
def test_group_auc_in_compile_gets_its_groups_from_feed_groups(run_eagerly):
    rng = np.random.default_rng(3)
    n = 6000
    x = {"features": rng.normal(size=(n, 4)).astype(np.float32), "user": rng.integers(0, 40, n)}
    y = (x["features"][:, 0] + rng.normal(size=n) > 0.5).astype(np.float32)
    group_auc = tfps.metrics.GroupAUC(name="gauc")
    model = _two_input_click_model(group_auc)
    model.compile(optimizer="adam", loss="binary_crossentropy", metrics=[group_auc], run_eagerly=run_eagerly)
    history = model.fit(x, y, epochs=1, batch_size=500, verbose=0).history
    assert 0.0 < history["gauc"][0] < 1.0 and history["gauc"][0] != 0.5  # updated, groups seen
    results = model.evaluate(x, y, batch_size=700, verbose=0, return_dict=True)
    predictions = model.predict(x, batch_size=700, verbose=0)[:, 0]
    bucketed = log_linear_buckets(predictions, group_auc.buckets_per_octave, group_auc.octaves)
    expected = exact_group_auc(x["user"], y, bucketed)
    assert results["gauc"] == pytest.approx(expected, abs=1e-6)


def test_group_auc_without_groups_or_with_bad_ones_says_what_is_wrong():
    metric = tfps.metrics.GroupAUC()
    with pytest.raises(ValueError, match=r"no groups for this batch.*FeedGroups"):
        metric.update_state([1.0], [0.5])
    with pytest.raises(TypeError, match=r"GroupAUC\(group_auc\): groups must be integers"):
        metric.update_state([1.0], [0.5], groups=[0.5])
    with pytest.raises(tf.errors.InvalidArgumentError, match="must have the same number of elements"):
        metric.update_state([1.0, 0.0], [0.5, 0.2], groups=[1, 2, 3])
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"predictions must be probabilities.*1.5"):
        metric.update_state([1.0], [1.5], groups=[1])
    with pytest.raises(ValueError, match="num_buckets must be 2 \\* octaves times a power of two"):
        tfps.metrics.GroupAUC(num_buckets=100)
    with pytest.raises(TypeError, match="feeds GroupAUC metrics"):
        tfps.metrics.FeedGroups(tfps.metrics.AUC())
    assert float(metric.result()) == 0.5  # the refused updates changed nothing


@pytest.mark.parametrize("steps_per_execution", [1, 8])
def test_auc_works_in_keras_compile_fit_evaluate(steps_per_execution):
    # With steps_per_execution > 1 the updates run inside a tf.while_loop body.
    rng = np.random.default_rng(0)
    x = rng.normal(size=(4096, 4)).astype(np.float32)
    y = (x[:, 0] + 0.5 * rng.normal(size=4096) > 0).astype(np.float32)
    model = keras.Sequential([keras.layers.Dense(1, activation="sigmoid", input_shape=(4,))])
    model.compile(optimizer="adam", loss="binary_crossentropy", steps_per_execution=steps_per_execution,
                  metrics=[tfps.metrics.AUC(name="auc"), tfps.metrics.BinaryLogLoss()])
    model.fit(x, y, epochs=2, batch_size=256, verbose=0)
    results = model.evaluate(x, y, batch_size=512, verbose=0, return_dict=True)
    predictions = model.predict(x, verbose=0)[:, 0]
    assert results["auc"] == pytest.approx(exact_roc_auc(y, predictions), abs=1e-4)
    # A step that changes nothing: fit's AUC is over every training batch, each counted once.
    model.compile(optimizer=keras.optimizers.SGD(0.0), loss="binary_crossentropy",
                  steps_per_execution=steps_per_execution, metrics=[tfps.metrics.AUC(name="auc")])
    history = model.fit(x, y, epochs=1, batch_size=256, verbose=0).history
    assert history["auc"][0] == pytest.approx(exact_roc_auc(y, predictions), abs=1e-4)


def test_histogram_ops_reject_a_variable_that_is_not_a_float64_pair_histogram():
    from tfps._ops import ops
    zero = tf.constant(0.0, tf.float64)
    for bad in (tf.Variable(tf.zeros([8, 2], tf.float32)), tf.Variable(tf.zeros([8, 3], tf.float64))):
        with pytest.raises(tf.errors.InvalidArgumentError, match=r"m: the histogram must be .*\[num_buckets, 2\]"):
            ops.tfps_histogram_auc_update(bad.handle, [1.0], [0.5], tf.zeros([0]), tf.constant(0, tf.int64),
                                          buckets_per_octave=2, octaves=2, metric_name="m")
        with pytest.raises(tf.errors.InvalidArgumentError, match="Tfps>HistogramCurveSum: the histogram"):
            ops.tfps_histogram_curve_sum(bad.handle, zero, zero, curve="ROC")
    histogram = tf.Variable(tf.zeros([8, 2], tf.float64))
    for scale, message in (({"buckets_per_octave": 3, "octaves": 1}, r"buckets_per_octave must be a power of two"),
                           ({"buckets_per_octave": 4, "octaves": 126}, r"octaves must be in \[1, 125\]"),
                           ({"buckets_per_octave": 1 << 23, "octaves": 2}, r"octaves must be in .* got 2 octaves of 8388608")):
        with pytest.raises(tf.errors.InvalidArgumentError, match="m: " + message):
            ops.tfps_histogram_auc_update(histogram.handle, [1.0], [0.5], tf.zeros([0]),
                                          tf.constant(0, tf.int64), metric_name="m", **scale)


def test_histogram_ops_given_non_scalars_eagerly_raise_instead_of_aborting():
    # Eager calls skip shape functions; a kernel that trusted .scalar() would abort the
    # process, so the calls run in a child process whose survival is part of the check.
    import subprocess
    import sys
    program = """
import tensorflow as tf
from tfps._ops import ops
h = tf.Variable(tf.zeros([8, 2], tf.float64))
for name, call in (
        ("first_bucket", lambda: ops.tfps_histogram_auc_update(
            h.handle, [1.0], [0.5], tf.zeros([0]), tf.constant([0, 1], tf.int64),
            buckets_per_octave=2, octaves=2, metric_name="m")),
        ("positives_above", lambda: ops.tfps_histogram_curve_sum(
            h.handle, tf.zeros([2], tf.float64), tf.constant(0.0, tf.float64), curve="ROC")),
        ("negatives_above", lambda: ops.tfps_histogram_curve_sum(
            h.handle, tf.constant(0.0, tf.float64), tf.zeros([3], tf.float64), curve="ROC"))):
    try:
        call()
    except tf.errors.InvalidArgumentError as e:
        assert name + " must be a scalar" in str(e), str(e)
        print("raised", name)
"""
    out = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["raised", "first_bucket", "raised", "positives_above",
                                  "raised", "negatives_above"]
