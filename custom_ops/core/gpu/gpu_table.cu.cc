// Host side of the GPU table (gpu_table.h): argument checks, device memory, growth, and the
// launch sequence of each call. Built by nvcc (with --fmad=false, so initial values and
// optimizer updates round as the CPU table's -ffp-contract=off build does), or by a host
// compiler against host_emulation.h to run the same kernels on CPU threads.
#include "custom_ops/core/gpu/gpu_table.h"

#include <algorithm>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "custom_ops/core/gpu/apply_kernels.h"
#include "custom_ops/core/gpu/batch_kernels.h"
#include "custom_ops/core/gpu/device_memory.h"
#include "custom_ops/core/gpu/export_chunk.h"
#include "custom_ops/core/gpu/key_counts.h"
#include "custom_ops/core/gpu/row_kernels.h"

namespace tfps {
namespace gpu {
namespace {

constexpr uint64_t kMinCapacity = 64;
constexpr uint64_t kMaxCapacity = uint64_t{1} << 36;  // slots; export cursors hold 40 bits
constexpr int64_t kMaxBatch = INT32_MAX;              // batch positions are 32-bit
constexpr int kCursorSlotBits = 40;
constexpr int64_t kCursorSlotMask = (int64_t{1} << kCursorSlotBits) - 1;
constexpr uint32_t kGenerationMask = (1u << 23) - 1;
constexpr int kMaxLanes = 16;

uint64_t PowerOfTwoAtLeast(uint64_t n, uint64_t floor) {
  uint64_t p = floor;
  while (p < n) p *= 2;
  return p;
}

// An InvalidArgument naming the operation, the argument and its value unless low <= value
// <= high.
template <typename T>
Status CheckInRange(const char* op, const char* name, T value, T low, T high) {
  if (value >= low && value <= high) return Status::OK();
  return InvalidArgument(std::string(op) + ": " + name + " must be in [" + std::to_string(low) +
                         ", " + std::to_string(high) + "], got " + std::to_string(value));
}

// Every pointer a call needs with n > 0 is given, and n fits a batch.
Status CheckBatch(const char* op, int64_t n,
                  std::initializer_list<std::pair<const char*, const void*>> required,
                  const char* count_name = "n") {
  TFPS_GPU_RETURN_IF_ERROR(CheckInRange(op, count_name, n, int64_t{0}, kMaxBatch));
  for (const auto& [name, pointer] : required) {
    if (n > 0 && pointer == nullptr) {
      return InvalidArgument(std::string(op) + ": " + name +
                             " is null with n = " + std::to_string(n));
    }
  }
  return Status::OK();
}

Status CheckConfig(const char* op, const GpuTableConfig& config) {
  TFPS_GPU_RETURN_IF_ERROR(CheckInRange(op, "dim", config.dim, 1, 65536));
  TFPS_GPU_RETURN_IF_ERROR(CheckInRange(op, "optimizer kind",
                                        static_cast<int>(config.optimizer.kind), 0,
                                        kNumOptimizers - 1));
  TFPS_GPU_RETURN_IF_ERROR(CheckInRange(op, "initializer kind",
                                        static_cast<int>(config.initializer.kind), 0,
                                        static_cast<int>(InitializerKind::kTruncatedNormal)));
  TFPS_GPU_RETURN_IF_ERROR(CheckInRange(op, "initial_capacity", config.initial_capacity, int64_t{0},
                                        static_cast<int64_t>(kMaxCapacity)));
  // A full index would leave probes no empty byte to stop at.
  return CheckInRange(op, "max_load", config.max_load, 0.01f, 0.95f);
}

// Marks every slot of an index empty and zeroes its counters.
Status EmptyIndex(const char* op, cudaStream_t stream, const TableView& view, uint64_t capacity) {
  TFPS_RETURN_IF_CUDA_ERROR(op, "clearing the index",
                            cudaMemsetAsync(view.ctrl, kCtrlEmpty, capacity, stream));
  return CudaStatus(
      cudaMemsetAsync(view.counters, 0, kCounterWords * sizeof(unsigned long long), stream), op,
      "clearing the counters");
}

}  // namespace

struct GpuTable::Arrays {
  void* block = nullptr;
  uint64_t capacity = 0;
  TableView view{};
};

struct GpuTable::Scratch {
  void* block = nullptr;
  int64_t keys = 0;  // batch size it holds
  BatchView view{};
};

GpuTable::GpuTable(const GpuTableConfig& config)
    : config_(config),
      num_slots_(NumSlots(config.optimizer.kind)),
      arrays_(new Arrays),
      scratch_(new Scratch),
      counts_(new KeyCountBound) {}

Status GpuTable::Create(const GpuTableConfig& config, cudaStream_t stream,
                        std::unique_ptr<GpuTable>* table) {
  TFPS_GPU_RETURN_IF_ERROR(CheckConfig("GpuTable::Create", config));
  std::unique_ptr<GpuTable> created(new GpuTable(config));
  TFPS_GPU_RETURN_IF_ERROR(created->Init(stream));
  *table = std::move(created);
  return Status::OK();
}

Status GpuTable::Init(cudaStream_t stream) {
  static constexpr const char* kOp = "GpuTable::Create";
  TFPS_RETURN_IF_CUDA_ERROR(kOp, "creating an event",
                            cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
  TFPS_GPU_RETURN_IF_ERROR(counts_->Init(kOp));
  return Call(kOp, stream, [&]() -> Status {
    DeviceBlock block;
    block.Add(&clock_, 1);
    block.Add(&refused_, 1);
    block.Add(&scalars_, 4);
    TFPS_GPU_RETURN_IF_ERROR(block.Allocate(kOp, "the table's counters", stream, &state_block_));
    TFPS_RETURN_IF_CUDA_ERROR(kOp, "clearing the clock",
                              cudaMemsetAsync(clock_, 0, sizeof(int64_t), stream));
    return AllocateArrays(kOp, stream, PowerOfTwoAtLeast(config_.initial_capacity, kMinCapacity),
                          arrays_.get());
  });
}

GpuTable::~GpuTable() {
  // Work queued on any stream may still use the memory; cudaFree waits for the device.
  cudaDeviceSynchronize();
  for (void* block : {arrays_->block, scratch_->block, state_block_}) cudaFree(block);
  if (done_ != nullptr) cudaEventDestroy(done_);
}

template <typename Body>
Status GpuTable::Call(const char* op, cudaStream_t stream, Body&& body) {
  std::lock_guard<std::mutex> lock(mu_);
  if (any_call_ && stream != last_stream_) {
    TFPS_RETURN_IF_CUDA_ERROR(op, "ordering after the previous call's stream",
                              cudaStreamWaitEvent(stream, done_, 0));
  }
  const Status status = body();
  const Status recorded =
      CudaStatus(cudaEventRecord(done_, stream), op, "recording the call's end");
  last_stream_ = stream;
  any_call_ = true;
  return status.ok() ? recorded : status;
}

int64_t GpuTable::capacity() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(arrays_->capacity);
}

TableView GpuTable::View() const { return arrays_->view; }

RowInit GpuTable::MakeRowInit(const OptimizerConfig& optimizer) const {
  return RowInit{config_.initializer, optimizer, config_.seed};
}

Status GpuTable::AllocateArrays(const char* op, cudaStream_t stream, uint64_t capacity,
                                Arrays* out) {
  const uint64_t dim = config_.dim;
  TableView v{};
  DeviceBlock block;
  block.Add(&v.ctrl, capacity / 4);
  block.Add(&v.keys, capacity);
  block.Add(&v.values, capacity * dim);
  block.Add(&v.slots, capacity * dim * num_slots_);
  block.Add(&v.counts, capacity);
  block.Add(&v.last_steps, capacity);
  if (KeepsRowStep(config_.optimizer.kind)) block.Add(&v.opt_steps, capacity);
  block.Add(&v.counters, kCounterWords);
  void* memory = nullptr;
  TFPS_GPU_RETURN_IF_ERROR(
      block.Allocate(op, "an index of " + std::to_string(capacity) + " slots", stream, &memory));
  v.bucket_mask = capacity / kBucketSlots - 1;
  v.dim = config_.dim;
  v.num_slots = num_slots_;
  const Status cleared = EmptyIndex(op, stream, v, capacity);
  if (!cleared.ok()) {
    FreeBlock(op, stream, &memory);
    return cleared;
  }
  *out = Arrays{memory, capacity, v};
  return Status::OK();
}

Status GpuTable::EnsureRoom(const char* op, cudaStream_t stream, int64_t new_keys) {
  const uint64_t capacity = arrays_->capacity;
  const double max_load = config_.max_load;
  int64_t size = -1, tombstones = 0;
  TFPS_GPU_RETURN_IF_ERROR(counts_->Poll(op, &size, &tombstones));
  if (counts_->Admit(new_keys, max_load * capacity)) return Status::OK();
  if (size < 0) {
    TFPS_GPU_RETURN_IF_ERROR(ReadKeyCounts(op, stream, View().counters, &size, &tombstones));
  }
  counts_->Reset(size + tombstones);
  if (counts_->Admit(new_keys, max_load * capacity)) return Status::OK();
  // Sweeping tombstones at the same size pays only while the live keys leave a quarter of
  // the budget free (as the CPU stripes decide); otherwise double.
  uint64_t grown = capacity;
  if (size + new_keys > 0.75 * max_load * capacity) {
    while (size + new_keys > max_load * grown && grown <= kMaxCapacity) grown *= 2;
  }
  if (grown > kMaxCapacity) {
    return Status(StatusCode::kResourceExhausted,
                  std::string(op) + ": " + std::to_string(size + new_keys) +
                      " keys would need an index of more than 2^36 slots");
  }
  TFPS_GPU_RETURN_IF_ERROR(Rebuild(op, stream, grown));
  counts_->Reset(size + new_keys);
  return Status::OK();
}

Status GpuTable::Rebuild(const char* op, cudaStream_t stream, uint64_t capacity) {
  Arrays rebuilt;
  TFPS_GPU_RETURN_IF_ERROR(AllocateArrays(op, stream, capacity, &rebuilt));
  const Status moved = TFPS_LAUNCH(op, RehashKernel, arrays_->capacity, stream, View(),
                                   arrays_->capacity, rebuilt.view);
  if (!moved.ok()) {
    FreeBlock(op, stream, &rebuilt.block);
    return moved;
  }
  std::swap(*arrays_, rebuilt);
  ++generation_;
  return FreeBlock(op, stream, &rebuilt.block);
}

Status GpuTable::EnsureScratch(const char* op, cudaStream_t stream, int64_t n) {
  if (scratch_->keys >= n) return Status::OK();
  const uint64_t keys = PowerOfTwoAtLeast(n, 1024);
  Scratch grown;
  DeviceBlock block;
  block.Add(&grown.view.map, 2 * keys);
  block.Add(&grown.view.rep, keys);
  block.Add(&grown.view.acc, keys);
  block.Add(&grown.view.slot, keys);
  block.Add(&grown.view.fresh, keys);
  block.Add(&grown.view.cursor, keys);
  block.Add(&grown.view.list, keys);
  block.Add(&grown.view.merged, keys);
  block.Add(&grown.view.repeated, keys);
  TFPS_GPU_RETURN_IF_ERROR(
      block.Allocate(op, "a batch of " + std::to_string(keys) + " keys", stream, &grown.block));
  grown.keys = static_cast<int64_t>(keys);
  grown.view.listed = scalars_ + 1;
  grown.view.longest = scalars_ + 2;
  grown.view.repeats = scalars_ + 3;
  std::swap(*scratch_, grown);
  return FreeBlock(op, stream, &grown.block);
}

Status GpuTable::GroupAndClaim(const char* op, cudaStream_t stream, const uint64_t* keys, int64_t n,
                               GroupFold fold, const int64_t* occurrences, ClaimMetadata meta,
                               const uint32_t* refused, BatchView* batch) {
  TFPS_GPU_RETURN_IF_ERROR(EnsureRoom(op, stream, n));
  TFPS_GPU_RETURN_IF_ERROR(EnsureScratch(op, stream, n));
  BatchView b = scratch_->view;
  const uint64_t entries =
      PowerOfTwoAtLeast(2 * static_cast<uint64_t>(n), 64);  // at most half full
  b.map_mask = entries - 1;
  TFPS_RETURN_IF_CUDA_ERROR(op, "clearing the batch map",
                            cudaMemsetAsync(b.map, 0, entries * sizeof(uint32_t), stream));
  TFPS_RETURN_IF_CUDA_ERROR(op, "clearing the batch accumulators",
                            cudaMemsetAsync(b.acc, 0, n * sizeof(unsigned long long), stream));
  TFPS_GPU_RETURN_IF_ERROR(TFPS_LAUNCH(op, GroupKernel, n, stream, keys, n, b, fold, occurrences));
  TFPS_GPU_RETURN_IF_ERROR(
      TFPS_LAUNCH(op, ClaimKernel, n, stream, View(), keys, n, b, meta, refused));
  *batch = b;
  return counts_->Snapshot(op, stream, View().counters);
}

Status GpuTable::LaunchRowsOut(const char* op, cudaStream_t stream, const uint64_t* keys, int64_t n,
                               const BatchView& batch, float* values, uint8_t* exists) {
  const int dim = config_.dim;
  const auto fits = [&](int width) {
    return dim % width == 0 && reinterpret_cast<uintptr_t>(values) % (width * sizeof(float)) == 0;
  };
  const int width = fits(4) ? 4 : fits(2) ? 2 : 1;
  int lane_bits = 0;  // a power of two of lanes, up to one per piece of the row
  while ((2 << lane_bits) <= std::min(dim / width, kMaxLanes)) ++lane_bits;
  using Kernel =
      void (*)(TableView, RowInit, const uint64_t*, int64_t, int, BatchView, float*, uint8_t*);
  const Kernel kernel = width == 4   ? RowsOutKernel<4>
                        : width == 2 ? RowsOutKernel<2>
                                     : RowsOutKernel<1>;
  return LaunchKernel(op, "RowsOutKernel", kernel, n << lane_bits, stream, View(),
                      MakeRowInit(config_.optimizer), keys, n, lane_bits, batch, values, exists);
}

Status GpuTable::Find(cudaStream_t stream, const uint64_t* keys, int64_t n, float* values,
                      uint8_t* exists) {
  static constexpr const char* kOp = "GpuTable::Find";
  TFPS_GPU_RETURN_IF_ERROR(CheckBatch(kOp, n, {{"keys", keys}, {"values", values}}));
  return Call(kOp, stream,
              [&] { return LaunchRowsOut(kOp, stream, keys, n, BatchView{}, values, exists); });
}

Status GpuTable::FindOrInsert(cudaStream_t stream, const uint64_t* keys, int64_t n, float* values,
                              const int64_t* occurrences) {
  static constexpr const char* kOp = "GpuTable::FindOrInsert";
  TFPS_GPU_RETURN_IF_ERROR(CheckBatch(kOp, n, {{"keys", keys}, {"values", values}}));
  if (n == 0) return Status::OK();
  return Call(kOp, stream, [&]() -> Status {
    BatchView b;
    TFPS_GPU_RETURN_IF_ERROR(GroupAndClaim(kOp, stream, keys, n, GroupFold::kOccurrences,
                                           occurrences, ClaimMetadata{true, nullptr, clock_}, nullptr, &b));
    return LaunchRowsOut(kOp, stream, keys, n, b, values, nullptr);
  });
}

Status GpuTable::ApplyGradients(cudaStream_t stream, const uint64_t* keys, int64_t n,
                                const float* grads, int64_t step, float learning_rate,
                                bool* applied) {
  static constexpr const char* kOp = "GpuTable::ApplyGradients";
  TFPS_GPU_RETURN_IF_ERROR(CheckBatch(kOp, n, {{"keys", keys}, {"grads", grads}}));
  OptimizerConfig optimizer = config_.optimizer;
  if (learning_rate >= 0.0f) optimizer.learning_rate = learning_rate;
  return Call(kOp, stream, [&]() -> Status {
    const int64_t dim = config_.dim;
    TFPS_RETURN_IF_CUDA_ERROR(kOp, "clearing the refusal flag",
                              cudaMemsetAsync(refused_, 0, sizeof(uint32_t), stream));
    TFPS_GPU_RETURN_IF_ERROR(
        TFPS_LAUNCH(kOp, CheckFiniteKernel, n * dim, stream, grads, n * dim, refused_));
    TFPS_GPU_RETURN_IF_ERROR(TFPS_LAUNCH(kOp, AdvanceClockKernel, 1, stream, refused_, clock_));
    if (n > 0) {
      BatchView b;
      TFPS_GPU_RETURN_IF_ERROR(GroupAndClaim(kOp, stream, keys, n, GroupFold::kCount, nullptr,
                                             ClaimMetadata{false, nullptr, nullptr}, refused_, &b));
      TFPS_RETURN_IF_CUDA_ERROR(
          kOp, "clearing the occurrence list",
          cudaMemsetAsync(b.listed, 0, 3 * sizeof(*b.listed), stream));  // and longest, repeats
      TFPS_GPU_RETURN_IF_ERROR(TFPS_LAUNCH(kOp, ListSegmentKernel, n, stream, n, b));
      TFPS_GPU_RETURN_IF_ERROR(TFPS_LAUNCH(kOp, ListScatterKernel, n, stream, n, b));
      // As many passes as the longest possible segment needs; those past the longest
      // actual one return at once (the host does not wait to learn it).
      uint32_t* from = b.list;
      uint32_t* to = b.merged;
      for (uint64_t width = 1; width < static_cast<uint64_t>(n); width *= 2, std::swap(from, to)) {
        TFPS_GPU_RETURN_IF_ERROR(TFPS_LAUNCH(kOp, ListMergeKernel, std::min(n, kMergeThreads),
                                             stream, b, from, to, width));
      }
      TFPS_GPU_RETURN_IF_ERROR(TFPS_LAUNCH(kOp, ApplyKernel, n * dim, stream, View(),
                                           MakeRowInit(optimizer), keys, n, b, grads, refused_));
      TFPS_GPU_RETURN_IF_ERROR(TFPS_LAUNCH(kOp, ApplyRepeatedKernel,
                                           std::min(n * dim, kRepeatedThreads), stream, View(),
                                           optimizer, b, grads, refused_));
      TFPS_GPU_RETURN_IF_ERROR(
          TFPS_LAUNCH(kOp, RecordStepKernel, n, stream, View(), n, b, step, clock_, refused_));
    }
    if (applied == nullptr) return Status::OK();
    uint32_t refused = 0;
    TFPS_GPU_RETURN_IF_ERROR(CopyToHost(kOp, "the apply's verdict", stream, &refused, refused_, 1));
    *applied = refused == 0;
    return Status::OK();
  });
}

Status GpuTable::Insert(cudaStream_t stream, const uint64_t* keys, int64_t n, const float* values) {
  static constexpr const char* kOp = "GpuTable::Insert";
  TFPS_GPU_RETURN_IF_ERROR(CheckBatch(kOp, n, {{"keys", keys}, {"values", values}}));
  if (n == 0) return Status::OK();
  return WriteRows(kOp, stream, keys, n, values, nullptr, nullptr);
}

Status GpuTable::Import(cudaStream_t stream, const uint64_t* keys, int64_t n, const float* values,
                        const float* slots, const int64_t* metadata) {
  static constexpr const char* kOp = "GpuTable::Import";
  TFPS_GPU_RETURN_IF_ERROR(CheckBatch(kOp, n,
                                      {{"keys", keys},
                                       {"values", values},
                                       {"metadata", metadata},
                                       {"slots", num_slots_ > 0 ? slots : values}}));
  if (n == 0) return Status::OK();
  return WriteRows(kOp, stream, keys, n, values, slots, metadata);
}

Status GpuTable::WriteRows(const char* op, cudaStream_t stream, const uint64_t* keys, int64_t n,
                           const float* values, const float* slots, const int64_t* metadata) {
  return Call(op, stream, [&]() -> Status {
    BatchView b;
    TFPS_GPU_RETURN_IF_ERROR(GroupAndClaim(op, stream, keys, n, GroupFold::kLast, nullptr,
                                           ClaimMetadata{false, metadata, nullptr}, nullptr, &b));
    return TFPS_LAUNCH(op, WriteRowsKernel, n * config_.dim, stream, View(), config_.optimizer, n,
                       b, values, metadata != nullptr ? slots : nullptr);
  });
}

Status GpuTable::Remove(cudaStream_t stream, const uint64_t* keys, int64_t n, int64_t* removed) {
  static constexpr const char* kOp = "GpuTable::Remove";
  TFPS_GPU_RETURN_IF_ERROR(CheckBatch(kOp, n, {{"keys", keys}}));
  return Call(kOp, stream, [&]() -> Status {
    TFPS_RETURN_IF_CUDA_ERROR(kOp, "clearing the removal count",
                              cudaMemsetAsync(scalars_, 0, sizeof(*scalars_), stream));
    TFPS_GPU_RETURN_IF_ERROR(TFPS_LAUNCH(kOp, RemoveKernel, n, stream, View(), keys, n, scalars_));
    TFPS_GPU_RETURN_IF_ERROR(counts_->Snapshot(kOp, stream, View().counters));
    if (removed == nullptr) return Status::OK();
    unsigned long long count = 0;
    TFPS_GPU_RETURN_IF_ERROR(CopyToHost(kOp, "the removal count", stream, &count, scalars_, 1));
    *removed = static_cast<int64_t>(count);
    return Status::OK();
  });
}

Status GpuTable::Clear(cudaStream_t stream, bool keep_memory) {
  static constexpr const char* kOp = "GpuTable::Clear";
  return Call(kOp, stream, [&]() -> Status {
    const uint64_t initial = PowerOfTwoAtLeast(config_.initial_capacity, kMinCapacity);
    if (keep_memory || arrays_->capacity == initial) {
      TFPS_GPU_RETURN_IF_ERROR(EmptyIndex(kOp, stream, View(), arrays_->capacity));
    } else {
      Arrays emptied;
      TFPS_GPU_RETURN_IF_ERROR(AllocateArrays(kOp, stream, initial, &emptied));
      std::swap(*arrays_, emptied);
      TFPS_GPU_RETURN_IF_ERROR(FreeBlock(kOp, stream, &emptied.block));
      TFPS_GPU_RETURN_IF_ERROR(FreeBlock(kOp, stream, &scratch_->block));
      *scratch_ = Scratch();
    }
    counts_->Reset(0);
    ++generation_;  // cursors of an export before the clear point at nothing
    return Status::OK();
  });
}

Status GpuTable::Reserve(cudaStream_t stream, int64_t expected_keys) {
  static constexpr const char* kOp = "GpuTable::Reserve";
  if (expected_keys < 0)
    return InvalidArgument(std::string(kOp) + ": expected_keys must be >= 0, got " +
                           std::to_string(expected_keys));
  return Call(kOp, stream, [&]() -> Status {
    int64_t size, tombstones;
    TFPS_GPU_RETURN_IF_ERROR(ReadKeyCounts(kOp, stream, View().counters, &size, &tombstones));
    const double keys = static_cast<double>(std::max(expected_keys, size));
    uint64_t capacity = arrays_->capacity;
    while (keys > static_cast<double>(config_.max_load) * capacity && capacity <= kMaxCapacity)
      capacity *= 2;
    if (capacity > kMaxCapacity) {
      return Status(StatusCode::kResourceExhausted,
                    std::string(kOp) + ": " + std::to_string(expected_keys) +
                        " keys would need an index of more than 2^36 slots");
    }
    if (capacity == arrays_->capacity) return Status::OK();
    TFPS_GPU_RETURN_IF_ERROR(Rebuild(kOp, stream, capacity));
    counts_->Reset(size);
    return Status::OK();
  });
}

Status GpuTable::Size(cudaStream_t stream, int64_t* size) {
  return Call("GpuTable::Size", stream, [&] {
    int64_t tombstones;
    return ReadKeyCounts("GpuTable::Size", stream, View().counters, size, &tombstones);
  });
}

Status GpuTable::ApplyCalls(cudaStream_t stream, int64_t* calls) {
  return Call("GpuTable::ApplyCalls", stream, [&] {
    return CopyToHost("GpuTable::ApplyCalls", "the clock", stream, calls, clock_, 1);
  });
}

Status GpuTable::SetApplyCalls(cudaStream_t stream, int64_t calls) {
  return Call("GpuTable::SetApplyCalls", stream, [&] {
    return TFPS_LAUNCH("GpuTable::SetApplyCalls", SetClockKernel, 1, stream, clock_, calls);
  });
}

Status GpuTable::Export(cudaStream_t stream, int64_t cursor, int64_t max_rows,
                        const RowBuffers& out, int64_t* rows, int64_t* next_cursor) {
  static constexpr const char* kOp = "GpuTable::Export";
  if (rows == nullptr || next_cursor == nullptr) {
    return InvalidArgument(std::string(kOp) + ": rows and next_cursor must be given");
  }
  const void* slots = num_slots_ > 0 ? static_cast<const void*>(out.slots) : out.keys;
  TFPS_GPU_RETURN_IF_ERROR(CheckBatch(kOp, max_rows,
                                      {{"out.keys", out.keys},
                                       {"out.values", out.values},
                                       {"out.metadata", out.metadata},
                                       {"out.slots", slots}},
                                      "max_rows"));
  return Call(kOp, stream, [&]() -> Status {
    const uint32_t generation = generation_ & kGenerationMask;
    uint64_t begin = 0;
    if (cursor > 0) {
      const uint32_t made_in = static_cast<uint32_t>(cursor >> kCursorSlotBits);
      if (made_in != generation) {
        return FailedPrecondition(std::string(kOp) + ": cursor " + std::to_string(cursor) +
                                  " is from before the index was rebuilt (generation " +
                                  std::to_string(made_in) + ", now " + std::to_string(generation) +
                                  "); start the export again from cursor 0");
      }
      begin = static_cast<uint64_t>(cursor & kCursorSlotMask);
    }
    int64_t next_slot = -1;
    TFPS_GPU_RETURN_IF_ERROR(ExportChunkFrom(kOp, stream, View(), arrays_->capacity, begin,
                                             max_rows, out, rows, &next_slot));
    *next_cursor = next_slot < 0 ? -1 : (int64_t{generation} << kCursorSlotBits) | next_slot;
    return Status::OK();
  });
}

}  // namespace gpu
}  // namespace tfps
