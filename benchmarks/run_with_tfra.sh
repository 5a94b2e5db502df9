#!/usr/bin/env bash
# benchmarks/table_ops.py with tensorflow-recommenders-addons' table in the same run:
# TFRA 0.8.1 needs TensorFlow 2.16.2, so tfps is built for 2.16.2 in its own virtual
# environment. Arguments go to table_ops.py.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/tf216_env.sh
tf216_build_copy "tensorflow-recommenders-addons==0.8.1"
TF_CPP_MIN_LOG_LEVEL=2 "$VENV/bin/python" benchmarks/table_ops.py "$@"
