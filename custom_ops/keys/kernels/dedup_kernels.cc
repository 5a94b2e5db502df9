// CPU kernels of the ops that number a batch's distinct keys (core/key_dedup.h).
#include <cstring>

#include "absl/strings/str_cat.h"
#include "custom_ops/core/key_dedup.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/op_requires.h"

namespace tfps {
namespace {

using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;

// Numbers keys [m] into number[m]; the distinct keys go to `unique` (first occurrences).
int64_t NumberKeys(const int64_t* keys, int64_t m, int64_t* number, int64_t* unique) {
  KeyDedup dedup(m);
  for (int64_t i = 0; i < m; ++i) {
    const int64_t before = dedup.size();
    number[i] = dedup.Number(static_cast<uint64_t>(keys[i]));
    if (number[i] == before) unique[before] = keys[i];
  }
  return dedup.size();
}

class UniqueKeysOp : public OpKernel {
 public:
  using OpKernel::OpKernel;

  void Compute(OpKernelContext* ctx) override {
    const Tensor& keys = ctx->input(0);
    OP_REQUIRES(ctx, keys.dims() == 1,
                absl::InvalidArgumentError(absl::StrCat("Tfps>UniqueKeys: keys must be a vector, got shape ",
                                                        keys.shape().DebugString())));
    const int64_t m = keys.NumElements();
    Tensor* index = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, keys.shape(), &index));
    Tensor unique;
    OP_REQUIRES_OK(ctx, ctx->allocate_temp(::tensorflow::DT_INT64, keys.shape(), &unique));
    int64_t* number = index->flat<int64_t>().data();
    const int64_t n = NumberKeys(keys.flat<int64_t>().data(), m, number, unique.flat<int64_t>().data());
    ctx->set_output(0, unique.Slice(0, n));  // its first n keys, without a copy
    Tensor* counts = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, TensorShape({n}), &counts));
    int64_t* count = counts->flat<int64_t>().data();
    if (n > 0) std::memset(count, 0, n * sizeof(int64_t));
    for (int64_t i = 0; i < m; ++i) ++count[number[i]];
  }
};

class SumByKeyOp : public OpKernel {
 public:
  using OpKernel::OpKernel;

  void Compute(OpKernelContext* ctx) override {
    const Tensor& keys = ctx->input(0);
    const Tensor& values = ctx->input(1);
    OP_REQUIRES(ctx, keys.dims() == 1 && values.dims() == 2 && values.dim_size(0) == keys.dim_size(0),
                absl::InvalidArgumentError(absl::StrCat(
                    "Tfps>SumByKey: keys must be [m] and values [m, d], got keys ",
                    keys.shape().DebugString(), " and values ", values.shape().DebugString())));
    const int64_t m = keys.NumElements();
    const int64_t d = values.dim_size(1);
    Tensor number_tensor, unique;
    OP_REQUIRES_OK(ctx, ctx->allocate_temp(::tensorflow::DT_INT64, keys.shape(), &number_tensor));
    OP_REQUIRES_OK(ctx, ctx->allocate_temp(::tensorflow::DT_INT64, keys.shape(), &unique));
    const int64_t* number = number_tensor.flat<int64_t>().data();
    const int64_t n = NumberKeys(keys.flat<int64_t>().data(), m, number_tensor.flat<int64_t>().data(),
                                 unique.flat<int64_t>().data());
    ctx->set_output(0, unique.Slice(0, n));  // its first n keys, without a copy
    Tensor* sums = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({n, d}), &sums));
    float* out = sums->flat<float>().data();
    const float* in = values.flat<float>().data();
    // Zero plus each row in turn: the order, and so the rounding, of unsorted_segment_sum.
    if (n * d > 0) std::memset(out, 0, n * d * sizeof(float));
    for (int64_t i = 0; i < m; ++i) {
      float* row = out + number[i] * d;
      const float* add = in + i * d;
      for (int64_t j = 0; j < d; ++j) row[j] += add[j];
    }
  }
};

REGISTER_KERNEL_BUILDER(Name("Tfps>UniqueKeys").Device(::tensorflow::DEVICE_CPU), UniqueKeysOp);
REGISTER_KERNEL_BUILDER(Name("Tfps>SumByKey").Device(::tensorflow::DEVICE_CPU), SumByKeyOp);

}  // namespace
}  // namespace tfps
