#!/usr/bin/env bash
# On a machine with an NVIDIA GPU and CUDA (no TensorFlow needed): builds and runs the
# GPU-vs-CPU table harness, then the GPU table benchmark.
set -euo pipefail
cd "$(dirname "$0")/../../.."
OUT_DIR="${OUT_DIR:-build/gpu}" bash custom_ops/core/gpu/build.sh
"${OUT_DIR:-build/gpu}/gpu_table_harness"
"${OUT_DIR:-build/gpu}/gpu_table_benchmark"
