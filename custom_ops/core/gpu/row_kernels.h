// Kernels that move whole rows: reading rows out (find, find_or_insert), writing given
// rows in (insert, import) and rebuilding the index into a larger one (growth).
//
// RowsOutKernel is the hot path. Each key is served by 2^lane_bits neighbouring threads, which
// all run the same probe (their loads of the same bucket, key and row merge into one
// access) and then each copy their share of the row as 16-, 8- or 4-byte vectors, so a
// warp reads and writes whole rows contiguously. Find probes in the kernel itself, one
// launch and no scratch; find_or_insert reads the slots its claim launch left. A key
// without a row, or with a row this call inserted, reads its initial value, computed
// from (seed, key) as the CPU table computes it: duplicates of a fresh key compute it
// too, rather than read the row the key's representative is writing.
#ifndef TFPS_CORE_GPU_ROW_KERNELS_H_
#define TFPS_CORE_GPU_ROW_KERNELS_H_

#include <cstdint>

#include "custom_ops/core/gpu/batch_kernels.h"
#include "custom_ops/core/gpu/hash_index.h"

namespace tfps {
namespace gpu {

// What a fresh row is made of.
struct RowInit {
  InitializerConfig initializer;
  OptimizerConfig optimizer;
  uint64_t seed;
};

template <int kWidth>
struct FloatVector;
template <>
struct FloatVector<1> {
  using type = float;
};
template <>
struct FloatVector<2> {
  using type = float2;
};
template <>
struct FloatVector<4> {
  using type = float4;
};

// Piece p (kWidth floats) of the initial value of the key with `stream`.
template <int kWidth>
TFPS_DEVICE typename FloatVector<kWidth>::type InitialPiece(const InitializerConfig& init,
                                                            uint64_t stream, int p) {
  typename FloatVector<kWidth>::type v;
  float* f = reinterpret_cast<float*>(&v);
  for (int k = 0; k < kWidth; ++k) f[k] = InitialValueFromStream(init, stream, p * kWidth + k);
  return v;
}

// values [n, dim]: the row of each key, or its initial value. With b.rep null (find) each
// key is probed here and exists[i] (if given) says whether it has a row; otherwise the
// claim launch's slots are used, and each fresh row's representative also writes the
// initial value and slots into the row.
template <int kWidth>
__global__ void RowsOutKernel(TableView t, RowInit init, const uint64_t* keys, int64_t n,
                              int lane_bits, BatchView b, float* values, uint8_t* exists) {
  using Vec = typename FloatVector<kWidth>::type;
  const int64_t g = GlobalThread();
  const int64_t i = g >> lane_bits;
  const int lanes = 1 << lane_bits;
  const int lane = static_cast<int>(g & (lanes - 1));
  if (i >= n) return;
  const uint64_t key = keys[i];
  uint64_t slot;
  bool fresh = false, owner = false;
  if (b.rep == nullptr) {
    slot = FindSlot<false>(t, key, TableHash(key));
    if (exists != nullptr && lane == 0) exists[i] = slot != kNoSlot;
  } else {
    const uint32_t rep = b.rep[i];
    slot = b.slot[rep];
    fresh = b.fresh[rep] != 0;
    owner = rep == static_cast<uint32_t>(i) && slot != kNoSlot;
  }
  const int pieces = t.dim / kWidth;
  Vec* out = reinterpret_cast<Vec*>(values + i * t.dim);
  if (slot != kNoSlot && !fresh) {
    const Vec* row = reinterpret_cast<const Vec*>(t.values + slot * t.dim);
    for (int p = lane; p < pieces; p += lanes) out[p] = row[p];
    return;
  }
  const uint64_t stream = KeyStream(init.seed, key);
  for (int p = lane; p < pieces; p += lanes) {
    const Vec v = InitialPiece<kWidth>(init.initializer, stream, p);
    out[p] = v;
    if (owner) {
      reinterpret_cast<Vec*>(t.values + slot * t.dim)[p] = v;
      for (int k = 0; k < kWidth; ++k) InitializeSlots(t, init.optimizer, slot, p * kWidth + k);
    }
  }
}

// Writes each representative's row from its last occurrence: values [n, dim], and with
// `slots` ([n, num_slots, dim], the layout of Export) the optimizer slots too; without,
// fresh rows get initial slots (insert keeps the slots of present keys). One thread per
// element.
__global__ void WriteRowsKernel(TableView t, OptimizerConfig optimizer, int64_t n, BatchView b,
                                const float* values, const float* slots) {
  const int64_t g = GlobalThread();
  const int64_t i = g / t.dim;
  const int e = static_cast<int>(g - i * t.dim);
  if (i >= n || !IsRepresentative(b, i) || b.slot[i] == kNoSlot) return;
  const uint64_t slot = b.slot[i];
  const int64_t from = static_cast<int64_t>(b.acc[i]);
  t.values[slot * t.dim + e] = values[from * t.dim + e];
  if (slots != nullptr) {
    for (int s = 0; s < t.num_slots; ++s) {
      t.slots[(slot * t.dim + e) * t.num_slots + s] = slots[(from * t.num_slots + s) * t.dim + e];
    }
  } else if (b.fresh[i]) {
    InitializeSlots(t, optimizer, slot, e);
  }
}

TFPS_DEVICE bool SlotIsFull(const uint32_t* ctrl, uint64_t slot) {
  return (reinterpret_cast<const uint8_t*>(ctrl)[slot] & 0x80) == 0;
}

// Moves every row of `from` into `to` (whose index is empty), one thread per old slot.
__global__ void RehashKernel(TableView from, uint64_t from_capacity, TableView to) {
  const int64_t s = GlobalThread();
  if (s >= static_cast<int64_t>(from_capacity) || !SlotIsFull(from.ctrl, s)) return;
  const uint64_t key = from.keys[s];
  const uint64_t slot = ClaimSlot(to, key, TableHash(key));
  if (slot == kNoSlot) return;
  const int dim = from.dim, width = from.dim * from.num_slots;
  for (int e = 0; e < dim; ++e) to.values[slot * dim + e] = from.values[s * dim + e];
  for (int e = 0; e < width; ++e) to.slots[slot * width + e] = from.slots[s * width + e];
  to.counts[slot] = from.counts[s];
  to.last_steps[slot] = from.last_steps[s];
  if (to.opt_steps != nullptr) to.opt_steps[slot] = from.opt_steps[s];
}

}  // namespace gpu
}  // namespace tfps

#endif  // TFPS_CORE_GPU_ROW_KERNELS_H_
