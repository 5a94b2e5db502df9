// CPU kernel that exports a table shard for a vector index: its keys and values as NumPy
// .npy files (PREFIX.keys.npy int64 [n], PREFIX.vectors.npy float32 [n, dim]), and for an
// export of changes the keys removed since (PREFIX.removed_keys.npy). An .npy header holds
// the row count, which is known only once the rows are read, so each array is streamed to
// a temporary raw file chunk by chunk and then copied behind its header into a temporary
// .npy renamed into place: memory stays at one chunk whatever the table's size. The
// changes follow the save chain `chain` (the table's change record, as checkpoints use it),
// which moves on only when Tfps>TableCommitSave records this export.
#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "custom_ops/table/kernels/row_file.h"
#include "custom_ops/table/kernels/table_resource.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/op_requires.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/platform/env.h"
#include "tensorflow/core/platform/file_system.h"

namespace tfps {
namespace {

using ::tensorflow::Env;
using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;

constexpr char kOp[] = "Tfps>TableExportForRetrieval";
constexpr size_t kCopyBytes = size_t{4} << 20;

// Version 1.0 of the format: magic, version, little-endian header length, then a Python
// dict literal padded with spaces and a newline to a multiple of 64 bytes.
std::string NpyHeader(const char* descr, int64_t rows, int64_t dim) {
  std::string dict = absl::StrCat("{'descr': '", descr, "', 'fortran_order': False, 'shape': (", rows,
                                  dim > 0 ? absl::StrCat(", ", dim, ")") : std::string(",)"), ", }");
  const size_t unpadded = 10 + dict.size() + 1;
  dict.append((64 - unpadded % 64) % 64, ' ');
  dict.push_back('\n');
  std::string header("\x93NUMPY\x01\x00", 8);
  header.push_back(static_cast<char>(dict.size() & 0xff));
  header.push_back(static_cast<char>(dict.size() >> 8));
  return header + dict;
}

// One array: appended to a raw temporary file, then written as `path` (an .npy file).
class NpyArrayWriter {
 public:
  NpyArrayWriter(Env* env, std::string path, const char* descr, int64_t dim, size_t item_bytes)
      : env_(env), path_(std::move(path)), descr_(descr), dim_(dim), item_bytes_(item_bytes),
        raw_path_(TempPathOf(env, path_ + ".raw")) {}

  ~NpyArrayWriter() {
    raw_.reset();
    env_->DeleteFile(raw_path_).IgnoreError();
  }

  absl::Status Open() { return env_->NewWritableFile(raw_path_, &raw_); }

  absl::Status Append(const void* data, int64_t items) {
    if (items == 0) return absl::OkStatus();
    items_ += items;
    return raw_->Append(absl::string_view(static_cast<const char*>(data), items * item_bytes_));
  }

  int64_t rows() const { return dim_ > 0 ? items_ / dim_ : items_; }

  absl::Status Finish() {
    TF_RETURN_IF_ERROR(raw_->Close());
    raw_.reset();
    const std::string temp = TempPathOf(env_, path_);
    std::unique_ptr<::tensorflow::WritableFile> out;
    TF_RETURN_IF_ERROR(env_->NewWritableFile(temp, &out));
    absl::Status status = out->Append(NpyHeader(descr_, rows(), dim_));
    if (status.ok()) status = CopyRawInto(out.get());
    if (status.ok()) status = out->Close();
    if (status.ok()) status = env_->RenameFile(temp, path_);
    if (!status.ok()) env_->DeleteFile(temp).IgnoreError();
    return status;
  }

 private:
  absl::Status CopyRawInto(::tensorflow::WritableFile* out) {
    std::unique_ptr<::tensorflow::RandomAccessFile> raw;
    TF_RETURN_IF_ERROR(env_->NewRandomAccessFile(raw_path_, &raw));
    std::vector<char> buffer(kCopyBytes);
    const uint64_t total = static_cast<uint64_t>(items_) * item_bytes_;
    for (uint64_t offset = 0; offset < total;) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(kCopyBytes, total - offset));
      absl::string_view read;
      TF_RETURN_IF_ERROR(raw->Read(offset, n, &read, buffer.data()));
      if (read.size() != n) return absl::DataLossError(absl::StrCat(kOp, ": short read of ", raw_path_));
      TF_RETURN_IF_ERROR(out->Append(read));
      offset += n;
    }
    return absl::OkStatus();
  }

  Env* env_;
  std::string path_;
  const char* descr_;
  int64_t dim_;
  size_t item_bytes_;
  std::string raw_path_;
  std::unique_ptr<::tensorflow::WritableFile> raw_;
  int64_t items_ = 0;
};

class TableExportForRetrievalOp : public OpKernel {
 public:
  explicit TableExportForRetrievalOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("changes_only", &changes_only_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("chain", &chain_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("chunk_rows", &chunk_rows_));
    OP_REQUIRES(ctx, !chain_.empty(), absl::InvalidArgumentError(absl::StrCat(kOp, ": chain must be named")));
    OP_REQUIRES(ctx, chunk_rows_ > 0,
                absl::InvalidArgumentError(absl::StrCat(kOp, ": chunk_rows must be > 0, got ", chunk_rows_)));
  }

  void Compute(OpKernelContext* ctx) override {
    ::tensorflow::core::RefCountPtr<TableResource> resource;
    OP_REQUIRES_OK(ctx, LookupTableInput(ctx, &resource));
    ::tensorflow::tf_shared_lock not_restoring(resource->restore_gate());
    const Tensor* prefix;
    OP_REQUIRES_OK(ctx, ScalarInput(ctx, kOp, 1, "prefix", &prefix));
    Table& table = resource->table();
    Table::ChainPoint base;
    bool changes = changes_only_ && table.LastSaveOfChain(chain_, &base);
    const int64_t stamp = table.BeginSave();
    int64_t rows = 0, removed = 0;
    absl::Status status;
    RunOrReportOutOfMemory(ctx, kOp, resource->name(), [&] {
      bool incomplete = false;
      status = Write(ctx->env(), table, prefix->scalar<::tensorflow::tstring>()(),
                     changes ? base.stamp : -1, &rows, &removed, &incomplete);
      if (status.ok() && incomplete) {  // removals the chain needed were dropped: write whole
        changes = false;
        status = Write(ctx->env(), table, prefix->scalar<::tensorflow::tstring>()(), -1, &rows,
                       &removed, &incomplete);
      }
    }, "no file was written");
    if (!ctx->status().ok()) return;
    OP_REQUIRES_OK(ctx, status);
    // The export these changes follow, so that a reader can refuse them after any other.
    const int64_t follows = changes ? static_cast<int64_t>(base.save_id) : 0;
    const int64_t outputs[] = {rows, removed, changes ? 1 : 0, stamp, follows};
    for (int i = 0; i < 5; ++i) {
      Tensor* out;
      OP_REQUIRES_OK(ctx, ctx->allocate_output(i, TensorShape({}), &out));
      out->scalar<int64_t>()() = outputs[i];
    }
  }

 private:
  absl::Status Write(Env* env, const Table& table, const std::string& prefix, int64_t changed_after,
                     int64_t* rows, int64_t* removed, bool* incomplete) const {
    const int64_t dim = table.dim();
    NpyArrayWriter keys(env, prefix + ".keys.npy", "<i8", 0, sizeof(int64_t));
    NpyArrayWriter vectors(env, prefix + ".vectors.npy", "<f4", dim, sizeof(float));
    NpyArrayWriter removed_keys(env, prefix + ".removed_keys.npy", "<i8", 0, sizeof(int64_t));
    TF_RETURN_IF_ERROR(keys.Open());
    TF_RETURN_IF_ERROR(vectors.Open());
    TF_RETURN_IF_ERROR(removed_keys.Open());
    ExportChunk chunk;
    *incomplete = false;
    for (int64_t cursor = 0; cursor >= 0; cursor = chunk.next_cursor) {
      table.SaveChunk(cursor, chunk_rows_, changed_after, &chunk);
      if (chunk.changes_incomplete) {
        *incomplete = true;
        return absl::OkStatus();
      }
      const int64_t n = static_cast<int64_t>(chunk.keys.size());
      TF_RETURN_IF_ERROR(keys.Append(chunk.keys.data(), n));
      TF_RETURN_IF_ERROR(vectors.Append(chunk.values.data(), n * dim));
      TF_RETURN_IF_ERROR(removed_keys.Append(chunk.removed.data(), static_cast<int64_t>(chunk.removed.size())));
    }
    TF_RETURN_IF_ERROR(keys.Finish());
    TF_RETURN_IF_ERROR(vectors.Finish());
    TF_RETURN_IF_ERROR(removed_keys.Finish());
    *rows = keys.rows();
    *removed = removed_keys.rows();
    return absl::OkStatus();
  }

  bool changes_only_ = false;
  std::string chain_;
  int64_t chunk_rows_ = 0;
};

REGISTER_KERNEL_BUILDER(Name("Tfps>TableExportForRetrieval").Device(::tensorflow::DEVICE_CPU),
                        TableExportForRetrievalOp);

}  // namespace
}  // namespace tfps
