"""Update time and accuracy of tfps.metrics.AUC against tf_keras.metrics.AUC(200).

    python benchmarks/metrics.py

Updates on 1,048,576 predictions in batches of 8192, all batches looped over inside one
tf.function for both metrics (as model.fit does with steps_per_execution), so the figures
are the metrics' own cost rather than Python dispatch. Then compares each result with the
exact AUC. Prints JSON lines and a summary per target.
"""

import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import common  # noqa: E402

import tensorflow as tf  # noqa: E402
import tf_keras as keras  # noqa: E402

import tfps  # noqa: E402
from tests.auc_reference import exact_roc_auc  # noqa: E402

N, BATCH, REPEATS = 1 << 20, 8192, 5


def measure(make_metric, labels, scores):
    all_labels = tf.constant(labels.reshape(-1, BATCH))
    all_scores = tf.constant(scores.reshape(-1, BATCH))
    metric = make_metric()

    @tf.function
    def update_all(y, p):
        for i in tf.range(tf.shape(y)[0]):
            metric.update_state(y[i], p[i])

    update_all(all_labels[:1], all_scores[:1])  # trace
    times = []
    for _ in range(REPEATS):
        metric.reset_state()
        start = time.perf_counter()
        update_all(all_labels, all_scores)
        float(metric.result())
        times.append(time.perf_counter() - start)
    return float(np.median(times)), float(metric.result())


def main():
    common.emit({"machine": common.machine()})
    rng = np.random.default_rng(0)
    labels = (rng.random(N) < 0.25).astype(np.float32)
    scores = np.clip(rng.normal(0.45 + 0.12 * labels, 0.18), 0, 1).astype(np.float32)
    exact = float(exact_roc_auc(labels, scores))
    results = {}
    for name, make in (("tfps.metrics.AUC", tfps.metrics.AUC),
                       ("tf_keras.metrics.AUC(num_thresholds=200)",
                        lambda: keras.metrics.AUC(num_thresholds=200))):
        seconds, value = measure(make, labels, scores)
        results[name] = (seconds, abs(value - exact))
        common.emit({"metric": name, "predictions": N, "batch": BATCH, "update_seconds": round(seconds, 4),
                     "mpred_per_s": round(N / seconds / 1e6, 2), "auc": value, "exact_auc": exact,
                     "abs_error": abs(value - exact)})
    (ours_s, ours_err), (keras_s, keras_err) = results.values()
    common.emit({"summary": "update >= 5x faster than Keras AUC(200)", "ratio": round(keras_s / ours_s, 2),
                 "met": keras_s / ours_s >= 5})
    accuracy_ratio = keras_err / max(ours_err, 1e-12)
    common.emit({"summary": ">= 10x more accurate than Keras AUC(200)", "ratio": round(accuracy_ratio, 1),
                 "our_error": ours_err, "keras_error": keras_err, "met": accuracy_ratio >= 10})


if __name__ == "__main__":
    main()
