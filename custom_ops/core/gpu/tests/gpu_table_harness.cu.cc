// Runs the same operations on the GPU table and the CPU table and checks they give the
// same rows: random and power-law keys, duplicates within a batch, growth far past the
// initial capacity, SGD and Adagrad updates, absent keys. Needs CUDA only, no TensorFlow.
// Prints "N passed, M failed" and exits non-zero on any failure.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <set>
#include <vector>

#include "custom_ops/core/gpu/gpu_table.h"
#include "custom_ops/core/table.h"

namespace {

int passed = 0, failed = 0;

void Check(bool ok, const char* what, const char* case_name) {
  (ok ? passed : failed)++;
  if (!ok) std::printf("FAILED: %s (%s)\n", what, case_name);
}

// Equal bit for bit, or within 1 ulp where the initializer uses log/cos (truncated normal).
bool SameRows(const std::vector<float>& a, const std::vector<float>& b, int max_ulp) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    int32_t x, y;
    std::memcpy(&x, &a[i], 4);
    std::memcpy(&y, &b[i], 4);
    if (std::abs(static_cast<int64_t>(x) - y) > max_ulp) {
      std::printf("  first difference at %zu: %.9g vs %.9g\n", i, a[i], b[i]);
      return false;
    }
  }
  return true;
}

template <typename T>
T* ToDevice(const std::vector<T>& host) {
  T* device = nullptr;
  cudaMalloc(&device, std::max<size_t>(1, host.size()) * sizeof(T));
  cudaMemcpy(device, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice);
  return device;
}

template <typename T>
std::vector<T> ToHost(const T* device, size_t n) {
  std::vector<T> host(n);
  cudaMemcpy(host.data(), device, n * sizeof(T), cudaMemcpyDeviceToHost);
  return host;
}

std::vector<uint64_t> Batch(std::mt19937_64& rng, int64_t n, bool power_law) {
  std::vector<uint64_t> keys(n);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  for (auto& k : keys) {
    if (power_law) {  // Zipf-like ranks scrambled over the 64-bit space, many duplicates
      const uint64_t rank = static_cast<uint64_t>(std::exp(u(rng) * std::log(2e6)));
      k = tfps::Mix64(rank);
    } else {
      k = rng() % 3 == 0 ? rng() % 1000 : rng();  // small IDs repeat within a batch
    }
  }
  keys[0] = 0;
  keys[1] = ~uint64_t{0};
  return keys;
}

void RunCase(const char* name, tfps::OptimizerKind opt, tfps::InitializerKind init, int dim,
             bool power_law) {
  tfps::TableConfig cpu_config;
  cpu_config.dim = dim;
  cpu_config.optimizer.kind = opt;
  cpu_config.optimizer.learning_rate = 0.25f;
  cpu_config.initializer.kind = init;
  cpu_config.initializer.a = init == tfps::InitializerKind::kUniform ? -0.5f : 0.0f;
  cpu_config.initializer.b = init == tfps::InitializerKind::kUniform ? 0.5f : 0.2f;
  cpu_config.seed = 1234;
  tfps::gpu::GpuTableConfig gpu_config;
  gpu_config.dim = dim;
  gpu_config.optimizer = cpu_config.optimizer;
  gpu_config.initializer = cpu_config.initializer;
  gpu_config.seed = cpu_config.seed;
  const int ulp = init == tfps::InitializerKind::kTruncatedNormal ? 1 : 0;

  cudaStream_t stream;
  cudaStreamCreate(&stream);
  tfps::Table cpu(cpu_config);
  tfps::gpu::GpuTable gpu(gpu_config, /*initial_capacity=*/1024, stream);
  const tfps::ParallelFor serial = tfps::SerialParallelFor();
  std::mt19937_64 rng(7);
  const int64_t n = 40000;
  for (int round = 0; round < 6; ++round) {  // ~200K keys: the table grows 8 times or more
    std::vector<uint64_t> keys = Batch(rng, n, power_law);
    uint64_t* d_keys = ToDevice(keys);
    float* d_values;
    cudaMalloc(&d_values, n * dim * sizeof(float));
    std::vector<float> cpu_values(n * dim);
    cpu.FindOrInsert(keys.data(), n, cpu_values.data(), serial);
    gpu.FindOrInsert(d_keys, n, d_values);
    cudaStreamSynchronize(stream);
    Check(SameRows(cpu_values, ToHost(d_values, n * dim), ulp), "find_or_insert rows", name);
    Check(cpu.Size() == gpu.Size(), "size after find_or_insert", name);

    std::vector<uint64_t> unique(std::set<uint64_t>(keys.begin(), keys.end()).begin(),
                                 std::set<uint64_t>(keys.begin(), keys.end()).end());
    std::shuffle(unique.begin(), unique.end(), rng);
    std::vector<float> grads(unique.size() * dim);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (auto& g : grads) g = normal(rng);
    uint64_t* d_unique = ToDevice(unique);
    float* d_grads = ToDevice(grads);
    Check(cpu.ApplyGradients(unique.data(), unique.size(), grads.data(), round, serial), "cpu apply", name);
    Check(gpu.ApplyGradients(d_unique, unique.size(), d_grads, round), "gpu apply", name);

    std::vector<uint64_t> probe = Batch(rng, n, power_law);  // mostly absent keys
    probe.insert(probe.end(), keys.begin(), keys.begin() + 1000);
    uint64_t* d_probe = ToDevice(probe);
    float* d_found;
    uint8_t* d_exists;
    cudaMalloc(&d_found, probe.size() * dim * sizeof(float));
    cudaMalloc(&d_exists, probe.size());
    std::vector<float> cpu_found(probe.size() * dim);
    std::vector<uint8_t> cpu_exists(probe.size());
    cpu.Find(probe.data(), probe.size(), cpu_found.data(), cpu_exists.data(), serial);
    gpu.Find(d_probe, probe.size(), d_found, d_exists);
    cudaStreamSynchronize(stream);
    Check(SameRows(cpu_found, ToHost(d_found, probe.size() * dim), ulp), "find rows after apply", name);
    Check(cpu_exists == ToHost(d_exists, probe.size()), "find exists mask", name);
    for (void* p : {static_cast<void*>(d_keys), static_cast<void*>(d_values), static_cast<void*>(d_unique),
                    static_cast<void*>(d_grads), static_cast<void*>(d_probe), static_cast<void*>(d_found),
                    static_cast<void*>(d_exists)}) {
      cudaFree(p);
    }
  }
  Check(gpu.capacity() > 1024 * 64, "grew past the initial capacity", name);
  std::vector<float> bad(dim, 1.0f);
  bad[dim - 1] = NAN;
  const std::vector<uint64_t> one = {42};
  uint64_t* d_one = ToDevice(one);
  float* d_bad = ToDevice(bad);
  Check(!gpu.ApplyGradients(d_one, 1, d_bad, 9), "NaN gradient rejected", name);
  const int64_t size = gpu.Size();
  uint64_t* d_all_keys;
  float *d_all_values, *d_all_slots;
  const int slot_width = dim * tfps::NumSlots(opt);
  cudaMalloc(&d_all_keys, size * sizeof(uint64_t));
  cudaMalloc(&d_all_values, size * dim * sizeof(float));
  cudaMalloc(&d_all_slots, std::max(1, static_cast<int>(size * slot_width)) * sizeof(float));
  Check(gpu.Export(d_all_keys, d_all_values, d_all_slots) == cpu.Size(), "export size", name);
  cudaStreamSynchronize(stream);
  const std::vector<uint64_t> exported = ToHost(d_all_keys, size);
  const std::vector<float> slots = ToHost(d_all_slots, size * slot_width);
  bool slots_match = true;
  for (int64_t i = 0; i < size; i += 97) {
    std::vector<float> v, s;
    int64_t meta[tfps::kNumMetadata];
    slots_match &= cpu.DebugRow(exported[i], &v, &s, meta) &&
                   SameRows(s, std::vector<float>(slots.begin() + i * slot_width,
                                                  slots.begin() + (i + 1) * slot_width), ulp);
  }
  Check(slots_match, "exported keys and optimizer slots", name);
  cudaFree(d_one);
  cudaFree(d_bad);
  cudaFree(d_all_keys);
  cudaFree(d_all_values);
  cudaFree(d_all_slots);
  cudaStreamDestroy(stream);
}

}  // namespace

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("no CUDA device\n0 passed, 1 failed\n");
    return 1;
  }
  using tfps::InitializerKind;
  using tfps::OptimizerKind;
  RunCase("sgd uniform dim 8 random", OptimizerKind::kSgd, InitializerKind::kUniform, 8, false);
  RunCase("adagrad uniform dim 64 power-law", OptimizerKind::kAdagrad, InitializerKind::kUniform, 64, true);
  RunCase("adagrad truncated-normal dim 8 power-law", OptimizerKind::kAdagrad,
          InitializerKind::kTruncatedNormal, 8, true);
  RunCase("sgd zeros dim 16 random", OptimizerKind::kSgd, InitializerKind::kZeros, 16, false);
  std::printf("%d passed, %d failed\n", passed, failed);
  return failed == 0 ? 0 : 1;
}
