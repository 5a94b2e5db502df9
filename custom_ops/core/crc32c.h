// CRC-32C (Castagnoli), the checksum of tfps checkpoint files: SSE4.2's crc32 instruction
// where the processor has it (checked once at run time), a table otherwise. TF-free.
#ifndef TFPS_CORE_CRC32C_H_
#define TFPS_CORE_CRC32C_H_

#include <cstddef>
#include <cstdint>

namespace tfps {

// The CRC-32C of `size` bytes at `data` following `crc` (0 to begin): Crc32c(Crc32c(0, a), b)
// is the CRC of a followed by b.
uint32_t Crc32c(uint32_t crc, const void* data, size_t size);

}  // namespace tfps

#endif  // TFPS_CORE_CRC32C_H_
