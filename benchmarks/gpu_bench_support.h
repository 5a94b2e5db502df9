// What the GPU table benchmarks share: failing loudly, device copies, timing by CUDA
// events (median of repeated calls after an untimed one), keys that are distinct by
// construction (Mix64 of an index, so no host set is needed even for 100M keys), power-law
// draws over them, a batch reduced to its distinct keys, and the device's memory
// bandwidth, nominal and as a device-to-device copy reaches it. Needs CUDA only.
#ifndef TFPS_BENCHMARKS_GPU_BENCH_SUPPORT_H_
#define TFPS_BENCHMARKS_GPU_BENCH_SUPPORT_H_

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "custom_ops/core/gpu/gpu_table.h"
#include "custom_ops/core/hashing.h"
#include "custom_ops/core/table.h"

namespace tfps {
namespace gpu {
namespace bench {

constexpr int64_t kBatch = int64_t{1} << 20;

inline void Require(const Status& status, const char* what) {
  if (!status.ok()) {
    std::fprintf(stderr, "%s: %s\n", what, status.message().c_str());
    std::exit(1);
  }
}

inline void RequireCuda(cudaError_t error, const char* what) {
  if (error != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(error));
    std::exit(1);
  }
}

// A device array of n elements, freed with the object.
template <typename T>
class Device {
 public:
  explicit Device(size_t n) : n_(n) {
    RequireCuda(cudaMalloc(&ptr_, std::max<size_t>(n, 1) * sizeof(T)), "cudaMalloc");
  }
  explicit Device(const std::vector<T>& host) : Device(host.size()) { Upload(host); }
  ~Device() { cudaFree(ptr_); }
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;
  void Upload(const std::vector<T>& host) {
    RequireCuda(cudaMemcpy(ptr_, host.data(), std::min(n_, host.size()) * sizeof(T),
                           cudaMemcpyHostToDevice),
                "upload");
  }
  T* get() const { return ptr_; }

 private:
  T* ptr_ = nullptr;
  size_t n_;
};

// The device's properties; exits when there is no CUDA device.
inline cudaDeviceProp RequireDevice() {
  cudaDeviceProp prop;
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) {
    std::fprintf(stderr, "no CUDA device\n");
    std::exit(1);
  }
  return prop;
}

// Median time in ms of `reps` calls fn(1..reps) on `stream`, after an untimed fn(0).
template <typename Fn>
float MedianMs(cudaStream_t stream, Fn&& fn, int reps = 7) {
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  fn(0);
  std::vector<float> times;
  for (int rep = 1; rep <= reps; ++rep) {
    cudaEventRecord(start, stream);
    fn(rep);
    cudaEventRecord(stop, stream);
    RequireCuda(cudaEventSynchronize(stop), "timed call");
    float ms = 0;
    cudaEventElapsedTime(&ms, start, stop);
    times.push_back(ms);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

// The i-th key of a population: distinct for distinct i, spread over the 64-bit space.
inline uint64_t PopulationKey(uint64_t i) { return Mix64(i + 0x51ed2701u); }

inline std::vector<uint64_t> PopulationKeys(uint64_t first, int64_t n) {
  std::vector<uint64_t> keys(n);
  for (int64_t i = 0; i < n; ++i) keys[i] = PopulationKey(first + i);
  return keys;
}

// n keys drawn from the first `population` keys: uniformly, or with log-uniform ranks
// (power-law: a few hot keys, a long tail, many repeats).
inline std::vector<uint64_t> Draw(int64_t population, int64_t n, bool power_law,
                                  std::mt19937_64& rng) {
  std::uniform_real_distribution<double> u(0.0, 1.0);
  const double log_population = std::log(static_cast<double>(population));
  std::vector<uint64_t> keys(n);
  for (auto& k : keys) {
    const int64_t rank = power_law ? static_cast<int64_t>(std::exp(u(rng) * log_population)) - 1
                                   : static_cast<int64_t>(rng() % population);
    k = PopulationKey(std::min(std::max<int64_t>(rank, 0), population - 1));
  }
  return keys;
}

// The distinct keys of a batch and how often each occurs, as a worker reduces its batch
// before it reaches the table.
inline void DistinctWithCounts(std::vector<uint64_t> keys, std::vector<uint64_t>* distinct,
                               std::vector<int64_t>* counts) {
  std::sort(keys.begin(), keys.end());
  distinct->clear();
  counts->clear();
  for (size_t i = 0; i < keys.size(); ++i) {
    if (i == 0 || keys[i] != keys[i - 1]) {
      distinct->push_back(keys[i]);
      counts->push_back(0);
    }
    ++counts->back();
  }
}

inline std::vector<float> NormalFloats(size_t n, std::mt19937_64& rng, float stddev = 0.01f) {
  std::normal_distribution<float> normal(0.0f, stddev);
  std::vector<float> x(n);
  for (float& v : x) v = normal(rng);
  return x;
}

struct Bandwidth {
  double nominal_bytes_per_s;  // memory clock x bus width x 2 (double data rate)
  double copy_bytes_per_s;     // bytes read plus bytes written by a 2 GiB device copy
};

inline Bandwidth MeasureBandwidth(cudaStream_t stream) {
  int clock_khz = 0, bus_bits = 0;
  cudaDeviceGetAttribute(&clock_khz, cudaDevAttrMemoryClockRate, 0);
  cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, 0);
  const size_t bytes = size_t{2} << 30;
  Device<char> from(bytes), to(bytes);
  cudaMemsetAsync(from.get(), 1, bytes, stream);
  const float ms = MedianMs(stream, [&](int) {
    cudaMemcpyAsync(to.get(), from.get(), bytes, cudaMemcpyDeviceToDevice, stream);
  });
  return Bandwidth{2.0 * clock_khz * 1e3 * bus_bits / 8, 2.0 * bytes / (ms * 1e-3)};
}

// Device memory in use (total minus free), after the device has finished its work and
// the stream-ordered allocator's pool has handed back what it holds unused.
inline int64_t DeviceBytesInUse() {
  RequireCuda(cudaDeviceSynchronize(), "synchronize");
  cudaMemPool_t pool;
  RequireCuda(cudaDeviceGetDefaultMemPool(&pool, 0), "the default memory pool");
  RequireCuda(cudaMemPoolTrimTo(pool, 0), "trimming the memory pool");
  size_t free_bytes = 0, total_bytes = 0;
  RequireCuda(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo");
  return static_cast<int64_t>(total_bytes - free_bytes);
}

// The optimizer of a name the core parses ("adagrad", "adam", ...); exits on an unknown one.
inline OptimizerKind OptimizerOf(const std::string& name) {
  OptimizerKind kind;
  if (!ParseOptimizerKind(name, &kind)) {
    std::fprintf(stderr, "unknown optimizer %s\n", name.c_str());
    std::exit(1);
  }
  return kind;
}

}  // namespace bench
}  // namespace gpu
}  // namespace tfps

#endif  // TFPS_BENCHMARKS_GPU_BENCH_SUPPORT_H_
