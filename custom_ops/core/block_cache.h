// Large output blocks kept for reuse. A freshly mapped block costs a page fault per 4 KiB
// on its first write, and for a big lookup result that costs more than the lookup itself.
// A block handed back keeps its pages, so the next result of a similar size is written at
// memory speed.
//
// A table writes rows grouped by stripe, so they land scattered over the output, and with
// 4 KiB pages a narrow row written nearly always misses the TLB. Blocks of 2 MiB or more
// therefore start on a 2 MiB boundary, and a caller may ask for a reused block to move
// onto transparent huge pages, some work on its thread per reuse that narrow rows repay
// and wide rows (one or more cache lines each) do not. A fresh block starts on small pages
// either way: on virtual machines a fresh huge page can be slow to back, and a whole block
// of them would stall its first call. benchmarks/table_ops.py measures both.
#ifndef TFPS_CORE_BLOCK_CACHE_H_
#define TFPS_CORE_BLOCK_CACHE_H_

#include <cstddef>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace tfps {

class BlockCache {
 public:
  // Keeps at most `max_idle_bytes` of returned blocks; older ones go back to the OS first.
  explicit BlockCache(size_t max_idle_bytes) : max_idle_bytes_(max_idle_bytes) {}
  ~BlockCache();
  BlockCache(const BlockCache&) = delete;
  BlockCache& operator=(const BlockCache&) = delete;

  // A page-aligned block of at least `bytes` (2 MiB-aligned from 2 MiB on), or nullptr
  // when memory is exhausted. An idle block is reused only if it wastes at most a quarter
  // of its size; with `huge_pages`, reusing one moves more of it onto them. Thread-safe.
  void* Take(size_t bytes, bool huge_pages);
  // Returns a block from Take. Thread-safe.
  void Give(void* block);
  // Whether a lent block came from the idle ones (its pages are backed) rather than from a
  // fresh mapping. Thread-safe.
  bool WasReused(const void* block) const;

  size_t IdleBytes() const;
  size_t LentBytes() const;

 private:
  struct Block {
    void* base;
    size_t size;
    size_t collapse_done;  // bytes from base on huge pages, or never to be
  };
  struct Lent {
    Block block;
    bool reused;
  };
  void EvictOldestUntilWithinLimit();  // holds mu_

  const size_t max_idle_bytes_;
  mutable std::mutex mu_;
  std::unordered_map<const void*, Lent> lent_;
  std::vector<Block> idle_;  // oldest first
  size_t idle_bytes_ = 0;
  size_t lent_bytes_ = 0;
};

}  // namespace tfps

#endif  // TFPS_CORE_BLOCK_CACHE_H_
