#include "custom_ops/core/pending.h"

#include <algorithm>
#include <cmath>

#include "custom_ops/core/hashing.h"

namespace tfps {
namespace {

// Salts of the sketch's hashes, apart from the table's and the shards' own.
constexpr uint64_t kSketchSalt = 0x736b65746368ULL;  // "sketch"
constexpr uint64_t kExactSalt = 0x6578616374ULL;     // "exact"

}  // namespace

void PendingCounts::Configure(size_t width) {
  width_ = width;
  cells_.assign(width * kDepth, 0);
  used_in_first_row_ = 0;
  keys_.clear();
  counts_.clear();
  exact_size_ = 0;
}

size_t PendingCounts::Cell(int row, uint64_t key) const {
  // 32 bits of two independent mixes per row: widths up to 2^32.
  const uint64_t a = Mix64(key ^ kSketchSalt), b = Mix64(key ^ (kSketchSalt << 1));
  const uint64_t bits = ((a >> (16 * row)) & 0xffff) | (((b >> (16 * row)) & 0xffff) << 16);
  return static_cast<size_t>(row) * width_ + (bits & (width_ - 1));
}

uint32_t PendingCounts::Add(uint64_t key, uint32_t n) {
  if (exact()) {
    if (keys_.empty()) {
      if (n == 0) return 0;
      GrowExact(16);
    }
    size_t i = Home(key);
    while (counts_[i] != 0 && keys_[i] != key) i = (i + 1) & (keys_.size() - 1);
    const uint32_t before = counts_[i];
    if (n == 0) return before;  // a look that adds nothing claims no slot
    if (before == 0) {
      keys_[i] = key;
      ++exact_size_;
    }
    counts_[i] = static_cast<uint32_t>(std::min<uint64_t>(uint64_t{before} + n, 0xffffffffu));
    if (exact_size_ * 2 > keys_.size()) GrowExact(keys_.size() * 2);  // after Reserve: no-op
    return before;
  }
  size_t cell[kDepth];
  uint32_t before = kMaxSketchCount;
  for (int r = 0; r < kDepth; ++r) {
    cell[r] = Cell(r, key);
    before = std::min<uint32_t>(before, cells_[cell[r]]);
  }
  const uint16_t after = static_cast<uint16_t>(std::min<uint32_t>(before + n, kMaxSketchCount));
  for (int r = 0; r < kDepth; ++r) {
    if (cells_[cell[r]] >= after) continue;
    if (r == 0 && cells_[cell[r]] == 0) ++used_in_first_row_;
    cells_[cell[r]] = after;
  }
  if (used_in_first_row_ * 2 > width_) Halve();
  return before;
}

void PendingCounts::Halve() {
  // An admitted key's counters (min_count or more) outlive a halving or two: count half
  // of those forgotten as still held, a rough mean over counts.
  forgotten_ /= 2;
  used_in_first_row_ = 0;
  for (size_t i = 0; i < cells_.size(); ++i) {
    cells_[i] >>= 1;
    if (i < width_ && cells_[i] != 0) ++used_in_first_row_;
  }
  for (int bits = 1; bits < kCountBits; ++bits) elsewhere_[bits - 1] = elsewhere_[bits];
  elsewhere_[kCountBits - 1] = 0.0;
  elsewhere_[0] = 0.0;  // counts of 1 are gone
}

size_t PendingCounts::Home(uint64_t key) const {
  return static_cast<size_t>(Mix64(key ^ kExactSalt)) & (keys_.size() - 1);
}

void PendingCounts::Forget(uint64_t key) {
  if (!exact()) {
    ++forgotten_;
    return;
  }
  if (keys_.empty()) return;
  const size_t mask = keys_.size() - 1;
  size_t i = Home(key);
  while (counts_[i] != 0 && keys_[i] != key) i = (i + 1) & mask;
  if (counts_[i] == 0) return;
  // Backward-shift removal: later keys of the run move up so no probe stops early.
  for (size_t j = (i + 1) & mask; counts_[j] != 0; j = (j + 1) & mask) {
    const size_t home = Home(keys_[j]);
    // j's key may fill the hole at i when its home lies cyclically outside (i, j].
    const bool movable = i <= j ? (home <= i || home > j) : (home <= i && home > j);
    if (movable) {
      keys_[i] = keys_[j];
      counts_[i] = counts_[j];
      i = j;
    }
  }
  counts_[i] = 0;
  --exact_size_;
}

void PendingCounts::GrowExact(size_t capacity) {
  std::vector<uint64_t> keys(capacity);
  std::vector<uint32_t> counts(capacity, 0);
  keys.swap(keys_);
  counts.swap(counts_);
  for (size_t i = 0; i < counts.size(); ++i) {
    if (counts[i] == 0) continue;
    size_t j = Home(keys[i]);
    while (counts_[j] != 0) j = (j + 1) & (capacity - 1);
    keys_[j] = keys[i];
    counts_[j] = counts[i];
  }
}

void PendingCounts::Reserve(size_t more) {
  if (!exact()) return;
  size_t capacity = std::max<size_t>(16, keys_.size());
  while ((exact_size_ + more + 1) * 2 > capacity) capacity *= 2;
  if (capacity != keys_.size()) GrowExact(capacity);
}

int64_t PendingCounts::Counted() const {
  const size_t clear = width_ - used_in_first_row_;
  if (used_in_first_row_ == 0) return 0;
  return clear == 0 ? static_cast<int64_t>(width_)
                    : std::llround(static_cast<double>(width_) * std::log(static_cast<double>(width_) / clear));
}

int64_t PendingCounts::EstimateKeys() const {
  if (exact()) return static_cast<int64_t>(exact_size_);
  double elsewhere = 0.0;
  for (double keys : elsewhere_) elsewhere += keys;
  return std::max<int64_t>(0, Counted() - static_cast<int64_t>(forgotten_) - std::llround(elsewhere));
}

size_t PendingCounts::MemoryBytes() const {
  return cells_.capacity() * sizeof(uint16_t) +
         keys_.capacity() * (sizeof(uint64_t) + sizeof(uint32_t));
}

void PendingCounts::Clear() {
  std::fill(cells_.begin(), cells_.end(), 0);
  used_in_first_row_ = 0;
  forgotten_ = 0;
  elsewhere_.fill(0.0);
  std::fill(counts_.begin(), counts_.end(), 0);
  exact_size_ = 0;
}

void PendingCounts::MergeCells(const uint16_t* cells, size_t width, double share) {
  if (exact() || width == 0) return;
  const int64_t before = Counted();
  for (int r = 0; r < kDepth; ++r) {
    uint16_t* mine = cells_.data() + r * width_;
    const uint16_t* saved = cells + r * width;
    // A key's cell index in a power-of-two width w is its hash bits mod w, so cell i here
    // covers the saved cells congruent to i modulo the smaller width.
    if (width >= width_) {
      for (size_t i = 0; i < width; ++i) mine[i & (width_ - 1)] = std::max(mine[i & (width_ - 1)], saved[i]);
    } else {
      for (size_t i = 0; i < width_; ++i) mine[i] = std::max(mine[i], saved[i & (width - 1)]);
    }
  }
  used_in_first_row_ = 0;
  for (size_t i = 0; i < width_; ++i) used_in_first_row_ += cells_[i] != 0;
  const int64_t added = std::max<int64_t>(0, Counted() - before);
  if (added == 0 || share >= 1.0) return;
  // The other stripes' and shards' part of the added keys, spread over count sizes as the
  // saved first row's counters are, so halvings age them as they age the counters.
  std::array<double, kCountBits> cells_by_bits{};
  double used = 0.0;
  for (size_t i = 0; i < width; ++i) {
    if (cells[i] == 0) continue;
    cells_by_bits[64 - __builtin_clzll(cells[i])] += 1.0;
    used += 1.0;
  }
  for (int bits = 1; bits < kCountBits; ++bits) {
    elsewhere_[bits] += static_cast<double>(added) * (1.0 - share) * cells_by_bits[bits] / used;
  }
}

void PendingCounts::AddExact(uint64_t key, uint32_t count) {
  if (count == 0) return;
  if (exact()) Reserve(1);
  Add(key, count);
}

}  // namespace tfps
