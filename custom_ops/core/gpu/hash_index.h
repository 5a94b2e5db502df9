// The GPU table's index and rows as kernels see them, and the three probes on it: find
// (read-only), find-or-claim and remove.
//
// Slots come in buckets of 16. Each slot has a control byte, like the CPU stripes' index:
// 7 bits of its key's hash when full, or kEmpty / kDeleted / kBusy (top bit set), so every
// 64-bit key is an ordinary key. A probe loads a bucket's 16 control bytes at once
// (four 32-bit words), compares keys only where the 7 bits match, and walks buckets in
// turn from the key's home bucket until one with an empty byte. Rows live at their slot's
// index: values [capacity, dim]; optimizer slots [capacity, dim, num_slots] with the slots
// of one element together, so optimizer.h's ApplyRow updates one element at a time;
// metadata in three arrays. Rows move only when the whole index is rebuilt.
//
// Concurrency within one launch: the keys a launch inserts are distinct (batches are
// de-duplicated first, batch_kernels.h), so a thread never waits for another. It claims
// a free byte by one compare-and-swap to kBusy, writes the key, then publishes the hash
// bits with release semantics, which probes read with acquire loads; other threads skip
// busy bytes, which hold other keys.
#ifndef TFPS_CORE_GPU_HASH_INDEX_H_
#define TFPS_CORE_GPU_HASH_INDEX_H_

#include <cstdint>

#include "custom_ops/core/gpu/device_support.h"
#include "custom_ops/core/hashing.h"
#include "custom_ops/core/optimizer.h"

namespace tfps {
namespace gpu {

constexpr uint32_t kCtrlEmpty = 0x80, kCtrlDeleted = 0xFE, kCtrlBusy = 0xFF;
constexpr int kBucketSlots = 16;
constexpr uint64_t kNoSlot = ~uint64_t{0};
// Size and tombstone counts are spread over this many counters each, so the inserts of a
// launch do not all queue on one address.
constexpr int kCounterLanes = 32;

struct TableView {
  uint32_t* ctrl;                // capacity / 4 words, four control bytes each
  uint64_t* keys;                // [capacity]
  float* values;                 // [capacity, dim]
  float* slots;                  // [capacity, dim, num_slots]
  uint32_t* counts;              // [capacity] occurrences seen (kCount)
  uint32_t* last_steps;          // [capacity] (kLastStep)
  uint32_t* opt_steps;           // [capacity] Adam's per-row step (kOptimizerStep); null otherwise
  unsigned long long* counters;  // kCounterLanes size lanes, then kCounterLanes tombstone lanes
  uint64_t bucket_mask;          // buckets - 1 (a power of two)
  int dim;
  int num_slots;
};

struct Bucket {
  uint32_t word[4];
};

// Bit i set where control byte i of the bucket equals `byte`.
TFPS_DEVICE uint32_t MatchByte(const Bucket& b, uint32_t byte) {
  const uint32_t pattern = byte * 0x01010101u;
  uint32_t mask = 0;
  for (int w = 0; w < 4; ++w) {
    const uint32_t x = b.word[w] ^ pattern;
    const uint32_t zero =
        ~(((x & 0x7F7F7F7Fu) + 0x7F7F7F7Fu) | x | 0x7F7F7F7Fu);  // 0x80 per zero byte
    mask |= (((zero >> 7) & 1u) | ((zero >> 14) & 2u) | ((zero >> 21) & 4u) | ((zero >> 28) & 8u))
            << (4 * w);
  }
  return mask;
}

TFPS_DEVICE uint32_t CtrlByte(uint32_t word, int j) { return (word >> (8 * j)) & 0xFFu; }
TFPS_DEVICE uint32_t WithCtrlByte(uint32_t word, int j, uint32_t byte) {
  return (word & ~(0xFFu << (8 * j))) | (byte << (8 * j));
}

// Plain loads suffice where no thread of the launch writes control bytes (find, export);
// elsewhere each word is an acquire load.
template <bool kConcurrent>
TFPS_DEVICE Bucket LoadBucket(const uint32_t* ctrl, uint64_t bucket) {
  const uint32_t* p = ctrl + bucket * 4;
  if (kConcurrent)
    return Bucket{{LoadAcquire(p), LoadAcquire(p + 1), LoadAcquire(p + 2), LoadAcquire(p + 3)}};
#if TFPS_GPU_EMULATED
  return Bucket{{p[0], p[1], p[2], p[3]}};
#else
  const uint4 v = *reinterpret_cast<const uint4*>(p);  // one 16-byte load
  return Bucket{{v.x, v.y, v.z, v.w}};
#endif
}

TFPS_DEVICE uint64_t HomeBucket(const TableView& t, uint64_t hash) {
  return (hash >> 7) & t.bucket_mask;
}
TFPS_DEVICE uint32_t HashBits(uint64_t hash) { return static_cast<uint32_t>(hash & 0x7f); }

// The slot holding `key`, or kNoSlot.
template <bool kConcurrent>
TFPS_DEVICE uint64_t FindSlot(const TableView& t, uint64_t key, uint64_t hash) {
  const uint32_t h2 = HashBits(hash);
  uint64_t b = HomeBucket(t, hash);
  for (uint64_t probe = 0; probe <= t.bucket_mask; ++probe, b = (b + 1) & t.bucket_mask) {
    const Bucket bucket = LoadBucket<kConcurrent>(t.ctrl, b);
    for (uint32_t m = MatchByte(bucket, h2); m != 0; m &= m - 1) {
      const uint64_t slot = b * kBucketSlots + LowestBit(m);
      if (t.keys[slot] == key) return slot;
    }
    if (MatchByte(bucket, kCtrlEmpty) != 0) return kNoSlot;
  }
  return kNoSlot;
}

TFPS_DEVICE void AddToCounter(const TableView& t, int group, uint64_t slot, long long delta) {
  atomicAdd(&t.counters[group * kCounterLanes + (slot % kCounterLanes)],
            static_cast<unsigned long long>(delta));
}

// Claims the first free (empty or deleted) slot on the probe path of a key known to be
// absent, which no other thread of the launch inserts, and publishes the key there.
// Returns kNoSlot only if every slot is taken (growth keeps the load below max_load).
TFPS_DEVICE uint64_t ClaimSlot(const TableView& t, uint64_t key, uint64_t hash) {
  uint64_t b = HomeBucket(t, hash);
  for (uint64_t probe = 0; probe <= t.bucket_mask; ++probe, b = (b + 1) & t.bucket_mask) {
    for (int w = 0; w < 4; ++w) {
      uint32_t* word = t.ctrl + b * 4 + w;
      uint32_t seen = LoadAcquire(word);
      for (;;) {
        int j = 0;
        while (j < 4 && CtrlByte(seen, j) != kCtrlEmpty && CtrlByte(seen, j) != kCtrlDeleted) ++j;
        if (j == 4) break;  // no free byte left in this word
        const uint32_t old = atomicCAS(word, seen, WithCtrlByte(seen, j, kCtrlBusy));
        if (old != seen) {  // another byte of the word changed meanwhile: look again
          seen = old;
          continue;
        }
        const uint64_t slot = b * kBucketSlots + w * 4 + j;
        t.keys[slot] = key;
        PublishAnd(word, WithCtrlByte(0xFFFFFFFFu, j, HashBits(hash)));  // the key first
        AddToCounter(t, 0, slot, 1);
        if (CtrlByte(seen, j) == kCtrlDeleted) AddToCounter(t, 1, slot, -1);
        return slot;
      }
    }
  }
  return kNoSlot;
}

struct Claim {
  uint64_t slot;
  bool inserted;
};

// The slot of `key`, claimed if absent. Keys must be distinct across the launch.
TFPS_DEVICE Claim FindOrClaim(const TableView& t, uint64_t key, uint64_t hash) {
  const uint64_t found = FindSlot<true>(t, key, hash);
  if (found != kNoSlot) return Claim{found, false};
  const uint64_t slot = ClaimSlot(t, key, hash);
  return Claim{slot, slot != kNoSlot};
}

// Removes `key` if present; true when this thread removed it (a duplicate of the key in
// the same launch finds it gone). A byte in a bucket with an empty byte may become empty
// again, since probes stop there anyway; elsewhere it becomes a tombstone.
TFPS_DEVICE bool RemoveKey(const TableView& t, uint64_t key, uint64_t hash) {
  const uint32_t h2 = HashBits(hash);
  uint64_t b = HomeBucket(t, hash);
  for (uint64_t probe = 0; probe <= t.bucket_mask; ++probe, b = (b + 1) & t.bucket_mask) {
    const Bucket bucket = LoadBucket<true>(t.ctrl, b);
    const bool has_empty = MatchByte(bucket, kCtrlEmpty) != 0;
    for (uint32_t m = MatchByte(bucket, h2); m != 0; m &= m - 1) {
      const int i = LowestBit(m);
      const uint64_t slot = b * kBucketSlots + i;
      if (t.keys[slot] != key) continue;
      uint32_t* word = t.ctrl + b * 4 + i / 4;
      const uint32_t freed = has_empty ? kCtrlEmpty : kCtrlDeleted;
      for (uint32_t seen = bucket.word[i / 4]; CtrlByte(seen, i % 4) == h2;) {
        const uint32_t old = atomicCAS(word, seen, WithCtrlByte(seen, i % 4, freed));
        if (old == seen) {
          AddToCounter(t, 0, slot, -1);
          if (!has_empty) AddToCounter(t, 1, slot, 1);
          return true;
        }
        seen = old;
      }
      return false;  // a duplicate of this key removed it first
    }
    if (has_empty) return false;
  }
  return false;
}

// Initial optimizer slots of element e of a fresh row.
TFPS_DEVICE void InitializeSlots(const TableView& t, const OptimizerConfig& opt, uint64_t slot,
                                 int e) {
  float* s = t.slots + (slot * t.dim + e) * t.num_slots;
  for (int k = 0; k < t.num_slots; ++k) s[k] = InitialSlotValue(opt, k);
}

}  // namespace gpu
}  // namespace tfps

#endif  // TFPS_CORE_GPU_HASH_INDEX_H_
