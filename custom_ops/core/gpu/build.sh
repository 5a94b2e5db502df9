#!/usr/bin/env bash
# Builds the TF-free GPU table harness and the two GPU benchmarks with nvcc into OUT_DIR (default
# build/gpu). CUDA_ARCH picks the GPU (default sm_90: H100 and H200). Needs only CUDA.
set -euo pipefail
cd "$(dirname "$0")/../../.."
OUT="${OUT_DIR:-build/gpu}"
ARCH="${CUDA_ARCH:-sm_90}"
NVCC="${NVCC:-nvcc}"
mkdir -p "$OUT"
# --fmad=false and -ffp-contract=off: the GPU and CPU tables must round identically.
CU_FLAGS=(-std=c++17 -O3 --fmad=false -arch="$ARCH" -I. -Xcompiler -ffp-contract=off)
CXX_FLAGS=(-std=c++17 -O3 -pthread -ffp-contract=off -I.)
# Every object compiles at once (one job per source); `wait` fails the build if one did.
pids=()
"$NVCC" "${CU_FLAGS[@]}" -x cu -c custom_ops/core/gpu/gpu_table.cu.cc -o "$OUT/gpu_table.o" & pids+=($!)
"$NVCC" "${CU_FLAGS[@]}" -x cu -c custom_ops/core/gpu/tests/gpu_table_harness.cu.cc -o "$OUT/harness.o" & pids+=($!)
"$NVCC" "${CU_FLAGS[@]}" -x cu -c benchmarks/gpu_table.cu.cc -o "$OUT/benchmark.o" & pids+=($!)
"$NVCC" "${CU_FLAGS[@]}" -x cu -c benchmarks/gpu_training_step.cu.cc -o "$OUT/training_step.o" & pids+=($!)
CORE=()
source custom_ops/core/gpu/core_sources.sh
for source in "${CORE_SOURCES[@]}"; do
  g++ "${CXX_FLAGS[@]}" -c "$source" -o "$OUT/$(basename "$source" .cc).o" & pids+=($!)
  CORE+=("$OUT/$(basename "$source" .cc).o")
done
for pid in "${pids[@]}"; do wait "$pid"; done
"$NVCC" -arch="$ARCH" "$OUT/harness.o" "$OUT/gpu_table.o" "${CORE[@]}" -o "$OUT/gpu_table_harness" "${CORE_LIBS[@]}"
"$NVCC" -arch="$ARCH" "$OUT/benchmark.o" "$OUT/gpu_table.o" "${CORE[@]}" -o "$OUT/gpu_table_benchmark" "${CORE_LIBS[@]}"
"$NVCC" -arch="$ARCH" "$OUT/training_step.o" "$OUT/gpu_table.o" "${CORE[@]}" -o "$OUT/gpu_training_step" "${CORE_LIBS[@]}"
echo "built $OUT/gpu_table_harness, $OUT/gpu_table_benchmark and $OUT/gpu_training_step"
