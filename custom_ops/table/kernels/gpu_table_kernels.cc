// The table ops' kernels for a table in GPU memory (custom_ops/core/gpu/gpu_table.h):
// a DynamicTable created under tf.device("/GPU:0") is a GpuTableResource in that device's
// resource manager, and every op on it runs here, on the op's stream. The handle and the
// scalar inputs and outputs live in host memory; keys, rows, gradients and masks in device
// memory. Admission, eviction, a row cap, huge pages, statistics and checkpoint files are
// the CPU table's alone: creating a GPU table with them, or calling Stats or Evict on one,
// is an error that says so (export_chunk / import_rows move a GPU table's rows).
//
// Built two ways from this one source: with GOOGLE_CUDA, the DEVICE_GPU kernels of the op
// library's CUDA build (scripts/build_gpu_ops.sh); with TFPS_GPU_EMULATION, the same
// kernels registered for DEVICE_CPU under the label "gpu_emulation", running the GPU
// table's kernels on CPU threads (host_emulation.h), so CI drives them through TensorFlow
// without a GPU (tests/test_gpu_kernels.py).
#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "custom_ops/core/gpu/gpu_table.h"
#include "custom_ops/table/kernels/table_resource.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/op_requires.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor_shape.h"

#if TFPS_GPU_EMULATED
#define TFPS_GPU_KERNEL(name) Name(name).Device(::tensorflow::DEVICE_CPU).Label("gpu_emulation")
#else
#include "tensorflow/core/framework/device_base.h"
#include "xla/stream_executor/stream.h"
#define TFPS_GPU_KERNEL(name) Name(name).Device(::tensorflow::DEVICE_GPU)
#endif

namespace tfps {

using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;

namespace {

class GpuTableResource : public ::tensorflow::ResourceBase {
 public:
  GpuTableResource(std::unique_ptr<gpu::GpuTable> table, std::string name)
      : table_(std::move(table)), name_(std::move(name)) {}
  std::string DebugString() const override {
    return absl::StrCat("GPU dynamic table '", name_, "' (dim ", table_->dim(), ")");
  }
  gpu::GpuTable& table() { return *table_; }
  const std::string& name() const { return name_; }

 private:
  std::unique_ptr<gpu::GpuTable> table_;
  const std::string name_;
};

cudaStream_t StreamOf(OpKernelContext* ctx) {
#if TFPS_GPU_EMULATED
  (void)ctx;
  return nullptr;
#else
  return static_cast<cudaStream_t>(ctx->op_device_context()->stream()->platform_specific_handle().stream);
#endif
}

absl::Status FromGpu(const gpu::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.code()), status.message());
}

// The CPU table's policies a GPU table does not have, named, or "" when none is asked for.
std::string PoliciesAGpuTableLacks(const TableConfig& config) {
  std::vector<std::string> lacking;
  if (config.admission.kind != AdmissionKind::kNone) lacking.push_back("admission");
  if (config.eviction.kind != EvictionKind::kNone) lacking.push_back("eviction");
  if (config.eviction.max_rows > 0) lacking.push_back("max_rows");
  if (config.huge_pages) lacking.push_back("huge_pages");
  if (config.tier.memory_rows > 0) lacking.push_back("disk tier");
  std::string names;
  for (const auto& name : lacking) absl::StrAppend(&names, names.empty() ? "" : ", ", name);
  return names;
}

const uint64_t* KeyData(const Tensor& keys) {
  return reinterpret_cast<const uint64_t*>(keys.tensor_data().data());
}

class GpuTableCreateOp : public OpKernel {
 public:
  explicit GpuTableCreateOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    TableConfig config;
    OP_REQUIRES_OK(ctx, ParseTableConfig(ctx, &config));
    const std::string lacking = PoliciesAGpuTableLacks(config);
    OP_REQUIRES(ctx, lacking.empty(),
                absl::UnimplementedError(absl::StrCat(
                    "Tfps>TableCreate: a table on a GPU has no ", lacking,
                    "; create the table on a CPU device (a parameter server) to use them")));
    config_ = config;
    gpu_config_.dim = config.dim;
    gpu_config_.optimizer = config.optimizer;
    gpu_config_.initializer = config.initializer;
    gpu_config_.seed = config.seed;
    OP_REQUIRES_OK(ctx, ParseResourceName(ctx, "_tfps_gpu_table_", &container_, &shared_name_));
  }

  void Compute(OpKernelContext* ctx) override {
    const std::string container =
        container_.empty() ? ctx->resource_manager()->default_container() : container_;
    GpuTableResource* resource = nullptr;
    OP_REQUIRES_OK(ctx, ctx->resource_manager()->LookupOrCreate<GpuTableResource>(
                            container, shared_name_, &resource, [&](GpuTableResource** out) {
                              std::unique_ptr<gpu::GpuTable> table;
                              TF_RETURN_IF_ERROR(FromGpu(gpu::GpuTable::Create(gpu_config_, StreamOf(ctx), &table)));
                              *out = new GpuTableResource(std::move(table), shared_name_);
                              return absl::OkStatus();
                            }));
    TableConfig existing = config_;  // its policies are none, as checked above
    existing.dim = resource->table().config().dim;
    existing.optimizer = resource->table().config().optimizer;
    existing.initializer = resource->table().config().initializer;
    existing.seed = resource->table().config().seed;
    resource->Unref();
    OutputTableHandle<GpuTableResource>(ctx, "GPU table", container, shared_name_, existing, config_);
  }

 private:
  TableConfig config_;
  gpu::GpuTableConfig gpu_config_;
  std::string container_;
  std::string shared_name_;
};

// Base of every op on a GPU table: resolves the handle, checks dim (and num_slots where
// the op has it), and hands the table and the op's stream to ComputeOnGpu.
class GpuTableOpKernel : public OpKernel {
 public:
  explicit GpuTableOpKernel(OpKernelConstruction* ctx) : OpKernel(ctx) {
    if (ctx->def().attr().count("dim") > 0) OP_REQUIRES_OK(ctx, ctx->GetAttr("dim", &dim_));
    if (ctx->def().attr().count("num_slots") > 0) OP_REQUIRES_OK(ctx, ctx->GetAttr("num_slots", &num_slots_));
  }

  void Compute(OpKernelContext* ctx) final {
    ::tensorflow::core::RefCountPtr<GpuTableResource> resource;
    OP_REQUIRES_OK(ctx, LookupTableInput(ctx, &resource));
    gpu::GpuTable& table = resource->table();
    OP_REQUIRES(ctx, dim_ < 0 || table.dim() == dim_,
                absl::InvalidArgumentError(absl::StrCat(type_string(), ": dim mismatch: the op was built for dim ",
                                                        dim_, " but the table has dim ", table.dim())));
    OP_REQUIRES(ctx, num_slots_ < 0 || table.num_slots() == num_slots_,
                absl::InvalidArgumentError(absl::StrCat(
                    type_string(), ": num_slots mismatch: the op was built for ", num_slots_,
                    " optimizer slots but the table's optimizer has ", table.num_slots())));
    const absl::Status status = ComputeOnGpu(ctx, table, StreamOf(ctx));
    if (!status.ok()) {
      ctx->SetStatus(absl::Status(status.code(), absl::StrCat(status.message(), " (GPU table '",
                                                              resource->name(), "')")));
    }
  }

 protected:
  virtual absl::Status ComputeOnGpu(OpKernelContext* ctx, gpu::GpuTable& table, cudaStream_t stream) = 0;

  absl::Status AllocateRows(OpKernelContext* ctx, int index, const Tensor& keys, Tensor** rows) const {
    TensorShape shape = keys.shape();
    shape.AddDim(dim_);
    return ctx->allocate_output(index, shape, rows);
  }

  absl::Status CheckRows(const Tensor& keys, const Tensor& rows, const char* rows_name) const {
    return CheckKeyedRows(type_string(), keys, rows, rows_name, dim_);
  }

  // Rows written as given must be finite, as on the CPU table. They are on the device;
  // reading them back costs a copy and a sync, which only Insert and Import (restores,
  // not training steps) pay.
  absl::Status CheckFinite(cudaStream_t stream, const Tensor& rows, const char* rows_name) const {
    std::vector<float> host(rows.NumElements());
    if (host.empty()) return absl::OkStatus();
    const cudaError_t copied = cudaMemcpyAsync(host.data(), rows.flat<float>().data(), host.size() * sizeof(float),
                                               cudaMemcpyDeviceToHost, stream);
    const cudaError_t synced = copied == cudaSuccess ? cudaStreamSynchronize(stream) : copied;
    if (synced != cudaSuccess) {
      return absl::InternalError(absl::StrCat(type_string(), ": reading ", rows_name, " back failed: ",
                                              cudaGetErrorString(synced)));
    }
    for (size_t i = 0; i < host.size(); ++i) {
      if (!std::isfinite(host[i])) {
        return absl::InvalidArgumentError(absl::StrCat(type_string(), ": ", rows_name,
                                                       " contain NaN or Inf (element ", i, " is ", host[i],
                                                       "); no row was written"));
      }
    }
    return absl::OkStatus();
  }

  absl::Status HostOutput(OpKernelContext* ctx, int index, int64_t value) const {
    Tensor* out = nullptr;
    TF_RETURN_IF_ERROR(ctx->allocate_output(index, TensorShape({}), &out));
    out->scalar<int64_t>()() = value;
    return absl::OkStatus();
  }

  int64_t dim_ = -1;
  int64_t num_slots_ = -1;
};

class GpuTableFindOp : public GpuTableOpKernel {
 public:
  using GpuTableOpKernel::GpuTableOpKernel;
  absl::Status ComputeOnGpu(OpKernelContext* ctx, gpu::GpuTable& table, cudaStream_t stream) override {
    const Tensor& keys = ctx->input(1);
    Tensor *values = nullptr, *exists = nullptr;
    TF_RETURN_IF_ERROR(AllocateRows(ctx, 0, keys, &values));
    TF_RETURN_IF_ERROR(ctx->allocate_output(1, keys.shape(), &exists));
    return FromGpu(table.Find(stream, KeyData(keys), keys.NumElements(), values->flat<float>().data(),
                              reinterpret_cast<uint8_t*>(exists->flat<bool>().data())));
  }
};

// Occurrences (from the layer's dedupe, never negative) are counted as given; the table
// clamps a negative one at 0 instead of reading it back to refuse it. Every key is
// admitted: a GPU table has no admission.
class GpuTableFindOrInsertOp : public GpuTableOpKernel {
 public:
  using GpuTableOpKernel::GpuTableOpKernel;
  absl::Status ComputeOnGpu(OpKernelContext* ctx, gpu::GpuTable& table, cudaStream_t stream) override {
    const Tensor& keys = ctx->input(1);
    const Tensor& occurrences = ctx->input(2);
    if (occurrences.NumElements() != 0 && occurrences.shape() != keys.shape()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Tfps>TableFindOrInsert: occurrences must be empty or have the keys' shape ",
          keys.shape().DebugString(), ", got ", occurrences.shape().DebugString()));
    }
    Tensor *values = nullptr, *admitted = nullptr;
    TF_RETURN_IF_ERROR(AllocateRows(ctx, 0, keys, &values));
    TF_RETURN_IF_ERROR(ctx->allocate_output(1, keys.shape(), &admitted));
    const int64_t n = keys.NumElements();
    TF_RETURN_IF_ERROR(FromGpu(table.FindOrInsert(
        stream, KeyData(keys), n, values->flat<float>().data(),
        occurrences.NumElements() > 0 ? occurrences.flat<int64_t>().data() : nullptr)));
    if (n > 0 && cudaMemsetAsync(admitted->flat<bool>().data(), 1, n, stream) != cudaSuccess) {
      return absl::InternalError("Tfps>TableFindOrInsert: setting the admitted mask failed");
    }
    return absl::OkStatus();
  }
};

class GpuTableApplyGradientsOp : public GpuTableOpKernel {
 public:
  using GpuTableOpKernel::GpuTableOpKernel;
  absl::Status ComputeOnGpu(OpKernelContext* ctx, gpu::GpuTable& table, cudaStream_t stream) override {
    const Tensor& keys = ctx->input(1);
    const Tensor& grads = ctx->input(2);
    TF_RETURN_IF_ERROR(CheckRows(keys, grads, "gradients"));
    int64_t step = 0;
    TF_RETURN_IF_ERROR(Int64Input(ctx, type_string(), 3, "step", &step));
    float learning_rate = 0.0f;
    TF_RETURN_IF_ERROR(ParseLearningRate(ctx->input(4), table.config().optimizer.kind, &learning_rate));
    // The verdict on non-finite gradients is decided on the device: asking for it syncs,
    // so that a bad step is an error, as on the CPU table.
    bool applied = true;
    TF_RETURN_IF_ERROR(FromGpu(table.ApplyGradients(stream, KeyData(keys), keys.dim_size(0),
                                                    grads.flat<float>().data(), step, learning_rate, &applied)));
    if (!applied) {
      return absl::InvalidArgumentError("Tfps>TableApplyGradients: gradients contain NaN or Inf; no row was updated");
    }
    return absl::OkStatus();
  }
};

class GpuTableInsertOp : public GpuTableOpKernel {
 public:
  using GpuTableOpKernel::GpuTableOpKernel;
  absl::Status ComputeOnGpu(OpKernelContext* ctx, gpu::GpuTable& table, cudaStream_t stream) override {
    const Tensor& keys = ctx->input(1);
    const Tensor& values = ctx->input(2);
    TF_RETURN_IF_ERROR(CheckRows(keys, values, "values"));
    TF_RETURN_IF_ERROR(CheckFinite(stream, values, "values"));
    return FromGpu(table.Insert(stream, KeyData(keys), keys.dim_size(0), values.flat<float>().data()));
  }
};

class GpuTableRemoveOp : public GpuTableOpKernel {
 public:
  using GpuTableOpKernel::GpuTableOpKernel;
  absl::Status ComputeOnGpu(OpKernelContext* ctx, gpu::GpuTable& table, cudaStream_t stream) override {
    const Tensor& keys = ctx->input(1);
    if (keys.dims() != 1) {
      return absl::InvalidArgumentError(absl::StrCat("Tfps>TableRemove: keys must be a vector, got shape ",
                                                     keys.shape().DebugString()));
    }
    int64_t removed = 0;
    TF_RETURN_IF_ERROR(FromGpu(table.Remove(stream, KeyData(keys), keys.dim_size(0), &removed)));
    return HostOutput(ctx, 0, removed);
  }
};

// Size and Clock: one scalar the table reads back (a sync).
template <gpu::Status (gpu::GpuTable::*Read)(cudaStream_t, int64_t*)>
class GpuTableScalarOp : public GpuTableOpKernel {
 public:
  using GpuTableOpKernel::GpuTableOpKernel;
  absl::Status ComputeOnGpu(OpKernelContext* ctx, gpu::GpuTable& table, cudaStream_t stream) override {
    int64_t value = 0;
    TF_RETURN_IF_ERROR(FromGpu((table.*Read)(stream, &value)));
    return HostOutput(ctx, 0, value);
  }
};
using GpuTableSizeOp = GpuTableScalarOp<&gpu::GpuTable::Size>;
using GpuTableClockOp = GpuTableScalarOp<&gpu::GpuTable::ApplyCalls>;

class GpuTableSetClockOp : public GpuTableOpKernel {
 public:
  using GpuTableOpKernel::GpuTableOpKernel;
  absl::Status ComputeOnGpu(OpKernelContext* ctx, gpu::GpuTable& table, cudaStream_t stream) override {
    int64_t clock = 0;
    TF_RETURN_IF_ERROR(Int64Input(ctx, type_string(), 1, "clock", &clock));
    if (clock < 0) return absl::InvalidArgumentError(absl::StrCat("Tfps>TableSetClock: clock must be >= 0, got ", clock));
    return FromGpu(table.SetApplyCalls(stream, clock));
  }
};

class GpuTableClearOp : public GpuTableOpKernel {
 public:
  explicit GpuTableClearOp(OpKernelConstruction* ctx) : GpuTableOpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("keep_memory", &keep_memory_));
  }
  absl::Status ComputeOnGpu(OpKernelContext*, gpu::GpuTable& table, cudaStream_t stream) override {
    return FromGpu(table.Clear(stream, keep_memory_));
  }

 private:
  bool keep_memory_ = false;
};

// Stats, Evict and CountSkippedStep read or count the CPU table's admission, eviction and
// training statistics, which a GPU table does not keep.
class GpuTableUnsupportedOp : public GpuTableOpKernel {
 public:
  using GpuTableOpKernel::GpuTableOpKernel;
  absl::Status ComputeOnGpu(OpKernelContext*, gpu::GpuTable&, cudaStream_t) override {
    return absl::UnimplementedError(absl::StrCat(
        type_string(), " is not available for a table on a GPU (it keeps no admission, eviction "
        "or skipped-step statistics); size() and export_chunk() are"));
  }
};

// Export's row count is known only after the call, so rows go to scratch of max_rows
// (at most the table's capacity) and then into outputs of their size.
class GpuTableExportOp : public GpuTableOpKernel {
 public:
  using GpuTableOpKernel::GpuTableOpKernel;
  absl::Status ComputeOnGpu(OpKernelContext* ctx, gpu::GpuTable& table, cudaStream_t stream) override {
    int64_t cursor = 0, max_rows = 0;
    TF_RETURN_IF_ERROR(Int64Input(ctx, type_string(), 1, "cursor", &cursor));
    TF_RETURN_IF_ERROR(Int64Input(ctx, type_string(), 2, "max_rows", &max_rows));
    if (cursor < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Tfps>TableExport: cursor must be >= 0 (0 starts an export), got ", cursor));
    }
    if (max_rows <= 0) return absl::InvalidArgumentError(absl::StrCat("Tfps>TableExport: max_rows must be > 0, got ", max_rows));
    const int64_t room = std::min(max_rows, table.capacity());
    Tensor keys_scratch, values_scratch, slots_scratch, metadata_scratch;
    TF_RETURN_IF_ERROR(ctx->allocate_temp(::tensorflow::DT_INT64, TensorShape({room}), &keys_scratch));
    TF_RETURN_IF_ERROR(ctx->allocate_temp(::tensorflow::DT_FLOAT, TensorShape({room, dim_}), &values_scratch));
    TF_RETURN_IF_ERROR(ctx->allocate_temp(::tensorflow::DT_FLOAT, TensorShape({room, num_slots_, dim_}), &slots_scratch));
    TF_RETURN_IF_ERROR(ctx->allocate_temp(::tensorflow::DT_INT64, TensorShape({room, gpu::kMetadataColumns}),
                                          &metadata_scratch));
    gpu::RowBuffers scratch;
    scratch.keys = reinterpret_cast<uint64_t*>(keys_scratch.flat<int64_t>().data());
    scratch.values = values_scratch.flat<float>().data();
    scratch.slots = num_slots_ > 0 ? slots_scratch.flat<float>().data() : nullptr;
    scratch.metadata = metadata_scratch.flat<int64_t>().data();
    int64_t rows = 0, next_cursor = -1;
    TF_RETURN_IF_ERROR(FromGpu(table.Export(stream, cursor, room, scratch, &rows, &next_cursor)));
    const Tensor* scratches[] = {&keys_scratch, &values_scratch, &slots_scratch, &metadata_scratch};
    for (int i = 0; i < 4; ++i) {
      TensorShape shape = scratches[i]->shape();
      shape.set_dim(0, rows);
      Tensor* out = nullptr;
      TF_RETURN_IF_ERROR(ctx->allocate_output(i, shape, &out));
      const size_t bytes = out->TotalBytes();
      if (bytes > 0 && cudaMemcpyAsync(const_cast<char*>(out->tensor_data().data()), scratches[i]->tensor_data().data(),
                                       bytes, cudaMemcpyDeviceToDevice, stream) != cudaSuccess) {
        return absl::InternalError("Tfps>TableExport: copying the exported rows failed");
      }
    }
    return HostOutput(ctx, 4, next_cursor);
  }
};

class GpuTableImportOp : public GpuTableOpKernel {
 public:
  using GpuTableOpKernel::GpuTableOpKernel;
  absl::Status ComputeOnGpu(OpKernelContext* ctx, gpu::GpuTable& table, cudaStream_t stream) override {
    const Tensor& keys = ctx->input(1);
    const Tensor& values = ctx->input(2);
    const Tensor& slots = ctx->input(3);
    const Tensor& metadata = ctx->input(4);
    TF_RETURN_IF_ERROR(CheckRows(keys, values, "values"));
    const int64_t n = keys.dim_size(0);
    if (slots.dims() != 3 || slots.dim_size(0) != n || slots.dim_size(1) != num_slots_ || slots.dim_size(2) != dim_) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Tfps>TableImport: slots must have shape [num_keys, num_slots, dim] = [", n, ", ", num_slots_, ", ",
          dim_, "], got ", slots.shape().DebugString()));
    }
    if (metadata.dims() != 2 || metadata.dim_size(0) != n || metadata.dim_size(1) != gpu::kMetadataColumns) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Tfps>TableImport: metadata must have shape [num_keys, 4] for a GPU table, got ",
          metadata.shape().DebugString()));
    }
    TF_RETURN_IF_ERROR(CheckFinite(stream, values, "values"));
    TF_RETURN_IF_ERROR(CheckFinite(stream, slots, "slots"));
    return FromGpu(table.Import(stream, KeyData(keys), n, values.flat<float>().data(),
                                num_slots_ > 0 ? slots.flat<float>().data() : nullptr,
                                metadata.flat<int64_t>().data()));
  }
};

#define TFPS_REGISTER_GPU_KEYED(name, kernel, ...)                                                     \
  REGISTER_KERNEL_BUILDER(TFPS_GPU_KERNEL(name).TypeConstraint<int64_t>("Tkey") __VA_ARGS__, kernel); \
  REGISTER_KERNEL_BUILDER(TFPS_GPU_KERNEL(name).TypeConstraint<::tensorflow::uint64>("Tkey") __VA_ARGS__, kernel)

REGISTER_KERNEL_BUILDER(TFPS_GPU_KERNEL("Tfps>TableCreate").HostMemory("table_handle"), GpuTableCreateOp);
TFPS_REGISTER_GPU_KEYED("Tfps>TableFind", GpuTableFindOp, .HostMemory("table_handle"));
TFPS_REGISTER_GPU_KEYED("Tfps>TableFindOrInsert", GpuTableFindOrInsertOp, .HostMemory("table_handle"));
TFPS_REGISTER_GPU_KEYED("Tfps>TableApplyGradients", GpuTableApplyGradientsOp,
                        .HostMemory("table_handle").HostMemory("step").HostMemory("learning_rate"));
TFPS_REGISTER_GPU_KEYED("Tfps>TableInsert", GpuTableInsertOp, .HostMemory("table_handle"));
TFPS_REGISTER_GPU_KEYED("Tfps>TableRemove", GpuTableRemoveOp, .HostMemory("table_handle").HostMemory("removed"));
REGISTER_KERNEL_BUILDER(TFPS_GPU_KERNEL("Tfps>TableSize").HostMemory("table_handle").HostMemory("size"), GpuTableSizeOp);
REGISTER_KERNEL_BUILDER(TFPS_GPU_KERNEL("Tfps>TableClock").HostMemory("table_handle").HostMemory("clock"),
                        GpuTableClockOp);
REGISTER_KERNEL_BUILDER(TFPS_GPU_KERNEL("Tfps>TableSetClock").HostMemory("table_handle").HostMemory("clock"),
                        GpuTableSetClockOp);
REGISTER_KERNEL_BUILDER(TFPS_GPU_KERNEL("Tfps>TableClear").HostMemory("table_handle"), GpuTableClearOp);
REGISTER_KERNEL_BUILDER(TFPS_GPU_KERNEL("Tfps>TableStats").HostMemory("table_handle").HostMemory("stats"),
                        GpuTableUnsupportedOp);
REGISTER_KERNEL_BUILDER(TFPS_GPU_KERNEL("Tfps>TableEvict").HostMemory("table_handle").HostMemory("evicted"),
                        GpuTableUnsupportedOp);
REGISTER_KERNEL_BUILDER(TFPS_GPU_KERNEL("Tfps>TableCountSkippedStep").HostMemory("table_handle"),
                        GpuTableUnsupportedOp);
REGISTER_KERNEL_BUILDER(TFPS_GPU_KERNEL("Tfps>TableExport")
                            .HostMemory("table_handle")
                            .HostMemory("cursor")
                            .HostMemory("max_rows")
                            .HostMemory("next_cursor"),
                        GpuTableExportOp);
REGISTER_KERNEL_BUILDER(TFPS_GPU_KERNEL("Tfps>TableImport").HostMemory("table_handle"), GpuTableImportOp);

}  // namespace
}  // namespace tfps
