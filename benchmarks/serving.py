"""Export time and serving latency of a tfps model exported with save_for_serving.

    python benchmarks/serving.py

Trains a CTR model (26 fields sharing one DynamicEmbedding table plus a user-ID table) on
synthetic data, exports it, then measures p50/p99 latency at batch 1 and 256 of the
SavedModel loaded in a separate process that never imports tfps, next to model.predict
and a direct call of the training-time model in this process.
"""

import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

REPEATS = {1: 300, 256: 100}


def latency(fn, repeats):
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return {"p50_ms": round(float(np.percentile(times, 50)) * 1e3, 3),
            "p99_ms": round(float(np.percentile(times, 99)) * 1e3, 3)}


def batch_of(n, seed):
    rng = np.random.default_rng(seed)
    return {"fields": rng.integers(0, 5000, (n, 26)).astype(np.int64),
            "user": rng.integers(0, 20000, n).astype(np.int64)}


def serve_child(export_dir):
    import tensorflow as tf
    serve = tf.saved_model.load(export_dir).signatures["serving_default"]
    for batch in (1, 256):
        inputs = {k: tf.constant(v) for k, v in batch_of(batch, batch).items()}
        common.emit({"what": "saved_model_serving_default", "batch": batch,
                     **latency(lambda: serve(**inputs), REPEATS[batch])})
    common.emit({"tfps_imported": "tfps" in sys.modules})


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--serve":
        return serve_child(sys.argv[2])
    import tensorflow as tf
    import tf_keras as keras
    import tfps
    common.emit({"machine": common.machine()})
    fields = keras.Input((26,), dtype=tf.int64, name="fields")
    user = keras.Input((), dtype=tf.int64, name="user")
    x = keras.layers.Concatenate()([
        tfps.keras_layers.DynamicEmbedding(16, combiner="mean", name="fields_table")(fields, namespace="columns"),
        tfps.keras_layers.DynamicEmbedding(16, name="users")(user)])
    for width in (128, 64):
        x = keras.layers.Dense(width, activation="relu")(x)
    model = keras.Model([fields, user], keras.layers.Dense(1, activation="sigmoid")(x))
    model.compile(optimizer="adam", loss="binary_crossentropy")
    data = batch_of(65536, 0)
    model.fit(data, (data["user"] % 2).astype(np.float32), batch_size=1024, epochs=1, verbose=0)
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        report = tfps.export.save_for_serving(model, os.path.join(tmp, "export"))
        common.emit({"what": "export", "seconds": round(time.perf_counter() - start, 2),
                     "bytes": report["bytes"], "rows": report["rows"]})
        for batch in (1, 256):
            inputs = batch_of(batch, batch)
            tensors = {k: tf.constant(v) for k, v in inputs.items()}
            common.emit({"what": "training_model_predict", "batch": batch,
                         **latency(lambda: model.predict(inputs, verbose=0), REPEATS[batch] // 3)})
            common.emit({"what": "training_model_call", "batch": batch,
                         **latency(lambda: model(tensors, training=False), REPEATS[batch])})
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
        out = subprocess.run([sys.executable, os.path.abspath(__file__), "--serve", report["export_dir"]],
                             capture_output=True, text=True, timeout=900, env=env)
        if out.returncode != 0:
            sys.stderr.write(out.stderr[-3000:])
            raise SystemExit("serving child failed")
        for line in out.stdout.splitlines():
            if line.startswith("{"):
                common.emit(json.loads(line))


if __name__ == "__main__":
    main()
