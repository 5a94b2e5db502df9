// Kernels that turn a batch of keys, which may repeat, into distinct keys with table slots:
// the step every writing call (find_or_insert, apply, insert, import) begins with.
//
// GroupKernel gives each key of the batch a representative: the position of one
// occurrence of the same key (whichever claimed the key's entry in a per-call map first),
// and folds each occurrence into an accumulator per representative (occurrence sum,
// count, or last position). The map's entries are the positions themselves (plus one;
// 0 is empty), so an entry is claimed and filled by one compare-and-swap and no thread
// ever waits for another. ClaimKernel then finds or inserts each representative's key in
// the table: the keys of that launch are distinct, as hash_index.h requires. For an apply,
// ListKernels gather the occurrences of each repeated key in input order (a segment per
// key, filled by atomics, then sorted) so its updates run in the order the CPU table runs
// them.
#ifndef TFPS_CORE_GPU_BATCH_KERNELS_H_
#define TFPS_CORE_GPU_BATCH_KERNELS_H_

#include <cstdint>

#include "custom_ops/core/gpu/hash_index.h"

namespace tfps {
namespace gpu {

// Per-call scratch, sized for the batch (n keys, a map of 2n or more entries).
struct BatchView {
  uint32_t* map;  // [map_mask + 1] position + 1 of a representative, 0 empty
  uint64_t map_mask;
  uint32_t* rep;               // [n] representative of each key
  unsigned long long* acc;     // [n] per representative: see GroupFold
  uint64_t* slot;              // [n] per representative: the key's table slot
  uint8_t* fresh;              // [n] per representative: the call inserted the key
  uint32_t* cursor;            // [n] apply: per repeated key, next free place in its segment
  uint32_t* list;              // [n] apply: occurrences of repeated keys, one segment each
  unsigned long long* listed;  // apply: places of `list` handed out so far
};

enum class GroupFold : int {
  kOccurrences,  // acc += clamp(occurrences[i], 0, UINT32_MAX), or 1 each when null
  kCount,        // acc += 1
  kLast,         // acc = max(i): the last occurrence wins
};

TFPS_DEVICE uint64_t MapHash(uint64_t key) { return Mix64(key ^ 0x3c6ef372fe94f82bULL); }

__global__ void GroupKernel(const uint64_t* keys, int64_t n, BatchView b, GroupFold fold,
                            const int64_t* occurrences) {
  const int64_t i = GlobalThread();
  if (i >= n) return;
  const uint64_t key = keys[i];
  uint32_t rep = static_cast<uint32_t>(i);
  for (uint64_t p = MapHash(key) & b.map_mask;; p = (p + 1) & b.map_mask) {
    const uint32_t old = atomicCAS(&b.map[p], 0u, rep + 1);
    if (old == 0) break;
    if (keys[old - 1] == key) {
      rep = old - 1;
      break;
    }
  }
  b.rep[i] = rep;
  switch (fold) {
    case GroupFold::kOccurrences: {
      const int64_t seen = occurrences == nullptr ? 1 : occurrences[i];
      // A count saturates at UINT32_MAX, so no single occurrence need add more; n such
      // terms cannot overflow the 64-bit sum.
      const uint64_t add = seen < 0                     ? 0
                           : seen > int64_t{0xffffffff} ? 0xffffffffull
                                                        : static_cast<uint64_t>(seen);
      if (add != 0) atomicAdd(&b.acc[rep], static_cast<unsigned long long>(add));
      break;
    }
    case GroupFold::kCount:
      atomicAdd(&b.acc[rep], 1ull);
      break;
    case GroupFold::kLast:
      atomicMax(&b.acc[rep], static_cast<unsigned long long>(i));
      break;
  }
}

TFPS_DEVICE bool IsRepresentative(const BatchView& b, int64_t i) {
  return b.rep[i] == static_cast<uint32_t>(i);
}

// What a claim writes into the metadata of its row.
struct ClaimMetadata {
  bool add_occurrences;     // find_or_insert: count += the representative's accumulator
  const int64_t* imported;  // import: [n, kMetadataColumns], row = the accumulator (last occurrence)
  const int64_t* clock;     // find_or_insert: a key that occurred was last seen at the clock
};

// Finds or inserts each representative's key. A fresh row gets zero metadata; its value
// and slots are written by the call's row kernel. Does nothing when *refused is set (an
// apply whose gradients are not all finite).
__global__ void ClaimKernel(TableView t, const uint64_t* keys, int64_t n, BatchView b,
                            ClaimMetadata meta, const uint32_t* refused) {
  const int64_t i = GlobalThread();
  if (i >= n || !IsRepresentative(b, i) || (refused != nullptr && *refused != 0)) return;
  const uint64_t key = keys[i];
  const Claim c = FindOrClaim(t, key, TableHash(key));
  b.slot[i] = c.slot;
  b.fresh[i] = c.inserted;
  if (c.slot == kNoSlot) return;
  if (c.inserted) {
    t.counts[c.slot] = 0;
    t.last_steps[c.slot] = 0;
    if (t.opt_steps != nullptr) t.opt_steps[c.slot] = 0;
  }
  if (meta.add_occurrences) {
    t.counts[c.slot] = SaturatingAdd(t.counts[c.slot], b.acc[i]);
    if (b.acc[i] > 0 && meta.clock != nullptr) t.last_steps[c.slot] = ClampU32(*meta.clock);
  }
  if (meta.imported != nullptr) {
    const int64_t* m = meta.imported + b.acc[i] * kMetadataColumns;
    t.counts[c.slot] = ClampU32(m[0]);
    t.last_steps[c.slot] = ClampU32(m[1]);
    if (t.opt_steps != nullptr) t.opt_steps[c.slot] = ClampU32(m[2]);
  }
}

// Removes each key that is present, counting the removals in *removed. A repeated key is
// removed (and counted) once: its other occurrences find it gone.
__global__ void RemoveKernel(TableView t, const uint64_t* keys, int64_t n,
                             unsigned long long* removed) {
  const int64_t i = GlobalThread();
  if (i >= n) return;
  const uint64_t key = keys[i];
  if (RemoveKey(t, key, TableHash(key))) atomicAdd(removed, 1ull);
}

// ---- ListKernels: the occurrences of each repeated key, in input order (apply) ----
// Each representative's accumulator holds its key's occurrence count (GroupFold::kCount).

// A segment of `list` per repeated key; its cursor starts at the segment's first place.
__global__ void ListSegmentKernel(int64_t n, BatchView b) {
  const int64_t i = GlobalThread();
  if (i >= n || !IsRepresentative(b, i) || b.acc[i] < 2) return;
  b.cursor[i] = static_cast<uint32_t>(atomicAdd(b.listed, b.acc[i]));
}

__global__ void ListScatterKernel(int64_t n, BatchView b) {
  const int64_t i = GlobalThread();
  if (i >= n) return;
  const uint32_t rep = b.rep[i];
  if (b.acc[rep] < 2) return;
  b.list[atomicAdd(&b.cursor[rep], 1u)] = static_cast<uint32_t>(i);
}

// Restores input order within each segment (the scatter's order is arbitrary): insertion
// sort for short segments, heapsort otherwise, in place.
__global__ void ListSortKernel(int64_t n, BatchView b) {
  const int64_t i = GlobalThread();
  if (i >= n || !IsRepresentative(b, i) || b.acc[i] < 2) return;
  const int64_t count = static_cast<int64_t>(b.acc[i]);
  uint32_t* a = b.list + (b.cursor[i] - count);  // the cursor ended at the segment's end
  if (count <= 32) {
    for (int64_t k = 1; k < count; ++k) {
      const uint32_t v = a[k];
      int64_t j = k;
      for (; j > 0 && a[j - 1] > v; --j) a[j] = a[j - 1];
      a[j] = v;
    }
    return;
  }
  auto sift_down = [a](int64_t root, int64_t end) {
    for (int64_t child; (child = 2 * root + 1) < end; root = child) {
      if (child + 1 < end && a[child] < a[child + 1]) ++child;
      if (a[root] >= a[child]) return;
      const uint32_t v = a[root];
      a[root] = a[child];
      a[child] = v;
    }
  };
  for (int64_t start = count / 2 - 1; start >= 0; --start) sift_down(start, count);
  for (int64_t end = count - 1; end > 0; --end) {
    const uint32_t v = a[0];
    a[0] = a[end];
    a[end] = v;
    sift_down(0, end);
  }
}

// Occurrence k (0-based, input order) of the key whose representative is `rep`.
TFPS_DEVICE int64_t Occurrence(const BatchView& b, int64_t rep, uint64_t count, uint64_t k) {
  return count == 1 ? rep : static_cast<int64_t>(b.list[b.cursor[rep] - count + k]);
}

}  // namespace gpu
}  // namespace tfps

#endif  // TFPS_CORE_GPU_BATCH_KERNELS_H_
