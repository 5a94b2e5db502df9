// CPU kernels that checkpoint a table shard: save streams its rows (or its changes since
// its last save) to a row file, check reads row files whole, restore streams rows back in,
// keeping the keys routed to its shard. Memory stays at a chunk or two whatever the
// table's size (but for the rare restore of a whole-shard file among files of changes).
#include <algorithm>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "custom_ops/core/hashing.h"
#include "custom_ops/table/kernels/row_file.h"
#include "custom_ops/table/kernels/table_resource.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/op_requires.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/tensor.h"

namespace tfps {
namespace {

using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;

// shard_index and num_shards inputs, checked: 0 <= shard_index < num_shards <= 2^31.
absl::Status ShardInputs(OpKernelContext* ctx, const char* op, int index, uint32_t* shard,
                         uint32_t* num_shards) {
  const Tensor *shard_t, *count_t;
  TF_RETURN_IF_ERROR(ScalarInput(ctx, op, index, "shard_index", &shard_t));
  TF_RETURN_IF_ERROR(ScalarInput(ctx, op, index + 1, "num_shards", &count_t));
  const int64_t s = shard_t->scalar<int64_t>()(), n = count_t->scalar<int64_t>()();
  if (n < 1 || n > (int64_t{1} << 31) || s < 0 || s >= n) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": shard_index must be in [0, num_shards) and num_shards in [1, 2^31], got shard ",
        s, " of ", n));
  }
  *shard = static_cast<uint32_t>(s);
  *num_shards = static_cast<uint32_t>(n);
  return absl::OkStatus();
}

// paths [n] and expected_rows [n].
absl::Status FileInputs(OpKernelContext* ctx, const char* op, int index,
                        std::vector<std::string>* paths, std::vector<int64_t>* expected_rows) {
  const Tensor& p = ctx->input(index);
  const Tensor& r = ctx->input(index + 1);
  if (p.dims() != 1 || r.dims() != 1 || p.dim_size(0) != r.dim_size(0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": paths and expected_rows must be vectors of one length, got shapes ",
        p.shape().DebugString(), " and ", r.shape().DebugString()));
  }
  for (int64_t i = 0; i < p.dim_size(0); ++i) {
    paths->push_back(p.vec<::tensorflow::tstring>()(i));
    expected_rows->push_back(r.vec<int64_t>()(i));
  }
  return absl::OkStatus();
}

class TableSaveOp : public OpKernel {
 public:
  explicit TableSaveOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("max_chunk_bytes", &max_chunk_bytes_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("changes_only", &changes_only_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("snapshot", &snapshot_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("chain", &chain_));
    OP_REQUIRES(ctx, !(snapshot_ && changes_only_),
                absl::InvalidArgumentError(
                    "Tfps>TableSave: a snapshot is a whole copy; it cannot be changes_only"));
    OP_REQUIRES(ctx, max_chunk_bytes_ > 0,
                absl::InvalidArgumentError(absl::StrCat(
                    "Tfps>TableSave: max_chunk_bytes must be > 0, got ", max_chunk_bytes_)));
  }

  void Compute(OpKernelContext* ctx) override {
    ::tensorflow::core::RefCountPtr<TableResource> resource;
    OP_REQUIRES_OK(ctx, LookupTableInput(ctx, &resource));
    ::tensorflow::tf_shared_lock not_restoring(resource->restore_gate());
    const Tensor* path;
    OP_REQUIRES_OK(ctx, ScalarInput(ctx, "Tfps>TableSave", 1, "path", &path));
    RowFileHeader header;
    OP_REQUIRES_OK(ctx, ShardInputs(ctx, "Tfps>TableSave", 2, &header.shard_index,
                                    &header.num_shards));
    Table& table = resource->table();
    header.dim = table.dim();
    header.num_slots = table.num_slots();
    header.optimizer = static_cast<uint32_t>(table.config().optimizer.kind);
    header.clock = table.ApplyCalls();
    // A chunk record counts its rows in 32 bits.
    const int64_t chunk_rows = std::clamp<int64_t>(
        max_chunk_bytes_ / static_cast<int64_t>(RowBytes(header)), 1, std::numeric_limits<uint32_t>::max());
    const Tensor* save_id;
    OP_REQUIRES_OK(ctx, ScalarInput(ctx, "Tfps>TableSave", 4, "save_id", &save_id));
    const std::string file = path->scalar<::tensorflow::tstring>()();
    Table::ChainPoint base;
    const bool changes = changes_only_ && table.LastSaveOfChain(ChainOf(chain_, file), &base);
    header.kind = changes ? kShardChanges : kWholeShard;
    header.save_id = static_cast<uint64_t>(save_id->scalar<int64_t>()());
    header.base_id = changes ? base.save_id : 0;
    // A snapshot belongs to no chain: it leaves the clock alone and reads every row.
    const int64_t stamp = snapshot_ ? -1 : table.BeginSave();
    int64_t rows = 0;
    absl::Status status;
    RunOrReportOutOfMemory(ctx, "Tfps>TableSave", resource->name(), [&] {
      bool incomplete = false;
      status = Save(ctx, table, file, header, chunk_rows, changes ? base.stamp : -1, &rows, &incomplete);
      if (status.ok() && incomplete) {
        // Removals the chain needed were dropped while this save ran: it is written whole.
        header.kind = kWholeShard;
        header.base_id = 0;
        status = Save(ctx, table, file, header, chunk_rows, -1, &rows, &incomplete);
      }
    }, "no file was written");
    if (!ctx->status().ok()) return;
    OP_REQUIRES_OK(ctx, status);
    // The chain moves on only when the whole checkpoint is written (Tfps>TableCommitSave).
    Tensor *rows_out, *kind_out, *stamp_out;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &rows_out));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({}), &kind_out));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, TensorShape({}), &stamp_out));
    rows_out->scalar<int64_t>()() = rows;
    kind_out->scalar<int64_t>()() = header.kind;
    stamp_out->scalar<int64_t>()() = stamp;
  }

 private:
  // Writes the rows changed after `changed_after` (all rows when negative); *incomplete
  // when the table could not tell every change.
  static absl::Status Save(OpKernelContext* ctx, Table& table, const std::string& path,
                           const RowFileHeader& header, int64_t chunk_rows, int64_t changed_after,
                           int64_t* rows, bool* incomplete) {
    std::unique_ptr<RowFileWriter> writer;
    TF_RETURN_IF_ERROR(RowFileWriter::Create(ctx->env(), path, header, &writer));
    ExportChunk chunk;
    *incomplete = false;
    for (int64_t cursor = 0; cursor >= 0; cursor = chunk.next_cursor) {
      table.SaveChunk(cursor, chunk_rows, changed_after, &chunk);
      if (chunk.changes_incomplete) {
        *incomplete = true;
        return absl::OkStatus();  // the writer's temporary file goes with it
      }
      TF_RETURN_IF_ERROR(writer->Append(chunk));
    }
    TF_RETURN_IF_ERROR(SaveState(table, writer.get()));
    TF_RETURN_IF_ERROR(writer->Finish());
    *rows = writer->rows();
    return absl::OkStatus();
  }

  // The admission and eviction state after the rows: counters and clock record, then each
  // stripe's counts of keys waiting for admission, copied out of the stripe one at a time.
  static absl::Status SaveState(const Table& table, RowFileWriter* writer) {
    StateRecord record;
    record.kind = StateRecord::kTable;
    int64_t counters[kNumCounters];
    table.Counters(counters);
    record.table.assign(counters, counters + kNumCounters);
    for (const auto& [clock, micros] : table.ClockTimes()) {
      record.table.push_back(clock);
      record.table.push_back(micros);
    }
    TF_RETURN_IF_ERROR(writer->AppendState(record));
    if (table.config().admission.kind == AdmissionKind::kNone) return absl::OkStatus();
    constexpr size_t kPendingPerRecord = size_t{1} << 18;
    for (int stripe = 0; stripe < (1 << table.log2_stripes()); ++stripe) {
      const PendingCounts pending = table.PendingOfStripe(stripe);
      if (!pending.exact()) {
        record.kind = StateRecord::kSketch;
        record.stripe = static_cast<uint32_t>(stripe);
        record.log2_stripes = static_cast<uint32_t>(table.log2_stripes());
        record.width = static_cast<uint32_t>(pending.width());
        record.cells = pending.cells();
        TF_RETURN_IF_ERROR(writer->AppendState(record));
        continue;
      }
      record.kind = StateRecord::kPending;
      record.keys.clear();
      record.counts.clear();
      absl::Status status;
      auto flush = [&] {
        if (status.ok() && !record.keys.empty()) status = writer->AppendState(record);
        record.keys.clear();
        record.counts.clear();
      };
      pending.ForEachExact([&](uint64_t key, uint32_t count) {
        record.keys.push_back(static_cast<int64_t>(key));
        record.counts.push_back(count);
        if (record.keys.size() == kPendingPerRecord) flush();
      });
      flush();
      TF_RETURN_IF_ERROR(status);
    }
    return absl::OkStatus();
  }

  int64_t max_chunk_bytes_ = 0;
  bool changes_only_ = false;
  bool snapshot_ = false;
  std::string chain_;
};

class RowFilesCheckOp : public OpKernel {
 public:
  explicit RowFilesCheckOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    int64_t dim = 0, num_slots = 0;
    std::string optimizer;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("dim", &dim));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("num_slots", &num_slots));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("optimizer", &optimizer));
    OptimizerKind kind;
    OP_REQUIRES(ctx, ParseOptimizerKind(optimizer, &kind),
                absl::InvalidArgumentError(absl::StrCat("Tfps>RowFilesCheck: unknown optimizer '", optimizer,
                                                     "'; known: ", OptimizerNames())));
    dim_ = static_cast<uint32_t>(dim);
    num_slots_ = static_cast<uint32_t>(num_slots);
    optimizer_ = static_cast<uint32_t>(kind);
  }

  void Compute(OpKernelContext* ctx) override {
    ::tensorflow::core::RefCountPtr<TableResource> resource;
    OP_REQUIRES_OK(ctx, LookupTableInput(ctx, &resource));
    ::tensorflow::tf_shared_lock not_restoring(resource->restore_gate());
    std::vector<std::string> paths;
    std::vector<int64_t> expected_rows;
    OP_REQUIRES_OK(ctx, FileInputs(ctx, "Tfps>RowFilesCheck", 1, &paths, &expected_rows));
    int64_t clock = 0;
    for (size_t i = 0; i < paths.size(); ++i) {
      RowFileHeader header;
      const absl::Status read = CheckRowFile(ctx->env(), paths[i], expected_rows[i], dim_, num_slots_,
                                             optimizer_, &header);
      OP_REQUIRES(ctx, !absl::IsNotFound(read),
                  absl::NotFoundError(absl::StrCat(read.message(), " (on ", ctx->device()->name(),
                                                   "; every task must reach the checkpoint "
                                                   "location: on several machines, shared storage)")));
      OP_REQUIRES_OK(ctx, read);
      // Changes applied to another state than the one they follow would give a table that
      // never existed (a chain restored out of order, or changes without their whole save).
      OP_REQUIRES(ctx, header.kind != kShardChanges || header.base_id == 0 ||
                           resource->table().EqualsState(header.base_id),
                  absl::FailedPreconditionError(absl::StrCat(
                      "tfps checkpoint file '", paths[i], "' holds the changes since the save with "
                      "id ", header.base_id, ", but the table restoring it ",
                      resource->table().DescribeState(), "; restore the checkpoint these changes "
                      "follow first (the last whole one, then each later one in order), with no "
                      "training or other change of the table between")));
      clock = std::max(clock, header.clock);
    }
    Tensor* out;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
    out->scalar<int64_t>()() = clock;
  }

 private:
  uint32_t dim_ = 0, num_slots_ = 0, optimizer_ = 0;
};

// Keeps the rows of `chunk` whose keys route to `shard`, in place.
void KeepShard(ExportChunk* chunk, uint32_t shard, uint32_t num_shards, int dim, int slot_width) {
  if (num_shards == 1) return;
  size_t kept = 0;
  for (size_t i = 0; i < chunk->keys.size(); ++i) {
    if (ShardOf(static_cast<uint64_t>(chunk->keys[i]), num_shards) != shard) continue;
    if (kept != i) {
      chunk->keys[kept] = chunk->keys[i];
      std::copy_n(&chunk->metadata[i * kNumMetadata], kNumMetadata, &chunk->metadata[kept * kNumMetadata]);
      std::copy_n(&chunk->values[i * dim], dim, &chunk->values[kept * dim]);
      std::copy_n(&chunk->slots[i * slot_width], slot_width, &chunk->slots[kept * slot_width]);
    }
    ++kept;
  }
  chunk->keys.resize(kept);
}

void KeepShardKeys(std::vector<int64_t>* keys, uint32_t shard, uint32_t num_shards) {
  if (num_shards == 1) return;
  keys->erase(std::remove_if(keys->begin(), keys->end(), [&](int64_t k) {
                return ShardOf(static_cast<uint64_t>(k), num_shards) != shard;
              }), keys->end());
}

// Removes the table's keys that route to shard `shard` of `num_shards`.
void RemoveKeysOf(Table& table, uint32_t shard, uint32_t num_shards, const ParallelFor& parallel_for) {
  std::vector<int64_t> doomed;
  ExportChunk chunk;
  for (int64_t cursor = 0; cursor >= 0; cursor = chunk.next_cursor) {
    table.ExportInto(cursor, 1 << 16, &chunk);
    for (int64_t key : chunk.keys) {
      if (ShardOf(static_cast<uint64_t>(key), num_shards) == shard) doomed.push_back(key);
    }
  }
  table.Remove(reinterpret_cast<const uint64_t*>(doomed.data()), static_cast<int64_t>(doomed.size()),
               parallel_for);
}

// The counters and clock record of the files a restore reads. Read alone (as many shards
// as were saved), a file's state is the shard's; read by every new shard (the shard count
// changed), the counters are summed and shared out, but for the skipped steps, which every
// shard counts alike (the largest is kept), and the clock record is the newest file's. Counts of keys waiting for admission go straight into the table: sketches merge
// (each counter the largest saved one it covers), exact counts of this shard's keys add.
struct SavedState {
  int64_t counters[kNumCounters] = {};
  int64_t newest_clock = -1;
  std::vector<std::pair<int64_t, int64_t>> clock_times;
  bool seen = false;

  void Add(Table& table, const StateRecord& record, int64_t file_clock, uint32_t saved_shards,
           uint32_t shard, uint32_t num_shards) {
    if (record.kind == StateRecord::kSketch) {
      // Read by every new shard, a saved sketch's keys spread over all of them.
      table.MergePendingSketch(static_cast<int>(record.stripe), static_cast<int>(record.log2_stripes),
                               record.cells.data(), record.width,
                               saved_shards == num_shards ? 1.0 : 1.0 / num_shards);
      return;
    }
    if (record.kind == StateRecord::kPending) {
      std::vector<uint64_t> keys;
      std::vector<uint32_t> counts;
      for (size_t i = 0; i < record.keys.size(); ++i) {
        if (ShardOf(static_cast<uint64_t>(record.keys[i]), num_shards) != shard) continue;
        keys.push_back(static_cast<uint64_t>(record.keys[i]));
        counts.push_back(record.counts[i]);
      }
      table.AddPending(keys.data(), counts.data(), static_cast<int64_t>(keys.size()));
      return;
    }
    seen = true;
    for (size_t i = 0; i < kNumCounters; ++i) {
      counters[i] = i == kSkippedSteps ? std::max(counters[i], record.table[i]) : counters[i] + record.table[i];
    }
    if (file_clock > newest_clock) {
      newest_clock = file_clock;
      clock_times.clear();
      for (size_t i = kNumCounters; i + 1 < record.table.size(); i += 2) {
        clock_times.emplace_back(record.table[i], record.table[i + 1]);
      }
    }
  }

  void Apply(Table& table, bool shared_out, uint32_t shard, uint32_t num_shards) const {
    if (!seen) return;  // files of format version 1 carry no state
    int64_t mine[kNumCounters];
    for (int i = 0; i < kNumCounters; ++i) {
      mine[i] = shared_out && i != kSkippedSteps
                    ? counters[i] / num_shards + (shard < counters[i] % num_shards ? 1 : 0)
                    : counters[i];
    }
    table.SetCounters(mine);
    table.SetClockTimes(clock_times);
  }
};

class TableRestoreOp : public OpKernel {
 public:
  explicit TableRestoreOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("records_verified", &records_verified_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("chain", &chain_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("continue_chain", &continue_chain_));
  }

  void Compute(OpKernelContext* ctx) override {
    ::tensorflow::core::RefCountPtr<TableResource> resource;
    OP_REQUIRES_OK(ctx, LookupTableInput(ctx, &resource));
    ::tensorflow::mutex_lock restoring(resource->restore_gate());  // see restore_gate()
    std::vector<std::string> paths;
    std::vector<int64_t> expected_rows;
    OP_REQUIRES_OK(ctx, FileInputs(ctx, "Tfps>TableRestore", 1, &paths, &expected_rows));
    OP_REQUIRES(ctx, !paths.empty(),
                absl::InvalidArgumentError("Tfps>TableRestore: no files to restore from"));
    uint32_t shard = 0, num_shards = 1;
    OP_REQUIRES_OK(ctx, ShardInputs(ctx, "Tfps>TableRestore", 3, &shard, &num_shards));
    Table& table = resource->table();
    const int dim = table.dim(), slot_width = table.num_slots() * table.dim();
    // Every header before the table is touched.
    std::vector<std::unique_ptr<RowFileReader>> readers(paths.size());
    int64_t clock = 0;
    for (size_t i = 0; i < paths.size(); ++i) {
      OP_REQUIRES_OK(ctx, RowFileReader::Open(ctx->env(), paths[i], &readers[i], !records_verified_));
      const RowFileHeader& h = readers[i]->header();
      OP_REQUIRES(ctx, h.dim == static_cast<uint32_t>(dim) &&
                           h.num_slots == static_cast<uint32_t>(table.num_slots()) &&
                           h.optimizer == static_cast<uint32_t>(table.config().optimizer.kind),
                  absl::InvalidArgumentError(absl::StrCat(
                      "Tfps>TableRestore: '", paths[i], "' holds rows of dim ", h.dim, " with ",
                      h.num_slots, " slots; the table has dim ", dim, " with ",
                      table.num_slots(), " slots, or another optimizer")));
      // Checked by Tfps>RowFilesCheck too, but the table may have changed since (other
      // variables are restored between the two).
      OP_REQUIRES(ctx, h.kind != kShardChanges || h.base_id == 0 || table.EqualsState(h.base_id),
                  absl::FailedPreconditionError(absl::StrCat(
                      "tfps checkpoint file '", paths[i], "' holds the changes since the save with "
                      "id ", h.base_id, ", but the table restoring it ", table.DescribeState(),
                      "; it changed after its files were checked (is training still running?)")));
      clock = std::max(clock, h.clock);
    }
    int64_t restored = 0;
    absl::Status status;
    RunOrReportOutOfMemory(ctx, "Tfps>TableRestore", resource->name(), [&] {
      status = Restore(ctx, table, readers, expected_rows, shard, num_shards, &restored);
    }, "the table is partly restored");
    OP_REQUIRES_OK(ctx, status);
    if (!ctx->status().ok()) return;
    table.SetApplyCalls(clock);
    // The files of one save share its id: the table equals that save now, and the chain of
    // the files' directory continues from it.
    uint64_t save_id = readers[0]->header().save_id;
    for (const auto& reader : readers) {
      if (reader->header().save_id != save_id) save_id = 0;
    }
    const int64_t stamp = table.BeginSave();
    if (save_id != 0 && continue_chain_) {
      table.RecordChainSave(ChainOf(chain_, paths[0]), Table::ChainPoint{save_id, stamp});
    }
    table.RecordState(save_id, stamp, paths[0]);
    Tensor* out;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
    out->scalar<int64_t>()() = restored;
  }

 private:
  // Brings the files' rows and state into the table, file after file, record after record.
  static absl::Status Restore(OpKernelContext* ctx, Table& table,
                              const std::vector<std::unique_ptr<RowFileReader>>& readers,
                              const std::vector<int64_t>& expected_rows, uint32_t shard,
                              uint32_t num_shards, int64_t* restored) {
    const int dim = table.dim(), slot_width = table.num_slots() * table.dim();
    bool all_whole = true;
    for (const auto& reader : readers) all_whole &= reader->header().kind == kWholeShard;
    if (all_whole) {
      table.Clear(/*keep_memory=*/true);  // the restored rows reuse it
      int64_t saved_rows = 0;
      for (int64_t rows : expected_rows) saved_rows += std::max<int64_t>(0, rows);
      // Reading every file, this shard keeps about 1 / num_shards of their rows.
      table.Reserve(readers.size() > 1 ? saved_rows / num_shards : saved_rows);
    }
    // The saved counts of keys waiting for admission replace the table's.
    table.ClearPending();
    SavedState state;
    ExportChunk chunk;
    StateRecord record;
    const ParallelFor parallel_for = DeviceParallelFor(ctx);
    for (const auto& reader : readers) {
      const RowFileHeader& h = reader->header();
      if (!all_whole && h.kind == kWholeShard) {
        // Whole rows of one saved shard: the keys that shard held go first.
        RemoveKeysOf(table, h.shard_index, h.num_shards, parallel_for);
      }
      for (bool done = false;;) {
        const absl::Status status = reader->Next(&chunk, &done, &record);
        if (!status.ok()) {
          return absl::Status(status.code(),
                              absl::StrCat(status.message(), " (the table is partly restored)"));
        }
        if (done) break;
        if (record.kind != StateRecord::kNone) {
          state.Add(table, record, h.clock, h.num_shards, shard, num_shards);
        } else if (!chunk.removed.empty()) {
          KeepShardKeys(&chunk.removed, shard, num_shards);
          table.Remove(reinterpret_cast<const uint64_t*>(chunk.removed.data()),
                       static_cast<int64_t>(chunk.removed.size()), parallel_for);
        } else {
          KeepShard(&chunk, shard, num_shards, dim, slot_width);
          const int64_t n = static_cast<int64_t>(chunk.keys.size());
          table.Import(reinterpret_cast<const uint64_t*>(chunk.keys.data()), n,
                       chunk.values.data(), chunk.slots.data(), chunk.metadata.data(), parallel_for);
          *restored += n;
        }
      }
    }
    state.Apply(table, readers.size() > 1, shard, num_shards);
    return absl::OkStatus();
  }

  bool records_verified_ = false;
  std::string chain_;
  bool continue_chain_ = true;
};

// Records a save whose every file and manifest are written as its chain's last save.
class TableCommitSaveOp : public OpKernel {
 public:
  explicit TableCommitSaveOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("chain", &chain_));
  }

  void Compute(OpKernelContext* ctx) override {
    ::tensorflow::core::RefCountPtr<TableResource> resource;
    OP_REQUIRES_OK(ctx, LookupTableInput(ctx, &resource));
    ::tensorflow::tf_shared_lock not_restoring(resource->restore_gate());
    const Tensor *path, *save_id, *stamp;
    OP_REQUIRES_OK(ctx, ScalarInput(ctx, "Tfps>TableCommitSave", 1, "path", &path));
    OP_REQUIRES_OK(ctx, ScalarInput(ctx, "Tfps>TableCommitSave", 2, "save_id", &save_id));
    OP_REQUIRES_OK(ctx, ScalarInput(ctx, "Tfps>TableCommitSave", 3, "stamp", &stamp));
    const uint64_t id = static_cast<uint64_t>(save_id->scalar<int64_t>()());
    const Table::ChainPoint point{id, stamp->scalar<int64_t>()()};
    resource->table().RecordChainSave(ChainOf(chain_, path->scalar<::tensorflow::tstring>()()), point);
    resource->table().RecordState(point.save_id, point.stamp, path->scalar<::tensorflow::tstring>()());
  }

 private:
  std::string chain_;
};

// Fails, naming the file and the task that wrote it, when a shard's file is not visible
// here (the chief): tasks that see different storage at the checkpoint's path.
class RowFilesVisibleOp : public OpKernel {
 public:
  explicit RowFilesVisibleOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& paths = ctx->input(0);
    const Tensor& writers = ctx->input(1);
    OP_REQUIRES(ctx, paths.dims() == 1 && writers.shape() == paths.shape(),
                absl::InvalidArgumentError(absl::StrCat(
                    "Tfps>RowFilesVisible: paths and writers must be vectors of one length, got ",
                    paths.shape().DebugString(), " and ", writers.shape().DebugString())));
    for (int64_t i = 0; i < paths.dim_size(0); ++i) {
      const std::string path = paths.vec<::tensorflow::tstring>()(i);
      OP_REQUIRES(ctx, ctx->env()->FileExists(path).ok(),
                  absl::FailedPreconditionError(absl::StrCat(
                      "tfps checkpoint file '", path, "', which ", std::string(writers.vec<::tensorflow::tstring>()(i)),
                      " wrote, is not visible on ", ctx->device()->name(), ": every task must "
                      "reach the checkpoint location (on several machines, shared storage such as "
                      "a network file system or a cloud bucket); the save is not recorded")));
    }
  }
};

REGISTER_KERNEL_BUILDER(Name("Tfps>TableSave").Device(::tensorflow::DEVICE_CPU), TableSaveOp);
REGISTER_KERNEL_BUILDER(Name("Tfps>TableCommitSave").Device(::tensorflow::DEVICE_CPU), TableCommitSaveOp);
REGISTER_KERNEL_BUILDER(Name("Tfps>RowFilesVisible").Device(::tensorflow::DEVICE_CPU), RowFilesVisibleOp);
REGISTER_KERNEL_BUILDER(Name("Tfps>RowFilesCheck").Device(::tensorflow::DEVICE_CPU), RowFilesCheckOp);
REGISTER_KERNEL_BUILDER(Name("Tfps>TableRestore").Device(::tensorflow::DEVICE_CPU), TableRestoreOp);

}  // namespace
}  // namespace tfps
