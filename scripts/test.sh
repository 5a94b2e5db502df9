#!/usr/bin/env bash
# The whole test suite from a fresh machine: installs, builds, runs the C++ and Python
# tests against TensorFlow 2.21 (including the Bazel build) and, at the same time, builds
# and runs the op tests against 2.16.2 (many tests wait on processes of a cluster, so the
# two stages together keep both cores busy). Exits non-zero if either stage fails.
set -euo pipefail
cd "$(dirname "$0")/.."
export TFPS_TEST_START=$(date +%s)
# Each stage's time since the start, for keeping CI's whole run under its limit.
stage_done() { echo "scripts/test.sh: $1 done at $(( $(date +%s) - TFPS_TEST_START ))s" >&2; }
bash scripts/install.sh
stage_done "install (TensorFlow 2.21, op library)"
bash scripts/install_bazel.sh
stage_done "bazel install"

# The 2.16.2 stage runs in a session of its own, so that however this script ends (a
# failure, Ctrl-C, CI's time limit) it is stopped, and its output is shown.
tf216_log=$(mktemp)
tf216_pid=""
tf216_shown=""
show_tf216() {
  echo "--- tests under TensorFlow 2.16.2${1:-} ---"
  cat "$tf216_log"
  tf216_shown=1
}
finish() {
  local status=$?
  if [[ -n "$tf216_pid" ]] && kill -0 "$tf216_pid" 2>/dev/null; then
    kill -- "-$tf216_pid" 2>/dev/null || true
    [[ -n "$tf216_shown" ]] || show_tf216 " (stopped before it finished)"
  fi
  rm -f "$tf216_log"
  exit "$status"
}
trap finish EXIT
trap 'exit 130' INT TERM
setsid bash -c 'bash scripts/test_tf216.sh; status=$?
  echo "scripts/test.sh: tests under TensorFlow 2.16.2 (exit $status) finished at $(( $(date +%s) - TFPS_TEST_START ))s"
  exit $status' >"$tf216_log" 2>&1 &
tf216_pid=$!

# A test that needs bazel or nvcc fails here instead of skipping when the tool is missing.
export TF_CPP_MIN_LOG_LEVEL=2 TF_USE_LEGACY_KERAS=1 TFPS_REQUIRE_TOOLS=1
tf221_status=0
python3 -m pytest -q --durations=25 tests "$@" || tf221_status=$?
stage_done "tests under TensorFlow 2.21 (exit $tf221_status)"
tf216_status=0
wait "$tf216_pid" || tf216_status=$?
show_tf216
stage_done "both stages"
[[ $tf221_status -eq 0 && $tf216_status -eq 0 ]]
