#!/usr/bin/env bash
# The whole test suite from a fresh machine: installs, builds, and runs the C++ and Python
# tests against TensorFlow 2.21 (including the Bazel build) and, in a second lane at the
# same time, builds and runs the op tests against 2.16.2 and then the 2.21 test files named
# in SECOND_LANE (many tests wait on processes of a cluster, so two lanes keep both cores
# busy to the end). Exits non-zero if any of them fails. Arguments go to the first lane's
# pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
export TFPS_TEST_START=$(date +%s)
# Each stage's time since the start, for keeping CI's whole run under its limit.
stage_done() { echo "scripts/test.sh: $1 done at $(( $(date +%s) - TFPS_TEST_START ))s" >&2; }
# 2.21 test files the second lane runs after the 2.16.2 stage: the builds (Bazel, wheels,
# the C++ tests, the CUDA harness), about a quarter of the 2.21 tests' time, so both lanes
# end together when Bazel's disk cache holds the build (a cold Bazel adds about 400 s).
SECOND_LANE=(tests/test_bazel_build.py tests/test_packaging.py tests/test_core_cpp.py
             tests/test_cuda_compiles.py tests/test_gpu_emulation.py tests/test_tiered.py)
bash scripts/install.sh
stage_done "install (TensorFlow 2.21, op library)"
bash scripts/install_bazel.sh
stage_done "bazel install"

# The second lane runs in a session of its own, so that however this script ends (a
# failure, Ctrl-C, CI's time limit) it is stopped, and its output is shown.
lane_log=$(mktemp)
lane_pid=""
lane_shown=""
show_second_lane() {
  echo "--- second lane: tests under TensorFlow 2.16.2, then ${SECOND_LANE[*]}${1:-} ---"
  cat "$lane_log"
  lane_shown=1
}
finish() {
  local status=$?
  if [[ -n "$lane_pid" ]] && kill -0 "$lane_pid" 2>/dev/null; then
    kill -- "-$lane_pid" 2>/dev/null || true
    [[ -n "$lane_shown" ]] || show_second_lane " (stopped before it finished)"
  fi
  rm -f "$lane_log"
  exit "$status"
}
trap finish EXIT
trap 'exit 130' INT TERM
setsid bash -c 'bash scripts/test_tf216.sh; tf216=$?
  echo "scripts/test.sh: tests under TensorFlow 2.16.2 (exit $tf216) finished at $(( $(date +%s) - TFPS_TEST_START ))s"
  TF_CPP_MIN_LOG_LEVEL=2 TF_USE_LEGACY_KERAS=1 TFPS_REQUIRE_TOOLS=1 python3 -m pytest -q --durations=10 "$@"; late=$?
  echo "scripts/test.sh: second lane tests under TensorFlow 2.21 (exit $late) finished at $(( $(date +%s) - TFPS_TEST_START ))s"
  [[ $tf216 -eq 0 && $late -eq 0 ]]' bash "${SECOND_LANE[@]}" >"$lane_log" 2>&1 &
lane_pid=$!

# A test that needs bazel or nvcc fails here instead of skipping when the tool is missing.
export TF_CPP_MIN_LOG_LEVEL=2 TF_USE_LEGACY_KERAS=1 TFPS_REQUIRE_TOOLS=1
first_lane_status=0
python3 -m pytest -q --durations=25 tests "${SECOND_LANE[@]/#/--ignore=}" "$@" || first_lane_status=$?
stage_done "first lane tests under TensorFlow 2.21 (exit $first_lane_status)"
first_lane_done=$(( $(date +%s) - TFPS_TEST_START ))
second_lane_status=0
wait "$lane_pid" || second_lane_status=$?
show_second_lane
# Again after the second lane's output, where a log's tail shows it.
echo "scripts/test.sh: the first lane (exit $first_lane_status) finished at ${first_lane_done}s" >&2
stage_done "both lanes"
[[ $first_lane_status -eq 0 && $second_lane_status -eq 0 ]]
