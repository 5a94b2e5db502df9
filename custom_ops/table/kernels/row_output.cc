#include "custom_ops/table/kernels/row_output.h"

#include <algorithm>
#include <cstdlib>
#include <string>

#include "custom_ops/core/block_cache.h"
#include "custom_ops/core/table.h"
#include "custom_ops/table/kernels/table_resource.h"
#include "tensorflow/core/framework/allocator.h"

namespace tfps {
namespace {

constexpr int64_t kLargeOutputBytes = int64_t{8} << 20;

class CachedBlockAllocator : public ::tensorflow::Allocator {
 public:
  explicit CachedBlockAllocator(size_t max_idle_bytes) : cache_(max_idle_bytes) {}
  std::string Name() override { return "tfps_row_output_cache"; }
  void* AllocateRaw(size_t alignment, size_t num_bytes) override {
    return cache_.Take(num_bytes);  // blocks are page-aligned, beyond any asked alignment
  }
  void DeallocateRaw(void* ptr) override { cache_.Give(ptr); }
  bool WasReused(const void* ptr) const { return cache_.WasReused(ptr); }

 private:
  BlockCache cache_;
};

// With the cache turned off it keeps no idle block: each large output is a fresh mapping,
// unmapped when the output is freed. TF's own allocator would not do: with oneDNN on (the
// default on CPUs with AVX-512 VNNI) it pools freed memory in a BFC allocator for good.
// Never destroyed: outputs may outlive every kernel.
CachedBlockAllocator* RowOutputAllocator() {
  static CachedBlockAllocator* const allocator = [] {
    const char* env = std::getenv("TFPS_OUTPUT_CACHE_MB");
    const long long megabytes = env == nullptr ? 512 : std::max(0LL, std::atoll(env));
    return new CachedBlockAllocator(static_cast<size_t>(megabytes) << 20);
  }();
  return allocator;
}

}  // namespace

absl::Status AllocateRowOutput(::tensorflow::OpKernelContext* ctx, int index,
                               const ::tensorflow::TensorShape& shape, ::tensorflow::Tensor** out) {
  const int64_t bytes = shape.num_elements() * int64_t{sizeof(float)};
  // Small outputs come from the op's allocator, whose heap hands back backed memory.
  if (bytes < kLargeOutputBytes) return ctx->allocate_output(index, shape, out);
  ::tensorflow::Tensor* rows = nullptr;
  bool backed = false;
  CachedBlockAllocator* allocator = RowOutputAllocator();
  ::tensorflow::Tensor cached(allocator, ::tensorflow::DT_FLOAT, shape);
  if (cached.IsInitialized()) {
    ctx->set_output(index, cached);
    rows = ctx->mutable_output(index);
    // A reused block is backed already; backing it again would walk every page for nothing.
    backed = allocator->WasReused(rows->data());
  } else {
    // No mapping to be had; the op's allocator may still find memory.
    TF_RETURN_IF_ERROR(ctx->allocate_output(index, shape, &rows));
  }
  if (!backed) PopulateInParallel(rows->data(), bytes, DeviceParallelFor(ctx));
  *out = rows;
  return absl::OkStatus();
}

}  // namespace tfps
