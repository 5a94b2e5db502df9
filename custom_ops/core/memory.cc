#include "custom_ops/core/memory.h"

#include <malloc.h>
#include <sys/mman.h>

#include <cstdlib>
#include <cstring>
#include <new>

namespace tfps {
namespace {

constexpr size_t kMmapThreshold = size_t{64} << 10;
constexpr size_t kHugePage = size_t{2} << 20;

}  // namespace

void* AllocateZeroed(size_t bytes) {
  if (bytes == 0) bytes = 64;
  if (bytes < kMmapThreshold) {
    void* p = std::aligned_alloc(64, (bytes + 63) & ~size_t{63});
    if (p == nullptr) throw std::bad_alloc();
    std::memset(p, 0, bytes);
    return p;
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();
#ifdef MADV_HUGEPAGE
  if (bytes >= kHugePage) madvise(p, bytes, MADV_HUGEPAGE);
#endif
  return p;  // anonymous mappings are zero-filled
}

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

void ReleaseFreedHeapMemory() {
#if defined(__GLIBC__)
  malloc_trim(0);
#endif
}

}  // namespace tfps
