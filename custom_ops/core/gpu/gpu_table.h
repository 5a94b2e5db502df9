// A growable hash table from 64-bit keys to float rows with optimizer slots and per-key
// metadata, in GPU memory, with the CPU table's semantics (custom_ops/core/table.h): the
// same operations, initial values equal bit for bit, the same optimizer formulas. TF-free.
//
// Layout. One open-addressing index of 16-slot buckets with a control byte per slot
// (hash_index.h), rows stored at their slot's index, all in one device allocation; the
// index doubles (rows move) when keys plus tombstones would pass max_load. Writing calls
// first group their batch by key (batch_kernels.h), so the keys one launch inserts are
// distinct, no GPU thread ever waits for another, and a key repeated in a batch resolves
// to one row; an apply then walks each repeated key's gradients in input order. Per-call
// scratch (about 45 bytes per key of the largest batch so far) is kept by the table.
//
// Calling it. Pointers to keys, values, gradients and outputs are device pointers; scalar
// results (Size, Remove's count, Export's row count and cursor, the apply verdict) come
// back in host variables. Each call queues its work on the stream it is given and returns
// a Status; no CUDA error aborts. Calls are serialized by a host mutex, and a call on
// another stream than the previous call's first waits (on the device, through an event)
// for that call's work, so calls may come from several threads and streams.
//
// Host syncs. Find never syncs. FindOrInsert, ApplyGradients, Insert and Import sync only
// when the table might have to grow: the host keeps an upper bound of keys plus
// tombstones (it adds n per call, and resets it from a copy of the device's counts that
// each call queues and a later call reads if it has arrived, without waiting), and only
// when the bound would pass max_load does it wait for the exact counts (one sync); the
// rebuild itself (stream-ordered allocation, rehash kernel) is queued. ApplyGradients
// also syncs when asked for its verdict (`applied` non-null), since the refusal is decided
// on the device. Size, ApplyCalls, Remove with a count, Reserve, Export (once per window
// of slots it scans, to place rows in order) and the destructor sync; Clear and
// SetApplyCalls only queue work. Device memory comes from cudaMallocAsync (the device's
// default pool). A failed allocation leaves the table as it was; after any other CUDA
// error the table's device state is unspecified (a faulting kernel also spoils the CUDA
// context).
#ifndef TFPS_CORE_GPU_GPU_TABLE_H_
#define TFPS_CORE_GPU_GPU_TABLE_H_

#include <cstdint>
#include <memory>
#include <mutex>

#include "custom_ops/core/gpu/runtime.h"
#include "custom_ops/core/gpu/status.h"
#include "custom_ops/core/hashing.h"
#include "custom_ops/core/optimizer.h"

namespace tfps {
namespace gpu {

// Kernel-side views and parameters (hash_index.h, batch_kernels.h, row_kernels.h).
struct TableView;
struct BatchView;
struct ClaimMetadata;
struct RowInit;
enum class GroupFold : int;
class KeyCountBound;

struct GpuTableConfig {
  int dim = 8;
  OptimizerConfig optimizer;
  InitializerConfig initializer;
  uint64_t seed = 0;
  int64_t initial_capacity = 1024;  // slots, rounded up to a power of two (at least 64)
  float max_load = 0.8f;            // keys + tombstones past this share of slots rebuild
};

// Metadata columns per row, as the CPU table's (table.h MetadataColumn): count, last step,
// optimizer step, and the eviction score, which the GPU table keeps none of (0).
constexpr int kMetadataColumns = 4;

// Device buffers with room for max_rows rows, in the CPU table's ExportChunk layout:
// keys [rows], values [rows, dim], slots [rows, num_slots, dim], metadata [rows,
// kMetadataColumns]. slots may be null when the optimizer has none.
struct RowBuffers {
  uint64_t* keys = nullptr;
  float* values = nullptr;
  float* slots = nullptr;
  int64_t* metadata = nullptr;
};

class GpuTable {
 public:
  // Builds a table of config.initial_capacity slots; work is queued on `stream`.
  static Status Create(const GpuTableConfig& config, cudaStream_t stream,
                       std::unique_ptr<GpuTable>* table);
  ~GpuTable();  // frees device memory (cudaFree: a device sync)
  GpuTable(const GpuTable&) = delete;
  GpuTable& operator=(const GpuTable&) = delete;

  const GpuTableConfig& config() const { return config_; }
  int dim() const { return config_.dim; }
  int num_slots() const { return num_slots_; }
  int64_t capacity() const;

  // values [n, dim] = row of keys[i], or its initial value if absent (then exists[i] = 0).
  // exists may be null. Never inserts.
  Status Find(cudaStream_t stream, const uint64_t* keys, int64_t n, float* values, uint8_t* exists);

  // Like Find, but absent keys are inserted with their initial value and fresh slots. Each
  // key's count grows by occurrences[i] (clamped at 0; 1 when occurrences is null), and a
  // key that occurred records the clock as its last-seen step.
  Status FindOrInsert(cudaStream_t stream, const uint64_t* keys, int64_t n, float* values,
                      const int64_t* occurrences = nullptr);

  // Applies the optimizer to each key's row with its gradient row (grads [n, dim]),
  // inserting absent keys first, and records `step` as last seen (a negative step stands
  // for the table's clock, its count of ApplyGradients calls, this one included). A key
  // repeated in the call is updated once per occurrence, in input order. A
  // learning_rate >= 0 replaces the configured one for this call. If any gradient is NaN
  // or infinite, nothing changes (the clock neither) and *applied (if given) is false.
  Status ApplyGradients(cudaStream_t stream, const uint64_t* keys, int64_t n, const float* grads,
                        int64_t step, float learning_rate = -1.0f, bool* applied = nullptr);

  // Sets the value of each key (values [n, dim]), inserting absent keys with fresh slots
  // and zero metadata; slots and metadata of present keys are kept. A repeated key takes
  // its last value.
  Status Insert(cudaStream_t stream, const uint64_t* keys, int64_t n, const float* values);

  // Sets value, slots and metadata of each key, in Export's layout (values [n, dim], slots
  // [n, num_slots, dim], null when there are none, metadata [n, kMetadataColumns] clamped
  // to [0, UINT32_MAX], the score ignored). A repeated key takes its last row.
  Status Import(cudaStream_t stream, const uint64_t* keys, int64_t n, const float* values,
                const float* slots, const int64_t* metadata);

  // Removes the keys that are present; *removed (if given, a sync) says how many were.
  // Their slots are reused by later inserts.
  Status Remove(cudaStream_t stream, const uint64_t* keys, int64_t n, int64_t* removed = nullptr);

  // Removes every row; the index shrinks back to its initial capacity unless keep_memory.
  // The clock is kept, as the CPU table keeps it.
  Status Clear(cudaStream_t stream, bool keep_memory = false);
  // Grows the index so that expected_keys keys fit without another rebuild.
  Status Reserve(cudaStream_t stream, int64_t expected_keys);
  Status Size(cudaStream_t stream, int64_t* size);

  // The table's clock (see ApplyGradients); checkpoints save and restore it.
  Status ApplyCalls(cudaStream_t stream, int64_t* calls);
  Status SetApplyCalls(cudaStream_t stream, int64_t calls);

  // Up to max_rows rows into `out`, starting at `cursor` (0 to begin; negative counts as
  // 0), in slot order; *rows says how many and *next_cursor where the next chunk starts,
  // -1 when the table has been visited. Rows changed between chunks may be seen in either
  // state; a rebuild of the index between chunks moves rows, so a cursor from before one
  // is refused (kFailedPrecondition) and the export must start again.
  Status Export(cudaStream_t stream, int64_t cursor, int64_t max_rows, const RowBuffers& out,
                int64_t* rows, int64_t* next_cursor);

 private:
  struct Arrays;   // one device allocation holding the index, rows and counters
  struct Scratch;  // per-call buffers, kept for the next call

  explicit GpuTable(const GpuTableConfig& config);
  Status Init(cudaStream_t stream);
  // Runs body under the table's lock, first ordering `stream` after the previous call's
  // work when that ran on another stream, and marks the call's end with done_.
  template <typename Body>
  Status Call(const char* op, cudaStream_t stream, Body&& body);
  TableView View() const;
  RowInit MakeRowInit(const OptimizerConfig& optimizer) const;
  Status AllocateArrays(const char* op, cudaStream_t stream, uint64_t capacity, Arrays* out);
  // Makes room for new_keys more keys under max_load: by the host's bound, tightened by the
  // last snapshot of the counts when it has arrived; else after reading the counts (a sync),
  // rebuilding the index if they too say so.
  Status EnsureRoom(const char* op, cudaStream_t stream, int64_t new_keys);
  Status Rebuild(const char* op, cudaStream_t stream, uint64_t capacity);
  Status EnsureScratch(const char* op, cudaStream_t stream, int64_t n);
  // The start of every writing call: groups the batch by key and finds or inserts each
  // distinct key; *batch describes the result for the call's later kernels.
  Status GroupAndClaim(const char* op, cudaStream_t stream, const uint64_t* keys, int64_t n,
                       GroupFold fold, const int64_t* occurrences, ClaimMetadata meta,
                       const uint32_t* refused, BatchView* batch);
  Status LaunchRowsOut(const char* op, cudaStream_t stream, const uint64_t* keys, int64_t n,
                       const BatchView& batch, float* values, uint8_t* exists);
  // Insert (slots and metadata null) and Import.
  Status WriteRows(const char* op, cudaStream_t stream, const uint64_t* keys, int64_t n,
                   const float* values, const float* slots, const int64_t* metadata);

  GpuTableConfig config_;
  int num_slots_;
  mutable std::mutex mu_;
  std::unique_ptr<Arrays> arrays_;
  std::unique_ptr<Scratch> scratch_;
  std::unique_ptr<KeyCountBound> counts_;  // how full the index may be (key_counts.h)
  void* state_block_ = nullptr;            // device: the three below
  int64_t* clock_ = nullptr;               // count of applied calls
  uint32_t* refused_ = nullptr;            // this apply's gradients are not all finite
  unsigned long long* scalars_ = nullptr;  // removal count; occurrence-list places, longest, repeats
  cudaEvent_t done_ = nullptr;             // recorded at the end of every call
  cudaStream_t last_stream_ = nullptr;
  bool any_call_ = false;
  uint32_t generation_ = 0;  // index rebuilds and clears so far (export cursors carry it)
};

}  // namespace gpu
}  // namespace tfps

#endif  // TFPS_CORE_GPU_GPU_TABLE_H_
