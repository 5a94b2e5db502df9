// A table's admission and eviction policies: which keys get a row, and which rows go.
//
// Admission keeps rare keys out: a key absent from the table is counted (in a sketch of a
// fixed size, or exactly) each time a training lookup sees it, and gets a row only when
// its count reaches min_count (MinCount) or one of its occurrences draws an admission
// (Probability: occurrence i of a key admits it when a hash of (seed, key, i) falls under
// p, so replaying the same data admits the same keys). Until then a lookup reads its
// initial value and its gradient is dropped.
//
// Eviction removes rows: TTL those not seen for more than ttl_steps of the table's clock
// (or ttl_seconds of wall time, mapped onto the clock by the table's record of when each
// step ran); DecayedFrequency those whose score (occurrences, decayed by `decay` per step
// of the clock since the row was last seen) is under `threshold`. A sweep runs inside every
// training lookup, visiting every row 16 times per expiry horizon (and at least a row per
// key looked up), so rows go soon after they expire whatever the share of new keys;
// Table::Evict sweeps it all at once. A cap (max_rows)
// bounds the rows: an insert into a full stripe first evicts the lowest of a few sampled
// rows, ranked by the policy (LRU: last seen; LFU: occurrence count; DecayedFrequency:
// score; TTL ranks as LRU).
#ifndef TFPS_CORE_POLICIES_H_
#define TFPS_CORE_POLICIES_H_

#include <cmath>
#include <cstdint>

#include "custom_ops/core/hashing.h"

namespace tfps {

enum class AdmissionKind : int { kNone = 0, kMinCount = 1, kProbability = 2 };

struct AdmissionConfig {
  AdmissionKind kind = AdmissionKind::kNone;
  int64_t min_count = 1;      // MinCount
  float probability = 1.0f;   // Probability
  // Bytes of the sketch that counts absent keys on each shard; 0 counts them exactly.
  int64_t sketch_bytes = 0;
};

enum class EvictionKind : int { kNone = 0, kTtl = 1, kDecayedFrequency = 2, kLru = 3, kLfu = 4 };

struct EvictionConfig {
  EvictionKind kind = EvictionKind::kNone;
  int64_t ttl_steps = 0;     // TTL by the clock; 0: by seconds
  double ttl_seconds = 0.0;  // TTL by wall time; 0: by steps
  float decay = 1.0f;        // DecayedFrequency: score factor per step
  float threshold = 0.0f;    // DecayedFrequency: rows scoring under it go
  int64_t max_rows = 0;      // this shard's cap on rows; 0: none
};

inline bool Sweeps(const EvictionConfig& e) {
  return e.kind == EvictionKind::kTtl || e.kind == EvictionKind::kDecayedFrequency;
}

// Whether occurrence `index` (0-based, over the key's whole history) of `key` admits it.
inline bool DrawsAdmission(uint64_t seed, uint64_t key, uint64_t index, float probability) {
  const uint64_t bits = RandomBits(seed ^ 0x61646d6974ULL, key, index);  // "admit"
  return static_cast<double>(bits >> 11) * (1.0 / 9007199254740992.0) < probability;
}

// A score last set at step `last` as seen at step `now`.
inline float DecayedScore(float score, float decay, int64_t last, int64_t now) {
  if (now <= last || decay == 1.0f) return score;
  return score * std::pow(decay, static_cast<float>(now - last));
}

}  // namespace tfps

#endif  // TFPS_CORE_POLICIES_H_
