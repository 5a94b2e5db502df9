// Allocation of the large row outputs of the table ops (find, find_or_insert) from a
// process-wide cache of already-backed blocks; see custom_ops/core/block_cache.h.
#ifndef TFPS_TABLE_KERNELS_ROW_OUTPUT_H_
#define TFPS_TABLE_KERNELS_ROW_OUTPUT_H_

#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor_shape.h"

namespace tfps {

// Allocates float output `index` of `shape`, its pages backed. Outputs of at least 8 MiB
// come from the block cache, which keeps up to TFPS_OUTPUT_CACHE_MB (default 512; 0 keeps
// none, every such output then goes back to the OS when freed) of freed outputs for reuse;
// smaller ones come from the op's allocator, whose heap already reuses them. Fresh large
// outputs are backed by all threads at once.
absl::Status AllocateRowOutput(::tensorflow::OpKernelContext* ctx, int index,
                               const ::tensorflow::TensorShape& shape, ::tensorflow::Tensor** out);

}  // namespace tfps

#endif  // TFPS_TABLE_KERNELS_ROW_OUTPUT_H_
