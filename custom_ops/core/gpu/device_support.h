// What the GPU table's kernels and host code share across their two builds (nvcc, or a
// host compiler against host_emulation.h; see runtime.h): the one function
// every kernel is launched through, so a call site reads the same in both; CUDA errors as
// statuses; and the few device helpers spelled differently on a GPU and on the host
// (acquire loads, bit scans).
#ifndef TFPS_CORE_GPU_DEVICE_SUPPORT_H_
#define TFPS_CORE_GPU_DEVICE_SUPPORT_H_

#include <cstdint>
#include <string>
#include <utility>

#include "custom_ops/core/gpu/runtime.h"
#if !defined(__CUDACC__) && !TFPS_GPU_EMULATED
#error "the GPU table's kernels build with nvcc, or with TFPS_GPU_EMULATION defined"
#endif
#include "custom_ops/core/gpu/status.h"

#define TFPS_DEVICE __device__ __forceinline__

namespace tfps {
namespace gpu {

constexpr int kBlockThreads = 256;

// A CUDA result as a status: "<op>: <what> failed: <CUDA's words>". Running out of memory
// is kResourceExhausted (a caller may free memory and retry), anything else kInternal.
inline Status CudaStatus(cudaError_t error, const char* op, const std::string& what) {
  if (error == cudaSuccess) return Status::OK();
  (void)cudaGetLastError();  // a failed call is also the runtime's last error: not a later launch's
  return Status(
      error == cudaErrorMemoryAllocation ? StatusCode::kResourceExhausted : StatusCode::kInternal,
      std::string(op) + ": " + what + " failed: " + cudaGetErrorString(error));
}

#define TFPS_RETURN_IF_CUDA_ERROR(op, what, expr) \
  TFPS_GPU_RETURN_IF_ERROR(::tfps::gpu::CudaStatus((expr), op, what))

// Launches `kernel` with one CUDA thread per unit of `threads` (blocks of kBlockThreads;
// threads past the end exit at once) on `stream`; nothing when threads is 0. Use it through
// TFPS_LAUNCH, which names the kernel in errors.
template <typename... Params, typename... Args>
Status LaunchKernel(const char* op, const char* name, void (*kernel)(Params...), int64_t threads,
                    cudaStream_t stream, Args&&... args) {
  if (threads <= 0) return Status::OK();
  const int64_t blocks = (threads + kBlockThreads - 1) / kBlockThreads;
  if (blocks > INT32_MAX) {
    return InvalidArgument(std::string(op) + ": " + std::to_string(threads) + " threads for " +
                           name + " exceed a CUDA grid");
  }
#if TFPS_GPU_EMULATED
  (void)stream;
  emulation::Launch(name, dim3(static_cast<unsigned>(blocks)), dim3(kBlockThreads),
                    [&] { kernel(args...); });
#else
  // clang-format off
  kernel<<<static_cast<unsigned>(blocks), kBlockThreads, 0, stream>>>(std::forward<Args>(args)...);
  // clang-format on
#endif
  return CudaStatus(cudaGetLastError(), op, std::string("launching ") + name);
}

#define TFPS_LAUNCH(op, kernel, threads, stream, ...) \
  ::tfps::gpu::LaunchKernel(op, #kernel, kernel, threads, stream, __VA_ARGS__)

// This thread's index in the whole grid.
TFPS_DEVICE int64_t GlobalThread() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}

// A load that later loads of this thread cannot overtake: seeing another thread's
// release (PublishAnd) through it makes that thread's earlier writes visible.
TFPS_DEVICE uint32_t LoadAcquire(const uint32_t* p) {
#if defined(__CUDA_ARCH__)
  uint32_t v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
#elif TFPS_GPU_EMULATED
  return __atomic_load_n(p, __ATOMIC_ACQUIRE);
#else
  return *p;  // nvcc's host pass: device code is never run there
#endif
}

// *word &= mask as a release: this thread's earlier writes are visible to a thread whose
// LoadAcquire sees the result.
TFPS_DEVICE void PublishAnd(uint32_t* word, uint32_t mask) {
#if TFPS_GPU_EMULATED
  __atomic_fetch_and(word, mask, __ATOMIC_RELEASE);
#else
  __threadfence();
  atomicAnd(word, mask);
#endif
}

// Index of the lowest set bit of a non-zero mask.
TFPS_DEVICE int LowestBit(uint32_t mask) {
#if defined(__CUDA_ARCH__)
  return __ffs(static_cast<int>(mask)) - 1;
#else
  return __builtin_ctz(mask);
#endif
}

// v clamped into [0, UINT32_MAX], as the CPU table stores its metadata (ClampToU32).
TFPS_DEVICE uint32_t ClampU32(int64_t v) {
  return v < 0 ? 0u : v > int64_t{0xffffffff} ? 0xffffffffu : static_cast<uint32_t>(v);
}

TFPS_DEVICE uint32_t SaturatingAdd(uint32_t a, uint64_t b) {
  const uint64_t sum = a + b;
  return sum > 0xffffffffull ? 0xffffffffu : static_cast<uint32_t>(sum);
}

}  // namespace gpu
}  // namespace tfps

#endif  // TFPS_CORE_GPU_DEVICE_SUPPORT_H_
