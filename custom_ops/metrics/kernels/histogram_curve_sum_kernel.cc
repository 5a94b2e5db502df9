// CPU kernel of Tfps>HistogramCurveSum: one pass over an AUC histogram (or one part of a
// partitioned one) under the variable's shared lock.
#include <string>

#include "custom_ops/metrics/kernels/histogram_variable.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/op_requires.h"

namespace tfps {
namespace {

using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Tensor;

class HistogramCurveSumOp : public OpKernel {
 public:
  explicit HistogramCurveSumOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    std::string curve;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("curve", &curve));
    roc_ = curve == "ROC";
  }

  void Compute(OpKernelContext* ctx) override {
    ::tensorflow::core::RefCountPtr<::tensorflow::Var> var;
    OP_REQUIRES_OK(ctx, LookupHistogram(ctx, &var));
    ::tensorflow::tf_shared_lock lock(*var->mu());
    OP_REQUIRES_OK(ctx, CheckHistogram(*var, "Tfps>HistogramCurveSum"));
    const Tensor& histogram = *var->tensor();
    const double* counts = histogram.flat<double>().data();
    // Eager calls skip shape functions, so the kernel checks what .scalar() assumes.
    for (int i : {1, 2}) {
      OP_REQUIRES(ctx, ::tensorflow::TensorShapeUtils::IsScalar(ctx->input(i).shape()),
                  absl::InvalidArgumentError(absl::StrCat(
                      "Tfps>HistogramCurveSum: ", i == 1 ? "positives_above" : "negatives_above",
                      " must be a scalar, got shape ", ctx->input(i).shape().DebugString())));
    }
    double positives = ctx->input(1).scalar<double>()();
    double negatives = ctx->input(2).scalar<double>()();
    double sum = 0.0;
    for (int64_t b = histogram.dim_size(0) - 1; b >= 0; --b) {
      const double pos = counts[2 * b], neg = counts[2 * b + 1];
      if (roc_) {
        sum += neg * (positives + 0.5 * pos);
        positives += pos;
        negatives += neg;
      } else {
        positives += pos;
        negatives += neg;
        // A bucket without positives adds nothing (and 0/0 is not evaluated).
        if (pos > 0.0) sum += pos * (positives / (positives + negatives));
      }
    }
    ctx->set_output(0, Tensor(sum));
    ctx->set_output(1, Tensor(positives));
    ctx->set_output(2, Tensor(negatives));
  }

 private:
  bool roc_ = true;
};

REGISTER_KERNEL_BUILDER(Name("Tfps>HistogramCurveSum").Device(::tensorflow::DEVICE_CPU),
                        HistogramCurveSumOp);

}  // namespace
}  // namespace tfps
