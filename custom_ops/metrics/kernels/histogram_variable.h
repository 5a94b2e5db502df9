// The AUC histogram variable that both metric kernels use: a float64 [buckets, 2] resource
// variable of (positive, negative) weight per prediction bucket.
#ifndef TFPS_METRICS_KERNELS_HISTOGRAM_VARIABLE_H_
#define TFPS_METRICS_KERNELS_HISTOGRAM_VARIABLE_H_

#include <string>

#include "absl/strings/str_cat.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/resource_var.h"

namespace tfps {

// The variable behind input 0. Callers take its lock, then call CheckHistogram.
inline absl::Status LookupHistogram(::tensorflow::OpKernelContext* ctx,
                                    ::tensorflow::core::RefCountPtr<::tensorflow::Var>* var) {
  return ::tensorflow::LookupResource(ctx, ::tensorflow::HandleFromInput(ctx, 0), var);
}

// Holds the variable's lock while called.
inline absl::Status CheckHistogram(const ::tensorflow::Var& var, const std::string& who) {
  const ::tensorflow::Tensor& histogram = *const_cast<::tensorflow::Var&>(var).tensor();
  if (var.is_initialized && histogram.dtype() == ::tensorflow::DT_DOUBLE && histogram.dims() == 2 &&
      histogram.dim_size(1) == 2) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      who, ": the histogram must be an initialized float64 variable of shape [num_buckets, 2], "
      "got ", histogram.DebugString()));
}

}  // namespace tfps

#endif  // TFPS_METRICS_KERNELS_HISTOGRAM_VARIABLE_H_
