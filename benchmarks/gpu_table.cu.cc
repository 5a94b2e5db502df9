// Keys per second of the GPU table's operations at load factors 0.5 and 0.9, for batches
// of 1,048,576 keys, at dim 8 and 64 with Adagrad and Adam: find (uniform and power-law
// draws of present keys), find_or_insert of present keys, insert of present keys (insert
// or assign), insert of new keys (the fill's last batches before each load), and apply of
// distinct keys (uniform) or of the batch as drawn, repeats included (power-law). The
// index has 2^25 slots with max_load 0.95, so a 1M-key writing call at load 0.9 still fits
// without a rebuild. Each figure is the median of 7 timed calls after a warm-up (CUDA
// events on the table's stream); insert of new keys takes the median of the fill's last 3
// batches. Beside keys/s each line gives the bytes a call must move at least (the model
// below) over its time, as a share of the device's nominal bandwidth and of what a
// device-to-device copy reaches. One JSON line per figure. Built by
// custom_ops/core/gpu/build.sh; needs CUDA only.
//
// Bytes per key, at least: the key (8), its bucket's 16 control bytes and the key it
// matches (8); then per op: find reads the row and writes it out (8 dim); find_or_insert
// also updates count and last step (16); insert reads the value and writes the row (8 dim),
// a new key also its slots and metadata; apply reads the gradient (4 dim) and reads and
// writes the row and its slots (8 dim (1 + slots)) and the last step (4, Adam also its step 8).
#include <cuda_runtime.h>

#include <cstdio>
#include <string>
#include <vector>

#include "benchmarks/gpu_bench_support.h"

namespace tfps {
namespace gpu {
namespace bench {
namespace {

constexpr int64_t kCapacity = int64_t{1} << 25;

struct Case {
  int dim;
  std::string optimizer;
};

double ProbeBytes() { return 8 + 16 + 8; }
double FindBytes(int dim) { return ProbeBytes() + 8.0 * dim; }
double InsertBytes(int dim, int slots, bool fresh) {
  return ProbeBytes() + 8.0 * dim + (fresh ? 4.0 * dim * slots + 12 : 0);
}
double ApplyBytes(int dim, int slots, bool adam) {
  return ProbeBytes() + 4.0 * dim + 8.0 * dim * (1 + slots) + 4 + (adam ? 8 : 0);
}

class Reporter {
 public:
  Reporter(const Case& c, const Bandwidth& bandwidth) : case_(c), bandwidth_(bandwidth) {}
  void Print(const char* op, const char* keys, double load, float ms, double bytes_per_key) const {
    const double seconds = ms * 1e-3, bytes_per_s = kBatch * bytes_per_key / seconds;
    std::printf(
        "{\"op\": \"%s\", \"dim\": %d, \"optimizer\": \"%s\", \"keys\": \"%s\", \"load\": %.2f, "
        "\"batch\": %lld, \"ms\": %.3f, \"billion_keys_per_s\": %.3f, \"bytes_per_key\": %.0f, "
        "\"share_of_nominal_bandwidth\": %.3f, \"share_of_copy_bandwidth\": %.3f}\n",
        op, case_.dim, case_.optimizer.c_str(), keys, load, static_cast<long long>(kBatch), ms,
        kBatch / (seconds * 1e9), bytes_per_key, bytes_per_s / bandwidth_.nominal_bytes_per_s,
        bytes_per_s / bandwidth_.copy_bytes_per_s);
    std::fflush(stdout);
  }

 private:
  Case case_;
  Bandwidth bandwidth_;
};

// Inserts new keys (population indices [*filled, target)) in batches; returns the median
// time of the last three batches.
float FillTo(GpuTable& table, cudaStream_t stream, int64_t* filled, int64_t target,
             Device<uint64_t>& keys, Device<float>& values) {
  std::vector<float> times;
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  while (*filled < target) {
    const int64_t n = std::min(kBatch, target - *filled);
    keys.Upload(PopulationKeys(*filled, n));
    cudaEventRecord(start, stream);
    Require(table.Insert(stream, keys.get(), n, values.get()), "insert new keys");
    cudaEventRecord(stop, stream);
    RequireCuda(cudaEventSynchronize(stop), "fill");
    float ms = 0;
    cudaEventElapsedTime(&ms, start, stop);
    if (n == kBatch) times.push_back(ms);
    *filled += n;
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  if (times.size() > 3) times.erase(times.begin(), times.end() - 3);
  std::sort(times.begin(), times.end());
  return times.empty() ? 0.0f : times[times.size() / 2];
}

void RunCase(const Case& c, const Bandwidth& bandwidth, cudaStream_t stream) {
  GpuTableConfig config;
  config.dim = c.dim;
  config.optimizer.kind = OptimizerOf(c.optimizer);
  config.initializer.kind = InitializerKind::kUniform;
  config.initializer.a = -0.05f;
  config.initializer.b = 0.05f;
  config.initial_capacity = kCapacity;
  config.max_load = 0.95f;
  std::unique_ptr<GpuTable> table;
  Require(GpuTable::Create(config, stream, &table), "create");
  const int slots = table->num_slots();
  const bool adam = config.optimizer.kind == OptimizerKind::kAdam;
  const Reporter report(c, bandwidth);
  std::mt19937_64 rng(c.dim * 31 + slots);
  Device<uint64_t> batch(kBatch);
  Device<float> values(NormalFloats(kBatch * c.dim, rng, 0.05f));
  const Device<float> grads(NormalFloats(kBatch * c.dim, rng));
  int64_t filled = 0;
  for (double load : {0.5, 0.9}) {
    const int64_t target = static_cast<int64_t>(load * kCapacity);
    report.Print("insert_new", "uniform", load,
                 FillTo(*table, stream, &filled, target, batch, values),
                 InsertBytes(c.dim, slots, true));
    for (bool power_law : {false, true}) {
      const char* kind = power_law ? "power-law" : "uniform";
      batch.Upload(Draw(filled, kBatch, power_law, rng));
      report.Print("find", kind, load, MedianMs(stream, [&](int) {
                     Require(table->Find(stream, batch.get(), kBatch, values.get(), nullptr),
                             "find");
                   }),
                   FindBytes(c.dim));
      report.Print("find_or_insert_present", kind, load, MedianMs(stream, [&](int) {
                     Require(table->FindOrInsert(stream, batch.get(), kBatch, values.get()),
                             "find_or_insert");
                   }),
                   FindBytes(c.dim) + 16);
      if (!power_law) {
        // Distinct present keys, as a worker pushes each key once: rank order shuffled.
        std::vector<uint64_t> distinct = PopulationKeys(filled - kBatch, kBatch);
        std::shuffle(distinct.begin(), distinct.end(), rng);
        batch.Upload(distinct);
        report.Print("insert_present", kind, load, MedianMs(stream, [&](int) {
                       Require(table->Insert(stream, batch.get(), kBatch, values.get()),
                               "insert present");
                     }),
                     InsertBytes(c.dim, slots, false));
      }
      report.Print(("apply_" + c.optimizer).c_str(), kind, load, MedianMs(stream, [&](int) {
                     Require(table->ApplyGradients(stream, batch.get(), kBatch, grads.get(), -1),
                             "apply");
                   }),
                   ApplyBytes(c.dim, slots, adam));
    }
  }
  int64_t size = 0;
  Require(table->Size(stream, &size), "size");
  if (size != filled) {
    std::fprintf(stderr, "the table holds %lld keys, %lld were inserted\n",
                 static_cast<long long>(size), static_cast<long long>(filled));
    std::exit(1);
  }
  std::printf("{\"dim\": %d, \"optimizer\": \"%s\", \"size\": %lld, \"capacity\": %lld}\n", c.dim,
              c.optimizer.c_str(), static_cast<long long>(size),
              static_cast<long long>(table->capacity()));
}

}  // namespace
}  // namespace bench
}  // namespace gpu
}  // namespace tfps

int main() {
  using namespace tfps::gpu::bench;
  const cudaDeviceProp prop = RequireDevice();
  cudaStream_t stream;
  cudaStreamCreate(&stream);
  const Bandwidth bandwidth = MeasureBandwidth(stream);
  std::printf(
      "{\"device\": \"%s\", \"nominal_bandwidth_gb_per_s\": %.0f, "
      "\"copy_bandwidth_gb_per_s\": %.0f}\n",
      prop.name, bandwidth.nominal_bytes_per_s / 1e9, bandwidth.copy_bytes_per_s / 1e9);
  for (const Case& c : {Case{8, "adagrad"}, Case{8, "adam"}, Case{64, "adagrad"}, Case{64, "adam"}})
    RunCase(c, bandwidth, stream);
  cudaStreamDestroy(stream);
  return 0;
}
