// Billion keys per second of the GPU table at dim 8 and 64, for batches of 1,048,576 keys,
// uniform and power-law (log-uniform ranks: a few hot keys, a long tail): find of present
// keys, find_or_insert of present keys and of new keys, and apply (Adagrad) of distinct
// keys (uniform) or of the batch as drawn, repeats included (power-law). The table holds
// 8M keys in 16M slots (load 0.5) and reaches 0.75 as the new keys go in, without growing.
// Prints one JSON line per figure: the median of the timed calls (7, or 3 for new keys)
// after a warm-up (CUDA events on the table's stream). Built by custom_ops/core/gpu/build.sh; needs
// CUDA only.
#include "custom_ops/core/gpu/gpu_table.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <unordered_set>
#include <vector>

namespace {

using tfps::gpu::GpuTable;
using tfps::gpu::Status;

constexpr int64_t kBatch = int64_t{1} << 20;
constexpr int64_t kResident = int64_t{1} << 23;
constexpr int64_t kCapacity = int64_t{1} << 24;

void Require(const Status& status, const char* what) {
  if (!status.ok()) {
    std::fprintf(stderr, "%s: %s\n", what, status.message().c_str());
    std::exit(1);
  }
}

template <typename T>
T* ToDevice(const std::vector<T>& host) {
  T* device = nullptr;
  if (cudaMalloc(&device, host.size() * sizeof(T)) != cudaSuccess) {
    std::fprintf(stderr, "cudaMalloc of %zu bytes failed\n", host.size() * sizeof(T));
    std::exit(1);
  }
  cudaMemcpy(device, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice);
  return device;
}

// Median time in ms of `reps` calls fn(1..reps), after an untimed fn(0).
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
    cudaEventSynchronize(stop);
    float ms = 0;
    cudaEventElapsedTime(&ms, start, stop);
    times.push_back(ms);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

void Print(const char* op, int dim, const char* keys, float ms) {
  std::printf(
      "{\"op\": \"%s\", \"dim\": %d, \"keys\": \"%s\", \"batch\": %lld, \"ms\": %.3f, "
      "\"billion_keys_per_s\": %.3f}\n",
      op, dim, keys, static_cast<long long>(kBatch), ms, kBatch / (ms * 1e6));
  std::fflush(stdout);
}

// A batch drawn from `pool`: uniform, or log-uniform ranks (power-law).
std::vector<uint64_t> Draw(const std::vector<uint64_t>& pool, bool power_law,
                           std::mt19937_64& rng) {
  std::uniform_real_distribution<double> u(0.0, 1.0);
  std::vector<uint64_t> batch(kBatch);
  for (auto& k : batch) {
    const size_t rank =
        power_law
            ? static_cast<size_t>(std::exp(u(rng) * std::log(static_cast<double>(pool.size())))) - 1
            : static_cast<size_t>(rng() % pool.size());
    k = pool[std::min(rank, pool.size() - 1)];
  }
  return batch;
}

void RunDim(int dim, cudaStream_t stream) {
  tfps::gpu::GpuTableConfig config;
  config.dim = dim;
  config.optimizer.kind = tfps::OptimizerKind::kAdagrad;
  config.initializer.kind = tfps::InitializerKind::kUniform;
  config.initializer.a = -0.05f;
  config.initializer.b = 0.05f;
  config.initial_capacity = kCapacity;
  std::unique_ptr<GpuTable> table;
  Require(GpuTable::Create(config, stream, &table), "create");
  std::mt19937_64 rng(dim);
  std::vector<uint64_t> resident(kResident);
  for (auto& k : resident) k = rng();
  uint64_t* d_resident = ToDevice(resident);
  float* d_values = nullptr;
  cudaMalloc(&d_values, kBatch * dim * sizeof(float));
  for (int64_t b = 0; b < kResident; b += kBatch) {
    Require(table->FindOrInsert(stream, d_resident + b, kBatch, d_values), "fill");
  }
  std::vector<float> grads(kBatch * dim);
  std::normal_distribution<float> normal(0.0f, 0.01f);
  for (auto& g : grads) g = normal(rng);
  float* d_grads = ToDevice(grads);
  for (bool power_law : {false, true}) {
    const char* kind = power_law ? "power-law" : "uniform";
    uint64_t* d_batch = ToDevice(Draw(resident, power_law, rng));
    Print("find", dim, kind, MedianMs(stream, [&](int) {
            Require(table->Find(stream, d_batch, kBatch, d_values, nullptr), "find");
          }));
    Print("find_or_insert_present", dim, kind, MedianMs(stream, [&](int) {
            Require(table->FindOrInsert(stream, d_batch, kBatch, d_values), "find_or_insert");
          }));
    // Uniform applies take distinct keys (a worker pushes each key's summed gradient once);
    // power-law applies keep the draw's repeats, each walked in order.
    uint64_t* d_applied = d_batch;
    if (!power_law) {
      std::vector<uint64_t> distinct(resident.begin(), resident.begin() + kBatch);
      std::shuffle(distinct.begin(), distinct.end(), rng);
      d_applied = ToDevice(distinct);
    }
    Print("apply_adagrad", dim, kind, MedianMs(stream, [&](int) {
            Require(table->ApplyGradients(stream, d_applied, kBatch, d_grads, -1), "apply");
          }));
    if (d_applied != d_batch) cudaFree(d_applied);
    cudaFree(d_batch);
  }
  // New keys: 4 batches of 1M fresh keys (one warm-up, three timed) take the load to 0.75.
  std::vector<uint64_t> fresh(4 * kBatch);
  for (auto& k : fresh) k = rng();
  uint64_t* d_fresh = ToDevice(fresh);
  Print("find_or_insert_new", dim, "uniform",
        MedianMs(
            stream,
            [&](int rep) {
              Require(table->FindOrInsert(stream, d_fresh + rep * kBatch, kBatch, d_values),
                      "find_or_insert new");
            },
            3));
  int64_t size = 0;
  Require(table->Size(stream, &size), "size");
  std::printf("{\"dim\": %d, \"size\": %lld, \"capacity\": %lld}\n", dim,
              static_cast<long long>(size), static_cast<long long>(table->capacity()));
  cudaFree(d_fresh);
  cudaFree(d_grads);
  cudaFree(d_values);
  cudaFree(d_resident);
}

}  // namespace

int main() {
  cudaDeviceProp prop;
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) {
    std::fprintf(stderr, "no CUDA device\n");
    return 1;
  }
  std::printf("{\"device\": \"%s\"}\n", prop.name);
  cudaStream_t stream;
  cudaStreamCreate(&stream);
  for (int dim : {8, 64}) RunDim(dim, stream);
  cudaStreamDestroy(stream);
  return 0;
}
