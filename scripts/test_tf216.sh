#!/usr/bin/env bash
# Builds the op library against TensorFlow 2.16.2 in its own virtual environment and runs
# the table op, sparse-update (every execution mode) and checkpoint tests there.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/tf216_env.sh
tf216_build_copy pytest
TF_CPP_MIN_LOG_LEVEL=2 TF_USE_LEGACY_KERAS=1 "$VENV/bin/python" -m pytest -q -p no:cacheprovider \
  tests/test_table_ops.py tests/test_table_errors.py tests/test_table_lifecycle.py \
  tests/test_sparse_updates.py tests/test_sparse_updates_keras.py tests/test_dynamic_embedding.py \
  tests/test_checkpoint.py tests/test_incremental_backup.py
