// The payloads (value and optimizer slots) of a tiered table's stripe that are in memory.
// A tiered row keeps its key and metadata in the stripe's row arena, where it never moves,
// and a reference to its payload block here, or none while its payload lives only on disk
// (the table's DiskStore). Blocks are of one size, in chunks that double as the stripe's
// resident rows grow (a block number maps to its chunk as a row number does), each headed
// by its row and its own number: demotion picks victims by sampling blocks, which are all
// resident rows, where sampling rows would mostly find rows on disk. A freed block goes on
// a free list for the next promotion or insert; chunks go back only with the table's
// RegionAllocator (clear). Memory is taken only by Reserve, so the calls that write rows
// cannot fail half way. Not thread-safe by itself: the stripe's lock guards it.
#ifndef TFPS_CORE_PAYLOAD_ARENA_H_
#define TFPS_CORE_PAYLOAD_ARENA_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "custom_ops/core/memory.h"

namespace tfps {

class PayloadArena {
 public:
  // Blocks of `payload_floats` floats each.
  void Configure(size_t payload_floats) {
    block_bytes_ = (sizeof(Header) + payload_floats * sizeof(float) + 7) & ~size_t{7};
  }

  // Makes sure `n` more blocks can be taken with no allocation. Throws AllocationFailure,
  // the arena unchanged.
  void Reserve(size_t n, RegionAllocator* memory) {
    while (free_.size() + (made_ - taken_made_) < n) {
      const size_t c = chunks_.size();
      const uint64_t blocks = kFirstChunkBlocks << c;
      chunks_.reserve(c + 1);
      in_use_.reserve(ChunkFirst(c + 1));
      free_.reserve(free_.size() + blocks);
      chunks_.push_back(static_cast<char*>(memory->Allocate(blocks * block_bytes_)));
      in_use_.resize(ChunkFirst(c + 1), 0);
      made_ = ChunkFirst(c + 1);
    }
  }

  // A block for the row at `row` (its metadata, which never moves): its payload floats.
  // Reserve first.
  float* Take(const char* row) {
    uint64_t b;
    if (!free_.empty()) {
      b = free_.back();
      free_.pop_back();
    } else {
      b = taken_made_++;
    }
    Header* header = HeaderOf(b);
    header->row = row;
    header->block = b;
    in_use_[b] = 1;
    ++in_use_count_;
    return reinterpret_cast<float*>(header + 1);
  }

  void Give(float* payload) {
    const uint64_t b = reinterpret_cast<Header*>(payload)[-1].block;
    in_use_[b] = 0;
    --in_use_count_;
    free_.push_back(b);
  }

  // The row of a block taken for it.
  static const char* RowOf(const float* payload) { return reinterpret_cast<const Header*>(payload)[-1].row; }

  size_t in_use() const { return in_use_count_; }

  // The payload of the block `random` picks, if in use, else null.
  float* Sample(uint64_t random) const {
    if (in_use_count_ == 0 || taken_made_ == 0) return nullptr;
    const uint64_t b = random % taken_made_;
    return in_use_[b] ? reinterpret_cast<float*>(HeaderOf(b) + 1) : nullptr;
  }

  // The payload of the first block in use from the one `random` picks, wrapping around.
  // Some block must be in use.
  float* InUseFrom(uint64_t random) const {
    uint64_t b = random % taken_made_;
    while (!in_use_[b]) b = b + 1 == taken_made_ ? 0 : b + 1;
    return reinterpret_cast<float*>(HeaderOf(b) + 1);
  }

  // No block at all (the table was cleared: the chunks' memory went back to, or is
  // recycled by, the table's allocator).
  void Reset() {
    chunks_.clear();
    std::vector<uint8_t>().swap(in_use_);
    std::vector<uint64_t>().swap(free_);
    made_ = taken_made_ = 0;
    in_use_count_ = 0;
  }

  // Bytes of the chunks and the bookkeeping.
  size_t MemoryBytes() const {
    return made_ * block_bytes_ + in_use_.capacity() + free_.capacity() * sizeof(uint64_t);
  }

 private:
  struct Header {
    const char* row;
    uint64_t block;
  };
  static constexpr uint64_t kFirstChunkBlocks = 16;
  static uint64_t ChunkFirst(size_t c) { return kFirstChunkBlocks * ((uint64_t{1} << c) - 1); }
  static size_t ChunkOf(uint64_t b) { return 63 - __builtin_clzll(b / kFirstChunkBlocks + 1); }
  Header* HeaderOf(uint64_t b) const {
    const size_t c = ChunkOf(b);
    return reinterpret_cast<Header*>(chunks_[c] + (b - ChunkFirst(c)) * block_bytes_);
  }

  size_t block_bytes_ = 0;
  std::vector<char*> chunks_;
  std::vector<uint8_t> in_use_;  // a byte per block made
  std::vector<uint64_t> free_;   // freed blocks, taken first
  uint64_t made_ = 0;            // blocks the chunks hold
  uint64_t taken_made_ = 0;      // blocks ever taken: those below are in use or on free_
  size_t in_use_count_ = 0;
};

}  // namespace tfps

#endif  // TFPS_CORE_PAYLOAD_ARENA_H_
