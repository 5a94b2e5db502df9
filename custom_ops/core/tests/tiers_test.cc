// A tiered table against the same table all in memory: after the same calls, every row,
// slot and metadata column is equal bit for bit, whatever the memory budget, access
// pattern, optimizer and eviction policy, and rows removed leave the disk too.
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <unistd.h>

#include "custom_ops/core/tests/test_util.h"

namespace tfps {
namespace {

std::string TierDirectory(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  return std::string(tmp != nullptr ? tmp : "/tmp") + "/tfps_tiers_test_" + std::to_string(getpid()) + "_" + name;
}

// Every row's key, value, slots and metadata, by key.
std::map<int64_t, std::vector<float>> Rows(const Table& table) {
  std::map<int64_t, std::vector<float>> rows;
  ExportChunk chunk = table.Export(0, 1 << 30);
  const size_t dim = table.dim(), slot_width = dim * table.num_slots();
  for (size_t i = 0; i < chunk.keys.size(); ++i) {
    std::vector<float>& row = rows[chunk.keys[i]];
    row.assign(chunk.values.begin() + i * dim, chunk.values.begin() + (i + 1) * dim);
    row.insert(row.end(), chunk.slots.begin() + i * slot_width, chunk.slots.begin() + (i + 1) * slot_width);
    for (int m = 0; m < kNumMetadata; ++m) {
      float bits;
      const int32_t low = static_cast<int32_t>(chunk.metadata[i * kNumMetadata + m]);
      std::memcpy(&bits, &low, sizeof(bits));
      row.push_back(bits);
    }
  }
  return rows;
}

bool BitEqual(const std::map<int64_t, std::vector<float>>& a, const std::map<int64_t, std::vector<float>>& b) {
  if (a.size() != b.size()) return false;
  for (auto i = a.begin(), j = b.begin(); i != a.end(); ++i, ++j) {
    if (i->first != j->first || i->second.size() != j->second.size() ||
        std::memcmp(i->second.data(), j->second.data(), i->second.size() * sizeof(float)) != 0) {
      return false;
    }
  }
  return true;
}

// The eviction tests' streams: keys for step `step` of `pattern`.
std::vector<uint64_t> Batch(const std::string& pattern, int step, int batch, std::mt19937_64* random) {
  std::vector<uint64_t> keys(batch);
  for (int i = 0; i < batch; ++i) {
    const uint64_t r = (*random)();
    if (pattern == "all_new") {
      keys[i] = uint64_t(step) * batch + i + (uint64_t{1} << 40);
    } else if (pattern == "mostly_new") {
      keys[i] = r % 10 == 0 ? r % 200 : uint64_t(step) * batch + i + (uint64_t{1} << 40);
    } else if (pattern == "drifting") {
      keys[i] = uint64_t(step) * 20 + r % 600;  // a window of IDs that moves on
    } else {  // all_hot
      keys[i] = r % 300;
    }
  }
  return keys;
}

void RunPair(OptimizerKind optimizer, EvictionKind eviction, const std::string& pattern, double budget_share,
             const ParallelFor& parallel_for) {
  TableConfig plain_config = Config(4, optimizer, InitializerKind::kUniform);
  plain_config.eviction.kind = eviction;
  if (eviction == EvictionKind::kTtl) plain_config.eviction.ttl_steps = 6;
  if (eviction == EvictionKind::kLfu) plain_config.eviction.max_rows = 700;
  if (eviction == EvictionKind::kDecayedFrequency) {
    plain_config.eviction.decay = 0.8f;
    plain_config.eviction.threshold = 0.2f;
  }
  const int steps = 30, batch = 64;
  TableConfig tiered_config = plain_config;
  tiered_config.tier.memory_rows = std::max<int64_t>(1, static_cast<int64_t>(budget_share * steps * batch));
  tiered_config.tier.directory = TierDirectory(pattern);
  Table plain(plain_config), tiered(tiered_config);
  std::mt19937_64 random(7);
  std::vector<float> plain_values, tiered_values, grads;
  for (int step = 0; step < steps; ++step) {
    const std::vector<uint64_t> keys = Batch(pattern, step, batch, &random);
    const int64_t n = static_cast<int64_t>(keys.size());
    plain_values.assign(n * 4, 0.0f);
    tiered_values.assign(n * 4, 0.0f);
    plain.FindOrInsert(keys.data(), n, plain_values.data(), parallel_for);
    tiered.FindOrInsert(keys.data(), n, tiered_values.data(), parallel_for);
    CHECK_TRUE(std::memcmp(plain_values.data(), tiered_values.data(), n * 4 * sizeof(float)) == 0);
    grads.resize(n * 4);
    for (float& g : grads) g = static_cast<float>(random() % 2001) / 1000.0f - 1.0f;
    CHECK_TRUE(plain.ApplyGradients(keys.data(), n, grads.data(), -1, parallel_for));
    CHECK_TRUE(tiered.ApplyGradients(keys.data(), n, grads.data(), -1, parallel_for));
    if (step % 10 == 9) {
      CHECK_TRUE(plain.Evict(parallel_for) == tiered.Evict(parallel_for));
      const uint64_t gone[2] = {keys[0], keys[1]};
      CHECK_TRUE(plain.Remove(gone, 2, parallel_for) == tiered.Remove(gone, 2, parallel_for));
    }
    const TableStats stats = tiered.Stats();
    CHECK_TRUE(stats.rows_in_memory <= tiered_config.tier.memory_rows);
  }
  CHECK_TRUE(BitEqual(Rows(plain), Rows(tiered)));
  // Find reads rows from either tier.
  std::vector<uint64_t> every;
  for (const auto& [key, row] : Rows(plain)) every.push_back(static_cast<uint64_t>(key));
  std::vector<float> a(every.size() * 4), b(every.size() * 4);
  plain.Find(every.data(), every.size(), a.data(), nullptr, parallel_for);
  tiered.Find(every.data(), every.size(), b.data(), nullptr, parallel_for);
  CHECK_TRUE(a == b);
  const TableStats stats = tiered.Stats();
  CHECK_TRUE(stats.rows == plain.Stats().rows);
  if (budget_share < 0.5) {
    CHECK_TRUE(stats.payloads_demoted > 0);
    CHECK_TRUE(stats.rows_in_memory < stats.rows);
  }
  // A row's disk record goes with it: the disk holds at most the rows whose payloads are
  // only there or are there and in memory unchanged.
  CHECK_TRUE(tiered.DiskRows() <= stats.rows);
  const int64_t before = tiered.DiskRows();
  std::vector<uint64_t> removed(every.begin(), every.begin() + every.size() / 2);
  tiered.Remove(removed.data(), removed.size(), parallel_for);
  CHECK_TRUE(tiered.DiskRows() <= tiered.Stats().rows);
  CHECK_TRUE(before == 0 || tiered.DiskRows() < before || removed.empty());
  tiered.Clear();
  CHECK_TRUE(tiered.DiskRows() == 0);
}

void TestTieredRowsEqualRowsInMemory() {
  const OptimizerKind optimizers[] = {OptimizerKind::kSgd, OptimizerKind::kAdagrad, OptimizerKind::kAdam,
                                      OptimizerKind::kFtrl};
  const EvictionKind evictions[] = {EvictionKind::kNone, EvictionKind::kLfu, EvictionKind::kTtl,
                                    EvictionKind::kDecayedFrequency};
  const char* patterns[] = {"all_new", "mostly_new", "drifting", "all_hot"};
  int case_number = 0;
  for (OptimizerKind optimizer : optimizers) {
    for (const char* pattern : patterns) {
      for (double share : {0.01, 0.1, 0.5}) {
        const int failed_before = failures;
        // Each eviction policy in turn, and threads in every other case.
        const EvictionKind eviction = evictions[case_number % 4];
        RunPair(optimizer, eviction, pattern, share, case_number % 2 ? kThreads : kSerial);
        if (failures != failed_before) {
          std::fprintf(stderr, "  in case optimizer %d, pattern %s, budget %.2f, eviction %d\n",
                       static_cast<int>(optimizer), pattern, share, static_cast<int>(eviction));
        }
        ++case_number;
      }
    }
  }
}

void TestTheDiskTierIsWipedAndLocked() {
  TableConfig config = Config(4, OptimizerKind::kAdagrad, InitializerKind::kZeros);
  config.tier.memory_rows = 16;
  config.tier.directory = TierDirectory("locked");
  std::vector<uint64_t> keys(500);
  for (size_t i = 0; i < keys.size(); ++i) keys[i] = i;
  std::vector<float> values(keys.size() * 4);
  {
    Table table(config);
    table.FindOrInsert(keys.data(), keys.size(), values.data(), kSerial);
    CHECK_TRUE(table.DiskRows() > 0);
    bool refused = false;
    try {
      Table second(config);  // a second live table in the same directory
    } catch (const DiskStoreError& e) {
      refused = std::string(e.what()).find(config.tier.directory) != std::string::npos;
    }
    CHECK_TRUE(refused);
  }
  // What an earlier table left (a killed task's files) is never read.
  Table fresh(config);
  CHECK_TRUE(fresh.DiskRows() == 0);
  CHECK_TRUE(fresh.Size() == 0);
  std::filesystem::remove_all(config.tier.directory);
}

}  // namespace
}  // namespace tfps

int main() {
  tfps::TestTieredRowsEqualRowsInMemory();
  tfps::TestTheDiskTierIsWipedAndLocked();
  for (const char* name : {"all_new", "mostly_new", "drifting", "all_hot"}) {
    std::filesystem::remove_all(tfps::TierDirectory(name));
  }
  return tfps::Report("tiers_test");
}
