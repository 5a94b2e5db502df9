// CPU kernel of Tfps>HistogramAucUpdate: one pass to validate, one to add (under the
// variable's lock), so an update is a single op (and a single RPC to a parameter server).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/op_requires.h"
#include "custom_ops/metrics/kernels/bucketing_kernel.h"
#include "custom_ops/metrics/kernels/histogram_buckets.h"
#include "custom_ops/metrics/kernels/histogram_variable.h"

namespace tfps {
namespace {

using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Tensor;

class HistogramAucUpdateOp : public BucketingKernel {
 public:
  using BucketingKernel::BucketingKernel;

  void Compute(OpKernelContext* ctx) override {
    const Tensor& labels = ctx->input(1);
    const Tensor& predictions = ctx->input(2);
    const Tensor& weights = ctx->input(3);
    const int64_t n = predictions.NumElements();
    // An empty weights tensor means every example has weight 1.
    const bool unweighted = weights.NumElements() == 0 && n > 0;
    OP_REQUIRES(ctx, labels.NumElements() == n && (unweighted || weights.NumElements() == n),
                absl::InvalidArgumentError(absl::StrCat(
                    metric_name_, ": labels, predictions and sample weights must have the same "
                    "number of elements, got ", labels.NumElements(), ", ", n, " and ",
                    weights.NumElements())));
    const float* y = labels.flat<float>().data();
    const float* p = predictions.flat<float>().data();
    const float* w = unweighted ? nullptr : weights.flat<float>().data();
    // Pass one computes every bucket and checks every input without a branch, so it
    // vectorizes; only a failing batch pays for finding the culprit, and it changes nothing.
    Tensor slots;
    OP_REQUIRES_OK(ctx, ctx->allocate_temp(::tensorflow::DT_INT32, {n}, &slots));
    bool hard_labels = false;
    if (!SlotAndCheck(y, p, w, n, scale_, slots.flat<int32_t>().data(), &hard_labels)) {
      ctx->CtxFailure(FirstInvalidInput(metric_name_, y, p, w, n));
      return;
    }
    ::tensorflow::core::RefCountPtr<::tensorflow::Var> var;
    OP_REQUIRES_OK(ctx, LookupHistogram(ctx, &var));
    ::tensorflow::mutex_lock lock(*var->mu());
    OP_REQUIRES_OK(ctx, CheckHistogram(*var, metric_name_));
    Tensor* histogram = var->tensor();
    if (!histogram->RefCountIsOne()) {
      // Someone holds the old buffer (a read in flight): update a private copy.
      Tensor copy;
      OP_REQUIRES_OK(ctx, ctx->allocate_temp(::tensorflow::DT_DOUBLE, histogram->shape(), &copy));
      std::memcpy(copy.flat<double>().data(), histogram->flat<double>().data(),
                  histogram->TotalBytes());
      *histogram = copy;
    }
    // [bucket][positive, negative]: one cache line per example.
    // Eager calls skip shape functions, so the kernel checks what .scalar() assumes.
    OP_REQUIRES(ctx, ::tensorflow::TensorShapeUtils::IsScalar(ctx->input(4).shape()),
                absl::InvalidArgumentError(absl::StrCat(
                    metric_name_, ": first_bucket must be a scalar, got shape ",
                    ctx->input(4).shape().DebugString())));
    const int64_t first = ctx->input(4).scalar<int64_t>()();
    const int64_t rows = histogram->dim_size(0);
    const int64_t num_buckets = 2 * int64_t{scale_.per_side};
    OP_REQUIRES(ctx, first >= 0 && first + rows <= num_buckets,
                absl::InvalidArgumentError(absl::StrCat(
                    metric_name_, ": histogram rows [", first, ", ", first + rows,
                    ") do not fit in ", num_buckets, " buckets")));
    double* counts = histogram->flat<double>().data();
    const int32_t* slot = slots.flat<int32_t>().data();
    if (first == 0 && rows == num_buckets) {
      AddToHistogram(hard_labels, y, w, slot, n, AllSlots{}, counts);
    } else {
      AddToHistogram(hard_labels, y, w, slot, n, SlotRange{2 * first, 2 * rows}, counts);
    }
  }

};

REGISTER_KERNEL_BUILDER(Name("Tfps>HistogramAucUpdate").Device(::tensorflow::DEVICE_CPU),
                        HistogramAucUpdateOp);

}  // namespace
}  // namespace tfps
