// A dynamic hash table in GPU memory with the CPU table's semantics: every 64-bit key is
// ordinary (slot occupancy lives in a separate state word), initial values come from
// hashing.h and equal the CPU table's bit for bit, duplicate keys in one batch resolve to
// one row, and the table grows by rehashing. TF-free; pointers passed in are device
// pointers and every call is ordered on the given stream.
#ifndef TFPS_CORE_GPU_GPU_TABLE_H_
#define TFPS_CORE_GPU_GPU_TABLE_H_

#include <cuda_runtime.h>

#include <cstdint>

#include "custom_ops/core/hashing.h"
#include "custom_ops/core/optimizer.h"

namespace tfps {
namespace gpu {

struct GpuTableConfig {
  int dim = 8;
  OptimizerConfig optimizer;      // SGD and Adagrad
  InitializerConfig initializer;
  uint64_t seed = 0;
  float max_load = 0.75f;         // grow past this load factor
};

class GpuTable {
 public:
  GpuTable(const GpuTableConfig& config, int64_t initial_capacity, cudaStream_t stream);
  ~GpuTable();
  GpuTable(const GpuTable&) = delete;
  GpuTable& operator=(const GpuTable&) = delete;

  // values [n, dim]: rows of keys, or initial values of absent keys (exists[i] = 0).
  void Find(const uint64_t* keys, int64_t n, float* values, uint8_t* exists);
  // Inserts absent keys with initial values and fresh slots, then returns every row.
  void FindOrInsert(const uint64_t* keys, int64_t n, float* values);
  // Applies the optimizer to unique keys [n] with gradients [n, dim]; inserts absent keys.
  // Returns false and changes nothing if a gradient is NaN or infinite.
  bool ApplyGradients(const uint64_t* keys, int64_t n, const float* grads, int64_t step);
  int64_t Size();
  int64_t capacity() const { return capacity_; }
  // Copies every row out: keys [Size()], values [Size(), dim], slots [Size(), num_slots * dim].
  int64_t Export(uint64_t* keys, float* values, float* slots);
  // Grows (rehashes) so that `keys` more keys fit under max_load.
  void ReserveFor(int64_t more_keys);

 private:
  void Allocate(int64_t capacity);
  void Free();
  void Resolve(const uint64_t* keys, int64_t n, bool insert);

  GpuTableConfig config_;
  cudaStream_t stream_;
  int row_width_;        // dim * (1 + num_slots)
  int64_t capacity_ = 0; // power of two
  uint64_t* keys_ = nullptr;
  uint32_t* state_ = nullptr;
  float* rows_ = nullptr;
  uint32_t* counts_ = nullptr;
  uint32_t* last_steps_ = nullptr;
  unsigned long long* size_ = nullptr;  // device counter
  int64_t* slots_scratch_ = nullptr;    // resolved slot of each key of the current call
  uint8_t* inserted_scratch_ = nullptr;
  int64_t scratch_capacity_ = 0;
  int* flag_ = nullptr;
  unsigned long long* cursor_ = nullptr;  // output position of Export
};

}  // namespace gpu
}  // namespace tfps

#endif  // TFPS_CORE_GPU_GPU_TABLE_H_
