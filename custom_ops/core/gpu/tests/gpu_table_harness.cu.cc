// Runs the same operations on the GPU table and the CPU table (the reference) and checks
// they return and hold the same rows, slots and metadata: every operation, every
// optimizer, growth far past the initial capacity, removes and reinserts, chunked export
// and import, the clock and negative steps, learning-rate overrides, refused non-finite
// gradients, heavily repeated keys, concurrent callers, the op sequence of
// tests/test_gpu_kernels.py for every optimizer and both key types, and error statuses.
// Built by nvcc for a GPU (custom_ops/core/gpu/run_on_gpu.sh), or by g++ with
// TFPS_GPU_EMULATION to run the kernels on CPU threads (run_emulated.sh; CI does).
// `--quick` runs smaller batches (for ThreadSanitizer and compute-sanitizer). Prints "N passed, M failed"; exits non-zero on any failure.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "custom_ops/core/gpu/tests/harness_support.h"

namespace tfps {
namespace gpu {
namespace harness {
namespace {

int64_t scale = 20;  // batch sizes are multiples of this (--quick: 1)

// Keys that look like control bytes or sit at the ends of the range, then n-5 more: Zipf-
// like ranks scrambled over the 64-bit space (many repeats), or random keys with small IDs
// that repeat.
std::vector<uint64_t> Batch(std::mt19937_64& rng, int64_t n, bool power_law,
                            double universe = 2e6) {
  std::vector<uint64_t> keys = {0, ~uint64_t{0}, uint64_t{1} << 63, 0x80, 0xFE};
  std::uniform_real_distribution<double> u(0.0, 1.0);
  while (static_cast<int64_t>(keys.size()) < n) {
    if (power_law) {
      keys.push_back(Mix64(static_cast<uint64_t>(std::exp(u(rng) * std::log(universe)))));
    } else {
      keys.push_back(rng() % 3 == 0 ? rng() % 500 : rng());
    }
  }
  std::shuffle(keys.begin(), keys.end(), rng);
  return keys;
}

std::vector<float> Normal(std::mt19937_64& rng, size_t n) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(n);
  for (float& v : x) v = normal(rng);
  return x;
}

TableConfig Config(OptimizerKind optimizer, InitializerKind initializer, int dim) {
  TableConfig c;
  c.dim = dim;
  c.optimizer.kind = optimizer;
  c.optimizer.learning_rate = 0.1f;
  c.initializer.kind = initializer;
  c.initializer.a = initializer == InitializerKind::kUniform ? -0.5f : 0.0f;
  c.initializer.b = initializer == InitializerKind::kUniform ? 0.5f : 0.2f;
  c.seed = 1234;
  c.log2_stripes = 4;  // fewer locks for Clear to take (ThreadSanitizer tracks at most 64 at once)
  return c;
}

// Applies normal gradients to every key of the batch on both tables.
bool ApplyNormal(TablePair& t, std::mt19937_64& rng, const std::vector<uint64_t>& keys,
                 int64_t step, float learning_rate = -1.0f) {
  return t.Apply(keys, Normal(rng, keys.size() * t.dim()), step, learning_rate);
}

// A batch inserted by find_or_insert, then trained once at `step`.
std::vector<uint64_t> Populate(TablePair& t, std::mt19937_64& rng, int64_t n, bool power_law,
                               int64_t step) {
  std::vector<uint64_t> keys = Batch(rng, n, power_law);
  t.FindOrInsert(keys);
  ApplyNormal(t, rng, keys, step);
  return keys;
}

// Rounds of find_or_insert (with and without occurrence counts), apply (repeated keys,
// explicit and clock steps, learning-rate overrides) and find, compared after each.
void TestOperationsMatch(const std::string& name, const TableConfig& config, bool power_law) {
  current_case = name;
  TablePair t(config, /*initial_capacity=*/64);
  std::mt19937_64 rng(7);
  const int64_t n = 500 * scale;
  for (int round = 0; round < 5; ++round) {
    const std::vector<uint64_t> keys = Batch(rng, n, power_law);
    std::vector<int64_t> occurrences;
    if (round % 2 == 1) {
      for (size_t i = 0; i < keys.size(); ++i)
        occurrences.push_back(static_cast<int64_t>(rng() % 9) - 2);
    }
    t.FindOrInsert(keys, occurrences);
    const std::vector<uint64_t> applied = Batch(rng, n / 2, power_law);
    const int64_t step = round % 3 == 0 ? -1 : round * 7 + 3;
    const float learning_rate = round % 2 == 1 ? 0.02f * round : -1.0f;
    ApplyNormal(t, rng, applied, step, learning_rate);
    std::vector<uint64_t> probe = Batch(rng, n / 2, power_law);
    probe.insert(probe.end(), keys.begin(), keys.begin() + n / 4);
    t.Find(probe);
    t.ExpectSameState("round " + std::to_string(round));
  }
  Expect(t.gpu().capacity() >= 64 * 32, "the index grew far past its initial capacity");
}

// A batch where one key repeats 375*scale times, some 40 times (heapsort), some 3 times
// (insertion sort) among distinct keys: updates run in input order, counts add up.
void TestHeavilyRepeatedKeys(const std::string& name, const TableConfig& config) {
  current_case = name;
  TablePair t(config, 64);
  std::mt19937_64 rng(11);
  std::vector<uint64_t> keys(375 * scale, 42);
  for (uint64_t k = 0; k < 20; ++k) keys.insert(keys.end(), 40, 1000 + k);
  for (uint64_t k = 0; k < 100; ++k) keys.insert(keys.end(), 3, 5000 + k);
  for (uint64_t k = 0; k < 500; ++k) keys.push_back(rng());
  std::shuffle(keys.begin(), keys.end(), rng);
  ApplyNormal(t, rng, keys, 3);
  t.FindOrInsert(keys, std::vector<int64_t>(keys.size(), 2));
  ApplyNormal(t, rng, keys, -1);
  t.ExpectSameState("after repeated-key applies");
}

// Removes present, absent and repeated keys, reinserts some, applies to others.
void TestRemoveAndReinsert(const TableConfig& config) {
  current_case = "remove and reinsert";
  TablePair t(config, 64);
  std::mt19937_64 rng(3);
  std::vector<uint64_t> keys = Populate(t, rng, 600 * scale, false, 1);
  for (int round = 0; round < 4; ++round) {
    std::vector<uint64_t> removed;
    for (uint64_t k : keys) {
      if (rng() % 5 < 2) removed.push_back(k);
    }
    removed.insert(removed.end(), removed.begin(),
                   removed.begin() + removed.size() / 4);   // repeats
    for (int i = 0; i < 50; ++i) removed.push_back(rng());  // absent
    std::shuffle(removed.begin(), removed.end(), rng);
    t.Remove(removed);
    t.ExpectSameState("after remove " + std::to_string(round));
    const std::vector<uint64_t> back(removed.begin(), removed.begin() + removed.size() / 2);
    t.FindOrInsert(back, std::vector<int64_t>(back.size(), 3));
    const std::vector<uint64_t> applied(removed.begin() + removed.size() / 2, removed.end());
    ApplyNormal(t, rng, applied, 10 + round);
    const std::vector<uint64_t> fresh = Batch(rng, 200 * scale, false);
    t.FindOrInsert(fresh);
    keys.insert(keys.end(), fresh.begin(), fresh.end());
    t.ExpectSameState("after reinsert " + std::to_string(round));
  }
  t.Remove(keys);
  t.ExpectSameState("after removing every key");
  t.FindOrInsert(keys);
  t.ExpectSameState("after inserting them all again");
}

// Insert; export in chunks; import into fresh tables (repeated keys and out-of-range
// metadata included); a cursor from before a rebuild is refused.
void TestInsertExportImport(const TableConfig& config) {
  current_case = "insert, export, import";
  TablePair t(config, 64);
  std::mt19937_64 rng(5);
  const std::vector<uint64_t> keys = Populate(t, rng, 400 * scale, true, 4);
  std::vector<uint64_t> inserted = Batch(rng, 200 * scale, false);
  inserted.insert(inserted.end(), keys.begin(), keys.begin() + 50);
  inserted.push_back(inserted[0]);  // repeated: the last value wins
  t.Insert(inserted, Normal(rng, inserted.size() * config.dim));
  t.ExpectSameState("after insert");

  Rows gpu_rows = GpuRowsInSlotOrder(t.gpu(), t.stream(), rng);
  ExportChunk cpu_rows = t.cpu().Export(0, INT64_MAX);
  const int dim = config.dim, width = dim * NumSlots(config.optimizer.kind);
  // A repeated key whose last row carries metadata beyond [0, UINT32_MAX].
  const auto add_row = [&](auto& keys_out, auto& values, auto& slots, auto& metadata, size_t from) {
    keys_out.push_back(keys_out[from]);
    for (int e = 0; e < dim; ++e) values.push_back(values[from * dim + e] + 1.0f);
    for (int e = 0; e < width; ++e) slots.push_back(slots[from * width + e]);
    metadata.insert(metadata.end(), {-5, int64_t{1} << 40, 7, 0});
  };
  add_row(gpu_rows.keys, gpu_rows.values, gpu_rows.slots, gpu_rows.metadata, 0);
  const auto at =
      std::find(cpu_rows.keys.begin(), cpu_rows.keys.end(), static_cast<int64_t>(gpu_rows.keys[0]));
  add_row(cpu_rows.keys, cpu_rows.values, cpu_rows.slots, cpu_rows.metadata,
          at - cpu_rows.keys.begin());

  TablePair restored(config, 64);
  restored.Import(cpu_rows, gpu_rows, t.cpu().ApplyCalls());
  restored.ExpectSameState("imported from chunked exports");

  DeviceArray<uint64_t> out_keys(10);
  DeviceArray<float> out_values(10 * dim), out_slots(10 * std::max(width, 1));
  DeviceArray<int64_t> out_metadata(10 * kMetadataColumns);
  const RowBuffers out{out_keys.get(), out_values.get(), out_slots.get(), out_metadata.get()};
  int64_t rows = 0, next = 0;
  ExpectOk(t.gpu().Export(t.stream(), 0, 10, out, &rows, &next), "first chunk");
  ExpectOk(t.gpu().Reserve(t.stream(), t.gpu().capacity()), "reserve past the capacity: a rebuild");
  ExpectError(t.gpu().Export(t.stream(), next, 10, out, &rows, &next),
              StatusCode::kFailedPrecondition, "GpuTable::Export", "start the export again",
              "a cursor from before a rebuild is refused");
  t.ExpectSameState("after the rebuild");
}

// The clock: SetApplyCalls, negative steps, empty applies, refused non-finite gradients
// (nothing changes, the clock neither), steps beyond 32 bits.
void TestClockAndRefusals(const TableConfig& config) {
  current_case = "clock and refusals";
  TablePair t(config, 64);
  std::mt19937_64 rng(9);
  const std::vector<uint64_t> keys = Batch(rng, 100 * scale, false);
  t.FindOrInsert(keys);
  t.cpu().SetApplyCalls(41);
  ExpectOk(t.gpu().SetApplyCalls(t.stream(), 41), "set the clock");
  ApplyNormal(t, rng, keys, -1);
  t.Apply({}, {}, -1);
  t.ExpectSameState("after clock steps");
  for (float bad : {NAN, INFINITY, -INFINITY}) {
    std::vector<float> grads = Normal(rng, keys.size() * config.dim);
    grads[rng() % grads.size()] = bad;
    std::vector<uint64_t> with_new = keys;
    with_new.back() = rng();  // an absent key: must not be inserted
    Expect(!t.Apply(with_new, grads, -1), "a non-finite gradient refuses the apply");
    t.ExpectSameState("after a refused apply");
  }
  ApplyNormal(t, rng, keys, int64_t{5} << 32);
  ApplyNormal(t, rng, keys, -7, 0.0f);
  t.ExpectSameState("after a step beyond 32 bits and a zero learning rate");
}

void TestClear(const TableConfig& config) {
  current_case = "clear";
  TablePair t(config, 64);
  std::mt19937_64 rng(13);
  for (bool keep_memory : {false, true}) {
    const std::vector<uint64_t> keys = Populate(t, rng, 300 * scale, false, -1);
    const int64_t grown = t.gpu().capacity();
    t.cpu().Clear(keep_memory);
    ExpectOk(t.gpu().Clear(t.stream(), keep_memory), "clear");
    Expect(t.gpu().capacity() == (keep_memory ? grown : 64), "clear keeps memory only when asked");
    t.ExpectSameState("after clear");
    t.FindOrInsert(keys);
    t.ExpectSameState("refilled after clear");
  }
}

// Several host threads, each with its own stream, call one GPU table at once; the CPU
// table then runs the same calls one after another. Gradients and the learning rate are
// powers of two with zero initial values, so SGD sums exactly in any order.
void TestConcurrentCallers() {
  current_case = "concurrent callers";
  TableConfig config = Config(OptimizerKind::kSgd, InitializerKind::kZeros, 4);
  config.optimizer.learning_rate = 0.5f;
  TablePair t(config, 64);
  constexpr int kThreads = 4, kRounds = 6;
  struct Calls {
    std::vector<std::vector<uint64_t>> keys;
    std::vector<std::vector<float>> grads;
  };
  std::vector<Calls> calls(kThreads);
  std::mt19937_64 rng(17);
  for (Calls& c : calls) {
    for (int r = 0; r < kRounds; ++r) {
      c.keys.push_back(Batch(rng, 100 * scale, true, 3000));
      std::vector<float> grads(c.keys.back().size() * config.dim);
      for (float& g : grads) g = static_cast<float>(static_cast<int>(rng() % 129) - 64) / 64.0f;
      c.grads.push_back(grads);
    }
  }
  std::vector<std::thread> threads;
  std::vector<int> ok(kThreads, 1);
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      cudaStream_t stream;
      cudaStreamCreate(&stream);
      for (int r = 0; r < kRounds; ++r) {
        const std::vector<uint64_t>& keys = calls[i].keys[r];
        DeviceArray<uint64_t> d_keys(keys);
        DeviceArray<float> d_grads(calls[i].grads[r]), values(keys.size() * config.dim);
        DeviceArray<int64_t> occurrences(std::vector<int64_t>(keys.size(), i + 1));
        ok[i] &=
            t.gpu()
                .FindOrInsert(stream, d_keys.get(), keys.size(), values.get(), occurrences.get())
                .ok();
        ok[i] &= t.gpu().ApplyGradients(stream, d_keys.get(), keys.size(), d_grads.get(), 7).ok();
        ok[i] &= t.gpu().Find(stream, d_keys.get(), keys.size(), values.get(), nullptr).ok();
      }
      cudaStreamSynchronize(stream);
      cudaStreamDestroy(stream);
    });
  }
  for (auto& th : threads) th.join();
  Expect(std::count(ok.begin(), ok.end(), 1) == kThreads, "every concurrent call succeeded");
  std::vector<float> values;
  for (int i = 0; i < kThreads; ++i) {
    for (int r = 0; r < kRounds; ++r) {
      const std::vector<uint64_t>& keys = calls[i].keys[r];
      values.resize(keys.size() * config.dim);
      t.cpu().FindOrInsert(keys.data(), keys.size(), values.data(), SerialParallelFor(),
                           std::vector<int64_t>(keys.size(), i + 1).data());
      t.cpu().ApplyGradients(keys.data(), keys.size(), calls[i].grads[r].data(), 7,
                             SerialParallelFor());
    }
  }
  t.ExpectSameState("after concurrent calls");
}

// The sequence tests/test_gpu_kernels.py drives through TensorFlow's ops, on the tables
// themselves: find_or_insert with occurrence counts (keys repeated in the call), applies
// at the clock with learning-rate overrides, find of present and absent keys, insert,
// remove of present and absent keys, the clock set and stepped, export in chunks of 7 and
// import into a fresh pair, clear. Keys with the top bit set stand for the op's uint64
// keys (int64 keys reach the table as their bits).
void TestTensorFlowOpSequence(const std::string& name, const TableConfig& config, bool top_bit) {
  current_case = "op sequence: " + name + (top_bit ? ", uint64 keys" : ", int64 keys");
  TablePair t(config, 64);
  std::mt19937_64 rng(7);
  std::vector<uint64_t> keys;
  for (int i = 0; i < 40; ++i) keys.push_back((rng() >> 2) | (top_bit ? uint64_t{1} << 63 : 0));
  keys.insert(keys.end(), keys.begin(), keys.begin() + 10);  // repeated within one call
  std::shuffle(keys.begin(), keys.end(), rng);
  std::vector<int64_t> occurrences;
  for (size_t i = 0; i < keys.size(); ++i) occurrences.push_back(1 + static_cast<int64_t>(rng() % 3));
  t.FindOrInsert(keys, occurrences);
  for (float rate : {-1.0f, 0.05f, 0.2f}) ApplyNormal(t, rng, keys, -1, rate);
  std::vector<uint64_t> absent;
  for (int i = 0; i < 5; ++i) absent.push_back(rng() >> 2);
  std::vector<uint64_t> probe(keys.begin(), keys.begin() + 8);
  probe.insert(probe.end(), absent.begin(), absent.end());
  t.Find(probe);
  const std::vector<uint64_t> inserted(keys.begin(), keys.begin() + 3);
  t.Insert(inserted, Normal(rng, inserted.size() * config.dim));
  // keys[3:9] may repeat a key of keys[:3] or of each other: the CPU table's count rules.
  std::vector<uint64_t> removed(keys.begin() + 3, keys.begin() + 9);
  removed.insert(removed.end(), absent.begin(), absent.end());
  t.Remove(removed);
  t.ExpectSameState("after insert and remove");
  t.cpu().SetApplyCalls(100);
  ExpectOk(t.gpu().SetApplyCalls(t.stream(), 100), "set the clock");
  const std::vector<uint64_t> stepped(keys.begin() + 20, keys.begin() + 25);
  t.Apply(stepped, std::vector<float>(stepped.size() * config.dim, 1.0f), -1);
  t.ExpectSameState("after the clock was set and stepped");
  Expect(t.cpu().ApplyCalls() == 101, "the clock reads 101 after one apply past 100");

  const Rows exported =
      SortedByKey(GpuRowsInSlotOrder(t.gpu(), t.stream(), rng, /*fixed_chunk=*/7), config.dim,
                  t.cpu().num_slots());
  TablePair copy(config, 64);
  copy.Import(t.cpu().Export(0, INT64_MAX), exported, t.cpu().ApplyCalls());
  copy.ExpectSameState("imported from chunks of 7");
  const Rows reimported = SortedByKey(GpuRowsInSlotOrder(copy.gpu(), copy.stream(), rng, 1000),
                                      config.dim, t.cpu().num_slots());
  Expect(reimported.keys == exported.keys && reimported.values == exported.values &&
             reimported.slots == exported.slots && reimported.metadata == exported.metadata,
         "the imported GPU table exports exactly the rows it was given");
  if (config.optimizer.l1 > 0) {
    const std::vector<float>& cpu_values = CpuRows(t.cpu()).values;
    size_t zeros = 0;
    bool same_mask = cpu_values.size() == exported.values.size();
    for (size_t i = 0; same_mask && i < cpu_values.size(); ++i) {
      same_mask = (cpu_values[i] == 0.0f) == (exported.values[i] == 0.0f);
      zeros += cpu_values[i] == 0.0f;
    }
    Expect(same_mask, "FTRL's L1 zeroes the same coordinates on both tables");
    Expect(zeros * 5 > cpu_values.size(), "FTRL's L1 zeroes over a fifth of the coordinates");
  }
  t.cpu().Clear(false);
  ExpectOk(t.gpu().Clear(t.stream()), "clear");
  t.ExpectSameState("after clear");
  Expect(t.cpu().Size() == 0, "empty after clear");
}

void TestErrors() {
  current_case = "errors";
  cudaStream_t stream;
  cudaStreamCreate(&stream);
  std::unique_ptr<GpuTable> table;
  GpuTableConfig bad;
  bad.dim = 0;
  ExpectError(GpuTable::Create(bad, stream, &table), StatusCode::kInvalidArgument,
              "GpuTable::Create", "got 0", "dim 0 is refused");
  bad.dim = 8;
  bad.max_load = 1.5f;
  ExpectError(GpuTable::Create(bad, stream, &table), StatusCode::kInvalidArgument,
              "GpuTable::Create", "max_load", "max_load 1.5 is refused");
  cudaStreamDestroy(stream);

  TablePair t(Config(OptimizerKind::kAdagrad, InitializerKind::kUniform, 8), 64);
  std::mt19937_64 rng(19);
  const std::vector<uint64_t> keys = Batch(rng, 200, false);
  t.FindOrInsert(keys);
  DeviceArray<uint64_t> d_keys(keys);
  DeviceArray<float> values(keys.size() * 8);
  ExpectError(t.gpu().Find(t.stream(), d_keys.get(), -1, values.get(), nullptr),
              StatusCode::kInvalidArgument, "GpuTable::Find", "got -1", "a negative n is refused");
  ExpectError(t.gpu().FindOrInsert(t.stream(), nullptr, 3, values.get()),
              StatusCode::kInvalidArgument, "GpuTable::FindOrInsert", "keys is null",
              "null keys are refused");
  int64_t rows, next;
  ExpectError(t.gpu().Export(t.stream(), 0, -2, RowBuffers{}, &rows, &next),
              StatusCode::kInvalidArgument, "GpuTable::Export",
              "max_rows must be in [0, 2147483647], got -2", "a negative max_rows is refused");
  ExpectError(t.gpu().Reserve(t.stream(), int64_t{1} << 34), StatusCode::kResourceExhausted,
              "GpuTable::Reserve", "bytes of device memory",
              "an allocation beyond the device's memory fails as a status");
  t.ExpectSameState("after the failed reserve");
#if TFPS_GPU_EMULATED
  const std::vector<uint64_t> more = Batch(rng, 5000, false);
  DeviceArray<uint64_t> d_more(more);
  DeviceArray<float> more_values(more.size() * 8);
  emulation::SetDeviceMemoryLimit(emulation::DeviceBytesInUse() + 1000);
  ExpectError(t.gpu().FindOrInsert(t.stream(), d_more.get(), more.size(), more_values.get()),
              StatusCode::kResourceExhausted, "GpuTable::FindOrInsert", "out of memory",
              "growth without memory fails as a status");
  emulation::SetDeviceMemoryLimit(size_t{1} << 30);
  t.ExpectSameState("after the failed growth");
  t.FindOrInsert(more);
  t.ExpectSameState("after growing once memory is back");
  emulation::FailLaunchAfter(2);
  ExpectError(t.gpu().FindOrInsert(t.stream(), d_keys.get(), keys.size(), values.get()),
              StatusCode::kInternal, "GpuTable::FindOrInsert", "launching",
              "a failed launch comes back as a status");
  emulation::FailLaunchAfter(-1);
#endif
}

}  // namespace
}  // namespace harness
}  // namespace gpu
}  // namespace tfps

int main(int argc, char** argv) {
  using namespace tfps;
  using namespace tfps::gpu::harness;
  if (argc > 1 && std::strcmp(argv[1], "--quick") == 0) scale = 1;
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("no CUDA device\n0 passed, 1 failed\n");
    return 1;
  }
#if TFPS_GPU_EMULATED
  gpu::emulation::SetDeviceMemoryLimit(size_t{1}
                                       << 30);  // a failing huge allocation must not reach the OS
#endif
  using O = OptimizerKind;
  using I = InitializerKind;
  TableConfig ftrl = Config(O::kFtrl, I::kUniform, 3);  // odd dim: scalar copies
  TableConfig ftrl_power = Config(O::kFtrl, I::kZeros, 16);
  ftrl_power.optimizer.lr_power = -0.3f;
  ftrl_power.optimizer.l1 = 0.01f;
  ftrl_power.optimizer.l2 = 0.02f;
  TestOperationsMatch("sgd uniform dim 8 random", Config(O::kSgd, I::kUniform, 8), false);
  TestOperationsMatch("adagrad uniform dim 64 power-law", Config(O::kAdagrad, I::kUniform, 64),
                      true);
  TestOperationsMatch("adam truncated-normal dim 8 power-law",
                      Config(O::kAdam, I::kTruncatedNormal, 8), true);
  TestOperationsMatch("ftrl uniform dim 3 random", ftrl, false);
  TestOperationsMatch("ftrl lr_power -0.3 l1 l2 zeros dim 16 power-law", ftrl_power, true);
  TableConfig rmsprop_momentum = Config(O::kRmsprop, I::kUniform, 8);
  rmsprop_momentum.optimizer.momentum = 0.5f;
  TestOperationsMatch("rmsprop momentum 0.5 uniform dim 8 power-law", rmsprop_momentum, true);
  for (int k = 0; k < kNumOptimizers; ++k) {  // every registered optimizer
    const O o = static_cast<O>(k);
    TestHeavilyRepeatedKeys(std::string("repeated keys, ") + OptimizerName(o),
                            Config(o, I::kUniform, 6));
  }
  TestHeavilyRepeatedKeys("repeated keys, rmsprop momentum 0.5", rmsprop_momentum);
  TestHeavilyRepeatedKeys("repeated keys, ftrl lr_power -0.3", ftrl_power);
  TestRemoveAndReinsert(Config(O::kAdam, I::kUniform, 8));
  TestInsertExportImport(Config(O::kFtrl, I::kTruncatedNormal, 4));
  TestInsertExportImport(Config(O::kSgd, I::kUniform, 5));
  TestClockAndRefusals(Config(O::kAdam, I::kUniform, 4));
  TestClear(Config(O::kAdagrad, I::kUniform, 8));
  TestConcurrentCallers();
  TableConfig ftrl_l1 = Config(O::kFtrl, I::kUniform, 4);
  ftrl_l1.optimizer.learning_rate = 0.5f;
  ftrl_l1.optimizer.l1 = 1.0f;  // as large as the gradients: coordinates set exactly to 0
  const std::pair<std::string, TableConfig> sequences[] = {
      {"sgd", Config(O::kSgd, I::kUniform, 4)},
      {"adagrad", Config(O::kAdagrad, I::kUniform, 4)},
      {"adam", Config(O::kAdam, I::kTruncatedNormal, 4)},
      {"ftrl", Config(O::kFtrl, I::kUniform, 4)},
      {"ftrl l1", ftrl_l1},
      {"rmsprop momentum 0.5", rmsprop_momentum}};
  for (const auto& [name, config] : sequences) {
    for (bool top_bit : {false, true}) TestTensorFlowOpSequence(name, config, top_bit);
  }
  TestErrors();
  std::printf("%d passed, %d failed\n", passed, failed);
  return failed == 0 ? 0 : 1;
}
