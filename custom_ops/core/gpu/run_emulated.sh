#!/usr/bin/env bash
# Builds the GPU-vs-CPU table harness with a host compiler against the CUDA emulation
# (host_emulation.h: every kernel runs on CPU threads) and runs it; no GPU or CUDA
# toolkit needed. With --tsan, builds under ThreadSanitizer and runs the harness's
# smaller batches (--quick). OUT_DIR (default build/gpu-emulated) keeps the build; CXX
# picks the compiler (default g++).
set -euo pipefail
cd "$(dirname "$0")/../../.."
OUT="${OUT_DIR:-build/gpu-emulated}"
CXX="${CXX:-g++}"
mkdir -p "$OUT"
# The CPU table's own flags (build_config.CXXFLAGS): both tables must round alike.
FLAGS=(-std=c++17 -pthread -ffp-contract=off -fno-math-errno -I.)
RUN_ARGS=()
if [[ "${1:-}" == "--tsan" ]]; then
  FLAGS+=(-O1 -g -fsanitize=thread)
  RUN_ARGS+=(--quick)
else
  FLAGS+=(-O2)
fi
EMULATED=(-DTFPS_GPU_EMULATION -Wall -Wextra -x c++)
pids=()
CORE=()
source custom_ops/core/gpu/core_sources.sh
for source in "${CORE_SOURCES[@]}"; do
  CORE+=("$OUT/$(basename "$source" .cc).o")
  "$CXX" "${FLAGS[@]}" -c "$source" -o "${CORE[-1]}" & pids+=($!)
done
"$CXX" "${FLAGS[@]}" "${EMULATED[@]}" -c custom_ops/core/gpu/gpu_table.cu.cc -o "$OUT/gpu_table.o" & pids+=($!)
"$CXX" "${FLAGS[@]}" "${EMULATED[@]}" -c custom_ops/core/gpu/tests/gpu_table_harness.cu.cc -o "$OUT/harness.o" & pids+=($!)
for pid in "${pids[@]}"; do wait "$pid"; done
"$CXX" "${FLAGS[@]}" "$OUT/harness.o" "$OUT/gpu_table.o" "${CORE[@]}" -o "$OUT/gpu_table_harness" "${CORE_LIBS[@]}"
"$OUT/gpu_table_harness" "${RUN_ARGS[@]}"
