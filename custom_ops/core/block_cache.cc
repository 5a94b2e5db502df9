#include "custom_ops/core/block_cache.h"

#include <sys/mman.h>

#include <cerrno>
#include <chrono>

#include "custom_ops/core/memory.h"

namespace tfps {
namespace {

constexpr size_t kGranule = size_t{64} << 10;
// A reuse moves pieces onto huge pages for about this long, at least one piece: a bare
// machine collapses a 2 MiB piece at once, a virtual machine may take several ms.
constexpr auto kCollapseTimePerReuse = std::chrono::milliseconds(3);

// Moves the block's next whole 2 MiB pieces after `done` bytes onto huge pages, contents
// kept, for about kCollapseTimePerReuse, and returns how far the block is done. A piece
// that fails is not tried again; a kernel that cannot collapse at all (before Linux 6.1,
// or huge pages turned off) finishes the whole block.
size_t CollapseMore(char* base, size_t size, size_t done) {
  const size_t whole = size / kHugePageBytes * kHugePageBytes;
  if (done >= whole) return size;
  const auto deadline = std::chrono::steady_clock::now() + kCollapseTimePerReuse;
  while (done < whole) {
    if (CollapseIntoHugePages(base + done, kHugePageBytes) == EINVAL) return size;
    done += kHugePageBytes;
    if (std::chrono::steady_clock::now() >= deadline) break;
  }
  return done < whole ? done : size;
}

}  // namespace

BlockCache::~BlockCache() {
  for (const Block& b : idle_) munmap(b.base, b.size);
}

void* BlockCache::Take(size_t bytes, bool huge_pages) {
  const size_t size = (bytes + kGranule - 1) / kGranule * kGranule;
  {
    std::unique_lock<std::mutex> lock(mu_);
    size_t best = idle_.size();
    for (size_t i = 0; i < idle_.size(); ++i) {
      const size_t s = idle_[i].size;
      if (s >= size && s - size <= s / 4 && (best == idle_.size() || s < idle_[best].size)) best = i;
    }
    if (best != idle_.size()) {
      const Block b = idle_[best];
      idle_.erase(idle_.begin() + best);
      idle_bytes_ -= b.size;
      lent_.emplace(b.base, Lent{b, true});
      lent_bytes_ += b.size;
      if (huge_pages && b.collapse_done < b.size) {
        lock.unlock();
        // Outside the lock: the block is this caller's until it gives it back.
        const size_t done = CollapseMore(static_cast<char*>(b.base), b.size, b.collapse_done);
        lock.lock();
        lent_.find(b.base)->second.block.collapse_done = done;
      }
      return b.base;
    }
  }
  // On small pages at first, 2 MiB-aligned so that reuses can collapse it (see the header).
  void* base = MapHugePageAligned(size, /*huge_pages=*/false);
  if (base == nullptr) return nullptr;
  std::lock_guard<std::mutex> lock(mu_);
  lent_.emplace(base, Lent{Block{base, size, 0}, false});
  lent_bytes_ += size;
  return base;
}

void BlockCache::Give(void* block) {
  if (block == nullptr) return;
  std::lock_guard<std::mutex> lock(mu_);
  const auto it = lent_.find(block);
  if (it == lent_.end()) return;  // not ours: nothing to give back
  const Block b = it->second.block;
  lent_.erase(it);
  lent_bytes_ -= b.size;
  idle_.push_back(b);
  idle_bytes_ += b.size;
  EvictOldestUntilWithinLimit();
}

void BlockCache::EvictOldestUntilWithinLimit() {
  size_t evicted = 0;
  while (evicted < idle_.size() && idle_bytes_ > max_idle_bytes_) {
    munmap(idle_[evicted].base, idle_[evicted].size);
    idle_bytes_ -= idle_[evicted].size;
    ++evicted;
  }
  idle_.erase(idle_.begin(), idle_.begin() + evicted);
}

bool BlockCache::WasReused(const void* block) const {
  std::lock_guard<std::mutex> lock(mu_);
  const auto it = lent_.find(block);
  return it != lent_.end() && it->second.reused;
}

size_t BlockCache::IdleBytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return idle_bytes_;
}

size_t BlockCache::LentBytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return lent_bytes_;
}

}  // namespace tfps
