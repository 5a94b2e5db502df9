// Page-level allocation for table storage. Large blocks come straight from mmap so that a
// deleted table's memory goes back to the OS (malloc keeps freed arenas), and are advised
// to use transparent huge pages, which halves the cost of first-touching fresh rows.
#ifndef TFPS_CORE_MEMORY_H_
#define TFPS_CORE_MEMORY_H_

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <new>
#include <vector>

namespace tfps {

// Thrown when table memory cannot be had: a std::bad_alloc that says how much was asked
// for. Table calls throw it before changing anything.
class AllocationFailure : public std::bad_alloc {
 public:
  explicit AllocationFailure(int64_t bytes) : bytes_(bytes) {}
  const char* what() const noexcept override { return "tfps table: out of memory"; }
  int64_t bytes() const { return bytes_; }

 private:
  int64_t bytes_;
};

// Block of `bytes` bytes, 64-byte aligned, zero-filled or not; AllocationFailure on
// exhaustion. Freed with Deallocate(block, bytes).
void* AllocateZeroed(size_t bytes);
void* AllocateUninitialized(size_t bytes);
void Deallocate(void* block, size_t bytes);

constexpr size_t kCacheLineBytes = 64;
constexpr size_t kHugePageBytes = size_t{2} << 20;

// Zero-filled mapping of `bytes` starting on a 2 MiB boundary, so that all of its whole
// 2 MiB pieces can be transparent huge pages; with `huge_pages` it is advised to use them.
// Null when the mapping fails. Freed with munmap.
void* MapHugePageAligned(size_t bytes, bool huge_pages);

// Moves the whole huge pages [begin, begin + bytes) (2 MiB-aligned) onto transparent huge
// pages now, contents kept. Returns 0, or the error: EINVAL where the kernel cannot
// (before Linux 6.1, or huge pages turned off).
int CollapseIntoHugePages(void* begin, size_t bytes);

// Hands freed heap memory back to the OS (glibc keeps it otherwise): the small blocks of a
// destroyed table, and the temporaries of the calls that built it.
void ReleaseFreedHeapMemory();

// Backs [begin, begin + bytes) with memory before it is written. The kernel populates a
// range (MADV_POPULATE_WRITE, Linux 5.14+) faster than a fault per page; elsewhere every
// page is touched once. Contents are kept; thread-safe.
void PopulateForWrite(void* begin, size_t bytes);

// Hands out blocks carved from large regions; blocks are never freed one by one, only all
// together. A table's row chunks are small and many (a series per stripe): regions keep
// mmap calls rare and, when asked for, let rows live on transparent huge pages. Huge pages
// roughly double first-touch bandwidth, but on virtual machines a fresh huge page can
// stall for a long time while the host backs it, so they are opt-in.
class RegionAllocator {
 public:
  explicit RegionAllocator(bool huge_pages) : huge_pages_(huge_pages) {}
  ~RegionAllocator() { ReleaseAll(); }
  RegionAllocator(const RegionAllocator&) = delete;
  RegionAllocator& operator=(const RegionAllocator&) = delete;

  // A 64-byte aligned block: zeroed when it comes from a fresh region, holding old
  // contents when from a recycled one (callers write every byte they later read);
  // `recycled`, if given, says which: a recycled block's pages were handed out before, so
  // they need no populating. Thread-safe. Throws AllocationFailure when no region can be
  // mapped.
  void* Allocate(size_t bytes, bool* recycled = nullptr);
  // Unmaps every region. The caller guarantees no block is in use.
  void ReleaseAll();
  // Keeps every region mapped (and backed) and hands them out again from the start, so a
  // table refilled to about its old size, as a restore does, writes into memory it already
  // has instead of faulting in fresh pages. The caller guarantees no block is in use.
  void RecycleAll();
  // Bytes of the regions ever handed out as blocks (a recycled region counts what it held
  // before): the memory blocks can occupy, not the untouched rest of a region's mapping.
  size_t HandedOutBytes() const;

 private:
  struct Region {
    char* base;
    size_t size;
    size_t handed_out;  // the most of it ever handed out
  };
  const bool huge_pages_;
  mutable std::mutex mu_;
  std::vector<Region> regions_;
  size_t current_ = 0;  // the region blocks come from
  size_t used_ = 0;     // bytes handed out from regions_[current_]
};

}  // namespace tfps

#endif  // TFPS_CORE_MEMORY_H_
