// Page-level allocation for table storage. Large blocks come straight from mmap so that a
// deleted table's memory goes back to the OS (malloc keeps freed arenas), and are advised
// to use transparent huge pages, which halves the cost of first-touching fresh rows.
#ifndef TFPS_CORE_MEMORY_H_
#define TFPS_CORE_MEMORY_H_

#include <cstddef>

namespace tfps {

// Zero-filled block of `bytes` bytes, 64-byte aligned. Aborts on exhaustion, like new.
void* AllocateZeroed(size_t bytes);
void Deallocate(void* block, size_t bytes);

// Hands freed heap memory back to the OS (glibc keeps it otherwise): the small blocks of a
// destroyed table, and the temporaries of the calls that built it.
void ReleaseFreedHeapMemory();

}  // namespace tfps

#endif  // TFPS_CORE_MEMORY_H_
