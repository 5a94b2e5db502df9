#include "custom_ops/core/crc32c.h"

#include <algorithm>
#include <array>

namespace tfps {
namespace {

constexpr uint32_t kPolynomial = 0x82f63b78;  // reflected Castagnoli polynomial

std::array<uint32_t, 256> MakeTable() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int bit = 0; bit < 8; ++bit) c = (c >> 1) ^ ((c & 1) ? kPolynomial : 0);
    table[i] = c;
  }
  return table;
}

uint32_t SoftwareCrc(uint32_t crc, const uint8_t* p, size_t size) {
  static const std::array<uint32_t, 256> table = MakeTable();
  for (size_t i = 0; i < size; ++i) crc = table[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
  return crc;
}

// Multiplies a CRC register by a 32x32 matrix over GF(2): bit i of v selects column i.
uint32_t Gf2Times(const uint32_t* matrix, uint32_t v) {
  uint32_t out = 0;
  for (int i = 0; v != 0; ++i, v >>= 1) {
    if (v & 1) out ^= matrix[i];
  }
  return out;
}

// The operator that advances a raw CRC register over `bytes` zero bytes, built by squaring
// the one-zero-bit operator (zlib's crc32_combine does the same for its polynomial).
struct ZerosOperator {
  explicit ZerosOperator(size_t bytes) {
    uint32_t odd[32], even[32];
    odd[0] = kPolynomial;
    for (int i = 1; i < 32; ++i) odd[i] = uint32_t{1} << (i - 1);
    Square(odd, even);  // two zero bits
    Square(even, odd);  // four
    Square(odd, even);  // eight: one zero byte, in even
    bool have = false;
    for (size_t n = bytes; n != 0; n >>= 1) {
      if (n & 1) {
        if (!have) {
          std::copy(even, even + 32, matrix);
          have = true;
        } else {
          uint32_t product[32];
          for (int i = 0; i < 32; ++i) product[i] = Gf2Times(even, matrix[i]);
          std::copy(product, product + 32, matrix);
        }
      }
      uint32_t squared[32];
      Square(even, squared);
      std::copy(squared, squared + 32, even);
    }
  }
  static void Square(const uint32_t* m, uint32_t* out) {
    for (int i = 0; i < 32; ++i) out[i] = Gf2Times(m, m[i]);
  }
  uint32_t matrix[32];
};

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) uint32_t HardwareCrcOneStream(uint32_t crc, const uint8_t* p,
                                                                size_t size) {
  uint64_t c = crc;
  for (; size >= 8; size -= 8, p += 8) {
    uint64_t word;
    __builtin_memcpy(&word, p, 8);
    c = __builtin_ia32_crc32di(c, word);
  }
  uint32_t c32 = static_cast<uint32_t>(c);
  for (; size > 0; --size, ++p) c32 = __builtin_ia32_crc32qi(c32, *p);
  return c32;
}

// The crc32 instruction takes 3 cycles but starts one per cycle, so one dependent chain
// uses a third of it. Blocks of 3 * kStreamBytes run as three independent chains, joined
// by advancing the first two over the bytes after them (a fixed operator per block size).
constexpr size_t kStreamBytes = 4096;

__attribute__((target("sse4.2"))) uint32_t HardwareCrc(uint32_t crc, const uint8_t* p,
                                                       size_t size) {
  static const ZerosOperator advance(kStreamBytes);
  for (; size >= 3 * kStreamBytes; size -= 3 * kStreamBytes, p += 3 * kStreamBytes) {
    uint64_t c0 = crc, c1 = 0, c2 = 0;
    for (size_t i = 0; i < kStreamBytes; i += 8) {
      uint64_t w0, w1, w2;
      __builtin_memcpy(&w0, p + i, 8);
      __builtin_memcpy(&w1, p + kStreamBytes + i, 8);
      __builtin_memcpy(&w2, p + 2 * kStreamBytes + i, 8);
      c0 = __builtin_ia32_crc32di(c0, w0);
      c1 = __builtin_ia32_crc32di(c1, w1);
      c2 = __builtin_ia32_crc32di(c2, w2);
    }
    crc = Gf2Times(advance.matrix, Gf2Times(advance.matrix, static_cast<uint32_t>(c0)) ^
                                       static_cast<uint32_t>(c1)) ^
          static_cast<uint32_t>(c2);
  }
  return HardwareCrcOneStream(crc, p, size);
}

bool HasHardwareCrc() {
  static const bool has = __builtin_cpu_supports("sse4.2");
  return has;
}
#endif

}  // namespace

uint32_t Crc32c(uint32_t crc, const void* data, size_t size) {
  const uint8_t* p = static_cast<const uint8_t*>(data);
  crc = ~crc;
#if defined(__x86_64__)
  crc = HasHardwareCrc() ? HardwareCrc(crc, p, size) : SoftwareCrc(crc, p, size);
#else
  crc = SoftwareCrc(crc, p, size);
#endif
  return ~crc;
}

}  // namespace tfps
