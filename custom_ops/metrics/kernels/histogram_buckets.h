// How the histogram AUC metrics (AUC and GroupAUC) bucket a prediction, check an example
// and add it to a histogram of [bucket][positive, negative] weights.
#ifndef TFPS_METRICS_KERNELS_HISTOGRAM_BUCKETS_H_
#define TFPS_METRICS_KERNELS_HISTOGRAM_BUCKETS_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace tfps {

// Buckets follow a prediction's distance d = min(p, 1 - p) to the nearer end, on a
// log-linear scale: each octave of d ([1/4, 1/2), [1/8, 1/4), ...) holds buckets_per_octave
// equal buckets, so a bucket is narrower than d / buckets_per_octave and CTR predictions near
// 0 are ordered as finely (relatively) as any. The float32 bits of d, exponent then
// mantissa, already are such a scale: the bucket is a shift and a subtraction. 1 - p is exact
// for p in [1/2, 1], so the two sides mirror exactly.
struct BucketScale {
  BucketScale() = default;
  BucketScale(int64_t buckets_per_octave, int64_t octaves) {
    const int32_t precision_bits = __builtin_ctzll(static_cast<uint64_t>(buckets_per_octave));
    shift = 23 - precision_bits;
    // d in [2^-(octaves + 1), 2^-octaves) has exponent field 126 - octaves: bucket 0.
    offset = static_cast<int32_t>((126 - octaves) << precision_bits);
    per_side = static_cast<int32_t>(octaves * buckets_per_octave);
  }
  int32_t shift = 0, offset = 0, per_side = 0;
};

// The scale of the metric's attributes buckets_per_octave and octaves, checked: a float32
// mantissa has 23 bits, and d >= 2^-126 is a normal float.
inline absl::Status ScaleFromAttributes(const std::string& metric_name, int64_t buckets_per_octave,
                                        int64_t octaves, BucketScale* scale) {
  if (buckets_per_octave < 1 || buckets_per_octave > (int64_t{1} << 23) ||
      (buckets_per_octave & (buckets_per_octave - 1)) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        metric_name, ": buckets_per_octave must be a power of two in [1, 2^23], got ",
        buckets_per_octave));
  }
  if (octaves < 1 || octaves > 125 || 2 * octaves * buckets_per_octave > (int64_t{1} << 24)) {
    return absl::InvalidArgumentError(absl::StrCat(
        metric_name, ": octaves must be in [1, 125] with 2 * octaves * buckets_per_octave <= "
        "2^24, got ", octaves, " octaves of ", buckets_per_octave));
  }
  *scale = BucketScale(buckets_per_octave, octaves);
  return absl::OkStatus();
}

// Pass one: slots[i] = 2 * bucket + (label == 0), checking every input without a branch so
// that it vectorizes (AVX2 where the CPU has it, chosen at load time). Returns whether every
// input is valid; *hard_labels says whether every label is exactly 0 or 1.
__attribute__((target_clones("avx2", "default")))
inline bool SlotAndCheck(const float* y, const float* p, const float* w, int64_t n, BucketScale scale,
                  int32_t* slots, bool* hard_labels) {
  const int32_t last = 2 * scale.per_side - 1;
  int32_t invalid = 0, soft = 0;
  for (int64_t i = 0; i < n; ++i) {
    // Each comparison with NaN is false, so NaN is invalid.
    invalid |= static_cast<int32_t>(!(p[i] >= 0.0f)) | static_cast<int32_t>(!(p[i] <= 1.0f)) |
               static_cast<int32_t>(!(y[i] >= 0.0f)) | static_cast<int32_t>(!(y[i] <= 1.0f));
    soft |= static_cast<int32_t>(y[i] != 0.0f) & static_cast<int32_t>(y[i] != 1.0f);
    const float distance = std::min(p[i], 1.0f - p[i]);
    int32_t bits;
    std::memcpy(&bits, &distance, sizeof(bits));
    // d below the lowest octave (and -0.0, whose bits are negative) joins bucket 0; d = 1/2
    // joins the last bucket of its side.
    int32_t side = (bits >> scale.shift) - scale.offset;
    side = side > 0 ? side : 0;
    side = side < scale.per_side - 1 ? side : scale.per_side - 1;
    const int32_t bucket = p[i] < 0.5f ? side : last - side;
    slots[i] = 2 * bucket + static_cast<int32_t>(y[i] == 0.0f);
  }
  if (w != nullptr) {
    for (int64_t i = 0; i < n; ++i) {
      invalid |= static_cast<int32_t>(!(w[i] >= 0.0f)) |
                 static_cast<int32_t>(!(w[i] <= std::numeric_limits<float>::max()));
    }
  }
  *hard_labels = soft == 0;
  return invalid == 0;
}

// Which slots a histogram holds: all of them, or (a partitioned histogram) the range
// [first, first + count), its slot i being global slot first + i. AllSlots needs no
// per-example range check.
struct AllSlots {
  int64_t Local(int32_t slot) const { return slot; }
  bool Holds(int64_t) const { return true; }
};
struct SlotRange {
  int64_t first, count;
  int64_t Local(int32_t slot) const { return slot - first; }
  bool Holds(int64_t local) const {
    return static_cast<uint64_t>(local) < static_cast<uint64_t>(count);
  }
};

// Pass two adds each example whose slot the histogram holds. A hard label touches one
// count, a soft label both; a bucket's two counts share a cache line. The buckets a batch
// touches stay in L2 from one update to the next, and out-of-order execution covers that
// latency: a software prefetch per example only added work. Unrolled, fewer loop
// instructions stand between one add and the next, so more adds are in flight
// (benchmarks/metrics.py measures the update).
template <bool kHardLabels, bool kWeighted, typename Slots, typename Count>
void AddToHistogram(const float* y, const float* w, const int32_t* slots, int64_t n,
                    Slots held, Count* counts) {
#pragma GCC unroll 8
  for (int64_t i = 0; i < n; ++i) {
    const int64_t slot = held.Local(slots[i]);
    if (!held.Holds(slot)) continue;
    const Count weight = kWeighted ? static_cast<Count>(w[i]) : Count{1};
    if (kHardLabels) {
      counts[slot] += weight;
    } else {
      const int64_t positive_slot = slot & ~int64_t{1};
      const Count positive = weight * static_cast<Count>(y[i]);
      counts[positive_slot] += positive;
      counts[positive_slot + 1] += weight - positive;
    }
  }
}

template <typename Slots, typename Count>
void AddToHistogram(bool hard_labels, const float* y, const float* w, const int32_t* slots,
                    int64_t n, Slots held, Count* counts) {
  const bool weighted = w != nullptr;
  if (hard_labels && !weighted) {
    AddToHistogram<true, false>(y, w, slots, n, held, counts);
  } else if (hard_labels) {
    AddToHistogram<true, true>(y, w, slots, n, held, counts);
  } else if (!weighted) {
    AddToHistogram<false, false>(y, w, slots, n, held, counts);
  } else {
    AddToHistogram<false, true>(y, w, slots, n, held, counts);
  }
}

// The error naming the first invalid example of a batch SlotAndCheck refused.
inline absl::Status FirstInvalidInput(const std::string& metric_name, const float* y,
                                      const float* p, const float* w, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    // Written so that NaN fails every comparison and is reported.
    if (!(p[i] >= 0.0f && p[i] <= 1.0f)) {
      return absl::InvalidArgumentError(absl::StrCat(
          metric_name, ": predictions must be probabilities in [0, 1] (NaN is rejected); got ",
          p[i], " at index ", i));
    }
    if (!(y[i] >= 0.0f && y[i] <= 1.0f)) {
      return absl::InvalidArgumentError(
          absl::StrCat(metric_name, ": labels must be in [0, 1]; got ", y[i], " at index ", i));
    }
    if (w != nullptr && !(w[i] >= 0.0f && std::isfinite(w[i]))) {
      return absl::InvalidArgumentError(absl::StrCat(
          metric_name, ": sample_weight must be >= 0 and finite; got ", w[i], " at index ", i));
    }
  }
  return absl::OkStatus();
}

}  // namespace tfps

#endif  // TFPS_METRICS_KERNELS_HISTOGRAM_BUCKETS_H_
