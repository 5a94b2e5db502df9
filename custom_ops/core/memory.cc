#include "custom_ops/core/memory.h"

#include <malloc.h>
#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>

namespace tfps {
namespace {

constexpr size_t kMmapThreshold = size_t{64} << 10;

// Small blocks from the heap, large ones straight from the OS (zero-filled, given back
// whole when freed).
void* AllocateBlock(size_t bytes, bool zeroed) {
  if (bytes == 0) bytes = 64;
  if (bytes < kMmapThreshold) {
    void* p = std::aligned_alloc(64, (bytes + 63) & ~size_t{63});
    if (p == nullptr) throw AllocationFailure(static_cast<int64_t>(bytes));
    if (zeroed) std::memset(p, 0, bytes);
    return p;
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw AllocationFailure(static_cast<int64_t>(bytes));
  return p;
}

}  // namespace

void* AllocateZeroed(size_t bytes) { return AllocateBlock(bytes, true); }

void* AllocateUninitialized(size_t bytes) { return AllocateBlock(bytes, false); }

void Deallocate(void* block, size_t bytes) {
  if (block == nullptr) return;
  if (bytes == 0) bytes = 64;
  if (bytes < kMmapThreshold) {
    std::free(block);
  } else {
    munmap(block, bytes);
  }
}

}  // namespace tfps

namespace tfps {

namespace {
constexpr size_t kRegionBytes = size_t{32} << 20;
}  // namespace

void* MapHugePageAligned(size_t bytes, bool huge_pages) {
  // Over-map by one huge page and trim, so the region starts on a 2 MiB boundary.
  const size_t span = bytes + kHugePageBytes;
  char* raw = static_cast<char*>(
      mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  if (raw == MAP_FAILED) return nullptr;
  char* aligned = reinterpret_cast<char*>(
      (reinterpret_cast<uintptr_t>(raw) + kHugePageBytes - 1) & ~(kHugePageBytes - 1));
  if (aligned > raw) munmap(raw, aligned - raw);
  const size_t tail = (raw + span) - (aligned + bytes);
  if (tail > 0) munmap(aligned + bytes, tail);
#ifdef MADV_HUGEPAGE
  if (huge_pages) madvise(aligned, bytes, MADV_HUGEPAGE);
#endif
  return aligned;
}

int CollapseIntoHugePages(void* begin, size_t bytes) {
#ifndef MADV_COLLAPSE
  constexpr int MADV_COLLAPSE = 25;
#endif
  return madvise(begin, bytes, MADV_COLLAPSE) == 0 ? 0 : errno;
}

void* RegionAllocator::Allocate(size_t bytes, bool* recycled) {
  bytes = (bytes + 63) & ~size_t{63};
  std::lock_guard<std::mutex> lock(mu_);
  // Recycled regions first, in order; a block too large for the next one skips it.
  while (current_ < regions_.size() && used_ + bytes > regions_[current_].size) {
    ++current_;
    used_ = 0;
  }
  if (current_ == regions_.size()) {
    const size_t size =
        std::max(kRegionBytes, (bytes + kHugePageBytes - 1) & ~(kHugePageBytes - 1));
    char* base = static_cast<char*>(MapHugePageAligned(size, huge_pages_));
    if (base == nullptr) throw AllocationFailure(static_cast<int64_t>(size));
    regions_.push_back(Region{base, size, 0});
    used_ = 0;
  }
  Region& region = regions_[current_];
  void* block = region.base + used_;
  used_ += bytes;
  if (recycled != nullptr) *recycled = used_ <= region.handed_out;
  region.handed_out = std::max(region.handed_out, used_);
  return block;
}

void RegionAllocator::RecycleAll() {
  std::lock_guard<std::mutex> lock(mu_);
  current_ = 0;
  used_ = 0;
}

void RegionAllocator::ReleaseAll() {
  std::lock_guard<std::mutex> lock(mu_);
  for (const Region& r : regions_) munmap(r.base, r.size);
  regions_.clear();
  current_ = 0;
  used_ = 0;
}

size_t RegionAllocator::HandedOutBytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  size_t total = 0;
  for (const Region& r : regions_) total += r.handed_out;
  return total;
}

void PopulateForWrite(void* begin, size_t bytes) {
  if (bytes == 0) return;
  constexpr uintptr_t kPage = 4096;
  char* const first = static_cast<char*>(begin);
  char* const end = first + bytes;
  // Every page holding a byte of the range, whole: each is mapped and writable, since the
  // range is, and populating a page keeps its contents, so neighbours sharing an edge page
  // lose nothing. (Leaving the edges to faults cost 1 fault per 16 pages populated.)
  char* const page_begin = reinterpret_cast<char*>(reinterpret_cast<uintptr_t>(first) & ~(kPage - 1));
  char* const page_end = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(end) + kPage - 1) & ~(kPage - 1));
#ifndef MADV_POPULATE_WRITE
  constexpr int MADV_POPULATE_WRITE = 23;
#endif
  if (madvise(page_begin, page_end - page_begin, MADV_POPULATE_WRITE) == 0) return;
  // A write that keeps the byte, so a wrong range could never clobber data.
  for (char* p = first; p < end; p = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(p) + kPage) & ~(kPage - 1))) {
    __atomic_fetch_or(p, 0, __ATOMIC_RELAXED);
  }
}

void ReleaseFreedHeapMemory() {
#if defined(__GLIBC__)
  malloc_trim(0);
#endif
}

}  // namespace tfps
