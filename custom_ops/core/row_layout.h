// Where each field lives in a table row: [RowHeader (key, count, last step) | value dim
// floats | optimizer slots num_slots * dim floats | Adam's per-row step (uint32, Adam only)
// | decayed-frequency score (float, DecayedFrequency eviction only)], padded to 8 bytes.
// Only the fields a table's optimizer and policies use take space in its rows. A tiered
// table's row holds no payload (value and slots): [RowHeader | step | score | payload
// reference], the reference (8 bytes) being the address of its payload in the stripe's
// PayloadArena, or null while the payload lives only on disk, with two flags in its low
// bits: the disk holds a record of the row, and that record is the payload as it is now.
#ifndef TFPS_CORE_ROW_LAYOUT_H_
#define TFPS_CORE_ROW_LAYOUT_H_

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "custom_ops/core/optimizer.h"
#include "custom_ops/core/policies.h"
#include "custom_ops/core/stripe.h"
#include "custom_ops/core/table.h"

namespace tfps {

// A tiered row's payload reference: the payload's address, or'ed with these flags.
constexpr uint64_t kOnDisk = 1;        // the disk holds a record of the row
constexpr uint64_t kDiskCurrent = 2;   // ... and it is the payload as it is now
constexpr uint64_t kPayloadFlags = 7;  // payloads are 8-byte aligned

struct RowView {
  RowHeader* header;
  float* value;              // null for a tiered row whose payload is only on disk
  float* slots;
  uint32_t* optimizer_step;  // null unless the optimizer keeps a per-row step (Adam)
  float* score;              // null unless the table evicts by decayed frequency
  uint64_t* payload;         // a tiered row's payload reference (null if not tiered)

  bool resident() const { return value != nullptr; }
  // Its payload was just written: a disk record of it is no longer current.
  void PayloadWritten() const {
    if (payload != nullptr) *payload &= ~kDiskCurrent;
  }
};

struct RowLayout {
  int dim;
  int num_slots;
  bool has_step;
  bool has_score;
  bool tiered;

  RowLayout(int dim, OptimizerKind optimizer, EvictionKind eviction, bool tiered = false)
      : dim(dim), num_slots(NumSlots(optimizer)), has_step(KeepsRowStep(optimizer)),
        has_score(KeepsScore(eviction)), tiered(tiered) {}

  size_t PayloadFloats() const { return static_cast<size_t>(dim) * (1 + num_slots); }

  RowView View(char* row) const {
    auto* header = reinterpret_cast<RowHeader*>(row);
    if (tiered) {
      float* after_header = reinterpret_cast<float*>(row + sizeof(RowHeader));
      uint64_t* payload = reinterpret_cast<uint64_t*>(row + PayloadReferenceOffset());
      float* value = reinterpret_cast<float*>(*payload & ~kPayloadFlags);
      return RowView{header, value, value != nullptr ? value + dim : nullptr,
                     has_step ? reinterpret_cast<uint32_t*>(after_header) : nullptr,
                     has_score ? after_header + (has_step ? 1 : 0) : nullptr, payload};
    }
    float* value = reinterpret_cast<float*>(row + sizeof(RowHeader));
    float* slots = value + dim;
    float* after_slots = slots + static_cast<size_t>(dim) * num_slots;
    uint32_t* step = has_step ? reinterpret_cast<uint32_t*>(after_slots) : nullptr;
    float* score = has_score ? after_slots + (has_step ? 1 : 0) : nullptr;
    return RowView{header, value, slots, step, score, nullptr};
  }

  size_t PayloadReferenceOffset() const {
    return (sizeof(RowHeader) + sizeof(float) * (has_step + has_score) + 7) & ~size_t{7};
  }

  size_t RowBytes() const {
    if (tiered) return PayloadReferenceOffset() + sizeof(uint64_t);
    const size_t floats = PayloadFloats() + has_step + has_score;
    return (sizeof(RowHeader) + floats * sizeof(float) + 7) & ~size_t{7};
  }
};

// The row cap's order, and a tiered table's order of demotion: the lowest goes first.
inline double EvictionRank(const EvictionConfig& e, const RowView& row, int64_t clock) {
  switch (e.kind) {
    case EvictionKind::kLfu:
      return row.header->count;
    case EvictionKind::kDecayedFrequency:
      return DecayedScore(*row.score, e.decay, row.header->last_step, clock);
    default:  // LRU; TTL ranks by recency too
      // Rows seen at the same step tie on recency; the one seen more often ranks higher,
      // so a step that inserts many new rows evicts one of them before a hot row it
      // also touched. The fraction stays below 1 and never crosses a step.
      return row.header->last_step + row.header->count / (row.header->count + 1.0);
  }
}

// The score column of exported metadata holds the float's bits, so it round-trips exactly.
inline int64_t ScoreToMetadata(float score) {
  uint32_t bits;
  std::memcpy(&bits, &score, sizeof(bits));
  return bits;
}

inline float ScoreFromMetadata(int64_t column) {
  const uint32_t bits = static_cast<uint32_t>(column);
  float score;
  std::memcpy(&score, &bits, sizeof(score));
  return score;
}

inline RowLayout LayoutOf(const TableConfig& config) {
  return RowLayout(config.dim, config.optimizer.kind, config.eviction.kind, config.tier.memory_rows > 0);
}

}  // namespace tfps

#endif  // TFPS_CORE_ROW_LAYOUT_H_
