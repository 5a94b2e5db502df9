// Billion keys/s of the GPU table: find and find_or_insert at dim 8 and 64, 1,048,576
// keys per call, at load factors 0.5 and 0.9. Prints JSON lines. Built by
// custom_ops/core/gpu/build.sh; needs CUDA only.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <random>
#include <vector>

#include "custom_ops/core/gpu/gpu_table.h"

namespace {

constexpr int64_t kBatch = 1 << 20;
constexpr int64_t kCapacity = int64_t{1} << 22;  // 4M slots

template <typename Fn>
float MedianMs(Fn fn, cudaStream_t stream) {
  std::vector<float> times;
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  for (int rep = 0; rep < 7; ++rep) {
    cudaEventRecord(start, stream);
    fn();
    cudaEventRecord(stop, stream);
    cudaEventSynchronize(stop);
    float ms;
    cudaEventElapsedTime(&ms, start, stop);
    times.push_back(ms);
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

}  // namespace

int main() {
  cudaDeviceProp prop;
  cudaGetDeviceProperties(&prop, 0);
  std::printf("{\"device\": \"%s\"}\n", prop.name);
  cudaStream_t stream;
  cudaStreamCreate(&stream);
  std::mt19937_64 rng(1);
  for (int dim : {8, 64}) {
    for (double load : {0.5, 0.9}) {
      tfps::gpu::GpuTableConfig config;
      config.dim = dim;
      config.initializer.kind = tfps::InitializerKind::kUniform;
      config.initializer.a = -0.05f;
      config.initializer.b = 0.05f;
      config.max_load = 0.95f;  // fixed capacity: the load factor is what is measured
      tfps::gpu::GpuTable table(config, kCapacity, stream);
      const int64_t resident = static_cast<int64_t>(load * kCapacity) - kBatch;
      std::vector<uint64_t> keys(resident + kBatch);
      for (auto& k : keys) k = rng();
      uint64_t* d_keys;
      float* d_values;
      cudaMalloc(&d_keys, keys.size() * sizeof(uint64_t));
      cudaMalloc(&d_values, kBatch * dim * sizeof(float));
      cudaMemcpy(d_keys, keys.data(), keys.size() * sizeof(uint64_t), cudaMemcpyHostToDevice);
      for (int64_t b = 0; b < resident; b += kBatch) {
        table.FindOrInsert(d_keys + b, std::min(kBatch, resident - b), d_values);
      }
      uint64_t* fresh = d_keys + resident;
      cudaEvent_t start, stop;
      cudaEventCreate(&start);
      cudaEventCreate(&stop);
      cudaEventRecord(start, stream);
      table.FindOrInsert(fresh, kBatch, d_values);  // 1M new keys: the insert path, once
      cudaEventRecord(stop, stream);
      cudaEventSynchronize(stop);
      float insert_new_ms;
      cudaEventElapsedTime(&insert_new_ms, start, stop);
      const float insert_hit_ms = MedianMs([&] { table.FindOrInsert(fresh, kBatch, d_values); }, stream);
      const float find_ms = MedianMs([&] { table.Find(d_keys, kBatch, d_values, nullptr); }, stream);
      const double load_now = static_cast<double>(table.Size()) / table.capacity();
      std::printf("{\"dim\": %d, \"load_factor\": %.3f, \"find_billion_keys_per_s\": %.3f, "
                  "\"find_or_insert_new_billion_keys_per_s\": %.3f, "
                  "\"find_or_insert_present_billion_keys_per_s\": %.3f}\n",
                  dim, load_now, kBatch / (find_ms * 1e6), kBatch / (insert_new_ms * 1e6),
                  kBatch / (insert_hit_ms * 1e6));
      cudaFree(d_keys);
      cudaFree(d_values);
    }
  }
  return 0;
}
