// Key mixing and the counter-based random numbers behind deterministic initial values.
// Header-only and free of TensorFlow so the CUDA kernels and the tests can share it.
#ifndef TFPS_CORE_HASHING_H_
#define TFPS_CORE_HASHING_H_

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define TFPS_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define TFPS_HOST_DEVICE inline
#endif

namespace tfps {

// MurmurHash3's 64-bit finalizer: every input bit affects every output bit, so real IDs
// (sequential, clustered, low-entropy) spread evenly over stripes and probe positions.
TFPS_HOST_DEVICE uint64_t Mix64(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33;
  return x;
}

// Hash used to place a key inside one table. Salted so that it is independent of the
// hash Python uses to route keys to parameter-server shards (otherwise every key of one
// shard would land in the same few stripes).
TFPS_HOST_DEVICE uint64_t TableHash(uint64_t key) {
  return Mix64(key ^ 0x2545f4914f6cdd1dULL);
}

// 64 random bits that depend only on (seed, key, counter).
TFPS_HOST_DEVICE uint64_t RandomBits(uint64_t seed, uint64_t key, uint64_t counter) {
  const uint64_t stream = Mix64(key + Mix64(seed ^ 0x9e3779b97f4a7c15ULL));
  return Mix64(stream + (counter + 1) * 0x9e3779b97f4a7c15ULL);
}

// Uniform in [0, 1) with 24 bits, exactly representable as a float.
TFPS_HOST_DEVICE float UniformUnit(uint64_t bits) {
  return static_cast<float>(bits >> 40) * (1.0f / 16777216.0f);
}

// Uniform in (0, 1) with 53 bits, never 0 so log() is finite.
TFPS_HOST_DEVICE double OpenUnitDouble(uint64_t bits) {
  return (static_cast<double>(bits >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

enum class InitializerKind : int { kZeros = 0, kUniform = 1, kTruncatedNormal = 2 };

struct InitializerConfig {
  InitializerKind kind = InitializerKind::kZeros;
  float a = 0.0f;  // uniform: low;  truncated normal: mean
  float b = 0.0f;  // uniform: high; truncated normal: stddev
};

// Element i of the initial vector of `key`. Truncated normal uses Box-Muller in double
// precision with rejection outside two standard deviations, so a CPU and a GPU computing
// it agree to the last bit of the float result in all but vanishingly rare cases.
TFPS_HOST_DEVICE float InitialValue(const InitializerConfig& init, uint64_t seed,
                                    uint64_t key, uint64_t i) {
  switch (init.kind) {
    case InitializerKind::kZeros:
      return 0.0f;
    case InitializerKind::kUniform: {
      const double u = UniformUnit(RandomBits(seed, key, i));
      return static_cast<float>(init.a + (static_cast<double>(init.b) - init.a) * u);
    }
    case InitializerKind::kTruncatedNormal: {
      for (uint64_t attempt = 0; attempt < 64; ++attempt) {
        const uint64_t counter = (i << 7) | (attempt << 1);
        const double u1 = OpenUnitDouble(RandomBits(seed, key, counter));
        const double u2 = OpenUnitDouble(RandomBits(seed, key, counter | 1));
        const double z = sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
        if (z >= -2.0 && z <= 2.0) {
          return static_cast<float>(init.a + static_cast<double>(init.b) * z);
        }
      }
      return init.a;  // probability of 64 rejections in a row is about 1e-86
    }
  }
  return 0.0f;
}

}  // namespace tfps

#endif  // TFPS_CORE_HASHING_H_
