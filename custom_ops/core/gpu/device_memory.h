// Host helpers for the GPU table's device memory: one allocation carved into arrays (so a
// table's or a call's buffers are all there or none is), freeing, and copies the host
// waits for. Every failure is a status naming the operation.
#ifndef TFPS_CORE_GPU_DEVICE_MEMORY_H_
#define TFPS_CORE_GPU_DEVICE_MEMORY_H_

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "custom_ops/core/gpu/device_support.h"
#include "custom_ops/core/gpu/status.h"

namespace tfps {
namespace gpu {

// One device allocation carved into 256-byte aligned arrays, queued on a stream.
class DeviceBlock {
 public:
  template <typename T>
  void Add(T** array, uint64_t count) {
    parts_.push_back({reinterpret_cast<void**>(array), count * sizeof(T)});
  }
  Status Allocate(const char* op, const std::string& what, cudaStream_t stream, void** block) {
    size_t total = 0;
    for (const Part& p : parts_) total += Rounded(p.bytes);
    char* base = nullptr;
    TFPS_GPU_RETURN_IF_ERROR(
        CudaStatus(cudaMallocAsync(&base, std::max<size_t>(total, 1), stream), op,
                   "allocating " + std::to_string(total) + " bytes of device memory for " + what +
                       " (the table is unchanged)"));
    char* next = base;
    for (const Part& p : parts_) {
      *p.array = next;
      next += Rounded(p.bytes);
    }
    *block = base;
    return Status::OK();
  }

 private:
  struct Part {
    void** array;
    size_t bytes;
  };
  static size_t Rounded(size_t bytes) { return (bytes + 255) / 256 * 256; }
  std::vector<Part> parts_;
};

inline Status FreeBlock(const char* op, cudaStream_t stream, void** block) {
  const cudaError_t error = *block == nullptr ? cudaSuccess : cudaFreeAsync(*block, stream);
  *block = nullptr;
  return CudaStatus(error, op, "freeing device memory");
}

template <typename T>
Status CopyToHost(const char* op, const char* what, cudaStream_t stream, T* host, const T* device,
                  size_t count) {
  TFPS_RETURN_IF_CUDA_ERROR(
      op, std::string("copying ") + what + " to the host",
      cudaMemcpyAsync(host, device, count * sizeof(T), cudaMemcpyDeviceToHost, stream));
  return CudaStatus(cudaStreamSynchronize(stream), op, std::string("waiting for ") + what);
}

}  // namespace gpu
}  // namespace tfps

#endif  // TFPS_CORE_GPU_DEVICE_MEMORY_H_
