// How serving exports store rows in a tensor bundle: each key as its TableHash with the top
// bit flipped (ascending as int64, so stock tf.searchsorted finds it), and values as
// float32, or float16 as their int16 bit patterns (bundles cannot read float16 tensors
// written in slices). Shared by whole exports and exports of changes, which serving
// consults together.
#ifndef TFPS_CUSTOM_OPS_TABLE_KERNELS_SERVING_ROWS_H_
#define TFPS_CUSTOM_OPS_TABLE_KERNELS_SERVING_ROWS_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/types.h"

namespace tfps {

// The least magnitude float16 rounds to inf (its largest finite value is 65504).
constexpr float kFloat16Overflow = 65520.0f;

inline int64_t ServingHash(uint64_t table_hash) {
  return static_cast<int64_t>(table_hash ^ (uint64_t{1} << 63));
}

inline ::tensorflow::DataType StoredValueType(::tensorflow::DataType value_dtype) {
  return value_dtype == ::tensorflow::DT_HALF ? ::tensorflow::DT_INT16 : ::tensorflow::DT_FLOAT;
}

// A float16 export refuses, naming the key, a value float16 would serve as inf.
inline absl::Status CheckFloat16Holds(const std::string& op, ::tensorflow::DataType value_dtype,
                                      float max_abs_value, uint64_t max_abs_key, const std::string& table) {
  if (value_dtype != ::tensorflow::DT_HALF || max_abs_value < kFloat16Overflow) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      op, ": float16 cannot hold a value of magnitude ", max_abs_value, " (key ",
      static_cast<int64_t>(max_abs_key), ") (it rounds to inf from ", kFloat16Overflow, "; table '", table, "')"));
}

// Writes n float32 values into `stored` (of StoredValueType) from element `offset` on.
inline void StoreValues(const float* values, int64_t n, int64_t offset, ::tensorflow::Tensor* stored) {
  if (stored->dtype() == ::tensorflow::DT_INT16) {
    auto out = stored->flat<int16_t>();
    for (int64_t i = 0; i < n; ++i) {
      out(offset + i) = static_cast<int16_t>(
          Eigen::numext::bit_cast<uint16_t>(static_cast<Eigen::half>(values[i])));
    }
  } else {
    std::copy(values, values + n, stored->flat<float>().data() + offset);
  }
}

}  // namespace tfps

#endif  // TFPS_CUSTOM_OPS_TABLE_KERNELS_SERVING_ROWS_H_
