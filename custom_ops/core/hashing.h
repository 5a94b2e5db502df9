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

// Key of a feature's ID inside a table shared by several features: a bijection for each
// namespace, so IDs of one feature never collide, and different namespaces scatter the
// same ID to unrelated keys. Namespace 0 leaves keys unchanged.
TFPS_HOST_DEVICE uint64_t NamespacedKey(uint64_t key, uint64_t ns) {
  return ns == 0 ? key : Mix64(key ^ Mix64(ns * 0x9e3779b97f4a7c15ULL + 0x7f4a7c15ULL));
}

// Parameter-server shard of a key: well mixed (real IDs are far from uniform) and salted
// apart from TableHash, so the keys of one shard still spread over all of its stripes.
TFPS_HOST_DEVICE uint32_t ShardOf(uint64_t key, uint32_t num_shards) {
  const uint64_t h = Mix64(key ^ 0x6a09e667f3bcc909ULL);
  return static_cast<uint32_t>(((h >> 32) * num_shards) >> 32);
}

// The random stream of one key: 64 random bits per counter value, depending only on
// (seed, key, counter). Computing the stream once per row keeps the per-element cost at
// one mix.
TFPS_HOST_DEVICE uint64_t KeyStream(uint64_t seed, uint64_t key) {
  return Mix64(key + Mix64(seed ^ 0x9e3779b97f4a7c15ULL));
}

TFPS_HOST_DEVICE uint64_t StreamBits(uint64_t stream, uint64_t counter) {
  return Mix64(stream + (counter + 1) * 0x9e3779b97f4a7c15ULL);
}

TFPS_HOST_DEVICE uint64_t RandomBits(uint64_t seed, uint64_t key, uint64_t counter) {
  return StreamBits(KeyStream(seed, key), counter);
}

// MurmurHash3's 32-bit finalizer.
TFPS_HOST_DEVICE uint32_t Mix32(uint32_t h) {
  h ^= h >> 16;
  h *= 0x85ebca6bu;
  h ^= h >> 13;
  h *= 0xc2b2ae35u;
  h ^= h >> 16;
  return h;
}

// 32 random bits for element i of a key's stream: one 32-bit mix per element, which
// vectorizes, where a 64-bit mix per element would not.
TFPS_HOST_DEVICE uint32_t StreamBits32(uint64_t stream, uint32_t i) {
  return Mix32((static_cast<uint32_t>(stream) + i * 0x9e3779b9u) ^ static_cast<uint32_t>(stream >> 32));
}

// Uniform in [0, 1) with 24 bits, exactly representable as a float.
TFPS_HOST_DEVICE float UniformUnit32(uint32_t bits) {
  return static_cast<float>(bits >> 8) * (1.0f / 16777216.0f);
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

TFPS_HOST_DEVICE float UniformSpan(const InitializerConfig& init) { return init.b - init.a; }

// a + b rounded once, never fused with a preceding multiply.
TFPS_HOST_DEVICE float AddNoContract(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;  // host builds use -ffp-contract=off
#endif
}

// Element i of the initial vector of the key whose stream is `stream`. Truncated normal
// uses Box-Muller in double precision with rejection outside two standard deviations, so
// a CPU and a GPU computing it agree to the last bit of the float result in all but
// vanishingly rare cases.
TFPS_HOST_DEVICE float InitialValueFromStream(const InitializerConfig& init, uint64_t stream,
                                              uint64_t i) {
  switch (init.kind) {
    case InitializerKind::kZeros:
      return 0.0f;
    case InitializerKind::kUniform: {
      // low + (high - low) * u with two separately rounded float operations (no fused
      // multiply-add), so every compiler and the GPU give the same bits.
      const float product = UniformSpan(init) * UniformUnit32(StreamBits32(stream, static_cast<uint32_t>(i)));
      return AddNoContract(init.a, product);
    }
    case InitializerKind::kTruncatedNormal: {
      for (uint64_t attempt = 0; attempt < 64; ++attempt) {
        const uint64_t counter = (i << 7) | (attempt << 1);
        const double u1 = OpenUnitDouble(StreamBits(stream, counter));
        const double u2 = OpenUnitDouble(StreamBits(stream, counter | 1));
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

TFPS_HOST_DEVICE float InitialValue(const InitializerConfig& init, uint64_t seed,
                                    uint64_t key, uint64_t i) {
  return InitialValueFromStream(init, KeyStream(seed, key), i);
}

// The whole initial vector of `key` into out[0..dim).
TFPS_HOST_DEVICE void InitialRow(const InitializerConfig& init, uint64_t seed, uint64_t key,
                                 int dim, float* out) {
  if (init.kind == InitializerKind::kZeros) {
    for (int i = 0; i < dim; ++i) out[i] = 0.0f;
    return;
  }
  const uint64_t stream = KeyStream(seed, key);
  if (init.kind == InitializerKind::kUniform) {
    const float low = init.a, span = UniformSpan(init);
    for (int i = 0; i < dim; ++i) {
      out[i] = AddNoContract(low, span * UniformUnit32(StreamBits32(stream, static_cast<uint32_t>(i))));
    }
    return;
  }
  for (int i = 0; i < dim; ++i) out[i] = InitialValueFromStream(init, stream, static_cast<uint64_t>(i));
}

}  // namespace tfps

#endif  // TFPS_CORE_HASHING_H_
