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
#include <string>

#include "custom_ops/core/hashing.h"

namespace tfps {

// X(enum, name in ops). Each policy's rule is its case in Table::Admits.
#define TFPS_ADMISSION_POLICIES(X) \
  X(kNone, "none")                 \
  X(kMinCount, "min_count")        \
  X(kProbability, "probability")

#define TFPS_POLICY_ENUM(kind, name, ...) kind,
enum class AdmissionKind : int { TFPS_ADMISSION_POLICIES(TFPS_POLICY_ENUM) };

struct AdmissionConfig {
  AdmissionKind kind = AdmissionKind::kNone;
  int64_t min_count = 1;      // MinCount
  float probability = 1.0f;   // Probability
  // Bytes of the sketch that counts absent keys on each shard; 0 counts them exactly.
  int64_t sketch_bytes = 0;
};

// X(enum, name in ops, removes expired rows by itself (the sweep), keeps a per-row decayed
// score). Each policy's rule is its case in eviction.cc's Expired (which rows go by
// themselves) and Rank (the order a row cap evicts in, lowest first); tfps/table/eviction.py has
// a class per line, checked against this list by tests/test_registries.py.
#define TFPS_EVICTION_POLICIES(X)                         \
  X(kNone, "none", false, false)                          \
  X(kTtl, "ttl", true, false)                             \
  X(kDecayedFrequency, "decayed_frequency", true, true)   \
  X(kLru, "lru", false, false)                            \
  X(kLfu, "lfu", false, false)

enum class EvictionKind : int { TFPS_EVICTION_POLICIES(TFPS_POLICY_ENUM) };
#undef TFPS_POLICY_ENUM

struct EvictionConfig {
  EvictionKind kind = EvictionKind::kNone;
  int64_t ttl_steps = 0;     // TTL by the clock; 0: by seconds
  double ttl_seconds = 0.0;  // TTL by wall time; 0: by steps
  float decay = 1.0f;        // DecayedFrequency: score factor per step
  float threshold = 0.0f;    // DecayedFrequency: rows scoring under it go
  int64_t max_rows = 0;      // this shard's cap on rows; 0: none
};

inline bool Sweeps(const EvictionConfig& e) {
#define TFPS_EVICTION_SWEEPS(k, name, sweeps, keeps_score) \
  case EvictionKind::k: return sweeps;
  switch (e.kind) { TFPS_EVICTION_POLICIES(TFPS_EVICTION_SWEEPS) }
#undef TFPS_EVICTION_SWEEPS
  return false;
}

TFPS_HOST_DEVICE bool KeepsScore(EvictionKind kind) {
#define TFPS_EVICTION_SCORE(k, name, sweeps, keeps_score) \
  case EvictionKind::k: return keeps_score;
  switch (kind) { TFPS_EVICTION_POLICIES(TFPS_EVICTION_SCORE) }
#undef TFPS_EVICTION_SCORE
  return false;
}

// Names in the registries above; Parse* return false for an unknown name, *Names list the
// known ones for error messages (eviction.cc).
const char* AdmissionPolicyName(AdmissionKind kind);
bool ParseAdmissionPolicy(const std::string& name, AdmissionKind* kind);
std::string AdmissionPolicyNames();
const char* EvictionPolicyName(EvictionKind kind);
bool ParseEvictionPolicy(const std::string& name, EvictionKind* kind);
std::string EvictionPolicyNames();

// Whether occurrence `index` (0-based, over the key's whole history) of `key` admits it.
// The most occurrences of a key one call draws admission for; a key seen more often in one
// call is admitted.
constexpr uint32_t kMaxAdmissionDraws = 1 << 16;

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
