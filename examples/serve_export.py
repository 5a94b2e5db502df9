"""Serve a few examples from an export of examples/train_ctr.py, in a process without tfps.

    python examples/serve_export.py EXPORT_DIR [SAMPLES.npz]

Loads the SavedModel with stock TensorFlow, feeds it the eval examples train_ctr.py saved
beside it (EXPORT_DIR.samples.npz) and prints each click probability next to its label.
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402


def main():
    if len(sys.argv) not in (2, 3):
        raise SystemExit(__doc__)
    export_dir = sys.argv[1]
    samples = np.load(sys.argv[2] if len(sys.argv) == 3 else export_dir.rstrip("/") + ".samples.npz")
    serve = tf.saved_model.load(export_dir).signatures["serving_default"]
    inputs = {name: tf.constant(samples[name]) for name in serve.structured_input_signature[1]}
    (predictions,) = serve(**inputs).values()
    print(f"served {len(samples['labels'])} examples from {export_dir} "
          f"(tfps imported: {'tfps' in sys.modules})")
    for probability, label in zip(predictions.numpy().reshape(-1), samples["labels"]):
        print(f"  click probability {probability:.4f}   label {int(label)}")


if __name__ == "__main__":
    main()
