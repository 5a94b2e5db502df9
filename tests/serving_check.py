"""Runs in a process that never imports tfps: loads a SavedModel and prints its outputs for
inputs stored in an .npz, as JSON."""

import json
import sys

import numpy as np
import tensorflow as tf

export_dir, inputs_path = sys.argv[1], sys.argv[2]
inputs = dict(np.load(inputs_path))
serve = tf.saved_model.load(export_dir).signatures["serving_default"]
outputs = serve(**{k: tf.constant(v) for k, v in inputs.items()})
json.dump({"outputs": [v.numpy().tolist() for v in outputs.values()],
           "tfps_imported": "tfps" in sys.modules,
           "ops": sorted({op.type for f in [serve] for op in f.graph.get_operations()})},
          sys.stdout)
