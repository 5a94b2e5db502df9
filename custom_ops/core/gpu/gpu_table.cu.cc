// CUDA kernels of the GPU table. Build with --fmad=false so that initial values and
// optimizer updates round exactly as the CPU table's (-ffp-contract=off) do.
#include "custom_ops/core/gpu/gpu_table.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

namespace tfps {
namespace gpu {
namespace {

constexpr uint32_t kEmpty = 0, kBusy = 1, kFull = 2;
constexpr int kThreads = 256;

#define TFPS_CUDA_CHECK(expr)                                                              \
  do {                                                                                     \
    cudaError_t e = (expr);                                                                \
    if (e != cudaSuccess) {                                                                \
      std::fprintf(stderr, "tfps gpu table: %s failed: %s\n", #expr, cudaGetErrorString(e)); \
      std::abort();                                                                        \
    }                                                                                      \
  } while (0)

inline int Blocks(int64_t n) { return static_cast<int>(std::max<int64_t>(1, (n + kThreads - 1) / kThreads)); }

struct Slots {
  uint64_t* keys;
  uint32_t* state;
  int64_t mask;
};

// Probes for `key`; inserts it when `insert` is set. Returns the slot or -1, and sets
// *inserted when this thread claimed a new slot. A slot being claimed by another thread
// (busy) is waited for, so duplicate keys in one batch end in the same slot.
__device__ int64_t ProbeSlot(Slots t, uint64_t key, bool insert, bool* inserted,
                             unsigned long long* size) {
  *inserted = false;
  for (int64_t i = static_cast<int64_t>(TableHash(key)) & t.mask, probes = 0; probes <= t.mask;
       i = (i + 1) & t.mask, ++probes) {
    uint32_t s = atomicAdd(&t.state[i], 0u);
    if (s == kEmpty) {
      if (!insert) return -1;
      s = atomicCAS(&t.state[i], kEmpty, kBusy);
      if (s == kEmpty) {
        t.keys[i] = key;
        __threadfence();
        atomicExch(&t.state[i], kFull);
        atomicAdd(size, 1ull);
        *inserted = true;
        return i;
      }
    }
    while (s == kBusy) s = atomicAdd(&t.state[i], 0u);
    if (s == kFull && t.keys[i] == key) return i;
  }
  return -1;  // full table: the host grows it before any insert, so this is not reached
}

__global__ void ResolveKernel(Slots t, const uint64_t* keys, int64_t n, bool insert,
                              int64_t* slots, uint8_t* inserted, unsigned long long* size) {
  const int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (k >= n) return;
  bool claimed;
  slots[k] = ProbeSlot(t, keys[k], insert, &claimed, size);
  inserted[k] = claimed;
}

// Fresh rows: initial value, initial optimizer slots, zero metadata (one thread per element).
__global__ void InitRowsKernel(GpuTableConfig config, int row_width, const uint64_t* keys,
                               const int64_t* slots, const uint8_t* inserted, int64_t n,
                               float* rows, uint32_t* counts, uint32_t* last_steps) {
  const int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (t >= n * row_width) return;
  const int64_t k = t / row_width;
  const int e = static_cast<int>(t % row_width);
  if (!inserted[k]) return;
  const int64_t slot = slots[k];
  const int dim = config.dim;
  rows[slot * row_width + e] =
      e < dim ? InitialValue(config.initializer, config.seed, keys[k], e)
              : InitialSlotValue(config.optimizer, (e - dim) / dim);
  if (e == 0) {
    counts[slot] = 0;
    last_steps[slot] = 0;
  }
}

__global__ void CopyRowsKernel(GpuTableConfig config, int row_width, const uint64_t* keys,
                               const int64_t* slots, int64_t n, const float* rows,
                               float* values, uint8_t* exists) {
  const int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int dim = config.dim;
  if (t >= n * dim) return;
  const int64_t k = t / dim;
  const int e = static_cast<int>(t % dim);
  const int64_t slot = slots[k];
  values[t] = slot >= 0 ? rows[slot * row_width + e]
                        : InitialValue(config.initializer, config.seed, keys[k], e);
  if (exists != nullptr && e == 0) exists[k] = slot >= 0;
}

__global__ void CheckFiniteKernel(const float* grads, int64_t total, int* bad) {
  const int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (t < total && !isfinite(grads[t])) atomicExch(bad, 1);
}

// One thread per (key, element): keys are unique, so no two threads touch one element.
__global__ void ApplyKernel(GpuTableConfig config, int row_width, const int64_t* slots,
                            int64_t n, const float* grads, uint32_t step, float* rows,
                            uint32_t* counts, uint32_t* last_steps) {
  const int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int dim = config.dim;
  if (t >= n * dim) return;
  const int64_t k = t / dim;
  const int e = static_cast<int>(t % dim);
  const int64_t slot = slots[k];
  float* row = rows + slot * row_width;
  const float g = grads[t];
  const float lr = config.optimizer.learning_rate;
  if (config.optimizer.kind == OptimizerKind::kAdagrad) {
    float* acc = row + dim;
    acc[e] = __fadd_rn(acc[e], __fmul_rn(g, g));
    row[e] = __fsub_rn(row[e], __fdiv_rn(__fmul_rn(lr, g), __fadd_rn(__fsqrt_rn(acc[e]), config.optimizer.epsilon)));
  } else {
    row[e] = __fsub_rn(row[e], __fmul_rn(lr, g));
  }
  if (e == 0) {
    if (counts[slot] != 0xffffffffu) ++counts[slot];
    last_steps[slot] = step;
  }
}

__global__ void RehashKernel(Slots from, const float* from_rows, const uint32_t* from_counts,
                             const uint32_t* from_steps, int64_t from_capacity, Slots to,
                             float* to_rows, uint32_t* to_counts, uint32_t* to_steps,
                             int row_width, unsigned long long* size) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= from_capacity || from.state[i] != kFull) return;
  bool claimed;
  const int64_t slot = ProbeSlot(to, from.keys[i], true, &claimed, size);
  for (int e = 0; e < row_width; ++e) to_rows[slot * row_width + e] = from_rows[i * row_width + e];
  to_counts[slot] = from_counts[i];
  to_steps[slot] = from_steps[i];
}

__global__ void ExportKernel(Slots t, const float* rows, int64_t capacity, int dim, int row_width,
                             uint64_t* keys, float* values, float* slot_values,
                             unsigned long long* cursor) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= capacity || t.state[i] != kFull) return;
  const unsigned long long out = atomicAdd(cursor, 1ull);
  keys[out] = t.keys[i];
  for (int e = 0; e < dim; ++e) values[out * dim + e] = rows[i * row_width + e];
  for (int e = dim; e < row_width; ++e) slot_values[out * (row_width - dim) + e - dim] = rows[i * row_width + e];
}

}  // namespace

GpuTable::GpuTable(const GpuTableConfig& config, int64_t initial_capacity, cudaStream_t stream)
    : config_(config), stream_(stream),
      row_width_(config.dim * (1 + NumSlots(config.optimizer.kind))) {
  int64_t capacity = 64;
  while (capacity < initial_capacity) capacity *= 2;
  TFPS_CUDA_CHECK(cudaMalloc(&size_, sizeof(unsigned long long)));
  TFPS_CUDA_CHECK(cudaMalloc(&flag_, sizeof(int)));
  TFPS_CUDA_CHECK(cudaMalloc(&cursor_, sizeof(unsigned long long)));
  TFPS_CUDA_CHECK(cudaMemsetAsync(size_, 0, sizeof(unsigned long long), stream_));
  Allocate(capacity);
}

GpuTable::~GpuTable() {
  Free();
  cudaFree(size_);
  cudaFree(flag_);
  cudaFree(cursor_);
  cudaFree(slots_scratch_);
  cudaFree(inserted_scratch_);
}

void GpuTable::Allocate(int64_t capacity) {
  capacity_ = capacity;
  TFPS_CUDA_CHECK(cudaMalloc(&keys_, capacity * sizeof(uint64_t)));
  TFPS_CUDA_CHECK(cudaMalloc(&state_, capacity * sizeof(uint32_t)));
  TFPS_CUDA_CHECK(cudaMalloc(&rows_, capacity * row_width_ * sizeof(float)));
  TFPS_CUDA_CHECK(cudaMalloc(&counts_, capacity * sizeof(uint32_t)));
  TFPS_CUDA_CHECK(cudaMalloc(&last_steps_, capacity * sizeof(uint32_t)));
  TFPS_CUDA_CHECK(cudaMemsetAsync(state_, 0, capacity * sizeof(uint32_t), stream_));
}

void GpuTable::Free() {
  cudaFree(keys_);
  cudaFree(state_);
  cudaFree(rows_);
  cudaFree(counts_);
  cudaFree(last_steps_);
}

int64_t GpuTable::Size() {
  unsigned long long size = 0;
  TFPS_CUDA_CHECK(cudaMemcpyAsync(&size, size_, sizeof(size), cudaMemcpyDeviceToHost, stream_));
  TFPS_CUDA_CHECK(cudaStreamSynchronize(stream_));
  return static_cast<int64_t>(size);
}

void GpuTable::ReserveFor(int64_t more_keys) {
  const int64_t needed = Size() + more_keys;
  if (needed <= static_cast<int64_t>(config_.max_load * capacity_)) return;
  int64_t capacity = capacity_;
  while (needed > static_cast<int64_t>(config_.max_load * capacity)) capacity *= 2;
  Slots from{keys_, state_, capacity_ - 1};
  float* from_rows = rows_;
  uint32_t *from_counts = counts_, *from_steps = last_steps_;
  const int64_t from_capacity = capacity_;
  Allocate(capacity);
  TFPS_CUDA_CHECK(cudaMemsetAsync(size_, 0, sizeof(unsigned long long), stream_));
  RehashKernel<<<Blocks(from_capacity), kThreads, 0, stream_>>>(
      from, from_rows, from_counts, from_steps, from_capacity, Slots{keys_, state_, capacity_ - 1},
      rows_, counts_, last_steps_, row_width_, size_);
  TFPS_CUDA_CHECK(cudaStreamSynchronize(stream_));
  cudaFree(from.keys);
  cudaFree(from.state);
  cudaFree(from_rows);
  cudaFree(from_counts);
  cudaFree(from_steps);
}

void GpuTable::Resolve(const uint64_t* keys, int64_t n, bool insert) {
  if (n > scratch_capacity_) {
    cudaFree(slots_scratch_);
    cudaFree(inserted_scratch_);
    TFPS_CUDA_CHECK(cudaMalloc(&slots_scratch_, n * sizeof(int64_t)));
    TFPS_CUDA_CHECK(cudaMalloc(&inserted_scratch_, n));
    scratch_capacity_ = n;
  }
  if (insert) ReserveFor(n);
  ResolveKernel<<<Blocks(n), kThreads, 0, stream_>>>(Slots{keys_, state_, capacity_ - 1}, keys, n,
                                                     insert, slots_scratch_, inserted_scratch_, size_);
  if (insert) {
    InitRowsKernel<<<Blocks(n * row_width_), kThreads, 0, stream_>>>(
        config_, row_width_, keys, slots_scratch_, inserted_scratch_, n, rows_, counts_, last_steps_);
  }
}

void GpuTable::Find(const uint64_t* keys, int64_t n, float* values, uint8_t* exists) {
  if (n == 0) return;
  Resolve(keys, n, false);
  CopyRowsKernel<<<Blocks(n * config_.dim), kThreads, 0, stream_>>>(
      config_, row_width_, keys, slots_scratch_, n, rows_, values, exists);
}

void GpuTable::FindOrInsert(const uint64_t* keys, int64_t n, float* values) {
  if (n == 0) return;
  Resolve(keys, n, true);
  CopyRowsKernel<<<Blocks(n * config_.dim), kThreads, 0, stream_>>>(
      config_, row_width_, keys, slots_scratch_, n, rows_, values, nullptr);
}

bool GpuTable::ApplyGradients(const uint64_t* keys, int64_t n, const float* grads, int64_t step) {
  if (n == 0) return true;
  int bad = 0;
  TFPS_CUDA_CHECK(cudaMemsetAsync(flag_, 0, sizeof(int), stream_));
  CheckFiniteKernel<<<Blocks(n * config_.dim), kThreads, 0, stream_>>>(grads, n * config_.dim, flag_);
  TFPS_CUDA_CHECK(cudaMemcpyAsync(&bad, flag_, sizeof(int), cudaMemcpyDeviceToHost, stream_));
  TFPS_CUDA_CHECK(cudaStreamSynchronize(stream_));
  if (bad) return false;
  Resolve(keys, n, true);
  const uint32_t last = static_cast<uint32_t>(std::min<int64_t>(std::max<int64_t>(step, 0), 0xffffffffLL));
  ApplyKernel<<<Blocks(n * config_.dim), kThreads, 0, stream_>>>(
      config_, row_width_, slots_scratch_, n, grads, last, rows_, counts_, last_steps_);
  return true;
}

int64_t GpuTable::Export(uint64_t* keys, float* values, float* slots) {
  TFPS_CUDA_CHECK(cudaMemsetAsync(cursor_, 0, sizeof(unsigned long long), stream_));
  ExportKernel<<<Blocks(capacity_), kThreads, 0, stream_>>>(Slots{keys_, state_, capacity_ - 1}, rows_,
                                                            capacity_, config_.dim, row_width_, keys,
                                                            values, slots, cursor_);
  return Size();
}

}  // namespace gpu
}  // namespace tfps
