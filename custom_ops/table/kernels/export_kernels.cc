// CPU kernel that exports a table shard to serving: the rows go from the table into a
// tensor bundle in TableHash order, stripe after stripe, in tensor slices of at most
// slice_rows rows, so memory beyond the table stays at a bit per row, at most 20 bytes
// per row of one stripe, and one slice, whatever the table's size.
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "custom_ops/core/hashing.h"
#include "custom_ops/table/kernels/serving_rows.h"
#include "custom_ops/table/kernels/table_resource.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/op_requires.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor_slice.h"
#include "tensorflow/core/util/tensor_bundle/tensor_bundle.h"

namespace tfps {
namespace {

using ::tensorflow::DataType;
using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;
using ::tensorflow::TensorSlice;

constexpr char kOp[] = "Tfps>TableExportForServing";

class TableExportForServingOp : public OpKernel {
 public:
  explicit TableExportForServingOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("hashes_key", &hashes_key_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("values_key", &values_key_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("value_dtype", &value_dtype_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("min_count", &min_count_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("slice_rows", &slice_rows_));
    OP_REQUIRES(ctx, slice_rows_ > 0,
                absl::InvalidArgumentError(absl::StrCat(kOp, ": slice_rows must be > 0, got ", slice_rows_)));
    OP_REQUIRES(ctx, !hashes_key_.empty() && !values_key_.empty() && hashes_key_ != values_key_,
                absl::InvalidArgumentError(absl::StrCat(
                    kOp, ": hashes_key and values_key must be two different non-empty names")));
  }

  void Compute(OpKernelContext* ctx) override {
    ::tensorflow::core::RefCountPtr<TableResource> resource;
    OP_REQUIRES_OK(ctx, LookupTableInput(ctx, &resource));
    ::tensorflow::tf_shared_lock not_restoring(resource->restore_gate());
    const Tensor* prefix;
    OP_REQUIRES_OK(ctx, ScalarInput(ctx, kOp, 1, "prefix", &prefix));
    // Changes after this stamp are left to the next export of changes.
    const int64_t stamp = resource->table().BeginSave();
    const Table& table = resource->table();
    RunOrReportOutOfMemory(ctx, kOp, resource->name(), [&] { Export(ctx, table, *prefix, stamp, resource->name()); },
                           "the table is unchanged; the export is incomplete");
  }

 private:
  void Export(OpKernelContext* ctx, const Table& table, const Tensor& prefix_input, int64_t stamp,
              const std::string& name) {
    const Tensor* prefix = &prefix_input;
    const Table::ServingSelection selection = table.SelectForServing(min_count_);
    OP_REQUIRES_OK(ctx, CheckFloat16Holds(kOp, value_dtype_, selection.max_abs_value, selection.max_abs_key,
                                          name));
    int64_t rows = 0;
    for (int64_t n : selection.rows) rows += n;
    OP_REQUIRES_OK(ctx, Write(ctx, table, selection, rows, prefix->scalar<::tensorflow::tstring>()(), name));
    Tensor* out;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
    out->scalar<int64_t>()() = rows;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({}), &out));
    out->scalar<int64_t>()() = stamp;
  }

  absl::Status Write(OpKernelContext* ctx, const Table& table, const Table::ServingSelection& selection,
                     int64_t rows, const std::string& prefix, const std::string& name) {
    const int64_t dim = table.dim();
    ::tensorflow::BundleWriter writer(ctx->env(), prefix);
    TF_RETURN_IF_ERROR(writer.status());
    const TensorShape hashes_shape({rows}), values_shape({rows, dim});
    if (rows == 0) {
      TF_RETURN_IF_ERROR(writer.Add(hashes_key_, Tensor(::tensorflow::DT_INT64, hashes_shape)));
      TF_RETURN_IF_ERROR(writer.Add(values_key_, Tensor(StoredType(), values_shape)));
      return writer.Finish();
    }
    std::vector<std::pair<uint64_t, uint64_t>> order;
    std::vector<float> half_source;  // a float16 slice's values before conversion
    int64_t offset = 0;
    const absl::Status changed = absl::AbortedError(absl::StrCat(
        kOp, ": table '", name, "' was cleared or restored while it was being exported; export it again"));
    for (int s = 0; s < static_cast<int>(selection.rows.size()); ++s) {
      if (selection.rows[s] == 0) continue;
      if (!table.SortSelected(selection, s, &order)) return changed;
      for (size_t begin = 0; begin < order.size(); begin += static_cast<size_t>(slice_rows_)) {
        const size_t end = std::min(order.size(), begin + static_cast<size_t>(slice_rows_));
        const int64_t n = static_cast<int64_t>(end - begin);
        Tensor hashes_slice(::tensorflow::DT_INT64, TensorShape({n}));
        auto h = hashes_slice.flat<int64_t>();
        for (int64_t i = 0; i < n; ++i) h(i) = ServingHash(order[begin + i].first);
        Tensor values_slice(StoredType(), TensorShape({n, dim}));
        const bool half = value_dtype_ == ::tensorflow::DT_HALF;
        if (half) half_source.resize(static_cast<size_t>(n * dim));
        float* read_into = half ? half_source.data() : values_slice.flat<float>().data();
        if (!table.ReadSortedValues(s, order, begin, end, read_into)) return changed;
        if (half) StoreValues(half_source.data(), n * dim, 0, &values_slice);
        TF_RETURN_IF_ERROR(AddSlices(&writer, rows, dim, offset, hashes_slice, values_slice));
        offset += n;
      }
    }
    return writer.Finish();
  }

  // The next n rows' slices, starting at `offset`, of the two tensors of `rows` rows.
  absl::Status AddSlices(::tensorflow::BundleWriter* writer, int64_t rows, int64_t dim, int64_t offset,
                         const Tensor& hashes_slice, const Tensor& values_slice) const {
    const int64_t n = hashes_slice.dim_size(0);
    TensorSlice hashes_part(1), values_part(2);
    hashes_part.set_start(0, offset);
    hashes_part.set_length(0, n);
    values_part.set_start(0, offset);
    values_part.set_length(0, n);
    TF_RETURN_IF_ERROR(writer->AddSlice(hashes_key_, TensorShape({rows}), hashes_part, hashes_slice));
    return writer->AddSlice(values_key_, TensorShape({rows, dim}), values_part, values_slice);
  }

  DataType StoredType() const { return StoredValueType(value_dtype_); }

  std::string hashes_key_, values_key_;
  DataType value_dtype_;
  int64_t min_count_ = 0;
  int64_t slice_rows_ = 0;
};

REGISTER_KERNEL_BUILDER(Name("Tfps>TableExportForServing").Device(::tensorflow::DEVICE_CPU),
                        TableExportForServingOp);

}  // namespace
}  // namespace tfps
