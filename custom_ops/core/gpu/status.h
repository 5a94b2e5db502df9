// The outcome of a GPU table call: OK, or a code and a message naming the operation and
// the bad value or the CUDA call that failed. Plain C++ with no TensorFlow, so the table
// builds without it; a TensorFlow kernel maps it onto absl::Status (the codes are a subset
// of absl's, under the same names).
#ifndef TFPS_CORE_GPU_STATUS_H_
#define TFPS_CORE_GPU_STATUS_H_

#include <string>
#include <utility>

namespace tfps {
namespace gpu {

enum class StatusCode : int {
  kOk = 0,
  kInvalidArgument = 3,
  kResourceExhausted = 8,
  kFailedPrecondition = 9,
  kInternal = 13,
};

class Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}
  static Status OK() { return Status(); }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  std::string ToString() const { return ok() ? "OK" : message_; }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status InvalidArgument(std::string message) {
  return Status(StatusCode::kInvalidArgument, std::move(message));
}
inline Status FailedPrecondition(std::string message) {
  return Status(StatusCode::kFailedPrecondition, std::move(message));
}

}  // namespace gpu
}  // namespace tfps

#define TFPS_GPU_RETURN_IF_ERROR(expr)           \
  do {                                           \
    ::tfps::gpu::Status _tfps_status = (expr);   \
    if (!_tfps_status.ok()) return _tfps_status; \
  } while (0)

#endif  // TFPS_CORE_GPU_STATUS_H_
