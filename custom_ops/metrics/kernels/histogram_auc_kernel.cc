// CPU kernel of Tfps>HistogramAucUpdate: one pass to validate, one to add, under the
// variable's lock, so an update is a single op (and a single RPC to a parameter server).
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/op_requires.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/resource_var.h"

namespace tfps {
namespace {

using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Tensor;

class HistogramAucUpdateOp : public OpKernel {
 public:
  explicit HistogramAucUpdateOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("metric_name", &metric_name_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("num_buckets", &num_buckets_));
  }

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
    std::vector<float> ones;
    if (unweighted) ones.assign(n, 1.0f);
    const float* w = unweighted ? ones.data() : weights.flat<float>().data();
    // A branch-free pass that vectorizes; only a failing batch pays for finding the culprit.
    bool all_valid = true;
    for (int64_t i = 0; i < n; ++i) {
      all_valid &= (p[i] >= 0.0f) & (p[i] <= 1.0f) & (y[i] >= 0.0f) & (y[i] <= 1.0f) &
                   (w[i] >= 0.0f) & (w[i] <= std::numeric_limits<float>::max());
    }
    if (!all_valid) {
      ctx->CtxFailure(FirstInvalidInput(y, p, w, n));
      return;
    }
    ::tensorflow::core::RefCountPtr<::tensorflow::Var> var;
    OP_REQUIRES_OK(ctx, ::tensorflow::LookupResource(ctx, ::tensorflow::HandleFromInput(ctx, 0), &var));
    ::tensorflow::mutex_lock lock(*var->mu());
    Tensor* histogram = var->tensor();
    OP_REQUIRES(ctx, var->is_initialized && histogram->dtype() == ::tensorflow::DT_DOUBLE &&
                         histogram->dims() == 2 && histogram->dim_size(1) == 2,
                absl::InvalidArgumentError(absl::StrCat(
                    metric_name_, ": the histogram must be an initialized float64 variable of "
                    "shape [num_buckets, 2], got ", histogram->DebugString())));
    if (!histogram->RefCountIsOne()) {
      // Someone holds the old buffer (a read in flight): update a private copy.
      Tensor copy;
      OP_REQUIRES_OK(ctx, ctx->allocate_temp(::tensorflow::DT_DOUBLE, histogram->shape(), &copy));
      std::memcpy(copy.flat<double>().data(), histogram->flat<double>().data(),
                  histogram->TotalBytes());
      *histogram = copy;
    }
    // [bucket][positive, negative]: one cache line per example.
    const int64_t first = ctx->input(4).scalar<int64_t>()();
    const int64_t rows = histogram->dim_size(0);
    OP_REQUIRES(ctx, first >= 0 && first + rows <= num_buckets_,
                absl::InvalidArgumentError(absl::StrCat(
                    metric_name_, ": histogram rows [", first, ", ", first + rows,
                    ") do not fit in ", num_buckets_, " buckets")));
    double* counts = histogram->flat<double>().data();
    const float scale = static_cast<float>(num_buckets_);
    const bool whole = rows == num_buckets_;
    for (int64_t i = 0; i < n; ++i) {
      int64_t b = std::min<int64_t>(static_cast<int64_t>(p[i] * scale), num_buckets_ - 1);
      if (!whole) {
        b -= first;
        if (b < 0 || b >= rows) continue;
      }
      const double positive = static_cast<double>(w[i]) * y[i];
      counts[2 * b] += positive;
      counts[2 * b + 1] += static_cast<double>(w[i]) - positive;
    }
  }

  absl::Status FirstInvalidInput(const float* y, const float* p, const float* w, int64_t n) const {
    for (int64_t i = 0; i < n; ++i) {
      // Written so that NaN fails every comparison and is reported.
      if (!(p[i] >= 0.0f && p[i] <= 1.0f)) {
        return absl::InvalidArgumentError(absl::StrCat(
            metric_name_, ": predictions must be probabilities in [0, 1] (NaN is rejected); got ",
            p[i], " at index ", i));
      }
      if (!(y[i] >= 0.0f && y[i] <= 1.0f)) {
        return absl::InvalidArgumentError(
            absl::StrCat(metric_name_, ": labels must be in [0, 1]; got ", y[i], " at index ", i));
      }
      if (!(w[i] >= 0.0f && std::isfinite(w[i]))) {
        return absl::InvalidArgumentError(absl::StrCat(
            metric_name_, ": sample_weight must be >= 0 and finite; got ", w[i], " at index ", i));
      }
    }
    return absl::OkStatus();
  }

 private:
  std::string metric_name_;
  int64_t num_buckets_ = 0;
};

REGISTER_KERNEL_BUILDER(Name("Tfps>HistogramAucUpdate").Device(::tensorflow::DEVICE_CPU),
                        HistogramAucUpdateOp);

}  // namespace
}  // namespace tfps
