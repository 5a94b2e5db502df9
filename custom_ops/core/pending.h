// Occurrence counts of the keys that have no row yet, for admission; one per stripe, used
// under the stripe's lock. Either a count-min sketch (kDepth rows of 16-bit counters, a
// power-of-two width, conservative update: a key's counters rise only to its new
// estimate), which between halvings never undercounts, and overcounts a key only when all
// of its counters are shared with heavier keys; it halves every counter whenever half of its first row is
// in use, so its error stays bounded however long the stream runs (a key must gather its
// count within about the time the sketch takes to fill). Or exact counts in an
// open-addressing map (linear probing, backward-shift removal), which keeps every pending
// key until it is admitted.
#ifndef TFPS_CORE_PENDING_H_
#define TFPS_CORE_PENDING_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace tfps {

class PendingCounts {
 public:
  static constexpr int kDepth = 4;
  static constexpr uint32_t kMaxSketchCount = 0xffff;

  // A sketch of kDepth x width counters (width a power of two), or exact counts (width 0).
  // May throw std::bad_alloc.
  void Configure(size_t width);
  bool exact() const { return width_ == 0; }
  size_t width() const { return width_; }

  // Adds n occurrences to key's count; returns the count before them (an estimate, for a
  // sketch). The count after is min(before + n, MaxCount()).
  uint32_t Add(uint64_t key, uint32_t n);
  uint32_t MaxCount() const { return exact() ? 0xffffffffu : kMaxSketchCount; }
  // The key got a row: an exact count forgets it (a sketch cannot).
  void Forget(uint64_t key);
  // Room for `more` new exact keys without allocating. May throw std::bad_alloc.
  void Reserve(size_t more);

  // Keys waiting: exact, or for a sketch the distinct keys its first row holds (linear
  // counting) less those admitted since (whose counters it cannot clear), an estimate.
  int64_t EstimateKeys() const;
  size_t MemoryBytes() const;
  void Clear();

  // Checkpoints. A sketch's cells (kDepth rows of width, row after row).
  const std::vector<uint16_t>& cells() const { return cells_; }
  // Merges saved cells of another sketch (any power-of-two width): each of this sketch's
  // counters takes the largest of the saved counters it covers, folding a wider sketch or
  // repeating a narrower one, so no key's estimate falls below its saved one. `share` is
  // the part of the saved keys that come here (a saved stripe split over several stripes
  // or shards): EstimateKeys counts only that part of the keys the merge added.
  void MergeCells(const uint16_t* cells, size_t width, double share = 1.0);
  // Exact counts, for each key with fn(key, count).
  template <typename Fn>
  void ForEachExact(Fn&& fn) const {
    for (size_t i = 0; i < counts_.size(); ++i) {
      if (counts_[i] != 0) fn(keys_[i], counts_[i]);
    }
  }
  // Adds a saved exact count (saturating; into a sketch too). May throw std::bad_alloc.
  void AddExact(uint64_t key, uint32_t count);

 private:
  size_t Cell(int row, uint64_t key) const;
  void Halve();
  size_t Home(uint64_t key) const;
  void GrowExact(size_t capacity);
  int64_t Counted() const;  // sketch: the distinct keys its first row holds

  size_t width_ = 0;
  std::vector<uint16_t> cells_;
  size_t used_in_first_row_ = 0;
  size_t forgotten_ = 0;  // sketch: keys admitted since, halved with the counters
  // Sketch: merged keys that go to other stripes or shards, by the bit length of the count
  // their saved counter held (a halving takes a bit off, and those at 1 go).
  static constexpr int kCountBits = 17;
  std::array<double, kCountBits> elsewhere_{};
  // Exact: slots of keys and counts; a slot is free where its count is 0.
  std::vector<uint64_t> keys_;
  std::vector<uint32_t> counts_;
  size_t exact_size_ = 0;
};

}  // namespace tfps

#endif  // TFPS_CORE_PENDING_H_
