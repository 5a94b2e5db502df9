// CPU kernels of the dynamic table ops: fetch and validate inputs, allocate outputs, and
// hand the work to the core table.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "custom_ops/table/kernels/row_output.h"
#include "custom_ops/table/kernels/table_resource.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/op_requires.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor_shape.h"

namespace tfps {

using ::tensorflow::DEVICE_CPU;
using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;

namespace {

// Bytes this process may use: the machine's memory, or its cgroup's limit if lower.
int64_t UsableMemoryBytes() {
  int64_t bytes = static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGE_SIZE);
  std::ifstream limit("/sys/fs/cgroup/memory.max");
  int64_t cgroup_bytes = 0;
  if (limit >> cgroup_bytes && cgroup_bytes > 0) bytes = std::min(bytes, cgroup_bytes);
  return bytes;
}

// Bytes of the table's admission sketch (0: no admission, or exact counts).
int64_t SketchBytes(const TableConfig& config) {
  return config.admission.kind == AdmissionKind::kNone ? 0 : config.admission.sketch_bytes;
}

// The admission sketch is allocated and zeroed whole when the table is made: one larger
// than memory would not fail, the kernel would kill the process.
absl::Status CheckSketchFitsMemory(const TableConfig& config, const std::string& table) {
  const int64_t sketch = SketchBytes(config);
  const int64_t usable = UsableMemoryBytes();
  if (usable > 0 && sketch > usable / 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Tfps>TableCreate on table '", table, "': admission sketch_bytes ", sketch,
        " is more than half of the memory this process may use (", usable,
        " bytes); the sketch is allocated whole when the table is made. Give a smaller "
        "sketch_bytes (0 counts keys exactly)"));
  }
  return absl::OkStatus();
}

const uint64_t* KeyData(const Tensor& keys) {
  return reinterpret_cast<const uint64_t*>(keys.tensor_data().data());
}

// Base of every op that takes a table handle: resolves it, checks it against the op's
// attributes, and hands it to ComputeWithTable.
class TableOpKernel : public OpKernel {
 public:
  explicit TableOpKernel(OpKernelConstruction* ctx) : OpKernel(ctx) {
    if (ctx->def().attr().count("dim") > 0) OP_REQUIRES_OK(ctx, ctx->GetAttr("dim", &dim_));
  }

  void Compute(OpKernelContext* ctx) final {
    ::tensorflow::core::RefCountPtr<TableResource> resource;
    OP_REQUIRES_OK(ctx, LookupTableInput(ctx, &resource));
    OP_REQUIRES_OK(ctx, CheckTable(resource->table()));
    ::tensorflow::tf_shared_lock not_restoring(resource->restore_gate());
    RunOrReportOutOfMemory(ctx, type_string(), resource->name(),
                           [&] { ComputeWithTable(ctx, resource->table()); });
  }

 protected:
  virtual void ComputeWithTable(OpKernelContext* ctx, Table& table) = 0;

  virtual absl::Status CheckTable(const Table& table) const {
    if (dim_ >= 0 && table.dim() != dim_) {
      return absl::InvalidArgumentError(absl::StrCat(
          type_string(), ": dim mismatch: the op was built for dim ", dim_,
          " but the table has dim ", table.dim()));
    }
    return absl::OkStatus();
  }

  // Output `index`: one row of dim floats per key, shaped keys.shape + [dim].
  absl::Status AllocateRows(OpKernelContext* ctx, int index, const Tensor& keys, Tensor** rows) const {
    TensorShape shape = keys.shape();
    shape.AddDim(dim_);
    return AllocateRowOutput(ctx, index, shape, rows);
  }

  absl::Status CheckRows(const Tensor& keys, const Tensor& rows, const char* rows_name) const {
    return CheckKeyedRows(type_string(), keys, rows, rows_name, dim_);
  }

  // Rows written as given must be finite, as apply_gradients requires of gradients: one
  // NaN would spread through every model that reads the row.
  absl::Status CheckFinite(const Tensor& rows, const char* rows_name) const {
    const float* data = rows.flat<float>().data();
    for (int64_t i = 0; i < rows.NumElements(); ++i) {
      if (!std::isfinite(data[i])) {
        return absl::InvalidArgumentError(absl::StrCat(
            type_string(), ": ", rows_name, " contain NaN or Inf (element ", i, " is ", data[i],
            "); no row was written"));
      }
    }
    return absl::OkStatus();
  }

  int64_t dim_ = -1;
};

class TableCreateOp : public OpKernel {
 public:
  explicit TableCreateOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ParseTableConfig(ctx, &config_));
    OP_REQUIRES_OK(ctx, ParseResourceName(ctx, "_tfps_table_", &container_, &shared_name_));
  }

  void Compute(OpKernelContext* ctx) override {
    const std::string container =
        container_.empty() ? ctx->resource_manager()->default_container() : container_;
    TableResource* resource = nullptr;
    OP_REQUIRES_OK(ctx, ctx->resource_manager()->LookupOrCreate<TableResource>(
                            container, shared_name_, &resource,
                            [this](TableResource** out) {
                              TF_RETURN_IF_ERROR(CheckSketchFitsMemory(config_, shared_name_));
                              try {
                                auto table = std::make_unique<Table>(config_);
                                std::string name = shared_name_;
                                *out = new TableResource(std::move(table), std::move(name));
                              } catch (const DiskStoreError& e) {
                                return absl::FailedPreconditionError(absl::StrCat(
                                    "Tfps>TableCreate: table '", shared_name_,
                                    "' cannot open its disk tier: ", e.what()));
                              } catch (const std::bad_alloc&) {
                                const int64_t sketch = SketchBytes(config_);
                                return OutOfMemory(
                                    "Tfps>TableCreate", shared_name_, -1,
                                    sketch > 0 ? absl::StrCat("no table was made (its admission "
                                                              "sketch takes sketch_bytes ", sketch, ")")
                                               : std::string("no table was made"));
                              }
                              return absl::OkStatus();
                            }));
    const TableConfig existing = resource->table().config();
    resource->Unref();
    OutputTableHandle<TableResource>(ctx, "table", container, shared_name_, existing, config_);
  }

 private:
  TableConfig config_;
  std::string container_;
  std::string shared_name_;
};

class TableFindOp : public TableOpKernel {
 public:
  using TableOpKernel::TableOpKernel;
  void ComputeWithTable(OpKernelContext* ctx, Table& table) override {
    const Tensor& keys = ctx->input(1);
    Tensor *values = nullptr, *exists = nullptr;
    OP_REQUIRES_OK(ctx, AllocateRows(ctx, 0, keys, &values));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, keys.shape(), &exists));
    table.Find(KeyData(keys), keys.NumElements(), values->flat<float>().data(),
                         reinterpret_cast<uint8_t*>(exists->flat<bool>().data()),
                         DeviceParallelFor(ctx));
  }
};

class TableFindOrInsertOp : public TableOpKernel {
 public:
  using TableOpKernel::TableOpKernel;
  void ComputeWithTable(OpKernelContext* ctx, Table& table) override {
    const Tensor& keys = ctx->input(1);
    const Tensor& occurrences = ctx->input(2);
    OP_REQUIRES(ctx, occurrences.NumElements() == 0 ||
                         (occurrences.dims() == keys.dims() && occurrences.shape() == keys.shape()),
                absl::InvalidArgumentError(absl::StrCat(
                    "Tfps>TableFindOrInsert: occurrences must be empty or have the keys' shape ",
                    keys.shape().DebugString(), ", got ", occurrences.shape().DebugString())));
    const int64_t* seen = occurrences.NumElements() > 0 ? occurrences.flat<int64_t>().data() : nullptr;
    for (int64_t i = 0; seen != nullptr && i < occurrences.NumElements(); ++i) {
      OP_REQUIRES(ctx, seen[i] >= 0, absl::InvalidArgumentError(absl::StrCat(
                                         "Tfps>TableFindOrInsert: occurrences must be >= 0, got ",
                                         seen[i], " at index ", i)));
    }
    Tensor *values = nullptr, *admitted = nullptr;
    OP_REQUIRES_OK(ctx, AllocateRows(ctx, 0, keys, &values));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, keys.shape(), &admitted));
    table.FindOrInsert(KeyData(keys), keys.NumElements(), values->flat<float>().data(),
                       DeviceParallelFor(ctx), seen,
                       reinterpret_cast<uint8_t*>(admitted->flat<bool>().data()));
  }
};

class TableApplyGradientsOp : public TableOpKernel {
 public:
  using TableOpKernel::TableOpKernel;
  void ComputeWithTable(OpKernelContext* ctx, Table& table) override {
    const Tensor& keys = ctx->input(1);
    const Tensor& grads = ctx->input(2);
    OP_REQUIRES_OK(ctx, CheckRows(keys, grads, "gradients"));
    int64_t step = 0;
    OP_REQUIRES_OK(ctx, Int64Input(ctx, type_string(), 3, "step", &step));
    float learning_rate = 0.0f;
    OP_REQUIRES_OK(ctx, ParseLearningRate(ctx->input(4), table.config().optimizer.kind, &learning_rate));
    const bool applied = table.ApplyGradients(
        KeyData(keys), keys.NumElements(), grads.flat<float>().data(), step, DeviceParallelFor(ctx),
        learning_rate);
    OP_REQUIRES(ctx, applied,
                absl::InvalidArgumentError(
                    "Tfps>TableApplyGradients: gradients contain NaN or Inf; no row was updated"));
  }
};

class TableInsertOp : public TableOpKernel {
 public:
  using TableOpKernel::TableOpKernel;
  void ComputeWithTable(OpKernelContext* ctx, Table& table) override {
    const Tensor& keys = ctx->input(1);
    const Tensor& values = ctx->input(2);
    OP_REQUIRES_OK(ctx, CheckRows(keys, values, "values"));
    OP_REQUIRES_OK(ctx, CheckFinite(values, "values"));
    table.Insert(KeyData(keys), keys.NumElements(), values.flat<float>().data(),
                          DeviceParallelFor(ctx));
  }
};

class TableRemoveOp : public TableOpKernel {
 public:
  using TableOpKernel::TableOpKernel;
  void ComputeWithTable(OpKernelContext* ctx, Table& table) override {
    const Tensor& keys = ctx->input(1);
    OP_REQUIRES(ctx, keys.dims() == 1,
                absl::InvalidArgumentError(absl::StrCat(
                    "Tfps>TableRemove: keys must be a vector, got shape ", keys.shape().DebugString())));
    Tensor* removed = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &removed));
    removed->scalar<int64_t>()() =
        table.Remove(KeyData(keys), keys.NumElements(), DeviceParallelFor(ctx));
  }
};

class TableSizeOp : public TableOpKernel {
 public:
  using TableOpKernel::TableOpKernel;
  void ComputeWithTable(OpKernelContext* ctx, Table& table) override {
    Tensor* size = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &size));
    size->scalar<int64_t>()() = table.Size();
  }
};

class TableClockOp : public TableOpKernel {
 public:
  using TableOpKernel::TableOpKernel;
  void ComputeWithTable(OpKernelContext* ctx, Table& table) override {
    Tensor* clock = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &clock));
    clock->scalar<int64_t>()() = table.ApplyCalls();
  }
};

class TableStatsOp : public TableOpKernel {
 public:
  using TableOpKernel::TableOpKernel;
  void ComputeWithTable(OpKernelContext* ctx, Table& table) override {
    Tensor* stats = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({16}), &stats));
    const TableStats s = table.Stats();
    auto out = stats->flat<int64_t>();
    int i = 0;
    for (int64_t v : {s.rows, s.memory_bytes, s.row_memory_bytes, s.clock, s.admitted, s.pending,
                      s.rejected, s.evicted, s.skipped_steps, s.rows_in_memory, s.payload_memory_bytes,
                      s.disk_bytes, s.lookup_hits, s.lookup_misses, s.payloads_read, s.payloads_demoted}) {
      out(i++) = v;
    }
  }
};

class TableCountSkippedStepOp : public TableOpKernel {
 public:
  using TableOpKernel::TableOpKernel;
  void ComputeWithTable(OpKernelContext*, Table& table) override { table.CountSkippedStep(); }
};

class TableEvictOp : public TableOpKernel {
 public:
  using TableOpKernel::TableOpKernel;
  void ComputeWithTable(OpKernelContext* ctx, Table& table) override {
    Tensor* evicted = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &evicted));
    evicted->scalar<int64_t>()() = table.Evict(DeviceParallelFor(ctx));
  }
};

class TableSetClockOp : public TableOpKernel {
 public:
  using TableOpKernel::TableOpKernel;
  void ComputeWithTable(OpKernelContext* ctx, Table& table) override {
    int64_t clock = 0;
    OP_REQUIRES_OK(ctx, Int64Input(ctx, type_string(), 1, "clock", &clock));
    OP_REQUIRES(ctx, clock >= 0, absl::InvalidArgumentError(absl::StrCat(
                                     "Tfps>TableSetClock: clock must be >= 0, got ", clock)));
    table.SetApplyCalls(clock);
  }
};

class TableClearOp : public TableOpKernel {
 public:
  explicit TableClearOp(OpKernelConstruction* ctx) : TableOpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("keep_memory", &keep_memory_));
  }
  void ComputeWithTable(OpKernelContext* ctx, Table& table) override {
    table.Clear(keep_memory_);
  }

 private:
  bool keep_memory_ = false;
};

// Base of export and import: also checks the num_slots attribute against the table.
class TableTransferOpKernel : public TableOpKernel {
 public:
  explicit TableTransferOpKernel(OpKernelConstruction* ctx) : TableOpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("num_slots", &num_slots_));
  }

 protected:
  absl::Status CheckTable(const Table& table) const override {
    TF_RETURN_IF_ERROR(TableOpKernel::CheckTable(table));
    if (table.num_slots() != num_slots_) {
      return absl::InvalidArgumentError(absl::StrCat(
          type_string(), ": num_slots mismatch: the op was built for ", num_slots_,
          " optimizer slots but the table's optimizer has ", table.num_slots()));
    }
    return absl::OkStatus();
  }

  int64_t num_slots_ = 0;
};

class TableExportOp : public TableTransferOpKernel {
 public:
  using TableTransferOpKernel::TableTransferOpKernel;
  void ComputeWithTable(OpKernelContext* ctx, Table& table) override {
    int64_t cursor = 0, max_rows = 0;
    OP_REQUIRES_OK(ctx, Int64Input(ctx, type_string(), 1, "cursor", &cursor));
    OP_REQUIRES_OK(ctx, Int64Input(ctx, type_string(), 2, "max_rows", &max_rows));
    OP_REQUIRES(ctx, cursor >= 0,
                absl::InvalidArgumentError(absl::StrCat(
                    "Tfps>TableExport: cursor must be >= 0 (0 starts an export), got ", cursor)));
    OP_REQUIRES(ctx, max_rows > 0,
                absl::InvalidArgumentError(
                    absl::StrCat("Tfps>TableExport: max_rows must be > 0, got ", max_rows)));
    const ExportChunk chunk = table.Export(cursor, max_rows);
    const int64_t n = static_cast<int64_t>(chunk.keys.size());
    Tensor *keys, *values, *slots, *metadata, *next;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({n}), &keys));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({n, dim_}), &values));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, TensorShape({n, num_slots_, dim_}), &slots));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(3, TensorShape({n, kNumMetadata}), &metadata));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(4, TensorShape({}), &next));
    std::memcpy(keys->flat<int64_t>().data(), chunk.keys.data(), n * sizeof(int64_t));
    std::memcpy(values->flat<float>().data(), chunk.values.data(), chunk.values.size() * sizeof(float));
    std::memcpy(slots->flat<float>().data(), chunk.slots.data(), chunk.slots.size() * sizeof(float));
    std::memcpy(metadata->flat<int64_t>().data(), chunk.metadata.data(),
                chunk.metadata.size() * sizeof(int64_t));
    next->scalar<int64_t>()() = chunk.next_cursor;
  }
};

class TableImportOp : public TableTransferOpKernel {
 public:
  using TableTransferOpKernel::TableTransferOpKernel;
  void ComputeWithTable(OpKernelContext* ctx, Table& table) override {
    const Tensor& keys = ctx->input(1);
    const Tensor& values = ctx->input(2);
    const Tensor& slots = ctx->input(3);
    const Tensor& metadata = ctx->input(4);
    OP_REQUIRES_OK(ctx, CheckRows(keys, values, "values"));
    const int64_t n = keys.dim_size(0);
    OP_REQUIRES(ctx, slots.dims() == 3 && slots.dim_size(0) == n &&
                         slots.dim_size(1) == num_slots_ && slots.dim_size(2) == dim_,
                absl::InvalidArgumentError(absl::StrCat(
                    "Tfps>TableImport: slots must have shape [num_keys, num_slots, dim] = [", n,
                    ", ", num_slots_, ", ", dim_, "], got ", slots.shape().DebugString())));
    // [n, 3]: rows exported before tables kept a score column (their scores are 0).
    OP_REQUIRES(ctx, metadata.dims() == 2 && metadata.dim_size(0) == n &&
                         (metadata.dim_size(1) == kNumMetadata || metadata.dim_size(1) == kScore),
                absl::InvalidArgumentError(absl::StrCat(
                    "Tfps>TableImport: metadata must have shape [num_keys, 4] (or [num_keys, 3] "
                    "without scores), got ", metadata.shape().DebugString())));
    OP_REQUIRES_OK(ctx, CheckFinite(values, "values"));
    OP_REQUIRES_OK(ctx, CheckFinite(slots, "slots"));
    std::vector<int64_t> widened;
    const int64_t* meta = metadata.flat<int64_t>().data();
    if (metadata.dim_size(1) == kScore) {
      widened.assign(n * kNumMetadata, 0);
      for (int64_t i = 0; i < n; ++i) std::copy_n(meta + i * kScore, kScore, &widened[i * kNumMetadata]);
      meta = widened.data();
    }
    table.Import(KeyData(keys), n, values.flat<float>().data(), slots.flat<float>().data(), meta,
                 DeviceParallelFor(ctx));
  }
};

#define TFPS_REGISTER_KEYED(name, kernel)                                              \
  REGISTER_KERNEL_BUILDER(                                                           \
      Name(name).Device(DEVICE_CPU).TypeConstraint<int64_t>("Tkey"), kernel);        \
  REGISTER_KERNEL_BUILDER(                                                           \
      Name(name).Device(DEVICE_CPU).TypeConstraint<::tensorflow::uint64>("Tkey"), kernel)

REGISTER_KERNEL_BUILDER(Name("Tfps>TableCreate").Device(DEVICE_CPU), TableCreateOp);
TFPS_REGISTER_KEYED("Tfps>TableFind", TableFindOp);
TFPS_REGISTER_KEYED("Tfps>TableFindOrInsert", TableFindOrInsertOp);
TFPS_REGISTER_KEYED("Tfps>TableApplyGradients", TableApplyGradientsOp);
TFPS_REGISTER_KEYED("Tfps>TableInsert", TableInsertOp);
TFPS_REGISTER_KEYED("Tfps>TableRemove", TableRemoveOp);
REGISTER_KERNEL_BUILDER(Name("Tfps>TableSize").Device(DEVICE_CPU), TableSizeOp);
REGISTER_KERNEL_BUILDER(Name("Tfps>TableClear").Device(DEVICE_CPU), TableClearOp);
REGISTER_KERNEL_BUILDER(Name("Tfps>TableClock").Device(DEVICE_CPU), TableClockOp);
REGISTER_KERNEL_BUILDER(Name("Tfps>TableSetClock").Device(DEVICE_CPU), TableSetClockOp);
REGISTER_KERNEL_BUILDER(Name("Tfps>TableStats").Device(DEVICE_CPU), TableStatsOp);
REGISTER_KERNEL_BUILDER(Name("Tfps>TableCountSkippedStep").Device(DEVICE_CPU), TableCountSkippedStepOp);
REGISTER_KERNEL_BUILDER(Name("Tfps>TableEvict").Device(DEVICE_CPU), TableEvictOp);
REGISTER_KERNEL_BUILDER(Name("Tfps>TableExport").Device(DEVICE_CPU), TableExportOp);
REGISTER_KERNEL_BUILDER(Name("Tfps>TableImport").Device(DEVICE_CPU), TableImportOp);

}  // namespace
}  // namespace tfps
