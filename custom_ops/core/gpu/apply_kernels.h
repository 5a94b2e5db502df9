// Kernels of ApplyGradients, in launch order after the batch is grouped and claimed
// (batch_kernels.h): a finiteness check that refuses the whole call, the table's clock,
// the optimizer update and the per-row steps.
//
// The refusal lives on the device (a flag every later kernel of the call reads), so an
// apply needs no host sync unless its caller asks for the verdict. The update runs one
// thread per (distinct key, element): elements of a row are independent in every
// optimizer, so each thread walks its key's occurrences in input order with optimizer.h's
// ApplyRow on its one element (slots are stored element-major for this), and Adam's step
// for occurrence k is the row's step plus k, as the CPU table's sequential updates see it.
// The row's metadata is written by a later launch, once every element has read it.
#ifndef TFPS_CORE_GPU_APPLY_KERNELS_H_
#define TFPS_CORE_GPU_APPLY_KERNELS_H_

#include <cstdint>
#include <cstring>

#include "custom_ops/core/gpu/batch_kernels.h"
#include "custom_ops/core/gpu/hash_index.h"
#include "custom_ops/core/gpu/row_kernels.h"

namespace tfps {
namespace gpu {

// Sets *refused when any of x[0..total) is NaN or infinite: the floats whose exponent bits
// are all ones, tested on the bits as the CPU table does.
__global__ void CheckFiniteKernel(const float* x, int64_t total, uint32_t* refused) {
  const int64_t i = GlobalThread();
  if (i >= total) return;
  uint32_t bits;
  memcpy(&bits, x + i, sizeof(bits));
  if ((bits & 0x7f800000u) == 0x7f800000u) atomicOr(refused, 1u);
}

// The table's count of ApplyGradients calls, advanced by every call that is not refused.
__global__ void AdvanceClockKernel(const uint32_t* refused, int64_t* clock) {
  if (GlobalThread() == 0 && *refused == 0) ++*clock;
}

__global__ void SetClockKernel(int64_t* clock, int64_t value) {
  if (GlobalThread() == 0) *clock = value;
}

// Applies each distinct key's gradient (grads [n, dim]) to its row, inserting fresh rows'
// initial values and slots first. The accumulators hold occurrence counts
// (GroupFold::kCount); a repeated key gets only its initial values here, and its updates
// from ApplyRepeatedKernel, which runs next.
__global__ void ApplyKernel(TableView t, RowInit init, const uint64_t* keys, int64_t n, BatchView b,
                            const float* grads, const uint32_t* refused) {
  const int64_t g = GlobalThread();
  const int64_t i = g / t.dim;
  const int e = static_cast<int>(g - i * t.dim);
  if (i >= n || !IsRepresentative(b, i) || *refused != 0 || b.slot[i] == kNoSlot) return;
  const uint64_t slot = b.slot[i];
  float* value = t.values + slot * t.dim + e;
  float* slots = t.slots + (slot * t.dim + e) * t.num_slots;
  if (b.fresh[i]) {
    *value = InitialValue(init.initializer, init.seed, keys[i], e);
    InitializeSlots(t, init.optimizer, slot, e);
  }
  if (b.acc[i] != 1) return;
  const uint32_t step = t.opt_steps != nullptr ? SaturatingAdd(t.opt_steps[slot], 1) : 1;
  ApplyRow(init.optimizer, 1, grads + i * t.dim + e, value, slots, step);
}

// A repeated key's walk is the call's longest chain (a hot key of a power-law batch
// repeats tens of thousands of times), so it has a kernel of its own, whose registers do
// not weigh on ApplyKernel: the element and its slots stay in registers along the walk,
// and its gradients are loaded kGradientsAhead at a time, so the loads of a group wait for
// memory together rather than one after another. A grid of at most kRepeatedThreads
// strides over the (repeated key, element) pairs.
constexpr int kGradientsAhead = 16;
constexpr int kMaxSlots = 2;  // optimizer.h NumSlots
constexpr int64_t kRepeatedThreads = int64_t{1} << 20;

__global__ void ApplyRepeatedKernel(TableView t, OptimizerConfig optimizer, BatchView b,
                                    const float* grads, const uint32_t* refused) {
  if (*refused != 0) return;
  const uint64_t pairs = *b.repeats * t.dim, stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  const uint32_t* sorted = SortedList(b);
  for (uint64_t pair = static_cast<uint64_t>(GlobalThread()); pair < pairs; pair += stride) {
    const uint32_t i = b.repeated[pair / t.dim];
    const int e = static_cast<int>(pair % t.dim);
    const uint64_t slot = b.slot[i], count = b.acc[i];
    float* value = t.values + slot * t.dim + e;
    float* slots = t.slots + (slot * t.dim + e) * t.num_slots;
    const uint32_t step = t.opt_steps != nullptr ? t.opt_steps[slot] : 0;
    float element = *value, element_slots[kMaxSlots];
    for (int s = 0; s < t.num_slots; ++s) element_slots[s] = slots[s];
    for (uint64_t first = 0; first < count; first += kGradientsAhead) {
      float g[kGradientsAhead];
      for (int j = 0; j < kGradientsAhead; ++j) {
        g[j] = first + j < count ? grads[Occurrence(b, sorted, i, count, first + j) * t.dim + e]
                                 : 0.0f;
      }
      for (int j = 0; j < kGradientsAhead && first + j < count; ++j) {
        const uint32_t row_step =
            t.opt_steps != nullptr ? SaturatingAdd(step, first + j + 1) : 1;
        ApplyRow(optimizer, 1, &g[j], &element, element_slots, row_step);
      }
    }
    *value = element;
    for (int s = 0; s < t.num_slots; ++s) slots[s] = element_slots[s];
  }
}

// Records the step on each applied row and advances Adam's per-row step by the key's
// occurrences. `step` < 0 stands for the table's clock (read after this call advanced it).
__global__ void RecordStepKernel(TableView t, int64_t n, BatchView b, int64_t step,
                                 const int64_t* clock, const uint32_t* refused) {
  const int64_t i = GlobalThread();
  if (i >= n || !IsRepresentative(b, i) || *refused != 0 || b.slot[i] == kNoSlot) return;
  const uint64_t slot = b.slot[i];
  t.last_steps[slot] = ClampU32(step < 0 ? *clock : step);
  if (t.opt_steps != nullptr) t.opt_steps[slot] = SaturatingAdd(t.opt_steps[slot], b.acc[i]);
}

}  // namespace gpu
}  // namespace tfps

#endif  // TFPS_CORE_GPU_APPLY_KERNELS_H_
