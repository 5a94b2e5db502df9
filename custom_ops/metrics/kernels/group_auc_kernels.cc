// CPU kernels of GroupAUC: per-group histograms held as rows of a dynamic table (one row of
// [bucket][positive, negative] weights per group key), updated and summed where the table
// lives, so a worker sends examples to a parameter server and gets back two scalars.
#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "custom_ops/metrics/kernels/bucketing_kernel.h"
#include "custom_ops/metrics/kernels/histogram_buckets.h"
#include "custom_ops/table/kernels/table_resource.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/op_requires.h"
#include "tensorflow/core/framework/resource_mgr.h"

namespace tfps {
namespace {

using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Tensor;

absl::Status LookupGroupTable(OpKernelContext* ctx, const std::string& metric_name,
                              int64_t num_buckets,
                              ::tensorflow::core::RefCountPtr<TableResource>* resource) {
  TF_RETURN_IF_ERROR(::tensorflow::LookupResource(ctx, ::tensorflow::HandleFromInput(ctx, 0), resource));
  const TableConfig& config = (*resource)->table().config();
  if (config.dim != 2 * num_buckets || config.optimizer.kind != OptimizerKind::kSgd ||
      config.optimizer.learning_rate != 1.0f) {
    return absl::InvalidArgumentError(absl::StrCat(
        metric_name, ": the group table must have dim 2 * num_buckets = ", 2 * num_buckets,
        " and SGD with learning rate 1; it has ", DescribeTableConfig(config)));
  }
  return absl::OkStatus();
}

class GroupAucUpdateOp : public BucketingKernel {
 public:
  using BucketingKernel::BucketingKernel;

  void Compute(OpKernelContext* ctx) override {
    const Tensor& groups = ctx->input(1);
    const Tensor& labels = ctx->input(2);
    const Tensor& predictions = ctx->input(3);
    const Tensor& weights = ctx->input(4);
    // Eager calls skip shape functions, so the kernel checks the ranks itself.
    for (int i = 1; i <= 4; ++i) {
      OP_REQUIRES(ctx, ctx->input(i).dims() == 1,
                  absl::InvalidArgumentError(absl::StrCat(
                      metric_name_, ": groups, labels, predictions and weights must be vectors, "
                      "got input ", i, " of shape ", ctx->input(i).shape().DebugString())));
    }
    const int64_t n = predictions.NumElements();
    const bool unweighted = weights.NumElements() == 0 && n > 0;
    OP_REQUIRES(ctx, groups.NumElements() == n && labels.NumElements() == n &&
                         (unweighted || weights.NumElements() == n),
                absl::InvalidArgumentError(absl::StrCat(
                    metric_name_, ": groups, labels, predictions and sample weights must have "
                    "the same number of elements, got ", groups.NumElements(), ", ",
                    labels.NumElements(), ", ", n, " and ", weights.NumElements())));
    const int64_t* group = groups.flat<int64_t>().data();
    const float* y = labels.flat<float>().data();
    const float* p = predictions.flat<float>().data();
    const float* w = unweighted ? nullptr : weights.flat<float>().data();
    std::vector<int32_t> slots(n);
    bool hard_labels = false;
    if (!SlotAndCheck(y, p, w, n, scale_, slots.data(), &hard_labels)) {
      ctx->CtxFailure(FirstInvalidInput(metric_name_, y, p, w, n));
      return;
    }
    const int64_t num_buckets = 2 * int64_t{scale_.per_side};
    ::tensorflow::core::RefCountPtr<TableResource> resource;
    OP_REQUIRES_OK(ctx, LookupGroupTable(ctx, metric_name_, num_buckets, &resource));
    ::tensorflow::tf_shared_lock not_restoring(resource->restore_gate());

    // One row of negated weights per distinct group: the table's SGD at learning rate 1
    // subtracts it, adding the weights atomically under the row's lock.
    absl::flat_hash_map<int64_t, int64_t> row_of;
    std::vector<int64_t> keys;
    std::vector<int64_t> rows(n);
    for (int64_t i = 0; i < n; ++i) {
      auto inserted = row_of.try_emplace(group[i], static_cast<int64_t>(keys.size()));
      if (inserted.second) keys.push_back(group[i]);
      rows[i] = inserted.first->second;
    }
    const int64_t dim = 2 * num_buckets;
    std::vector<float> negated(keys.size() * dim, 0.0f);
    for (int64_t i = 0; i < n; ++i) {
      float* counts = negated.data() + rows[i] * dim + (slots[i] & ~int32_t{1});
      const float weight = w == nullptr ? 1.0f : w[i];
      counts[0] -= weight * y[i];
      counts[1] -= weight - weight * y[i];
    }
    resource->table().ApplyGradients(reinterpret_cast<const uint64_t*>(keys.data()),
                                     static_cast<int64_t>(keys.size()), negated.data(), 0,
                                     DeviceParallelFor(ctx));
  }

};

// Impression-weighted sum of the per-group ROC AUCs of one table, and the impressions of
// the groups that have both classes, visiting the table a chunk at a time.
class GroupAucSumOp : public OpKernel {
 public:
  explicit GroupAucSumOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("num_buckets", &num_buckets_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("metric_name", &metric_name_));
  }

  void Compute(OpKernelContext* ctx) override {
    ::tensorflow::core::RefCountPtr<TableResource> resource;
    OP_REQUIRES_OK(ctx, LookupGroupTable(ctx, metric_name_, num_buckets_, &resource));
    ::tensorflow::tf_shared_lock not_restoring(resource->restore_gate());
    double weighted_auc = 0.0, impressions = 0.0;
    ExportChunk chunk;
    int64_t cursor = 0;
    do {
      resource->table().ExportInto(cursor, kRowsPerChunk, &chunk);
      for (size_t r = 0; r < chunk.keys.size(); ++r) {
        const float* counts = chunk.values.data() + r * 2 * num_buckets_;
        // Pairs ranked by walking the buckets from the highest prediction down; a pair in
        // the same bucket counts one half.
        double positives_above = 0.0, negatives = 0.0, wins = 0.0;
        for (int64_t b = num_buckets_ - 1; b >= 0; --b) {
          const double pos = counts[2 * b], neg = counts[2 * b + 1];
          wins += neg * (positives_above + 0.5 * pos);
          positives_above += pos;
          negatives += neg;
        }
        if (positives_above > 0.0 && negatives > 0.0) {
          const double group_impressions = positives_above + negatives;
          weighted_auc += group_impressions * wins / (positives_above * negatives);
          impressions += group_impressions;
        }
      }
      cursor = chunk.next_cursor;
    } while (cursor >= 0);
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, {}, &out));
    out->scalar<double>()() = weighted_auc;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, {}, &out));
    out->scalar<double>()() = impressions;
  }

 private:
  static constexpr int64_t kRowsPerChunk = 1024;
  int64_t num_buckets_ = 0;
  std::string metric_name_;
};

REGISTER_KERNEL_BUILDER(Name("Tfps>GroupAucUpdate").Device(::tensorflow::DEVICE_CPU),
                        GroupAucUpdateOp);
REGISTER_KERNEL_BUILDER(Name("Tfps>GroupAucSum").Device(::tensorflow::DEVICE_CPU), GroupAucSumOp);

}  // namespace
}  // namespace tfps
