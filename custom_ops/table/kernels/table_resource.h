// The dynamic table as a TensorFlow resource, and helpers shared by its CPU kernels.
#ifndef TFPS_TABLE_KERNELS_TABLE_RESOURCE_H_
#define TFPS_TABLE_KERNELS_TABLE_RESOURCE_H_

#include <string>

#include "custom_ops/core/table.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"

namespace tfps {

class TableResource : public ::tensorflow::ResourceBase {
 public:
  explicit TableResource(const TableConfig& config) : table_(config) {}

  std::string DebugString() const override;
  int64_t MemoryUsed() const override { return table_.MemoryBytes(); }

  Table& table() { return table_; }

 private:
  Table table_;
};

// Everything that decides a table's values (not its memory policy), for comparing the
// table behind a shared name with the one an op asks for.
std::string DescribeTableConfig(const TableConfig& config);

// Parses create-op attributes into a table configuration; the error names the bad value.
absl::Status ParseTableConfig(::tensorflow::OpKernelConstruction* ctx, TableConfig* config);

// The intra-op thread pool of the kernel's device as a core ParallelFor.
ParallelFor DeviceParallelFor(::tensorflow::OpKernelContext* ctx);

}  // namespace tfps

#endif  // TFPS_TABLE_KERNELS_TABLE_RESOURCE_H_
