// Reusable per-call scratch arrays. A table call on a million keys needs tens of MB of
// temporaries; fresh allocations would be page-faulted in on every call, so a few are kept,
// shared by every table of the process (a model may hold dozens of tables).
#ifndef TFPS_CORE_SCRATCH_H_
#define TFPS_CORE_SCRATCH_H_

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

namespace tfps {

// The keys of one call grouped by stripe: position in the call, key, hash.
struct GroupedKeys {
  std::unique_ptr<int64_t[]> order;
  std::unique_ptr<uint64_t[]> keys;
  std::unique_ptr<uint64_t[]> hashes;
  int64_t capacity = 0;

  void Reserve(int64_t n) {
    if (n <= capacity) return;
    order.reset(new int64_t[n]);  // uninitialized on purpose: every slot is written
    keys.reset(new uint64_t[n]);
    hashes.reset(new uint64_t[n]);
    capacity = n;
  }
};

class ScratchPool {
 public:
  static constexpr size_t kMaxPooled = 2;
  // A larger scratch (a restore removing a whole saved shard's keys, say) is freed when
  // its call ends: kept, it would hold 24 bytes per key of that call for the process's life.
  static constexpr int64_t kMaxPooledKeys = int64_t{1} << 22;

  std::unique_ptr<GroupedKeys> Acquire(int64_t n) {
    std::unique_ptr<GroupedKeys> scratch;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!pool_.empty()) {
        scratch = std::move(pool_.back());
        pool_.pop_back();
      }
    }
    if (!scratch) scratch = std::make_unique<GroupedKeys>();
    scratch->Reserve(n);
    return scratch;
  }

  void Release(std::unique_ptr<GroupedKeys> scratch) {
    if (scratch->capacity > kMaxPooledKeys) return;
    std::lock_guard<std::mutex> lock(mu_);
    if (pool_.size() < kMaxPooled) pool_.push_back(std::move(scratch));
  }

 private:
  std::mutex mu_;
  std::vector<std::unique_ptr<GroupedKeys>> pool_;
};

// The process's pool. Never destroyed: tables may be destroyed during static teardown.
inline ScratchPool& SharedScratch() {
  static ScratchPool* const pool = new ScratchPool();
  return *pool;
}

}  // namespace tfps

#endif  // TFPS_CORE_SCRATCH_H_
