#!/usr/bin/env bash
# Builds the op library against TensorFlow 2.16.2 (where tensorflow-recommenders-addons
# 0.8.1 runs) in its own virtual environment and runs the table op tests there.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${TFPS_TF216_VENV:-$HOME/.cache/tfps/venv-tf2.16.2}"
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
export PIP_DISABLE_PIP_VERSION_CHECK=1
"$VENV/bin/python" -m pip install -q "tensorflow==2.16.2" "tf_keras==2.16.*" "numpy<2" pytest setuptools wheel
# A copy of the sources, so the 2.16 build does not replace the 2.21 library in place.
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
git ls-files -z | xargs -0 -I{} cp --parents {} "$WORK" 2>/dev/null || cp -r . "$WORK"
cd "$WORK"
"$VENV/bin/python" -m pip install -q --no-build-isolation -e .
TF_CPP_MIN_LOG_LEVEL=2 "$VENV/bin/python" -m pytest -q -p no:cacheprovider \
  tests/test_table_ops.py tests/test_table_errors.py tests/test_table_lifecycle.py
"$VENV/bin/python" -m pip uninstall -q -y tfps
