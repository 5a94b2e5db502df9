// The dynamic table as a TensorFlow resource, and helpers shared by its CPU kernels.
#ifndef TFPS_TABLE_KERNELS_TABLE_RESOURCE_H_
#define TFPS_TABLE_KERNELS_TABLE_RESOURCE_H_

#include <memory>
#include <new>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "custom_ops/core/table.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/op_requires.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/platform/mutex.h"

namespace tfps {

class TableResource : public ::tensorflow::ResourceBase {
 public:
  // The table is made first: a resource whose construction throws would be destroyed
  // still referenced, which some TensorFlow releases check fatally.
  TableResource(std::unique_ptr<Table> table, std::string name) noexcept
      : table_(std::move(table)), name_(std::move(name)) {}

  std::string DebugString() const override;
  int64_t MemoryUsed() const override { return table_->MemoryBytes(); }

  Table& table() { return *table_; }
  // The table's shared name, for error messages.
  const std::string& name() const { return name_; }
  // Held shared by every other op on the table and exclusively by a restore, from its
  // check that the files follow the table to its last row: a restore is then one change,
  // which no lookup, update or save sees half done or lands inside.
  ::tensorflow::mutex& restore_gate() { return restore_gate_; }

 private:
  std::unique_ptr<Table> table_;
  const std::string name_;
  ::tensorflow::mutex restore_gate_;
};

// A ResourceExhausted error naming the op, the table and the bytes it asked for (-1: not
// known), saying what became of the table.
absl::Status OutOfMemory(const std::string& op, const std::string& table, int64_t bytes,
                         const std::string& outcome);

// An Internal error naming the op and the table whose disk tier failed (a tiered table
// reads and writes its disk as calls need it), and what became of the table.
absl::Status DiskTierFailed(const std::string& op, const std::string& table, const std::string& what,
                            const std::string& outcome);

// Runs fn(); an allocation failure or a disk tier's failure inside it (table calls throw before changing anything)
// becomes the kernel's ResourceExhausted error instead of ending the process.
template <typename Fn>
void RunOrReportOutOfMemory(::tensorflow::OpKernelContext* ctx, const std::string& op,
                            const std::string& table, Fn&& fn,
                            const std::string& outcome = "the table is unchanged") {
  try {
    fn();
  } catch (const AllocationFailure& e) {
    ctx->SetStatus(OutOfMemory(op, table, e.bytes(), outcome));
  } catch (const std::bad_alloc&) {
    ctx->SetStatus(OutOfMemory(op, table, -1, outcome));
  } catch (const DiskStoreError& e) {
    ctx->SetStatus(DiskTierFailed(op, table, e.what(), outcome));
  }
}

// Everything that decides a table's values (not its memory policy), for comparing the
// table behind a shared name with the one an op asks for.
std::string DescribeTableConfig(const TableConfig& config);

// Parses create-op attributes into a table configuration; the error names the bad value.
absl::Status ParseTableConfig(::tensorflow::OpKernelConstruction* ctx, TableConfig* config);

// The create op's container and shared_name attributes; an empty shared_name becomes one
// unique to this kernel (prefix, the node's name and a counter).
absl::Status ParseResourceName(::tensorflow::OpKernelConstruction* ctx, const std::string& prefix,
                               std::string* container, std::string* shared_name);

// ApplyGradients' per-call learning rate: a finite scalar (not 0 for an optimizer that
// divides by it; negative: the table's own).
absl::Status ParseLearningRate(const ::tensorflow::Tensor& rate, OptimizerKind optimizer, float* out);

// keys must be a vector [n] and rows (named rows_name in the error) [n, dim].
absl::Status CheckKeyedRows(const std::string& op, const ::tensorflow::Tensor& keys,
                            const ::tensorflow::Tensor& rows, const char* rows_name, int64_t dim);

// Input `index`, which must be a scalar; the error names the op and the input.
absl::Status ScalarInput(::tensorflow::OpKernelContext* ctx, const std::string& op, int index,
                         const char* name, const ::tensorflow::Tensor** out);

// The int64 scalar of input `index`, checked as ScalarInput checks it.
absl::Status Int64Input(::tensorflow::OpKernelContext* ctx, const std::string& op, int index,
                        const char* name, int64_t* value);

// The table (CPU or GPU resource) behind the handle every table op takes as input 0.
template <typename Resource>
absl::Status LookupTableInput(::tensorflow::OpKernelContext* ctx,
                              ::tensorflow::core::RefCountPtr<Resource>* out) {
  return ::tensorflow::LookupResource(ctx, ::tensorflow::HandleFromInput(ctx, 0), out);
}

// A create op's last step: refuses the table already behind `shared_name` when its
// configuration is not the one asked for (`what` names the kind of table), and otherwise
// outputs its handle.
template <typename Resource>
void OutputTableHandle(::tensorflow::OpKernelContext* ctx, const std::string& what,
                       const std::string& container, const std::string& shared_name,
                       const TableConfig& existing, const TableConfig& wanted) {
  const std::string have = DescribeTableConfig(existing), want = DescribeTableConfig(wanted);
  OP_REQUIRES(ctx, have == want,
              absl::InvalidArgumentError(absl::StrCat("Tfps>TableCreate: a ", what, " named '", shared_name,
                                                      "' already exists with ", have, ", not ", want)));
  ::tensorflow::Tensor* handle = nullptr;
  ::tensorflow::AllocatorAttributes host;
  host.set_on_host(true);
  OP_REQUIRES_OK(ctx, ctx->allocate_output(0, ::tensorflow::TensorShape({}), &handle, host));
  handle->scalar<::tensorflow::ResourceHandle>()() =
      ::tensorflow::MakeResourceHandle<Resource>(ctx, container, shared_name);
}

// The intra-op thread pool of the kernel's device as a core ParallelFor.
ParallelFor DeviceParallelFor(::tensorflow::OpKernelContext* ctx);

}  // namespace tfps

#endif  // TFPS_TABLE_KERNELS_TABLE_RESOURCE_H_
