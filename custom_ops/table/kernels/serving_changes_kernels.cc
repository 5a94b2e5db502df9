// CPU kernel that exports a table shard's changes to serving: the rows changed since the
// last export of a chain, and the keys serving must stop finding, as a tensor bundle that a
// serving graph consults before the exports it follows. The changes are read as
// checkpoints read them (Table::SaveChunk after the chain's stamp), so memory and time
// follow the rows changed; they are few next to the table, so they are sorted in memory.
#include <algorithm>
#include <cmath>
#include <iterator>
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
#include "tensorflow/core/util/tensor_bundle/tensor_bundle.h"

namespace tfps {
namespace {

using ::tensorflow::DataType;
using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;

constexpr char kOp[] = "Tfps>TableExportChangesForServing";

// What a shard's changes come to: the rows to serve (hash, position in `values`) and the
// hashes serving must no longer find.
struct ServingChanges {
  std::vector<std::pair<uint64_t, int64_t>> rows;
  std::vector<float> values;
  std::vector<uint64_t> removed;
  float max_abs_value = 0.0f;
  uint64_t max_abs_key = 0;
};

class TableExportChangesForServingOp : public OpKernel {
 public:
  explicit TableExportChangesForServingOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("hashes_key", &hashes_key_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("values_key", &values_key_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("removed_key", &removed_key_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("value_dtype", &value_dtype_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("min_count", &min_count_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("chain", &chain_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("chunk_rows", &chunk_rows_));
    OP_REQUIRES(ctx, !chain_.empty(), absl::InvalidArgumentError(absl::StrCat(kOp, ": chain must be named")));
    OP_REQUIRES(ctx, chunk_rows_ > 0,
                absl::InvalidArgumentError(absl::StrCat(kOp, ": chunk_rows must be > 0, got ", chunk_rows_)));
    OP_REQUIRES(ctx, !hashes_key_.empty() && !values_key_.empty() && !removed_key_.empty() &&
                         hashes_key_ != values_key_ && hashes_key_ != removed_key_ &&
                         values_key_ != removed_key_,
                absl::InvalidArgumentError(absl::StrCat(
                    kOp, ": hashes_key, values_key and removed_key must be three different non-empty names")));
  }

  void Compute(OpKernelContext* ctx) override {
    ::tensorflow::core::RefCountPtr<TableResource> resource;
    OP_REQUIRES_OK(ctx, LookupTableInput(ctx, &resource));
    ::tensorflow::tf_shared_lock not_restoring(resource->restore_gate());
    const Tensor* prefix;
    OP_REQUIRES_OK(ctx, ScalarInput(ctx, kOp, 1, "prefix", &prefix));
    int64_t follows = 0;
    OP_REQUIRES_OK(ctx, Int64Input(ctx, kOp, 2, "follows_export_id", &follows));
    Table& table = resource->table();
    Table::ChainPoint base;
    bool written = table.LastSaveOfChain(chain_, &base) && base.save_id == static_cast<uint64_t>(follows);
    const int64_t stamp = written ? table.BeginSave() : -1;
    ServingChanges changes;
    if (written) {
      RunOrReportOutOfMemory(ctx, kOp, resource->name(), [&] {
        written = Collect(table, base.stamp, &changes);
      }, "no file was written");
      if (!ctx->status().ok()) return;
    }
    if (written) {
      OP_REQUIRES_OK(ctx, CheckFloat16Holds(kOp, value_dtype_, changes.max_abs_value, changes.max_abs_key,
                                            resource->name()));
      OP_REQUIRES_OK(ctx, Write(ctx, table.dim(), changes, prefix->scalar<::tensorflow::tstring>()()));
    }
    const int64_t counts[] = {static_cast<int64_t>(changes.rows.size()),
                              static_cast<int64_t>(changes.removed.size())};
    Tensor* out;
    for (int i = 0; i < 2; ++i) {
      OP_REQUIRES_OK(ctx, ctx->allocate_output(i, TensorShape({}), &out));
      out->scalar<int64_t>()() = counts[i];
    }
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, TensorShape({}), &out));
    out->scalar<bool>()() = written;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(3, TensorShape({}), &out));
    out->scalar<int64_t>()() = stamp;
  }

 private:
  // The changes after `changed_after`, sorted by hash, a re-inserted key's removal dropped;
  // false when the table cannot tell them all.
  bool Collect(const Table& table, int64_t changed_after, ServingChanges* out) const {
    const int dim = table.dim();
    ExportChunk chunk;
    for (int64_t cursor = 0; cursor >= 0; cursor = chunk.next_cursor) {
      table.SaveChunk(cursor, chunk_rows_, changed_after, &chunk);
      if (chunk.changes_incomplete) return false;
      for (size_t i = 0; i < chunk.keys.size(); ++i) {
        const uint64_t key = static_cast<uint64_t>(chunk.keys[i]);
        if (chunk.metadata[i * kNumMetadata + kCount] < min_count_) {
          out->removed.push_back(TableHash(key));
          continue;
        }
        out->rows.emplace_back(TableHash(key), static_cast<int64_t>(out->values.size()) / dim);
        const float* value = chunk.values.data() + i * dim;
        out->values.insert(out->values.end(), value, value + dim);
        for (int d = 0; d < dim; ++d) {
          if (std::fabs(value[d]) > out->max_abs_value) {
            out->max_abs_value = std::fabs(value[d]);
            out->max_abs_key = key;
          }
        }
      }
      for (int64_t key : chunk.removed) out->removed.push_back(TableHash(static_cast<uint64_t>(key)));
    }
    std::sort(out->rows.begin(), out->rows.end());
    std::sort(out->removed.begin(), out->removed.end());
    out->removed.erase(std::unique(out->removed.begin(), out->removed.end()), out->removed.end());
    std::vector<uint64_t> served;
    served.reserve(out->rows.size());
    for (const auto& row : out->rows) served.push_back(row.first);
    std::vector<uint64_t> gone;
    std::set_difference(out->removed.begin(), out->removed.end(), served.begin(), served.end(),
                        std::back_inserter(gone));
    out->removed.swap(gone);
    return true;
  }

  absl::Status Write(OpKernelContext* ctx, int64_t dim, const ServingChanges& changes,
                     const std::string& prefix) const {
    const int64_t n = static_cast<int64_t>(changes.rows.size());
    const int64_t r = static_cast<int64_t>(changes.removed.size());
    Tensor hashes(::tensorflow::DT_INT64, TensorShape({n}));
    Tensor values(StoredValueType(value_dtype_), TensorShape({n, dim}));
    Tensor removed(::tensorflow::DT_INT64, TensorShape({r}));
    auto h = hashes.flat<int64_t>();
    for (int64_t i = 0; i < n; ++i) {
      h(i) = ServingHash(changes.rows[i].first);
      StoreValues(changes.values.data() + changes.rows[i].second * dim, dim, i * dim, &values);
    }
    auto gone = removed.flat<int64_t>();
    for (int64_t i = 0; i < r; ++i) gone(i) = ServingHash(changes.removed[i]);
    ::tensorflow::BundleWriter writer(ctx->env(), prefix);
    TF_RETURN_IF_ERROR(writer.status());
    TF_RETURN_IF_ERROR(writer.Add(hashes_key_, hashes));
    TF_RETURN_IF_ERROR(writer.Add(values_key_, values));
    TF_RETURN_IF_ERROR(writer.Add(removed_key_, removed));
    return writer.Finish();
  }

  std::string hashes_key_, values_key_, removed_key_, chain_;
  DataType value_dtype_;
  int64_t min_count_ = 0;
  int64_t chunk_rows_ = 0;
};

REGISTER_KERNEL_BUILDER(Name("Tfps>TableExportChangesForServing").Device(::tensorflow::DEVICE_CPU),
                        TableExportChangesForServingOp);

}  // namespace
}  // namespace tfps
