// Numbers the distinct keys of a batch in order of first occurrence, as tf.unique does,
// for the worker's per-step key work (a lookup's unique keys and counts, a gradient's sum
// per key). An open-addressing set sized once for the batch (power-of-two slots, at most
// half full, linear probing) holds each distinct key's number; one pass, no allocation
// per key. The slots are the calling thread's, kept between batches of up to half
// kKeptSlots keys (16 MiB per thread at most), so a step does not fault in fresh pages for
// them; a larger batch gets fresh slots each time. One KeyDedup per thread at a time.
#ifndef TFPS_CORE_KEY_DEDUP_H_
#define TFPS_CORE_KEY_DEDUP_H_

#include <cstdint>
#include <vector>

#include "custom_ops/core/hashing.h"

namespace tfps {

class KeyDedup {
 public:
  // Room for up to `max_keys` distinct keys.
  explicit KeyDedup(int64_t max_keys) : slots_(ThreadSlots()) {
    int log2_slots = 4;
    while ((int64_t{1} << log2_slots) < 2 * max_keys) ++log2_slots;
    shift_ = 64 - log2_slots;
    mask_ = (uint64_t{1} << log2_slots) - 1;
    slots_.assign(mask_ + 1, Slot{0, -1});
  }

  ~KeyDedup() {
    if (slots_.size() > kKeptSlots) std::vector<Slot>().swap(slots_);
  }

  KeyDedup(const KeyDedup&) = delete;
  KeyDedup& operator=(const KeyDedup&) = delete;

  // The number of `key`: its position among the distinct keys seen so far, a new one
  // taking the next number.
  int64_t Number(uint64_t key) {
    // Salted, as the table's hashes are, so that keys chosen to collide in one do not
    // collide here too.
    for (uint64_t s = Mix64(key ^ 0x9b60933458e17d7dULL) >> shift_;; s = (s + 1) & mask_) {
      Slot& slot = slots_[s];
      if (slot.number < 0) {
        slot.key = key;
        return slot.number = size_++;
      }
      if (slot.key == key) return slot.number;
    }
  }

  int64_t size() const { return size_; }

 private:
  struct Slot {
    uint64_t key;
    int64_t number;  // -1: empty
  };
  static constexpr size_t kKeptSlots = size_t{1} << 20;

  static std::vector<Slot>& ThreadSlots() {
    thread_local std::vector<Slot> slots;
    return slots;
  }

  std::vector<Slot>& slots_;
  int shift_;
  uint64_t mask_;
  int64_t size_ = 0;
};

}  // namespace tfps

#endif  // TFPS_CORE_KEY_DEDUP_H_
