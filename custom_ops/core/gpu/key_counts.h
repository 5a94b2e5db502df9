// What the host knows of how many keys and tombstones the GPU table's index holds, without
// waiting for the device: an upper bound that each writing call raises by its batch size,
// reset whenever an exact count reaches the host. Each writing call queues a copy of the
// device's counters into pinned memory; a later call reads it if it has arrived (an event
// query, no wait). Only when the bound would pass the load limit does the table wait for
// the counts (ReadKeyCounts: a sync).
#ifndef TFPS_CORE_GPU_KEY_COUNTS_H_
#define TFPS_CORE_GPU_KEY_COUNTS_H_

#include <cstdint>

#include "custom_ops/core/gpu/device_memory.h"
#include "custom_ops/core/gpu/device_support.h"
#include "custom_ops/core/gpu/hash_index.h"

namespace tfps {
namespace gpu {

constexpr int kCounterWords = 2 * kCounterLanes;  // size lanes, then tombstone lanes

// Lanes wrap around below zero (a lane's removals may outnumber its inserts); sums do not.
inline void SumLanes(const unsigned long long* lanes, int64_t* size, int64_t* tombstones) {
  uint64_t sums[2] = {0, 0};
  for (int i = 0; i < kCounterWords; ++i) sums[i / kCounterLanes] += lanes[i];
  *size = static_cast<int64_t>(sums[0]);
  *tombstones = static_cast<int64_t>(sums[1]);
}

// The exact counts, waiting for the device.
inline Status ReadKeyCounts(const char* op, cudaStream_t stream, const unsigned long long* counters,
                            int64_t* size, int64_t* tombstones) {
  unsigned long long lanes[kCounterWords];
  TFPS_GPU_RETURN_IF_ERROR(
      CopyToHost(op, "the key counts", stream, lanes, counters, kCounterWords));
  SumLanes(lanes, size, tombstones);
  return Status::OK();
}

class KeyCountBound {
 public:
  KeyCountBound() = default;
  KeyCountBound(const KeyCountBound&) = delete;
  KeyCountBound& operator=(const KeyCountBound&) = delete;
  ~KeyCountBound() {
    cudaFreeHost(host_lanes_);
    if (arrived_ != nullptr) cudaEventDestroy(arrived_);
  }

  Status Init(const char* op) {
    TFPS_RETURN_IF_CUDA_ERROR(op, "creating an event",
                              cudaEventCreateWithFlags(&arrived_, cudaEventDisableTiming));
    return CudaStatus(cudaMallocHost(&host_lanes_, kCounterWords * sizeof(unsigned long long)), op,
                      "allocating pinned host memory");
  }

  // Queues a copy of `counters` (the counts after everything queued so far).
  Status Snapshot(const char* op, cudaStream_t stream, const unsigned long long* counters) {
    TFPS_RETURN_IF_CUDA_ERROR(
        op, "copying the key counts to the host",
        cudaMemcpyAsync(host_lanes_, counters, kCounterWords * sizeof(unsigned long long),
                        cudaMemcpyDeviceToHost, stream));
    TFPS_RETURN_IF_CUDA_ERROR(op, "recording the key counts' copy",
                              cudaEventRecord(arrived_, stream));
    pending_ = true;
    return Status::OK();
  }

  // If the last snapshot has arrived, sets *size and *tombstones to it (exact: the table
  // changes only in calls, and each call that changes it queues a snapshot) and the bound
  // to their sum; otherwise leaves them.
  Status Poll(const char* op, int64_t* size, int64_t* tombstones) {
    if (!pending_) return Status::OK();
    const cudaError_t arrived = cudaEventQuery(arrived_);
    if (arrived == cudaErrorNotReady) {
      (void)cudaGetLastError();  // not an error: the copy is still queued
      return Status::OK();
    }
    TFPS_GPU_RETURN_IF_ERROR(CudaStatus(arrived, op, "checking the key counts' copy"));
    pending_ = false;
    SumLanes(host_lanes_, size, tombstones);
    bound_ = *size + *tombstones;
    return Status::OK();
  }

  // Raises the bound by new_keys if it stays within limit; false (unchanged) otherwise.
  bool Admit(int64_t new_keys, double limit) {
    if (bound_ + new_keys > limit) return false;
    bound_ += new_keys;
    return true;
  }
  // The exact count is known to be at most `keys`, the counters are new (a rebuilt or
  // cleared index), or both.
  void Reset(int64_t keys) {
    bound_ = keys;
    pending_ = false;
  }

 private:
  unsigned long long* host_lanes_ = nullptr;  // pinned
  cudaEvent_t arrived_ = nullptr;             // recorded after the last snapshot's copy
  bool pending_ = false;                      // a snapshot is queued and not yet read
  int64_t bound_ = 0;                         // upper bound of keys + tombstones
};

}  // namespace gpu
}  // namespace tfps

#endif  // TFPS_CORE_GPU_KEY_COUNTS_H_
