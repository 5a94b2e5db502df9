#include "custom_ops/table/kernels/row_output.h"

#include <algorithm>
#include <cstdlib>
#include <string>

#include "custom_ops/core/block_cache.h"
#include "custom_ops/core/memory.h"
#include "custom_ops/core/table.h"
#include "custom_ops/table/kernels/table_resource.h"
#include "tensorflow/core/framework/allocator.h"

namespace tfps {
namespace {

constexpr int64_t kLargeOutputBytes = int64_t{8} << 20;

// A TF allocator over the process's block cache, asking reused blocks for huge pages or not.
class CachedBlockAllocator : public ::tensorflow::Allocator {
 public:
  CachedBlockAllocator(BlockCache* cache, bool huge_pages)
      : cache_(cache), huge_pages_(huge_pages) {}
  std::string Name() override { return "tfps_row_output_cache"; }
  void* AllocateRaw(size_t alignment, size_t num_bytes) override {
    // Blocks are page-aligned, beyond any asked alignment.
    return cache_->Take(num_bytes, huge_pages_);
  }
  void DeallocateRaw(void* ptr) override { cache_->Give(ptr); }
  bool WasReused(const void* ptr) const { return cache_->WasReused(ptr); }

 private:
  BlockCache* const cache_;
  const bool huge_pages_;
};

// Outputs whose rows are narrower than a cache line move onto huge pages while reused (see
// block_cache.h: a TLB miss per row costs them most, and wide rows gained nothing).
// With the cache turned off it keeps no idle block: each large output is a fresh mapping,
// unmapped when the output is freed. TF's own allocator would not do: with oneDNN on (the
// default on CPUs with AVX-512 VNNI) it pools freed memory in a BFC allocator for good.
// Never destroyed: outputs may outlive every kernel.
CachedBlockAllocator* RowOutputAllocator(int64_t row_bytes) {
  static BlockCache* const cache = [] {
    const char* env = std::getenv("TFPS_OUTPUT_CACHE_MB");
    const long long megabytes = env == nullptr ? 512 : std::max(0LL, std::atoll(env));
    return new BlockCache(static_cast<size_t>(megabytes) << 20);
  }();
  static CachedBlockAllocator* const narrow_rows = new CachedBlockAllocator(cache, true);
  static CachedBlockAllocator* const wide_rows = new CachedBlockAllocator(cache, false);
  return row_bytes < static_cast<int64_t>(kCacheLineBytes) ? narrow_rows : wide_rows;
}

}  // namespace

absl::Status AllocateRowOutput(::tensorflow::OpKernelContext* ctx, int index,
                               const ::tensorflow::TensorShape& shape, ::tensorflow::Tensor** out) {
  const int64_t bytes = shape.num_elements() * int64_t{sizeof(float)};
  // Small outputs come from the op's allocator, whose heap hands back backed memory.
  if (bytes < kLargeOutputBytes) return ctx->allocate_output(index, shape, out);
  ::tensorflow::Tensor* rows = nullptr;
  bool backed = false;
  const int64_t row_bytes =
      shape.dims() > 0 ? shape.dim_size(shape.dims() - 1) * int64_t{sizeof(float)} : 0;
  CachedBlockAllocator* allocator = RowOutputAllocator(row_bytes);
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
