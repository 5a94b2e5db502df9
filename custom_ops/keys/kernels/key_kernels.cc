// CPU kernels of the key ops.
#include "absl/strings/str_cat.h"
#include "custom_ops/core/hashing.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/op_requires.h"

namespace tfps {
namespace {

using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Tensor;

template <typename Tid>
class NamespacedKeysOp : public OpKernel {
 public:
  using OpKernel::OpKernel;

  void Compute(OpKernelContext* ctx) override {
    const Tensor& ids = ctx->input(0);
    const Tensor& namespaces = ctx->input(1);
    const bool scalar = namespaces.NumElements() == 1 && namespaces.dims() == 0;
    OP_REQUIRES(ctx, scalar || namespaces.shape() == ids.shape(),
                absl::InvalidArgumentError(absl::StrCat(
                    "Tfps>NamespacedKeys: namespaces must be a scalar or have the shape of ids ",
                    ids.shape().DebugString(), ", got ", namespaces.shape().DebugString())));
    Tensor* keys = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, ids.shape(), &keys));
    const auto in = ids.flat<Tid>();
    const auto ns = namespaces.flat<int64_t>();
    auto out = keys->flat<int64_t>();
    for (int64_t i = 0; i < in.size(); ++i) {
      // int32 IDs are sign-extended, so -1 as int32 and as int64 is the same key.
      const uint64_t id = static_cast<uint64_t>(static_cast<int64_t>(in(i)));
      out(i) = static_cast<int64_t>(NamespacedKey(id, static_cast<uint64_t>(ns(scalar ? 0 : i))));
    }
  }
};

class ShardOfOp : public OpKernel {
 public:
  explicit ShardOfOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("num_shards", &num_shards_));
    // ShardOf takes a 32-bit count; a larger one would wrap to another routing silently.
    OP_REQUIRES(ctx, num_shards_ >= 1 && num_shards_ <= (int64_t{1} << 31),
                absl::InvalidArgumentError(absl::StrCat(
                    "Tfps>ShardOf: num_shards must be in [1, 2^31], got ", num_shards_)));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& keys = ctx->input(0);
    Tensor* shards = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, keys.shape(), &shards));
    const auto in = keys.flat<int64_t>();
    auto out = shards->flat<int32_t>();
    for (int64_t i = 0; i < in.size(); ++i) {
      out(i) = static_cast<int32_t>(ShardOf(static_cast<uint64_t>(in(i)), static_cast<uint32_t>(num_shards_)));
    }
  }

 private:
  int64_t num_shards_ = 1;
};

REGISTER_KERNEL_BUILDER(Name("Tfps>NamespacedKeys").Device(::tensorflow::DEVICE_CPU).TypeConstraint<int32_t>("Tid"),
                        NamespacedKeysOp<int32_t>);
REGISTER_KERNEL_BUILDER(Name("Tfps>NamespacedKeys").Device(::tensorflow::DEVICE_CPU).TypeConstraint<int64_t>("Tid"),
                        NamespacedKeysOp<int64_t>);
REGISTER_KERNEL_BUILDER(Name("Tfps>NamespacedKeys").Device(::tensorflow::DEVICE_CPU).TypeConstraint<::tensorflow::uint64>("Tid"),
                        NamespacedKeysOp<::tensorflow::uint64>);
REGISTER_KERNEL_BUILDER(Name("Tfps>ShardOf").Device(::tensorflow::DEVICE_CPU), ShardOfOp);

}  // namespace
}  // namespace tfps
