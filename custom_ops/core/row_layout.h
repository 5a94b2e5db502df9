// Where each field lives in a table row: [RowHeader (key, count, last step) | value dim
// floats | optimizer slots num_slots * dim floats | Adam's per-row step (uint32, Adam only)
// | decayed-frequency score (float, DecayedFrequency eviction only)], padded to 8 bytes.
// Only the fields a table's optimizer and policies use take space in its rows.
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

struct RowView {
  RowHeader* header;
  float* value;
  float* slots;
  uint32_t* optimizer_step;  // null unless the optimizer keeps a per-row step (Adam)
  float* score;              // null unless the table evicts by decayed frequency
};

struct RowLayout {
  int dim;
  int num_slots;
  bool has_step;
  bool has_score;

  RowLayout(int dim, OptimizerKind optimizer, EvictionKind eviction)
      : dim(dim), num_slots(NumSlots(optimizer)), has_step(KeepsRowStep(optimizer)),
        has_score(KeepsScore(eviction)) {}

  RowView View(char* row) const {
    float* value = reinterpret_cast<float*>(row + sizeof(RowHeader));
    float* slots = value + dim;
    float* after_slots = slots + static_cast<size_t>(dim) * num_slots;
    uint32_t* step = has_step ? reinterpret_cast<uint32_t*>(after_slots) : nullptr;
    float* score = has_score ? after_slots + (has_step ? 1 : 0) : nullptr;
    return RowView{reinterpret_cast<RowHeader*>(row), value, slots, step, score};
  }

  size_t RowBytes() const {
    const size_t floats = static_cast<size_t>(dim) * (1 + num_slots) + has_step + has_score;
    return (sizeof(RowHeader) + floats * sizeof(float) + 7) & ~size_t{7};
  }
};

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
  return RowLayout(config.dim, config.optimizer.kind, config.eviction.kind);
}

}  // namespace tfps

#endif  // TFPS_CORE_ROW_LAYOUT_H_
