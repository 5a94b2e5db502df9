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
// them. The sort is a merge sort of every segment at once, one launch per doubling of the
// sorted runs, each place finding its new one by a binary search in the run it merges with:
// no thread walks a hot key's segment alone, which on a power-law batch (a key repeated
// tens of thousands of times) would take the whole call's time.
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
  uint32_t* merged;            // [n] apply: the merge sort's other buffer
  uint32_t* repeated;          // [n] apply: the representatives of repeated keys
  unsigned long long* listed;  // apply: places of `list` handed out so far; then, in turn,
  unsigned long long* longest;  // the most occurrences of one key,
  unsigned long long* repeats;  // and the number of repeated keys
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
// Also lists the repeated keys and finds the longest segment.
__global__ void ListSegmentKernel(int64_t n, BatchView b) {
  const int64_t i = GlobalThread();
  if (i >= n || !IsRepresentative(b, i) || b.acc[i] < 2) return;
  b.cursor[i] = static_cast<uint32_t>(atomicAdd(b.listed, b.acc[i]));
  atomicMax(b.longest, b.acc[i]);
  b.repeated[atomicAdd(b.repeats, 1ull)] = static_cast<uint32_t>(i);
}

// Fills the segments in arbitrary order; the cursors end at their segments' ends.
__global__ void ListScatterKernel(int64_t n, BatchView b) {
  const int64_t i = GlobalThread();
  if (i >= n) return;
  const uint32_t rep = b.rep[i];
  if (b.acc[rep] < 2) return;
  b.list[atomicAdd(&b.cursor[rep], 1u)] = static_cast<uint32_t>(i);
}

// Merge passes a segment of `count` places needs: its runs of 1, 2, 4, ... places are
// merged until one run holds it.
TFPS_DEVICE int MergePasses(uint64_t count) {
  int passes = 0;
  while ((uint64_t{1} << passes) < count) ++passes;
  return passes;
}

// One pass of the merge sort of every segment (run `width`, a power of two): within each
// segment the runs [r width, (r + 1) width) of `from` are sorted, and each pair of them is
// merged into `to`. Pass k of ListMergePasses(longest) runs; later ones return, so the
// sorted lists end in `list` after an even number of passes and in `merged` after an odd
// one (SortedList). Places hold distinct batch positions, so a binary search gives each one
// its rank in the other run of its pair.
// A grid of at most kMergeThreads strides over the places, so that a pass past the longest
// segment (most of them when few keys repeat) costs little more than its launch.
constexpr int64_t kMergeThreads = int64_t{1} << 16;

TFPS_DEVICE void MergePlace(const BatchView& b, const uint32_t* from, uint32_t* to, uint64_t width,
                            uint64_t p) {
  const uint32_t position = from[p];
  const uint32_t rep = b.rep[position];
  const uint64_t count = b.acc[rep];
  const uint64_t start = b.cursor[rep] - count;
  const uint64_t offset = p - start, run = offset / width;
  uint64_t low = (run ^ 1) * width, high = low + width < count ? low + width : count;
  const uint64_t other_start = low;
  while (low < high) {
    const uint64_t mid = (low + high) / 2;
    if (from[start + mid] < position) {
      low = mid + 1;
    } else {
      high = mid;
    }
  }
  const uint64_t rank = other_start < count ? low - other_start : 0;
  to[start + (run & ~uint64_t{1}) * width + (offset - run * width) + rank] = position;
}

__global__ void ListMergeKernel(BatchView b, const uint32_t* from, uint32_t* to, uint64_t width) {
  if (width >= *b.longest) return;
  const uint64_t listed = *b.listed, stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t p = static_cast<uint64_t>(GlobalThread()); p < listed; p += stride) {
    MergePlace(b, from, to, width, p);
  }
}

// The buffer that holds the sorted segments once the merge passes have run.
TFPS_DEVICE const uint32_t* SortedList(const BatchView& b) {
  return MergePasses(*b.longest) % 2 == 0 ? b.list : b.merged;
}

// Occurrence k (0-based, input order) of the key whose representative is `rep`; `sorted`
// is SortedList(b).
TFPS_DEVICE int64_t Occurrence(const BatchView& b, const uint32_t* sorted, int64_t rep,
                               uint64_t count, uint64_t k) {
  return count == 1 ? rep : static_cast<int64_t>(sorted[b.cursor[rep] - count + k]);
}

}  // namespace gpu
}  // namespace tfps

#endif  // TFPS_CORE_GPU_BATCH_KERNELS_H_
