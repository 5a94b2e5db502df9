#!/usr/bin/env bash
# The whole test suite from a fresh machine: installs, builds, runs the C++ and Python
# tests against TensorFlow 2.21 (including the Bazel build), then builds and runs the op
# tests against 2.16.2.
set -euo pipefail
cd "$(dirname "$0")/.."
# Each stage's time since the start, for keeping CI's whole run under its limit.
stage_done() { echo "scripts/test.sh: $1 done at ${SECONDS}s" >&2; }
bash scripts/install.sh
stage_done "install (TensorFlow 2.21, op library)"
bash scripts/install_bazel.sh
stage_done "bazel install"
# A test that needs bazel or nvcc fails here instead of skipping when the tool is missing.
export TF_CPP_MIN_LOG_LEVEL=2 TF_USE_LEGACY_KERAS=1 TFPS_REQUIRE_TOOLS=1
python3 -m pytest -q --durations=25 tests "$@"
stage_done "tests under TensorFlow 2.21"
bash scripts/test_tf216.sh
stage_done "tests under TensorFlow 2.16.2"
