#!/usr/bin/env bash
# On a machine with an NVIDIA GPU and CUDA (no TensorFlow needed): builds and runs the
# GPU-vs-CPU table harness, the table benchmark at load factors 0.5 and 0.9, and the
# training-step benchmark at 10M and 100M rows; then the harness's smaller batches under
# each of compute-sanitizer's tools where it is installed. docs/gpu.md has the figures.
set -euo pipefail
cd "$(dirname "$0")/../../.."
BUILD="${OUT_DIR:-build/gpu}"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.memory --format=csv,noheader || true
OUT_DIR="$BUILD" bash custom_ops/core/gpu/build.sh
"$BUILD/gpu_table_harness"
"$BUILD/gpu_table_benchmark"
"$BUILD/gpu_training_step"
if command -v compute-sanitizer >/dev/null; then
  # The harness makes one allocation beyond the device's memory fail on purpose (the table
  # must return it as a status, which the harness checks, as it checks every other status),
  # so failed API calls are not counted as errors; bad accesses, leaks, uninitialized reads,
  # shared-memory races and barrier misuse are.
  compute-sanitizer --tool memcheck --leak-check full --report-api-errors no --error-exitcode 1 \
    "$BUILD/gpu_table_harness" --quick
  for tool in initcheck racecheck synccheck; do
    compute-sanitizer --tool "$tool" --report-api-errors no --error-exitcode 1 \
      "$BUILD/gpu_table_harness" --quick
  done
fi
