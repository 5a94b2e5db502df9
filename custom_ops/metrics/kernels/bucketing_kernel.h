// Base of the kernels that bucket predictions (AUC and GroupAUC updates): reads the
// metric's name and bucket scale from the op's attributes once, checked.
#ifndef TFPS_METRICS_KERNELS_BUCKETING_KERNEL_H_
#define TFPS_METRICS_KERNELS_BUCKETING_KERNEL_H_

#include <cstdint>
#include <string>

#include "custom_ops/metrics/kernels/histogram_buckets.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/op_requires.h"

namespace tfps {

class BucketingKernel : public ::tensorflow::OpKernel {
 public:
  explicit BucketingKernel(::tensorflow::OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("metric_name", &metric_name_));
    int64_t buckets_per_octave = 0, octaves = 0;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("buckets_per_octave", &buckets_per_octave));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("octaves", &octaves));
    OP_REQUIRES_OK(ctx, ScaleFromAttributes(metric_name_, buckets_per_octave, octaves, &scale_));
  }

 protected:
  std::string metric_name_;
  BucketScale scale_;
};

}  // namespace tfps

#endif  // TFPS_METRICS_KERNELS_BUCKETING_KERNEL_H_
