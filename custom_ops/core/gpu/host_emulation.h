// CUDA on CPU threads, so the GPU table's kernels run (and are tested) where no GPU is.
// Included instead of <cuda_runtime.h> when the sources are compiled by a host compiler
// (g++) rather than nvcc. It maps the device built-ins the kernels use (thread and block
// indices, atomics, __threadfence) and the runtime calls the table and its harness make
// (memory, copies, streams, events) onto the host; device memory is ordinary aligned host
// memory.
//
// Execution. A launch runs every CUDA thread of the grid as a call of the kernel body on
// a pool of worker threads (at least 4, so even 2 cores interleave them), which take the
// grid a warp's worth (32 threads) at a time from a shared counter: neighbouring warps run
// truly concurrently, so duplicate keys and concurrent claims race as on a GPU, and the
// emulation's atomics are real atomics (the build also runs under ThreadSanitizer). Threads
// of one block do not run in lock step, so __syncthreads, shared memory and warp intrinsics
// are not provided, and the table's kernels use none. A thread that spun waiting for
// another thread's write could hang here (the other thread may be queued behind it on the
// same worker), as it can on a GPU without independent thread scheduling; the table's
// kernels never wait on each other (every claim publishes a whole entry in one atomic, and
// kernel boundaries order the phases), and a launch that runs past a deadline
// (TFPS_GPU_EMULATION_TIMEOUT_S, default 120 s) stops the process, naming the kernel,
// instead of hanging. Every launch completes before it returns, so streams and events are
// trivially ordered (though an event query may say otherwise; see cudaEventQuery).
//
// Test hooks (namespace tfps::gpu::emulation): a device memory limit, to make allocations
// fail, and injected launch failures, to check that errors come back as statuses.
#ifndef TFPS_CORE_GPU_HOST_EMULATION_H_
#define TFPS_CORE_GPU_HOST_EMULATION_H_

#if defined(__CUDACC__)
#error "host_emulation.h is for host-compiler builds; nvcc builds use the CUDA runtime"
#endif

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline

struct uint3 {
  unsigned x = 0, y = 0, z = 0;
};
struct dim3 {
  unsigned x, y, z;
  dim3(unsigned vx = 1, unsigned vy = 1, unsigned vz = 1) : x(vx), y(vy), z(vz) {}
};
inline thread_local uint3 threadIdx;
inline thread_local uint3 blockIdx;
inline thread_local dim3 blockDim;
inline thread_local dim3 gridDim;

struct alignas(8) float2 {
  float x, y;
};
struct alignas(16) float4 {
  float x, y, z, w;
};
struct alignas(16) uint4 {
  unsigned x, y, z, w;
};

// Device atomics: relaxed, as CUDA's are (they order nothing else; __threadfence does).
inline unsigned atomicAdd(unsigned* p, unsigned v) {
  return __atomic_fetch_add(p, v, __ATOMIC_RELAXED);
}
inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) {
  return __atomic_fetch_add(p, v, __ATOMIC_RELAXED);
}
inline unsigned atomicAnd(unsigned* p, unsigned v) {
  return __atomic_fetch_and(p, v, __ATOMIC_RELAXED);
}
inline unsigned atomicOr(unsigned* p, unsigned v) {
  return __atomic_fetch_or(p, v, __ATOMIC_RELAXED);
}
inline unsigned atomicCAS(unsigned* p, unsigned expected, unsigned desired) {
  __atomic_compare_exchange_n(p, &expected, desired, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
  return expected;  // the old value, whether or not it was replaced
}
template <typename T>  // unsigned or unsigned long long, as CUDA's overloads
inline T atomicMax(T* p, T v) {
  T old = __atomic_load_n(p, __ATOMIC_RELAXED);
  while (old < v &&
         !__atomic_compare_exchange_n(p, &old, v, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
  }
  return old;
}
#if defined(__SANITIZE_THREAD__)
// ThreadSanitizer does not model fences, so under it a fence orders nothing and code that
// relies on one shows up as a race: publish through release/acquire operations instead
// (device_support.h's PublishAnd and LoadAcquire), which it does check.
inline void __threadfence() {}
#else
inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
#endif

// ---- runtime API ----
enum cudaError_t {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorNoDevice = 100,
  cudaErrorNotReady = 600,
  cudaErrorLaunchFailure = 719,
};
enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4,
};
struct EmulatedStream {};
struct EmulatedEvent {
  int queries = 0;
};
using cudaStream_t = EmulatedStream*;
using cudaEvent_t = EmulatedEvent*;
constexpr unsigned cudaEventDisableTiming = 2;

namespace tfps {
namespace gpu {
namespace emulation {

// Runs launches on a pool of worker threads; one launch at a time.
class Executor {
 public:
  static Executor& Get() {
    static Executor* executor = new Executor();  // never destroyed: workers outlive main
    return *executor;
  }

  void Run(const char* name, dim3 grid, dim3 block, const std::function<void()>& body) {
    std::lock_guard<std::mutex> one_launch(launch_mu_);
    std::unique_lock<std::mutex> lock(mu_);
    job_ = Job{grid, block, &body};
    next_warp_.store(0);
    arrived_.store(0);
    busy_ = static_cast<int>(workers_.size());
    ++generation_;
    wake_.notify_all();
    const auto deadline = std::chrono::steady_clock::now() + timeout_;
    if (!done_.wait_until(lock, deadline, [&] { return busy_ == 0; })) {
      std::fprintf(stderr,
                   "emulated kernel %s still running after %lld s: a thread is probably spinning "
                   "on another thread's write, which neither this emulation nor a GPU guarantees "
                   "to make progress\n",
                   name, static_cast<long long>(timeout_.count()));
      std::abort();
    }
  }

 private:
  struct Job {
    dim3 grid, block;
    const std::function<void()>* body = nullptr;
  };
  static constexpr int64_t kWarp = 32;
  static constexpr int64_t kPrime = 2147483647;  // coprime with any smaller warp count

  Executor() {
    const char* threads = std::getenv("TFPS_GPU_EMULATION_THREADS");
    const char* timeout = std::getenv("TFPS_GPU_EMULATION_TIMEOUT_S");
    int count = threads != nullptr ? std::atoi(threads)
                                   : static_cast<int>(std::thread::hardware_concurrency());
    if (count < 4) count = 4;
    timeout_ = std::chrono::seconds(timeout != nullptr ? std::atoll(timeout) : 120);
    for (int i = 0; i < count; ++i) workers_.emplace_back([this] { Work(); });
    for (auto& w : workers_) w.detach();
  }

  void Work() {
    uint64_t seen = 0;
    for (;;) {
      Job job;
      {
        std::unique_lock<std::mutex> lock(mu_);
        wake_.wait(lock, [&] { return generation_ != seen; });
        seen = generation_;
        job = job_;
      }
      // Every worker starts at once, or a small launch would run on whichever woke first.
      arrived_.fetch_add(1);
      while (arrived_.load() < static_cast<int>(workers_.size())) std::this_thread::yield();
      const int64_t block_threads = job.block.x;
      const int64_t total = static_cast<int64_t>(job.grid.x) * block_threads;
      const int64_t warps = (total + kWarp - 1) / kWarp;
      // Warps run in a scrambled order (an affine permutation that changes every launch),
      // and the threads of a warp forwards or backwards: a GPU promises no order among
      // them, so neither does this.
      const int64_t stride = warps == 0 || kPrime % warps == 0 ? 1 : kPrime % warps;
      const int64_t offset =
          warps == 0
              ? 0
              : static_cast<int64_t>((seen * 0x9e3779b97f4a7c15ULL) % static_cast<uint64_t>(warps));
      const bool backwards = (seen & 1) != 0;
      for (int64_t k; (k = next_warp_.fetch_add(1)) < warps;) {
        const int64_t w = (k * stride + offset) % warps;
        const int64_t first = w * kWarp, end = std::min(total, first + kWarp);
        for (int64_t j = 0; j < end - first; ++j) {
          const int64_t t = backwards ? end - 1 - j : first + j;
          blockIdx.x = static_cast<unsigned>(t / block_threads);
          threadIdx.x = static_cast<unsigned>(t % block_threads);
          blockDim = job.block;
          gridDim = job.grid;
          (*job.body)();
        }
      }
      std::lock_guard<std::mutex> lock(mu_);
      if (--busy_ == 0) done_.notify_all();
    }
  }

  std::mutex launch_mu_;
  std::mutex mu_;
  std::condition_variable wake_, done_;
  std::vector<std::thread> workers_;
  Job job_;
  uint64_t generation_ = 0;
  int busy_ = 0;
  std::atomic<int64_t> next_warp_{0};
  std::atomic<int> arrived_{0};
  std::chrono::seconds timeout_{120};
};

// Live allocations and the test hooks, under one lock.
struct DeviceState {
  std::mutex mu;
  std::unordered_map<void*, size_t> allocations;
  size_t bytes_in_use = 0;
  size_t limit = SIZE_MAX;
  int launches_until_failure = -1;  // -1: none planned

  static DeviceState& Get() {
    static DeviceState* state = new DeviceState();
    return *state;
  }
};

// Allocations that would bring the live total past `bytes` fail (SIZE_MAX: no limit).
inline void SetDeviceMemoryLimit(size_t bytes) {
  std::lock_guard<std::mutex> lock(DeviceState::Get().mu);
  DeviceState::Get().limit = bytes;
}
inline size_t DeviceBytesInUse() {
  std::lock_guard<std::mutex> lock(DeviceState::Get().mu);
  return DeviceState::Get().bytes_in_use;
}
// The launch after `launches` more succeed fails with cudaErrorLaunchFailure, without
// running (-1 cancels).
inline void FailLaunchAfter(int launches) {
  std::lock_guard<std::mutex> lock(DeviceState::Get().mu);
  DeviceState::Get().launches_until_failure = launches;
}

inline thread_local cudaError_t last_error = cudaSuccess;

// Whether the next launch goes ahead; false consumes a planned failure.
inline bool LaunchAllowed() {
  DeviceState& state = DeviceState::Get();
  std::lock_guard<std::mutex> lock(state.mu);
  if (state.launches_until_failure < 0) return true;
  return state.launches_until_failure-- != 0;
}

// Runs body once per CUDA thread of grid x block. A planned failure skips it and sets the
// error cudaGetLastError returns.
inline void Launch(const char* name, dim3 grid, dim3 block, const std::function<void()>& body) {
  if (!LaunchAllowed()) {
    last_error = cudaErrorLaunchFailure;
    return;
  }
  Executor::Get().Run(name, grid, block, body);
}

}  // namespace emulation
}  // namespace gpu
}  // namespace tfps

inline const char* cudaGetErrorString(cudaError_t error) {
  switch (error) {
    case cudaSuccess:
      return "no error";
    case cudaErrorInvalidValue:
      return "invalid argument";
    case cudaErrorMemoryAllocation:
      return "out of memory";
    case cudaErrorNoDevice:
      return "no CUDA-capable device is detected";
    case cudaErrorLaunchFailure:
      return "unspecified launch failure";
    case cudaErrorNotReady:
      return "device not ready";
  }
  return "unknown error";
}

inline cudaError_t cudaGetLastError() {
  const cudaError_t error = tfps::gpu::emulation::last_error;
  tfps::gpu::emulation::last_error = cudaSuccess;
  return error;
}

inline cudaError_t cudaGetDeviceCount(int* count) {
  *count = 1;
  return cudaSuccess;
}

inline cudaError_t cudaMalloc(void** ptr, size_t bytes) {
  using tfps::gpu::emulation::DeviceState;
  DeviceState& state = DeviceState::Get();
  std::lock_guard<std::mutex> lock(state.mu);
  *ptr = nullptr;
  if (bytes > state.limit || state.bytes_in_use > state.limit - bytes)
    return cudaErrorMemoryAllocation;
  // 256-byte aligned like cudaMalloc, so vector loads see the alignment they would on a GPU.
  void* block = std::aligned_alloc(256, (std::max<size_t>(bytes, 1) + 255) / 256 * 256);
  if (block == nullptr) return cudaErrorMemoryAllocation;
  state.allocations[block] = bytes;
  state.bytes_in_use += bytes;
  *ptr = block;
  return cudaSuccess;
}
template <typename T>
cudaError_t cudaMalloc(T** ptr, size_t bytes) {
  return cudaMalloc(reinterpret_cast<void**>(ptr), bytes);
}
template <typename T>
cudaError_t cudaMallocAsync(T** ptr, size_t bytes, cudaStream_t) {
  return cudaMalloc(reinterpret_cast<void**>(ptr), bytes);
}

inline cudaError_t cudaFree(void* ptr) {
  if (ptr == nullptr) return cudaSuccess;
  using tfps::gpu::emulation::DeviceState;
  DeviceState& state = DeviceState::Get();
  std::lock_guard<std::mutex> lock(state.mu);
  auto it = state.allocations.find(ptr);
  if (it == state.allocations.end()) return cudaErrorInvalidValue;
  state.bytes_in_use -= it->second;
  state.allocations.erase(it);
  std::free(ptr);
  return cudaSuccess;
}
inline cudaError_t cudaFreeAsync(void* ptr, cudaStream_t) { return cudaFree(ptr); }
template <typename T>
cudaError_t cudaMallocHost(T** ptr, size_t bytes) {  // pinned memory: ordinary memory here
  *ptr = static_cast<T*>(std::malloc(std::max<size_t>(bytes, 1)));
  return *ptr == nullptr ? cudaErrorMemoryAllocation : cudaSuccess;
}
inline cudaError_t cudaFreeHost(void* ptr) {
  std::free(ptr);
  return cudaSuccess;
}

inline cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind) {
  if (bytes > 0) std::memmove(dst, src, bytes);
  return cudaSuccess;
}
inline cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                                   cudaStream_t) {
  return cudaMemcpy(dst, src, bytes, kind);
}
inline cudaError_t cudaMemset(void* dst, int value, size_t bytes) {
  if (bytes > 0) std::memset(dst, value, bytes);
  return cudaSuccess;
}
inline cudaError_t cudaMemsetAsync(void* dst, int value, size_t bytes, cudaStream_t) {
  return cudaMemset(dst, value, bytes);
}

// Streams and events order nothing: every launch and copy completes before it returns.
inline cudaError_t cudaStreamCreate(cudaStream_t* stream) {
  *stream = new EmulatedStream();
  return cudaSuccess;
}
inline cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  delete stream;
  return cudaSuccess;
}
inline cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
inline cudaError_t cudaDeviceSynchronize() { return cudaSuccess; }
inline cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned) {
  *event = new EmulatedEvent();
  return cudaSuccess;
}
inline cudaError_t cudaEventDestroy(cudaEvent_t event) {
  delete event;
  return cudaSuccess;
}
inline cudaError_t cudaEventRecord(cudaEvent_t, cudaStream_t) { return cudaSuccess; }
// The work before an event is always done here, but one query in three says it is not, as
// on a busy GPU, so callers' fallbacks for that case run too.
inline cudaError_t cudaEventQuery(cudaEvent_t event) {
  return ++event->queries % 3 == 0 ? cudaErrorNotReady : cudaSuccess;
}
inline cudaError_t cudaStreamWaitEvent(cudaStream_t, cudaEvent_t, unsigned = 0) {
  return cudaSuccess;
}

#endif  // TFPS_CORE_GPU_HOST_EMULATION_H_
