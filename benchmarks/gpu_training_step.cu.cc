// A training step on the GPU table at 10M and 100M rows, as the Keras layer drives it: a
// batch of 1,048,576 keys drawn power-law from the rows present, with 1% new keys, is
// reduced on the worker to its distinct keys and their counts (untimed here), then the
// table runs find_or_insert of the distinct keys with their counts (the rows the model
// gathers) and apply of one summed gradient row per distinct key, for Adagrad and Adam at
// dim 16 and, at 10M rows, dim 64. The table starts at its default size and grows by
// doubling while it is filled by find_or_insert of new keys in 1M batches. Prints one JSON
// line per table: fill rate, device memory per row (device memory in use after the fill,
// over rows; the index's own bytes per row; the bytes its values and slots need), and the
// median over 9 steps after a warm-up of each call's time, with the step's batch keys and
// distinct keys per second. Built by custom_ops/core/gpu/build.sh; needs CUDA only.
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "benchmarks/gpu_bench_support.h"

namespace tfps {
namespace gpu {
namespace bench {
namespace {

struct Case {
  int dim;
  std::string optimizer;
  int64_t rows;
};

constexpr int kSteps = 9;
constexpr double kNewShare = 0.01;

float Elapsed(cudaEvent_t from, cudaEvent_t to) {
  float ms = 0;
  cudaEventElapsedTime(&ms, from, to);
  return ms;
}

float Median(std::vector<float> x) {
  std::sort(x.begin(), x.end());
  return x[x.size() / 2];
}

void RunCase(const Case& c, cudaStream_t stream) {
  const int64_t memory_before = DeviceBytesInUse();
  GpuTableConfig config;
  config.dim = c.dim;
  config.optimizer.kind = OptimizerOf(c.optimizer);
  config.initializer.kind = InitializerKind::kUniform;
  config.initializer.a = -0.05f;
  config.initializer.b = 0.05f;
  std::unique_ptr<GpuTable> table;
  Require(GpuTable::Create(config, stream, &table), "create");
  Device<uint64_t> keys(kBatch);
  Device<float> values(kBatch * c.dim);
  const auto fill_start = std::chrono::steady_clock::now();
  for (int64_t first = 0; first < c.rows; first += kBatch) {
    const int64_t n = std::min(kBatch, c.rows - first);
    keys.Upload(PopulationKeys(first, n));
    Require(table->FindOrInsert(stream, keys.get(), n, values.get()), "fill");
  }
  const int64_t memory_used = DeviceBytesInUse() - memory_before;
  const double fill_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - fill_start).count();

  std::mt19937_64 rng(c.rows + c.dim);
  const Device<float> grads(NormalFloats(kBatch * c.dim, rng));
  cudaEvent_t start, found, applied;
  cudaEventCreate(&start);
  cudaEventCreate(&found);
  cudaEventCreate(&applied);
  Device<int64_t> counts(kBatch);
  std::vector<float> find_ms, apply_ms;
  int64_t population = c.rows, distinct_total = 0;
  for (int step = 0; step <= kSteps; ++step) {
    std::vector<uint64_t> batch = Draw(population, kBatch, /*power_law=*/true, rng);
    const int64_t fresh = static_cast<int64_t>(kNewShare * kBatch);
    for (int64_t i = 0; i < fresh; ++i) batch[rng() % kBatch] = PopulationKey(population + i);
    population += fresh;
    std::vector<uint64_t> distinct;
    std::vector<int64_t> occurrences;
    DistinctWithCounts(batch, &distinct, &occurrences);
    const int64_t n = static_cast<int64_t>(distinct.size());
    distinct_total += n;
    keys.Upload(distinct);
    counts.Upload(occurrences);
    cudaEventRecord(start, stream);
    Require(table->FindOrInsert(stream, keys.get(), n, values.get(), counts.get()),
            "step find_or_insert");
    cudaEventRecord(found, stream);
    Require(table->ApplyGradients(stream, keys.get(), n, grads.get(), -1), "step apply");
    cudaEventRecord(applied, stream);
    RequireCuda(cudaEventSynchronize(applied), "step");
    if (step == 0) continue;  // warm-up
    find_ms.push_back(Elapsed(start, found));
    apply_ms.push_back(Elapsed(found, applied));
  }
  cudaEventDestroy(start);
  cudaEventDestroy(found);
  cudaEventDestroy(applied);
  int64_t size = 0;
  Require(table->Size(stream, &size), "size");
  if (size < c.rows || size > population) {
    std::fprintf(stderr, "the table holds %lld keys, not between the %lld filled and %lld drawn\n",
                 static_cast<long long>(size), static_cast<long long>(c.rows),
                 static_cast<long long>(population));
    std::exit(1);
  }
  const float find = Median(find_ms), apply = Median(apply_ms);
  const double ideal_row_bytes = 4.0 * c.dim * (1 + table->num_slots());
  // What the index allocates per slot (gpu_table.cu.cc AllocateArrays): a control byte,
  // the key, values and slots, count and last step, Adam's step.
  const double slot_bytes =
      1 + 8 + ideal_row_bytes + 8 + (config.optimizer.kind == OptimizerKind::kAdam ? 4 : 0);
  std::printf(
      "{\"dim\": %d, \"optimizer\": \"%s\", \"rows\": %lld, \"capacity\": %lld, "
      "\"fill_million_keys_per_s\": %.1f, \"device_bytes_per_row\": %.1f, "
      "\"index_bytes_per_row\": %.1f, \"value_and_slot_bytes_per_row\": %.0f, "
      "\"batch\": %lld, \"distinct_keys_per_batch\": %lld, \"find_or_insert_ms\": %.3f, "
      "\"apply_ms\": %.3f, \"step_ms\": %.3f, \"batch_million_keys_per_s\": %.1f, "
      "\"distinct_million_keys_per_s\": %.1f}\n",
      c.dim, c.optimizer.c_str(), static_cast<long long>(size),
      static_cast<long long>(table->capacity()), c.rows / fill_s / 1e6,
      static_cast<double>(memory_used) / c.rows,
      slot_bytes * table->capacity() / size, ideal_row_bytes, static_cast<long long>(kBatch),
      static_cast<long long>(distinct_total / (kSteps + 1)), find, apply, find + apply,
      kBatch / ((find + apply) * 1e-3) / 1e6,
      distinct_total / (kSteps + 1.0) / ((find + apply) * 1e-3) / 1e6);
  std::fflush(stdout);
}

}  // namespace
}  // namespace bench
}  // namespace gpu
}  // namespace tfps

int main() {
  using namespace tfps::gpu::bench;
  const cudaDeviceProp prop = RequireDevice();
  std::printf("{\"device\": \"%s\", \"memory_gib\": %.1f}\n", prop.name,
              prop.totalGlobalMem / double(1 << 30));
  cudaStream_t stream;
  cudaStreamCreate(&stream);
  constexpr int64_t kMillion = 1000000;
  for (const Case& c : {Case{16, "adagrad", 10 * kMillion}, Case{16, "adam", 10 * kMillion},
                        Case{64, "adagrad", 10 * kMillion}, Case{64, "adam", 10 * kMillion},
                        Case{16, "adagrad", 100 * kMillion}, Case{16, "adam", 100 * kMillion}})
    RunCase(c, stream);
  cudaStreamDestroy(stream);
  return 0;
}
