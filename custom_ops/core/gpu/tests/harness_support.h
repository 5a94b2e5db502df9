// Support for the GPU-vs-CPU table harness: check counting, device buffers, and TablePair,
// which runs each operation on a CPU table (custom_ops/core/table.h, the reference) and a
// GPU table built from the same configuration, and compares what they return and hold.
//
// Tolerance: under the host emulation both tables run the same code on the same CPU, so
// everything must match bit for bit. On a GPU, initial values must match bit for bit
// (within 1 ulp for the truncated normal, whose log and cos may round differently) and
// trained values within float tolerance (sqrt, pow and division may round differently).
#ifndef TFPS_CORE_GPU_TESTS_HARNESS_SUPPORT_H_
#define TFPS_CORE_GPU_TESTS_HARNESS_SUPPORT_H_

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "custom_ops/core/gpu/gpu_table.h"
#include "custom_ops/core/table.h"

namespace tfps {
namespace gpu {
namespace harness {

inline int passed = 0, failed = 0;
inline std::string current_case;

inline bool Expect(bool ok, const std::string& what) {
  (ok ? passed : failed)++;
  if (!ok) std::printf("FAILED: %s (%s)\n", what.c_str(), current_case.c_str());
  return ok;
}

inline bool ExpectOk(const Status& status, const std::string& what) {
  if (!status.ok()) std::printf("  status: %s\n", status.message().c_str());
  return Expect(status.ok(), what);
}

// A status of `code` whose message names `op` (the operation) and `names` (the bad value).
inline bool ExpectError(const Status& status, StatusCode code, const std::string& op,
                        const std::string& names, const std::string& what) {
  const bool ok = status.code() == code && status.message().find(op) != std::string::npos &&
                  status.message().find(names) != std::string::npos;
  if (!ok) std::printf("  got: %s\n", status.ok() ? "OK" : status.message().c_str());
  return Expect(ok, what);
}

// Device copy of a host vector (or n zeroed elements), freed with the object.
template <typename T>
class DeviceArray {
 public:
  explicit DeviceArray(size_t n) : n_(n) {
    cudaMalloc(&ptr_, std::max<size_t>(1, n) * sizeof(T));
    cudaMemset(ptr_, 0, std::max<size_t>(1, n) * sizeof(T));
  }
  explicit DeviceArray(const std::vector<T>& host) : DeviceArray(host.size()) {
    cudaMemcpy(ptr_, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice);
  }
  ~DeviceArray() { cudaFree(ptr_); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  T* get() const { return ptr_; }
  std::vector<T> ToHost() const {
    std::vector<T> host(n_);
    cudaMemcpy(host.data(), ptr_, n_ * sizeof(T), cudaMemcpyDeviceToHost);
    return host;
  }

 private:
  T* ptr_ = nullptr;
  size_t n_;
};

enum class Values { kInitial, kTrained };

// Every float equal, to the tolerance the file comment gives.
inline bool SameFloats(const std::vector<float>& cpu, const std::vector<float>& gpu, Values kind,
                       int initial_ulp, const std::string& what) {
  bool ok = cpu.size() == gpu.size();
  for (size_t i = 0; ok && i < cpu.size(); ++i) {
    int32_t x, y;
    std::memcpy(&x, &cpu[i], 4);
    std::memcpy(&y, &gpu[i], 4);
    const int64_t ulp = std::abs(static_cast<int64_t>(x) - y);
    if (TFPS_GPU_EMULATED) {
      ok = ulp == 0 || (cpu[i] == 0.0f && gpu[i] == 0.0f);
    } else if (kind == Values::kInitial) {
      ok = ulp <= initial_ulp;
    } else {
      ok = ulp <= initial_ulp ||
           std::fabs(cpu[i] - gpu[i]) <= 2e-5f * std::max(1.0f, std::fabs(cpu[i]));
    }
    if (!ok)
      std::printf("  %s: first difference at %zu: cpu %.9g vs gpu %.9g\n", what.c_str(), i, cpu[i],
                  gpu[i]);
  }
  if (cpu.size() != gpu.size())
    std::printf("  %s: %zu vs %zu floats\n", what.c_str(), cpu.size(), gpu.size());
  return Expect(ok, what);
}

// Rows of a whole table, sorted by key.
struct Rows {
  std::vector<uint64_t> keys;
  std::vector<float> values, slots;
  std::vector<int64_t> metadata;
};

inline Rows SortedByKey(const Rows& rows, int dim, int num_slots) {
  std::vector<size_t> order(rows.keys.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return rows.keys[a] < rows.keys[b]; });
  Rows sorted;
  const size_t width = static_cast<size_t>(dim) * num_slots;
  for (size_t i : order) {
    sorted.keys.push_back(rows.keys[i]);
    sorted.values.insert(sorted.values.end(), rows.values.begin() + i * dim,
                         rows.values.begin() + (i + 1) * dim);
    sorted.slots.insert(sorted.slots.end(), rows.slots.begin() + i * width,
                        rows.slots.begin() + (i + 1) * width);
    sorted.metadata.insert(sorted.metadata.end(), rows.metadata.begin() + i * kMetadataColumns,
                           rows.metadata.begin() + (i + 1) * kMetadataColumns);
  }
  return sorted;
}

inline Rows CpuRows(const Table& table) {
  const ExportChunk chunk = table.Export(0, INT64_MAX);
  Rows rows{std::vector<uint64_t>(chunk.keys.begin(), chunk.keys.end()), chunk.values, chunk.slots,
            chunk.metadata};
  return SortedByKey(rows, table.dim(), table.num_slots());
}

// The whole GPU table through chunked exports (in slot order, as it comes) of random
// sizes, or of `fixed_chunk` rows when it is positive; an empty Rows if an export fails.
inline Rows GpuRowsInSlotOrder(GpuTable& table, cudaStream_t stream, std::mt19937_64& rng,
                               int64_t fixed_chunk = 0) {
  Rows rows;
  int64_t size = 0;
  if (!ExpectOk(table.Size(stream, &size), "size before export")) return rows;
  const int dim = table.dim(), width = dim * table.num_slots();
  const int64_t max_chunk = std::max<int64_t>(1, size / 3 + 1);
  int64_t cursor = 0;
  do {
    const int64_t chunk = fixed_chunk > 0 ? fixed_chunk
                                          : static_cast<int64_t>(rng() % (max_chunk + 1));  // 0-row chunks too
    DeviceArray<uint64_t> keys(chunk);
    DeviceArray<float> values(chunk * dim), slots(chunk * width);
    DeviceArray<int64_t> metadata(chunk * kMetadataColumns);
    int64_t got = 0, next = -1;
    if (!ExpectOk(table.Export(stream, cursor, chunk,
                               RowBuffers{keys.get(), values.get(), slots.get(), metadata.get()},
                               &got, &next),
                  "export chunk")) {
      return Rows();
    }
    const auto append = [got](auto& to, const auto& from, size_t per_row) {
      to.insert(to.end(), from.begin(), from.begin() + got * per_row);
    };
    append(rows.keys, keys.ToHost(), 1);
    append(rows.values, values.ToHost(), dim);
    append(rows.slots, slots.ToHost(), width);
    append(rows.metadata, metadata.ToHost(), kMetadataColumns);
    if (next != -1 && !Expect(got == chunk, "a chunk that is not the last is full")) return Rows();
    cursor = next;
  } while (cursor != -1);
  return rows;
}

inline GpuTableConfig GpuConfigOf(const TableConfig& cpu, int64_t initial_capacity) {
  GpuTableConfig config;
  config.dim = cpu.dim;
  config.optimizer = cpu.optimizer;
  config.initializer = cpu.initializer;
  config.seed = cpu.seed;
  config.initial_capacity = initial_capacity;
  return config;
}

// A CPU table and a GPU table with the same configuration.
class TablePair {
 public:
  TablePair(const TableConfig& config, int64_t initial_capacity)
      : cpu_(config), serial_(SerialParallelFor()), rng_(config.seed + 99) {
    cudaStreamCreate(&stream_);
    ExpectOk(GpuTable::Create(GpuConfigOf(config, initial_capacity), stream_, &gpu_),
             "create the GPU table");
    initial_ulp_ = config.initializer.kind == InitializerKind::kTruncatedNormal ? 1 : 0;
  }
  ~TablePair() {
    gpu_.reset();
    cudaStreamDestroy(stream_);
  }

  Table& cpu() { return cpu_; }
  GpuTable& gpu() { return *gpu_; }
  cudaStream_t stream() const { return stream_; }
  int dim() const { return cpu_.dim(); }
  int initial_ulp() const { return initial_ulp_; }

  // FindOrInsert on both; the rows returned must agree. `occurrences` empty: null.
  void FindOrInsert(const std::vector<uint64_t>& keys,
                    const std::vector<int64_t>& occurrences = {}) {
    const int64_t n = keys.size();
    std::vector<float> expected(n * dim());
    cpu_.FindOrInsert(keys.data(), n, expected.data(), serial_,
                      occurrences.empty() ? nullptr : occurrences.data());
    DeviceArray<uint64_t> d_keys(keys);
    DeviceArray<int64_t> d_occurrences(occurrences);
    DeviceArray<float> values(n * dim());
    ExpectOk(gpu_->FindOrInsert(stream_, d_keys.get(), n, values.get(),
                                occurrences.empty() ? nullptr : d_occurrences.get()),
             "find_or_insert");
    SameFloats(expected, values.ToHost(), Values::kTrained, initial_ulp_, "find_or_insert rows");
  }

  // Find on both: rows and exists must agree; rows of absent keys are initial values.
  void Find(const std::vector<uint64_t>& keys) {
    const int64_t n = keys.size();
    std::vector<float> expected(n * dim());
    std::vector<uint8_t> expected_exists(n);
    cpu_.Find(keys.data(), n, expected.data(), expected_exists.data(), serial_);
    DeviceArray<uint64_t> d_keys(keys);
    DeviceArray<float> values(n * dim());
    DeviceArray<uint8_t> exists(n);
    ExpectOk(gpu_->Find(stream_, d_keys.get(), n, values.get(), exists.get()), "find");
    const std::vector<float> got = values.ToHost();
    SameFloats(expected, got, Values::kTrained, initial_ulp_, "find rows");
    Expect(exists.ToHost() == expected_exists, "find exists");
    std::vector<float> cpu_initial, gpu_initial;
    for (int64_t i = 0; i < n; ++i) {
      if (expected_exists[i]) continue;
      cpu_initial.insert(cpu_initial.end(), expected.begin() + i * dim(),
                         expected.begin() + (i + 1) * dim());
      gpu_initial.insert(gpu_initial.end(), got.begin() + i * dim(), got.begin() + (i + 1) * dim());
    }
    SameFloats(cpu_initial, gpu_initial, Values::kInitial, initial_ulp_,
               "initial values of absent keys");
  }

  // ApplyGradients on both; the verdicts must agree. Returns the GPU's.
  bool Apply(const std::vector<uint64_t>& keys, const std::vector<float>& grads, int64_t step,
             float learning_rate = -1.0f) {
    const int64_t n = keys.size();
    const bool expected =
        cpu_.ApplyGradients(keys.data(), n, grads.data(), step, serial_, learning_rate);
    DeviceArray<uint64_t> d_keys(keys);
    DeviceArray<float> d_grads(grads);
    bool applied = !expected;
    ExpectOk(gpu_->ApplyGradients(stream_, d_keys.get(), n, d_grads.get(), step, learning_rate,
                                  &applied),
             "apply");
    Expect(applied == expected, "apply verdict");
    return applied;
  }

  void Insert(const std::vector<uint64_t>& keys, const std::vector<float>& values) {
    cpu_.Insert(keys.data(), keys.size(), values.data(), serial_);
    DeviceArray<uint64_t> d_keys(keys);
    DeviceArray<float> d_values(values);
    ExpectOk(gpu_->Insert(stream_, d_keys.get(), keys.size(), d_values.get()), "insert");
  }

  // Imports the CPU table's export into the CPU table and `gpu_rows` into the GPU table,
  // then sets both clocks to `clock`.
  void Import(const ExportChunk& cpu_rows, const Rows& gpu_rows, int64_t clock) {
    const std::vector<uint64_t> cpu_keys(cpu_rows.keys.begin(), cpu_rows.keys.end());
    cpu_.Import(cpu_keys.data(), cpu_keys.size(), cpu_rows.values.data(), cpu_rows.slots.data(),
                cpu_rows.metadata.data(), serial_);
    DeviceArray<uint64_t> d_keys(gpu_rows.keys);
    DeviceArray<float> d_values(gpu_rows.values), d_slots(gpu_rows.slots);
    DeviceArray<int64_t> d_metadata(gpu_rows.metadata);
    ExpectOk(gpu_->Import(stream_, d_keys.get(), gpu_rows.keys.size(), d_values.get(),
                          d_slots.get(), d_metadata.get()),
             "import");
    cpu_.SetApplyCalls(clock);
    ExpectOk(gpu_->SetApplyCalls(stream_, clock), "set the clock");
  }

  // Returns the GPU's count of removed keys.
  int64_t Remove(const std::vector<uint64_t>& keys) {
    const int64_t expected = cpu_.Remove(keys.data(), keys.size(), serial_);
    DeviceArray<uint64_t> d_keys(keys);
    int64_t removed = -1;
    ExpectOk(gpu_->Remove(stream_, d_keys.get(), keys.size(), &removed), "remove");
    Expect(removed == expected, "removed count (cpu " + std::to_string(expected) + ", gpu " +
                                    std::to_string(removed) + ")");
    return removed;
  }

  // Both tables hold the same rows, size and clock; the GPU's read by chunked export.
  void ExpectSameState(const std::string& when) {
    const Rows expected = CpuRows(cpu_);
    const Rows got = SortedByKey(GpuRowsInSlotOrder(*gpu_, stream_, rng_), dim(), cpu_.num_slots());
    Expect(got.keys == expected.keys, when + ": same keys (cpu " +
                                          std::to_string(expected.keys.size()) + ", gpu " +
                                          std::to_string(got.keys.size()) + ")");
    if (got.keys != expected.keys) return;
    SameFloats(expected.values, got.values, Values::kTrained, initial_ulp_, when + ": values");
    SameFloats(expected.slots, got.slots, Values::kTrained, initial_ulp_,
               when + ": optimizer slots");
    Expect(got.metadata == expected.metadata,
           when + ": metadata (count, last step, optimizer step, score)");
    int64_t size = -1, calls = -1;
    ExpectOk(gpu_->Size(stream_, &size), "size");
    ExpectOk(gpu_->ApplyCalls(stream_, &calls), "apply calls");
    Expect(size == cpu_.Size(), when + ": size");
    Expect(calls == cpu_.ApplyCalls(), when + ": clock");
  }

 private:
  Table cpu_;
  ParallelFor serial_;
  std::mt19937_64 rng_;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<GpuTable> gpu_;
  int initial_ulp_ = 0;
};

}  // namespace harness
}  // namespace gpu
}  // namespace tfps

#endif  // TFPS_CORE_GPU_TESTS_HARNESS_SUPPORT_H_
