// Plain C++ tests of the TF-free table core. Exit status 0 means every check passed.
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <random>
#include <thread>
#include <vector>

#include "custom_ops/core/block_cache.h"
#include "custom_ops/core/crc32c.h"
#include "custom_ops/core/memory.h"
#include "custom_ops/core/scratch.h"
#include "custom_ops/core/stripe.h"
#include "custom_ops/core/table.h"
#include "custom_ops/core/tests/test_util.h"

namespace tfps {
namespace {

std::vector<uint64_t> EdgeKeys() {
  return {0, 1, ~uint64_t{0}, uint64_t{1} << 63, (uint64_t{1} << 63) - 1, 0x80, 0xFE};
}

void TestEdgeKeysAreOrdinary() {
  Table t(Config(4, OptimizerKind::kSgd, InitializerKind::kUniform));
  const auto keys = EdgeKeys();
  const int64_t n = keys.size();
  std::vector<float> before(n * 4), after(n * 4);
  std::vector<uint8_t> exists(n, 1);
  t.Find(keys.data(), n, before.data(), exists.data(), kSerial);
  for (int64_t i = 0; i < n; ++i) CHECK_TRUE(exists[i] == 0);
  CHECK_TRUE(t.Size() == 0);
  t.FindOrInsert(keys.data(), n, after.data(), kSerial);
  CHECK_TRUE(t.Size() == n);
  CHECK_TRUE(before == after);  // a missing key's find equals its initial value
  std::vector<float> grads(n * 4);
  for (int64_t i = 0; i < n * 4; ++i) grads[i] = static_cast<float>(i);
  CHECK_TRUE(t.ApplyGradients(keys.data(), n, grads.data(), 7, kSerial));
  t.Find(keys.data(), n, after.data(), exists.data(), kSerial);
  for (int64_t i = 0; i < n * 4; ++i) CHECK_TRUE(after[i] == before[i] - 0.5f * grads[i]);
  for (int64_t i = 0; i < n; ++i) CHECK_TRUE(exists[i] == 1);
  CHECK_TRUE(t.Remove(keys.data(), 3, kSerial) == 3);
  CHECK_TRUE(t.Size() == n - 3);
  t.Find(keys.data(), n, after.data(), exists.data(), kSerial);
  for (int64_t i = 0; i < n; ++i) CHECK_TRUE(exists[i] == (i >= 3));
}

void TestInitialValuesAreDeterministic() {
  for (InitializerKind kind : {InitializerKind::kZeros, InitializerKind::kUniform,
                               InitializerKind::kTruncatedNormal}) {
    Table a(Config(16, OptimizerKind::kSgd, kind, 2));
    Table b(Config(16, OptimizerKind::kSgd, kind, 6));  // another stripe layout
    std::vector<uint64_t> keys(5000);
    std::mt19937_64 rng(1);
    for (auto& k : keys) k = rng();
    std::vector<float> va(keys.size() * 16), vb(keys.size() * 16);
    a.FindOrInsert(keys.data(), keys.size(), va.data(), kThreads);
    b.Find(keys.data(), keys.size(), vb.data(), nullptr, kSerial);
    CHECK_TRUE(va == vb);
    double sum = 0, sq = 0;
    bool in_range = true;
    for (float v : va) {
      sum += v;
      sq += double(v) * v;
      if (kind == InitializerKind::kZeros) in_range &= v == 0.0f;
      if (kind == InitializerKind::kUniform) in_range &= v >= -1.0f && v < 1.0f;
      if (kind == InitializerKind::kTruncatedNormal) in_range &= std::fabs(v) <= 1.0f;
    }
    CHECK_TRUE(in_range);
    const double mean = sum / va.size(), var = sq / va.size() - mean * mean;
    CHECK_TRUE(std::fabs(mean) < 0.02);
    if (kind == InitializerKind::kUniform) CHECK_TRUE(std::fabs(var - 1.0 / 3.0) < 0.01);
    // Truncated at 2 sigma, the variance of a unit normal is 0.7737.
    if (kind == InitializerKind::kTruncatedNormal) CHECK_TRUE(std::fabs(var - 0.25 * 0.7737) < 0.005);
  }
  TableConfig other_seed = Config(8, OptimizerKind::kSgd, InitializerKind::kUniform);
  other_seed.seed = 43;
  Table a(Config(8, OptimizerKind::kSgd, InitializerKind::kUniform)), b(other_seed);
  const uint64_t key = 12345;
  std::vector<float> va(8), vb(8);
  a.Find(&key, 1, va.data(), nullptr, kSerial);
  b.Find(&key, 1, vb.data(), nullptr, kSerial);
  CHECK_TRUE(va != vb);
}

void TestGrowthRemoveAndReinsert() {
  Table t(Config(3, OptimizerKind::kAdagrad, InitializerKind::kUniform, 3));
  const int64_t n = 300000;
  std::vector<uint64_t> keys(n);
  for (int64_t i = 0; i < n; ++i) keys[i] = static_cast<uint64_t>(i) * 7919;  // clustered IDs
  std::vector<float> inserted(n * 3), found(n * 3);
  for (int64_t b = 0; b < n; b += 10000) {
    t.FindOrInsert(keys.data() + b, 10000, inserted.data() + b * 3, kThreads);
  }
  CHECK_TRUE(t.Size() == n);
  std::vector<uint8_t> exists(n);
  t.Find(keys.data(), n, found.data(), exists.data(), kThreads);
  CHECK_TRUE(found == inserted);
  int64_t present = 0;
  for (auto e : exists) present += e;
  CHECK_TRUE(present == n);
  CHECK_TRUE(t.Remove(keys.data(), n / 2, kThreads) == n / 2);
  CHECK_TRUE(t.Remove(keys.data(), n / 2, kThreads) == 0);
  CHECK_TRUE(t.Size() == n - n / 2);
  t.Find(keys.data(), n, found.data(), exists.data(), kSerial);
  present = 0;
  for (int64_t i = 0; i < n; ++i) present += exists[i] == (i >= n / 2);
  CHECK_TRUE(present == n);
  // Removed rows are recycled: reinsertion must not grow the arena (an index crowded
  // with tombstones may grow).
  const int64_t row_bytes = t.RowMemoryBytes();
  t.FindOrInsert(keys.data(), n / 2, found.data(), kSerial);
  CHECK_TRUE(t.RowMemoryBytes() == row_bytes);
  CHECK_TRUE(t.Size() == n);
  t.Clear();
  CHECK_TRUE(t.Size() == 0);
  t.Find(keys.data(), n, found.data(), exists.data(), kSerial);
  CHECK_TRUE(exists[0] == 0 && exists[n - 1] == 0);
}

// Rows that hover about the end of a row block, as a table under eviction holds about as
// many rows as it evicts: the table's memory is the rows' (plus a small piece backed
// ahead), not the next block's, which is twice all before it, and it stays level.
void TestMemoryFollowsRowsThatHoverAtABlockEnd() {
  Table t(Config(8, OptimizerKind::kAdagrad, InitializerKind::kUniform, /*log2_stripes=*/0));
  const int64_t block_end = 2032, churn = 40;  // 16 + 32 + ... + 1024 rows in the first 7 blocks
  uint64_t next = 1;
  std::vector<uint64_t> live;
  std::vector<float> out(churn * 8);
  auto insert = [&](int64_t n) {
    std::vector<uint64_t> keys;
    for (int64_t i = 0; i < n; ++i) keys.push_back(next++ * 0x9e3779b97f4a7c15ULL);
    for (int64_t i = 0; i < n; i += churn) {
      const int64_t m = std::min(churn, n - i);
      t.FindOrInsert(keys.data() + i, m, out.data(), kSerial);
    }
    live.insert(live.end(), keys.begin(), keys.end());
  };
  insert(block_end - churn / 2);
  const int64_t row_bytes = t.RowMemoryBytes() / t.Size();  // about: backed rows over rows
  int64_t after_warm_up = 0;
  for (int round = 0; round < 200; ++round) {
    insert(churn);  // past the block's end, then back under it
    CHECK_TRUE(t.Remove(live.data(), churn, kSerial) == churn);
    live.erase(live.begin(), live.begin() + churn);
    if (round == 10) after_warm_up = t.MemoryBytes();
  }
  CHECK_TRUE(t.Size() == block_end - churn / 2);
  CHECK_TRUE(t.MappedRowBytes() >= 2 * block_end * row_bytes);  // the next block, handed out
  CHECK_TRUE(t.RowMemoryBytes() <= (block_end + churn) * row_bytes * 33 / 32 + 4096);
  CHECK_TRUE(t.MemoryBytes() == after_warm_up);
}

void TestNonFiniteGradientRejectsWholeApply() {
  Table t(Config(2, OptimizerKind::kAdagrad, InitializerKind::kUniform));
  std::vector<uint64_t> keys = {5, 6, 7};
  std::vector<float> before(6), after(6);
  t.FindOrInsert(keys.data(), 3, before.data(), kSerial);
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    std::vector<float> grads = {1, 1, 1, 1, 1, bad};
    CHECK_TRUE(!t.ApplyGradients(keys.data(), 3, grads.data(), 1, kThreads));
  }
  t.Find(keys.data(), 3, after.data(), nullptr, kSerial);
  CHECK_TRUE(before == after);
  int64_t meta[kNumMetadata];
  std::vector<float> v, s;
  CHECK_TRUE(t.DebugRow(5, &v, &s, meta));
  CHECK_TRUE(meta[kCount] == 1 && s[0] == 0.1f);  // the lookup counted; the refused applies nothing
}

// A clear that keeps its memory (a restore's) refills into the same mapped bytes, and the
// new rows read back exactly: recycled memory holds old rows, which must never show.
void TestClearKeepingMemoryReusesItForNewRows() {
  const TableConfig config = Config(4, OptimizerKind::kAdagrad, InitializerKind::kUniform);
  Table t(config), fresh(config);
  const int64_t n = 20000;
  std::vector<uint64_t> keys(n), others(n);
  for (int64_t i = 0; i < n; ++i) {
    keys[i] = i * 0x9e3779b97f4a7c15ULL;
    others[i] = i * 0x9e3779b97f4a7c15ULL + 1;
  }
  std::vector<float> out(n * 4), grads(n * 4, 0.5f);
  t.FindOrInsert(keys.data(), n, out.data(), kThreads);
  CHECK_TRUE(t.ApplyGradients(keys.data(), n, grads.data(), 3, kThreads));
  const int64_t mapped = t.MappedRowBytes(), held = t.RowMemoryBytes();
  t.Clear(/*keep_memory=*/true);
  CHECK_TRUE(t.Size() == 0 && t.MappedRowBytes() == mapped && t.RowMemoryBytes() == held);
  t.FindOrInsert(others.data(), n, out.data(), kThreads);
  fresh.SetApplyCalls(t.ApplyCalls());  // lookups record the clock as last seen
  fresh.FindOrInsert(others.data(), n, out.data(), kThreads);
  CHECK_TRUE(t.MappedRowBytes() == mapped && t.Size() == n);
  // The refill backs about what the old rows did: a stripe's count differs by a few rows.
  CHECK_TRUE(t.RowMemoryBytes() >= held && t.RowMemoryBytes() < held + held / 20);
  for (int64_t i = 0; i < n; i += 101) {
    std::vector<float> v1, s1, v2, s2;
    int64_t m1[kNumMetadata], m2[kNumMetadata];
    CHECK_TRUE(t.DebugRow(others[i], &v1, &s1, m1) && fresh.DebugRow(others[i], &v2, &s2, m2));
    CHECK_TRUE(v1 == v2 && s1 == s2 && std::memcmp(m1, m2, sizeof(m1)) == 0);
    CHECK_TRUE(!t.DebugRow(keys[i], &v1, &s1, m1));
  }
  t.Clear();
  CHECK_TRUE(t.RowMemoryBytes() == 0 && t.MappedRowBytes() == 0);
}

// A recycled region hands out memory it handed out before as recycled (its pages need no
// populating), and what lies past its old high-water mark, or in a fresh region, as not.
void TestRecycledRegionsSayWhichBlocksWereHandedOutBefore() {
  RegionAllocator memory(false);
  bool recycled = true;
  memory.Allocate(1 << 20, &recycled);
  CHECK_TRUE(!recycled);
  memory.Allocate(1 << 20, &recycled);
  CHECK_TRUE(!recycled);
  memory.RecycleAll();
  memory.Allocate(1 << 20, &recycled);
  CHECK_TRUE(recycled);
  memory.Allocate(1 << 20, &recycled);
  CHECK_TRUE(recycled);
  memory.Allocate(64, &recycled);  // past what the region held before
  CHECK_TRUE(!recycled);
  memory.ReleaseAll();
  memory.Allocate(64, &recycled);
  CHECK_TRUE(!recycled);
}

// The saves a table's rows equal: a save or restore joins them while no row changes, and
// an insert, an update, a removal or a clear ends them.
void TestStateFollowsRowChanges() {
  Table t(Config(2, OptimizerKind::kSgd, InitializerKind::kZeros));
  std::vector<uint64_t> keys = {5, 6, 7};
  std::vector<float> out(3 * 2), grads(3 * 2, 1.0f);
  CHECK_TRUE(!t.EqualsState(11));
  t.FindOrInsert(keys.data(), 3, out.data(), kSerial);
  t.RecordState(11, t.BeginSave());
  t.RecordState(12, t.BeginSave());  // nothing changed: the rows equal both saves
  CHECK_TRUE(t.EqualsState(11) && t.EqualsState(12) && !t.EqualsState(13));
  t.Find(keys.data(), 3, out.data(), nullptr, kSerial);  // a lookup that is not training changes nothing
  CHECK_TRUE(t.EqualsState(11));
  CHECK_TRUE(t.ApplyGradients(keys.data(), 1, grads.data(), 1, kSerial));
  CHECK_TRUE(!t.EqualsState(11) && !t.EqualsState(12));
  const int64_t stamp = t.BeginSave();
  CHECK_TRUE(t.ApplyGradients(keys.data(), 1, grads.data(), 1, kSerial));  // during the save
  t.RecordState(13, stamp);  // the rows changed after the save read them
  CHECK_TRUE(!t.EqualsState(13));
  t.RecordState(14, t.BeginSave());
  CHECK_TRUE(t.EqualsState(14) && !t.EqualsState(13));
  t.Remove(keys.data() + 2, 1, kSerial);
  CHECK_TRUE(!t.EqualsState(14));
  t.RecordState(15, t.BeginSave());
  uint64_t new_key = 8;
  t.FindOrInsert(&new_key, 1, out.data(), kSerial);
  CHECK_TRUE(!t.EqualsState(15));
  t.RecordState(16, t.BeginSave());
  t.Clear();
  CHECK_TRUE(!t.EqualsState(16));
  // A follower restores 20, then exports 9 times: the restore it equals first stays, with
  // the newest saves.
  for (uint64_t id = 20; id < 30; ++id) t.RecordState(id, t.BeginSave());
  CHECK_TRUE(t.EqualsState(20) && !t.EqualsState(21) && !t.EqualsState(22) && t.EqualsState(23) &&
             t.EqualsState(29));
  // A save that began before a clear committed after it: the empty table equals none.
  t.FindOrInsert(keys.data(), 3, out.data(), kSerial);
  int64_t before_clear = t.BeginSave();
  t.Clear();
  t.RecordState(31, before_clear);
  CHECK_TRUE(!t.EqualsState(31));
  // Two saves committed out of order with a change between them: the rows equal the later.
  t.FindOrInsert(keys.data(), 3, out.data(), kSerial);
  const int64_t older = t.BeginSave();
  CHECK_TRUE(t.ApplyGradients(keys.data(), 1, grads.data(), 1, kSerial));
  const int64_t newer = t.BeginSave();
  t.RecordState(33, newer);
  t.RecordState(32, older);
  CHECK_TRUE(t.EqualsState(33) && !t.EqualsState(32));
}

// A lookup counts each key's occurrences (given, or one per entry, repeats included),
// saturating; an apply does not count.
void TestFindOrInsertCountsOccurrences() {
  Table t(Config(2, OptimizerKind::kSgd, InitializerKind::kZeros));
  std::vector<uint64_t> keys = {5, 6, 7};
  std::vector<int64_t> occurrences = {3, 0, int64_t{1} << 40};
  std::vector<float> out(3 * 2), grads(3 * 2, 1.0f);
  t.FindOrInsert(keys.data(), 3, out.data(), kSerial, occurrences.data());
  std::vector<uint64_t> repeated = {5, 5, 6};
  t.FindOrInsert(repeated.data(), 3, out.data(), kThreads);
  CHECK_TRUE(t.ApplyGradients(keys.data(), 3, grads.data(), 1, kSerial));
  const int64_t expected[] = {5, 1, UINT32_MAX};
  for (int i = 0; i < 3; ++i) {
    std::vector<float> v, s;
    int64_t meta[kNumMetadata];
    CHECK_TRUE(t.DebugRow(keys[i], &v, &s, meta) && meta[kCount] == expected[i]);
  }
}

// The finiteness check reads gradients in wide pieces and in parallel chunks of 64K floats:
// a bad value is caught wherever it lies, and the extreme finite floats pass.
void TestFiniteCheckCoversEveryPosition() {
  const int dim = 3;
  const int64_t n = (int64_t{1} << 16) / dim + 7;  // floats span two chunks and a ragged tail
  Table t(Config(dim, OptimizerKind::kSgd, InitializerKind::kZeros));
  std::vector<uint64_t> keys(n);
  for (int64_t i = 0; i < n; ++i) keys[i] = static_cast<uint64_t>(i) * 0x9E3779B97F4A7C15ull;
  std::vector<float> grads(n * dim, std::numeric_limits<float>::denorm_min());
  grads[1] = std::numeric_limits<float>::max();
  grads[2] = -std::numeric_limits<float>::max();
  const float bad[] = {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                       -std::numeric_limits<float>::infinity()};
  const int64_t total = n * dim;
  int trial = 0;
  for (int64_t pos : {int64_t{0}, int64_t{7}, int64_t{8}, (int64_t{1} << 16) - 1, int64_t{1} << 16,
                      total - 9, total - 1}) {
    const float kept = grads[pos];
    grads[pos] = bad[trial++ % 3];
    CHECK_TRUE(!t.ApplyGradients(keys.data(), n, grads.data(), 1, kThreads));
    grads[pos] = kept;
  }
  CHECK_TRUE(t.Size() == 0);
  CHECK_TRUE(t.ApplyGradients(keys.data(), n, grads.data(), 1, kThreads));
  CHECK_TRUE(t.Size() == n);
}

// Stripes grow their index through staggered sizes, so stripes filled at the same pace do
// not all rebuild in the same call: while they double, their rebuilds spread over the range.
void TestStripesGrowThroughStaggeredSizes() {
  RegionAllocator rows(false);
  ChangeClock clock;
  const size_t row_bytes = 64;
  const int num_stripes = 256;
  std::vector<size_t> growth_size_in_doubling;  // per stripe: the size that outgrew its index
  for (int index = 0; index < num_stripes; index += 32) {
    Stripe s(&rows, &clock, index, num_stripes);
    s.ResetIndex(kMinCapacity);
    bool inserted = false;
    size_t last_capacity = s.capacity;
    for (uint64_t key = 1; key <= 16384; ++key) {
      s.PrepareInserts(1, 1, row_bytes, false);
      s.FindOrAddRow(key, TableHash(key), row_bytes, &inserted, true);
      s.FinishInserts(1);
      CHECK_TRUE(inserted);
      if (s.capacity == last_capacity) continue;
      // Growth comes when the load passes 7/8, to a size of whole groups, about double.
      CHECK_TRUE(s.size == last_capacity * 7 / 8 + 1);
      CHECK_TRUE(s.capacity % kGroup == 0);
      if (last_capacity >= 64 * kGroup) {
        CHECK_TRUE(s.capacity >= 1.95 * last_capacity && s.capacity <= 2.05 * last_capacity);
      }
      if (s.size > 4096 && s.size <= 8192) growth_size_in_doubling.push_back(s.size);
      last_capacity = s.capacity;
    }
    // Every key is still found after the rebuilds, and no absent key is.
    for (uint64_t key = 1; key <= s.size; ++key) CHECK_TRUE(s.FindSlot(key, TableHash(key), row_bytes) >= 0);
    for (uint64_t key = s.size + 1; key <= s.size + 1000; ++key) {
      CHECK_TRUE(s.FindSlot(key, TableHash(key), row_bytes) < 0);
    }
    s.FreeAll();
  }
  // Each of the 8 stripes rebuilt once while the size doubled from 4096, each at its own
  // size, and they cover most of the doubling: 2^(1/8) apart.
  CHECK_TRUE(growth_size_in_doubling.size() == 8);
  std::sort(growth_size_in_doubling.begin(), growth_size_in_doubling.end());
  for (size_t i = 1; i < growth_size_in_doubling.size(); ++i) {
    const double ratio = static_cast<double>(growth_size_in_doubling[i]) / growth_size_in_doubling[i - 1];
    CHECK_TRUE(ratio > 1.07 && ratio < 1.11);
  }
}

void TestExportImportRoundTrip() {
  for (OptimizerKind opt : {OptimizerKind::kSgd, OptimizerKind::kAdam, OptimizerKind::kFtrl}) {
    TableConfig config = Config(5, opt, InitializerKind::kTruncatedNormal);
    Table t(config);
    const int64_t n = 1000;
    std::vector<uint64_t> keys(n);
    std::mt19937_64 rng(3);
    for (auto& k : keys) k = rng();
    std::vector<float> values(n * 5), grads(n * 5, 0.25f);
    t.FindOrInsert(keys.data(), n, values.data(), kSerial);
    CHECK_TRUE(t.ApplyGradients(keys.data(), n / 2, grads.data(), 9, kSerial));
    Table copy(config);
    int64_t cursor = 0, exported = 0, chunks = 0;
    do {
      ExportChunk c = t.Export(cursor, 97);
      CHECK_TRUE(static_cast<int64_t>(c.keys.size()) <= 97);
      copy.Import(reinterpret_cast<const uint64_t*>(c.keys.data()), c.keys.size(), c.values.data(),
                  c.slots.data(), c.metadata.data(), kSerial);
      exported += c.keys.size();
      cursor = c.next_cursor;
      ++chunks;
    } while (cursor >= 0);
    CHECK_TRUE(exported == n);
    CHECK_TRUE(chunks >= n / 97);
    CHECK_TRUE(copy.Size() == n);
    for (int64_t i = 0; i < n; i += 37) {
      std::vector<float> v1, s1, v2, s2;
      int64_t m1[kNumMetadata], m2[kNumMetadata];
      CHECK_TRUE(t.DebugRow(keys[i], &v1, &s1, m1) && copy.DebugRow(keys[i], &v2, &s2, m2));
      CHECK_TRUE(v1 == v2 && s1 == s2);
      CHECK_TRUE(std::memcmp(m1, m2, sizeof(m1)) == 0);
      CHECK_TRUE(m1[kCount] == 1);  // the one lookup; applies do not count
      CHECK_TRUE(m1[kLastStep] == (i < n / 2 ? 9 : 0));
      CHECK_TRUE(m1[kOptimizerStep] == (opt == OptimizerKind::kAdam && i < n / 2 ? 1 : 0));
    }
  }
}

// Many threads run find_or_insert, apply and find on overlapping keys. SGD with
// learning rate 1 and gradients that are small multiples of 1/8 is exact in float, so
// the final rows must equal a single-threaded replay bit for bit whatever the order.
void TestConcurrentStressMatchesReplay() {
  TableConfig config = Config(8, OptimizerKind::kSgd, InitializerKind::kZeros, 3);
  config.optimizer.learning_rate = 1.0f;
  Table shared(config), replay(config);
  const int kThreadsN = 8, kRounds = 200, kBatch = 512, kKeySpace = 3000;
  auto batch_of = [&](int thread, int round, std::vector<uint64_t>* keys, std::vector<float>* grads) {
    std::mt19937_64 rng(thread * 100003 + round);
    keys->resize(kBatch);
    grads->resize(kBatch * 8);
    for (auto& k : *keys) k = rng() % kKeySpace * 0x9e3779b97f4a7c15ULL;
    for (auto& g : *grads) g = static_cast<float>(static_cast<int>(rng() % 9) - 4) / 8.0f;
  };
  std::vector<std::thread> threads;
  for (int th = 0; th < kThreadsN; ++th) {
    threads.emplace_back([&, th] {
      std::vector<uint64_t> keys;
      std::vector<float> grads, out(kBatch * 8);
      const ParallelFor pf = th % 2 ? kSerial : ThreadedParallelFor(2);
      for (int r = 0; r < kRounds; ++r) {
        batch_of(th, r, &keys, &grads);
        shared.FindOrInsert(keys.data(), kBatch, out.data(), pf);
        shared.ApplyGradients(keys.data(), kBatch, grads.data(), r, pf);
        shared.Find(keys.data(), kBatch, out.data(), nullptr, pf);
      }
    });
  }
  for (auto& t : threads) t.join();
  std::vector<uint64_t> keys;
  std::vector<float> grads, replay_out(kBatch * 8);
  for (int th = 0; th < kThreadsN; ++th) {
    for (int r = 0; r < kRounds; ++r) {
      batch_of(th, r, &keys, &grads);
      replay.FindOrInsert(keys.data(), kBatch, replay_out.data(), kSerial);
      replay.ApplyGradients(keys.data(), kBatch, grads.data(), r, kSerial);
    }
  }
  CHECK_TRUE(shared.Size() == replay.Size());
  int64_t mismatched = 0, total_count_shared = 0, total_count_replay = 0;
  for (int k = 0; k < kKeySpace; ++k) {
    const uint64_t key = k * 0x9e3779b97f4a7c15ULL;
    std::vector<float> v1, s1, v2, s2;
    int64_t m1[kNumMetadata], m2[kNumMetadata];
    const bool a = shared.DebugRow(key, &v1, &s1, m1), b = replay.DebugRow(key, &v2, &s2, m2);
    if (a != b || (a && v1 != v2)) ++mismatched;
    if (a) total_count_shared += m1[kCount];
    if (b) total_count_replay += m2[kCount];
  }
  CHECK_TRUE(mismatched == 0);
  CHECK_TRUE(total_count_shared == int64_t{kThreadsN} * kRounds * kBatch);
  CHECK_TRUE(total_count_shared == total_count_replay);
}

// Rows exported from a table, by key.
std::map<int64_t, std::vector<float>> ExportedValues(const Table& t, int64_t* rows) {
  std::map<int64_t, std::vector<float>> out;
  ExportChunk chunk;
  *rows = 0;
  for (int64_t cursor = 0; cursor >= 0; cursor = chunk.next_cursor) {
    t.ExportInto(cursor, 1000, &chunk);
    for (size_t i = 0; i < chunk.keys.size(); ++i) {
      out[chunk.keys[i]].assign(chunk.values.begin() + i * t.dim(), chunk.values.begin() + (i + 1) * t.dim());
    }
    *rows += static_cast<int64_t>(chunk.keys.size());
  }
  return out;
}

// Every operation at once, for each optimizer: two threads apply gradients to training keys
// that nothing else writes, one churns other keys (insert, import, remove), one reads
// (find, find_or_insert, export, saves of all rows and of changes). After the threads join,
// what applies leave regardless of their order must equal a serial replay: SGD values,
// Adagrad and FTRL accumulators (sums of g^2), per-row counts and Adam steps.
void TestEveryOperationAtOnceMatchesASerialReplay() {
  for (int k = 0; k < kNumOptimizers; ++k) {
    const OptimizerKind kind = static_cast<OptimizerKind>(k);
    const int dim = 4, kRounds = 60, kBatch = 256, kTrainKeys = 1500;
    TableConfig config = Config(dim, kind, InitializerKind::kUniform, 3);
    Table shared(config), replay(config);
    auto train_batch = [&](int thread, int round, std::vector<uint64_t>* keys, std::vector<float>* grads) {
      std::mt19937_64 rng(thread * 7919 + round);
      keys->resize(kBatch);
      grads->resize(kBatch * dim);
      for (auto& k : *keys) k = rng() % kTrainKeys;
      for (auto& g : *grads) g = static_cast<float>(static_cast<int>(rng() % 9) - 4) / 8.0f;
    };
    std::atomic<bool> training{true};
    std::vector<std::thread> threads;
    for (int th = 0; th < 2; ++th) {
      threads.emplace_back([&, th] {
        std::vector<uint64_t> keys;
        std::vector<float> grads, rows(kBatch * dim);
        for (int r = 0; r < kRounds; ++r) {
          train_batch(th, r, &keys, &grads);
          shared.FindOrInsert(keys.data(), kBatch, rows.data(), ThreadedParallelFor(2));  // counts
          shared.ApplyGradients(keys.data(), kBatch, grads.data(), -1, ThreadedParallelFor(2));
        }
      });
    }
    threads.emplace_back([&] {  // churn keys the appliers never touch
      std::mt19937_64 rng(5);
      std::vector<uint64_t> keys(64);
      std::vector<float> values(64 * dim, 0.25f), slots(64 * dim * shared.num_slots(), 0.5f);
      std::vector<int64_t> metadata(64 * kNumMetadata, 1);
      for (int r = 0; training.load(); ++r) {
        for (auto& k : keys) k = (uint64_t{1} << 40) + rng() % 2000;
        if (r % 3 == 0) shared.Insert(keys.data(), 64, values.data(), kSerial);
        if (r % 3 == 1) shared.Import(keys.data(), 64, values.data(), slots.data(), metadata.data(), kSerial);
        if (r % 3 == 2) shared.Remove(keys.data(), 64, kSerial);
      }
    });
    threads.emplace_back([&] {  // read and save while everything else runs
      std::vector<uint64_t> keys(128);
      std::vector<float> out(128 * dim);
      const std::vector<int64_t> no_occurrences(128, 0);  // a lookup that counts nothing
      ExportChunk chunk;
      for (int r = 0; training.load(); ++r) {
        for (size_t i = 0; i < keys.size(); ++i) keys[i] = (i * 13 + r) % (kTrainKeys + 50);
        shared.Find(keys.data(), 128, out.data(), nullptr, kSerial);
        shared.FindOrInsert(keys.data(), 128, out.data(), kSerial, no_occurrences.data());
        for (int64_t cursor = 0; cursor >= 0; cursor = chunk.next_cursor) {
          if (r % 2 == 0) shared.ExportInto(cursor, 500, &chunk);
          else shared.SaveChunk(cursor, 500, r % 4 == 1 ? shared.BeginSave() - 2 : -1, &chunk);
        }
      }
    });
    threads[0].join();
    threads[1].join();
    training.store(false);
    for (size_t t = 2; t < threads.size(); ++t) threads[t].join();
    std::vector<uint64_t> keys;
    std::vector<float> grads, rows(kBatch * dim);
    for (int th = 0; th < 2; ++th) {
      for (int r = 0; r < kRounds; ++r) {
        train_batch(th, r, &keys, &grads);
        replay.FindOrInsert(keys.data(), kBatch, rows.data(), kSerial);
        replay.ApplyGradients(keys.data(), kBatch, grads.data(), -1, kSerial);
      }
    }
    int64_t mismatched = 0;
    for (uint64_t key = 0; key < kTrainKeys; ++key) {
      std::vector<float> v1, s1, v2, s2;
      int64_t m1[kNumMetadata], m2[kNumMetadata];
      const bool a = shared.DebugRow(key, &v1, &s1, m1), b = replay.DebugRow(key, &v2, &s2, m2);
      if (!b) continue;  // a key only the reader inserted
      bool same = a && m1[kCount] == m2[kCount] && m1[kOptimizerStep] == m2[kOptimizerStep];
      for (int j = 0; same && j < dim; ++j) {
        if (kind == OptimizerKind::kSgd) same = std::fabs(v1[j] - v2[j]) <= 1e-4f;
        if (kind == OptimizerKind::kAdagrad || kind == OptimizerKind::kFtrl) {
          same = std::fabs(s1[j] - s2[j]) <= 1e-4f * std::fabs(s2[j]);
        }
        same = same && std::isfinite(v1[j]);
      }
      mismatched += same ? 0 : 1;
    }
    CHECK_TRUE(mismatched == 0);
    int64_t exported_rows = 0;
    ExportedValues(shared, &exported_rows);
    CHECK_TRUE(exported_rows == shared.Size());
  }
}

void TestClearDuringEveryOtherOperationLeavesAConsistentTable() {
  Table t(Config(4, OptimizerKind::kAdagrad, InitializerKind::kZeros, 3));
  std::atomic<bool> running{true};
  std::vector<std::thread> threads;
  threads.emplace_back([&] {
    for (int r = 0; r < 40; ++r) {
      t.Clear();
      std::this_thread::yield();
    }
    running.store(false);
  });
  for (int th = 0; th < 3; ++th) {
    threads.emplace_back([&, th] {
      std::vector<uint64_t> keys(200);
      std::vector<float> grads(200 * 4, 0.1f), out(200 * 4);
      ExportChunk chunk;
      for (int r = 0; running.load(); ++r) {
        for (size_t i = 0; i < keys.size(); ++i) keys[i] = i * 31 + th * 100000 + r % 7;
        t.ApplyGradients(keys.data(), keys.size(), grads.data(), -1, kSerial);
        t.FindOrInsert(keys.data(), keys.size(), out.data(), kSerial);
        t.Remove(keys.data(), 50, kSerial);
        for (int64_t cursor = 0; cursor >= 0; cursor = chunk.next_cursor) t.SaveChunk(cursor, 64, th == 1 ? 0 : -1, &chunk);
      }
    });
  }
  for (auto& th : threads) th.join();
  int64_t exported_rows = 0;
  ExportedValues(t, &exported_rows);
  CHECK_TRUE(exported_rows == t.Size());
}

void TestBlockCacheReusesBackedBlocksWithinItsLimit() {
  constexpr size_t kMiB = size_t{1} << 20;
  BlockCache cache(16 * kMiB);
  char* a = static_cast<char*>(cache.Take(10 * kMiB, /*huge_pages=*/false));
  CHECK_TRUE(a != nullptr && reinterpret_cast<uintptr_t>(a) % 4096 == 0);
  CHECK_TRUE(!cache.WasReused(a));
  std::memset(a, 7, 10 * kMiB);
  cache.Give(a);
  CHECK_TRUE(cache.IdleBytes() == 10 * kMiB && cache.LentBytes() == 0);
  // A similar size gets the same block back, pages and contents kept.
  char* again = static_cast<char*>(cache.Take(9 * kMiB, /*huge_pages=*/false));
  CHECK_TRUE(again == a && cache.WasReused(a));
  CHECK_TRUE(again[0] == 7 && again[9 * kMiB - 1] == 7);
  // Too small for it: a quarter of the block or more would be wasted.
  char* small = static_cast<char*>(cache.Take(4 * kMiB, /*huge_pages=*/false));
  CHECK_TRUE(small != a && !cache.WasReused(small));
  char* big = static_cast<char*>(cache.Take(12 * kMiB, /*huge_pages=*/false));
  CHECK_TRUE(cache.LentBytes() == 26 * kMiB);
  cache.Give(a);
  cache.Give(small);
  cache.Give(big);
  // 26 MiB idle is over the 16 MiB limit: the oldest returned block goes first.
  CHECK_TRUE(cache.IdleBytes() == 16 * kMiB);
  CHECK_TRUE(cache.Take(10 * kMiB, /*huge_pages=*/false) == big);
}

// A cache that may keep nothing idle hands every returned block straight back to the OS.
void TestBlockCacheWithoutRoomUnmapsReturnedBlocks() {
  constexpr size_t kMiB = size_t{1} << 20;
  BlockCache cache(0);
  char* a = static_cast<char*>(cache.Take(10 * kMiB, /*huge_pages=*/false));
  std::memset(a, 7, 10 * kMiB);
  cache.Give(a);
  CHECK_TRUE(cache.IdleBytes() == 0 && cache.LentBytes() == 0);
  unsigned char resident[1];
  // mincore fails with ENOMEM on an address that is no longer mapped.
  CHECK_TRUE(mincore(a, 4096, resident) != 0 && errno == ENOMEM);
}

// The kB on transparent huge pages ("AnonHugePages:" in /proc/self/smaps) of the mapping
// holding `p`; -1 when it cannot be read.
int64_t HugePageKiB(const void* p) {
  std::FILE* smaps = std::fopen("/proc/self/smaps", "r");
  if (smaps == nullptr) return -1;
  const uintptr_t address = reinterpret_cast<uintptr_t>(p);
  char line[512];
  bool inside = false;
  int64_t kib = -1;
  while (kib < 0 && std::fgets(line, sizeof line, smaps) != nullptr) {
    unsigned long begin, end;
    long long value;
    if (std::sscanf(line, "%lx-%lx ", &begin, &end) == 2) {
      inside = begin <= address && address < end;
    } else if (inside && std::sscanf(line, "AnonHugePages: %lld kB", &value) == 1) {
      kib = value;
    }
  }
  std::fclose(smaps);
  return kib;
}

// Whether this kernel collapses memory into huge pages on request (Linux 6.1+, huge pages
// not turned off).
bool CanCollapse() {
  void* probe = MapHugePageAligned(kHugePageBytes, /*huge_pages=*/false);
  std::memset(probe, 1, kHugePageBytes);
  const bool ok = CollapseIntoHugePages(probe, kHugePageBytes) == 0;
  munmap(probe, kHugePageBytes);
  return ok;
}

// Rows land scattered over a large output; huge pages spare a TLB miss per row. A fresh
// block starts on small pages and, when asked, moves onto huge ones, at least 2 MiB per
// reuse.
void TestBlockCacheMovesReusedBlocksOntoHugePages() {
  constexpr size_t kMiB = size_t{1} << 20;
  BlockCache cache(64 * kMiB);
  const size_t bytes = 17 * kMiB + 100;  // 8 whole 2 MiB pieces and a tail
  char* block = static_cast<char*>(cache.Take(bytes, /*huge_pages=*/true));
  char* small = static_cast<char*>(cache.Take(kMiB, /*huge_pages=*/true));
  CHECK_TRUE(block != nullptr && reinterpret_cast<uintptr_t>(block) % (2 * kMiB) == 0);
  CHECK_TRUE(small != nullptr && reinterpret_cast<uintptr_t>(small) % 4096 == 0);
  for (size_t i = 0; i < bytes; ++i) block[i] = static_cast<char>(i % 251);
  CHECK_TRUE(HugePageKiB(block) == 0);
  // Reuses that do not ask for huge pages leave the block on small ones.
  for (int reuse = 0; reuse < 3; ++reuse) {
    cache.Give(block);
    CHECK_TRUE(cache.Take(bytes, /*huge_pages=*/false) == block);
  }
  CHECK_TRUE(HugePageKiB(block) == 0);
  std::vector<int64_t> huge_kib;
  for (int reuse = 0; reuse < 9; ++reuse) {
    cache.Give(block);
    CHECK_TRUE(cache.Take(bytes, /*huge_pages=*/true) == block);
    huge_kib.push_back(HugePageKiB(block));
  }
  if (CanCollapse()) {
    for (int reuse = 0; reuse < 9; ++reuse) {
      CHECK_TRUE(huge_kib[reuse] >= std::min(reuse + 1, 8) * 2048);
      CHECK_TRUE(huge_kib[reuse] <= 16 * 1024);  // the tail stays on small pages
    }
  } else {
    std::printf("table_test: this kernel does not collapse huge pages; blocks stay small\n");
  }
  bool kept = true;
  for (size_t i = 0; i < bytes; ++i) kept &= block[i] == static_cast<char>(i % 251);
  CHECK_TRUE(kept);
  cache.Give(block);
  cache.Give(small);
}

void TestPopulateForWriteKeepsContents() {
  // Small: one call; large (several 4 MiB pieces): PopulateInParallel, threaded.
  for (size_t size : {size_t{3 * 4096 + 100}, size_t{(9 << 20) + 4096 * 3 + 100}}) {
    std::vector<char> buffer(size);
    for (size_t i = 0; i < buffer.size(); ++i) buffer[i] = static_cast<char>(i * 31);
    if (size < (size_t{8} << 20)) {
      PopulateForWrite(buffer.data() + 5, buffer.size() - 10);
    } else {
      PopulateInParallel(buffer.data() + 5, static_cast<int64_t>(buffer.size() - 10), kThreads);
    }
    bool kept = true;
    for (size_t i = 0; i < buffer.size(); ++i) kept = kept && buffer[i] == static_cast<char>(i * 31);
    CHECK_TRUE(kept);
  }
}

// On fresh memory, exactly the pages holding a byte of the range are backed, edge pages
// included, and nothing beyond them.
void TestPopulateForWriteBacksExactlyTheRangesPages() {
  constexpr size_t kPage = 4096, kPages = 16;
  char* fresh = static_cast<char*>(
      mmap(nullptr, kPages * kPage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  CHECK_TRUE(fresh != MAP_FAILED);
  PopulateForWrite(fresh + 2 * kPage + 100, 4 * kPage);  // touches pages 2 to 6
  unsigned char resident[kPages];
  CHECK_TRUE(mincore(fresh, kPages * kPage, resident) == 0);
  for (size_t page = 0; page < kPages; ++page) {
    CHECK_TRUE(((resident[page] & 1) != 0) == (page >= 2 && page <= 6));
  }
  munmap(fresh, kPages * kPage);
}

// Fresh rows are backed a piece at a time ahead of use; a big threaded batch must give
// exactly the rows of small serial ones.
void TestBatchInsertMatchesSmallBatches() {
  const TableConfig config = Config(24, OptimizerKind::kAdam, InitializerKind::kTruncatedNormal, 2);
  Table large(config), small(config);
  const int64_t n = 60000;
  std::vector<uint64_t> keys(n);
  for (int64_t i = 0; i < n; ++i) keys[i] = (static_cast<uint64_t>(i) * 0x9e3779b97f4a7c15ULL) ^ 0x5555;
  std::vector<float> from_large(n * 24), from_small(n * 24);
  large.FindOrInsert(keys.data(), n, from_large.data(), kThreads);
  for (int64_t b = 0; b < n; b += 100) small.FindOrInsert(keys.data() + b, 100, from_small.data() + b * 24, kSerial);
  CHECK_TRUE(from_large == from_small);
  std::vector<uint8_t> exists(n);
  std::vector<float> found(n * 24);
  large.Find(keys.data(), n, found.data(), exists.data(), kThreads);
  CHECK_TRUE(found == from_small);
}

// A batch that repeats its keys sizes the index for its distinct keys, not for its length:
// no larger than one batch of just the distinct keys makes it, and with the same rows.
void TestRepeatedKeysSizeTheIndexByDistinctKeys() {
  const TableConfig config = Config(8, OptimizerKind::kAdagrad, InitializerKind::kUniform);
  const int64_t distinct = 20000, repeats = 10, n = distinct * repeats;
  std::vector<uint64_t> unique(distinct), repeated(n);
  for (int64_t i = 0; i < distinct; ++i) unique[i] = static_cast<uint64_t>(i) * 0x9e3779b97f4a7c15ULL + 7;
  for (int64_t i = 0; i < n; ++i) repeated[i] = unique[(i * 7919) % distinct];  // every key, 10 times
  Table from_repeats(config), from_unique(config);
  std::vector<float> out_repeats(n * 8), out_unique(distinct * 8);
  from_repeats.FindOrInsert(repeated.data(), n, out_repeats.data(), kThreads);
  from_unique.FindOrInsert(unique.data(), distinct, out_unique.data(), kThreads);
  CHECK_TRUE(from_repeats.Size() == distinct);
  const int64_t index_repeats = from_repeats.MemoryBytes() - from_repeats.RowMemoryBytes();
  const int64_t index_unique = from_unique.MemoryBytes() - from_unique.RowMemoryBytes();
  // The estimate may round a stripe up one growth step; the batch's length would be ten.
  CHECK_TRUE(index_repeats <= 2 * index_unique);
  std::vector<uint8_t> exists(distinct);
  std::vector<float> found(distinct * 8);
  from_repeats.Find(unique.data(), distinct, found.data(), exists.data(), kSerial);
  CHECK_TRUE(found == out_unique);
}

// Every call that adds keys sizes a young stripe's index for its batch at once: a batch of
// 60K new keys into an empty table rebuilds each of the 256 stripes' indexes about once.
// Growing step by step while the keys arrived rebuilt each about five times.
void TestBatchesIntoAnEmptyTableRehashEachStripeOnce() {
  const TableConfig config = Config(4, OptimizerKind::kAdagrad, InitializerKind::kUniform);
  const int64_t n = 60000, stripes = int64_t{1} << config.log2_stripes;
  std::vector<uint64_t> keys(n);
  for (int64_t i = 0; i < n; ++i) keys[i] = static_cast<uint64_t>(i) * 0x9e3779b97f4a7c15ULL + 11;
  std::vector<float> values(n * 4, 0.5f), slots(n * 4, 0.1f);
  std::vector<int64_t> metadata(n * kNumMetadata, 1);
  Table found_or_inserted(config), inserted(config), imported(config);
  std::vector<float> out(n * 4);
  found_or_inserted.FindOrInsert(keys.data(), n, out.data(), kThreads);
  inserted.Insert(keys.data(), n, values.data(), kThreads);
  imported.Import(keys.data(), n, values.data(), slots.data(), metadata.data(), kThreads);
  for (const Table* t : {&found_or_inserted, &inserted, &imported}) {
    CHECK_TRUE(t->Size() == n);
    CHECK_TRUE(t->IndexRehashes() <= 2 * stripes);
  }
  std::vector<float> v, sl;
  int64_t meta[kNumMetadata];
  CHECK_TRUE(imported.DebugRow(keys[n - 1], &v, &sl, meta) && v[3] == 0.5f && sl[0] == 0.1f &&
             meta[kCount] == 1);
}

// The rows SelectForServing picks, read stripe after stripe, in TableHash order, in
// slices of slice_rows.
std::vector<std::pair<uint64_t, std::vector<float>>> ReadServingRows(const Table& t,
                                                                     const Table::ServingSelection& picks,
                                                                     bool* ok, size_t slice_rows = 7) {
  std::vector<std::pair<uint64_t, std::vector<float>>> rows;
  std::vector<std::pair<uint64_t, uint64_t>> order;
  std::vector<float> values;
  *ok = true;
  for (int s = 0; *ok && s < (1 << t.log2_stripes()); ++s) {
    *ok = t.SortSelected(picks, s, &order);
    for (size_t begin = 0; *ok && begin < order.size(); begin += slice_rows) {
      const size_t end = std::min(order.size(), begin + slice_rows);
      values.resize((end - begin) * t.dim());
      *ok = t.ReadSortedValues(s, order, begin, end, values.data());
      for (size_t i = 0; *ok && i < end - begin; ++i) {
        rows.emplace_back(order[begin + i].first, std::vector<float>(values.begin() + i * t.dim(),
                                                                     values.begin() + (i + 1) * t.dim()));
      }
    }
  }
  return rows;
}

void TestServingReadsPickedRowsInHashOrderWhileTheTableChanges() {
  Table t(Config(2, OptimizerKind::kSgd, InitializerKind::kZeros));
  std::vector<uint64_t> keys(300);
  std::vector<float> values(keys.size() * 2), out(keys.size() * 2);
  for (size_t i = 0; i < keys.size(); ++i) {
    keys[i] = i * 0x9e3779b97f4a7c15ULL + 3;
    values[2 * i] = static_cast<float>(i);
    values[2 * i + 1] = -static_cast<float>(i) * 1000.0f;
  }
  t.FindOrInsert(keys.data(), keys.size(), out.data(), kSerial);      // every key seen once
  t.FindOrInsert(keys.data(), 100, out.data(), kSerial);              // the first 100 twice
  t.Insert(keys.data(), keys.size(), values.data(), kSerial);
  Table::ServingSelection picks = t.SelectForServing(2);
  CHECK_TRUE(picks.max_abs_value == 99000.0f);
  // Between the passes: a picked key goes, a new key may take its row, another picked key
  // changes value. The picks still read as many rows, each as it is now.
  t.Remove(keys.data() + 5, 1, kSerial);
  const uint64_t fresh = 12345;
  t.FindOrInsert(&fresh, 1, out.data(), kSerial);
  const float changed[2] = {0.5f, 0.25f};
  t.Insert(keys.data() + 7, 1, changed, kSerial);
  bool ok;
  const auto rows = ReadServingRows(t, picks, &ok);
  CHECK_TRUE(ok && rows.size() == 100);
  std::map<uint64_t, std::vector<float>> expected;
  for (int i = 0; i < 100; ++i) {
    expected[TableHash(keys[i])] = {values[2 * i], values[2 * i + 1]};
  }
  expected[TableHash(keys[7])] = {0.5f, 0.25f};
  size_t matching = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    CHECK_TRUE(i == 0 || rows[i - 1].first < rows[i].first);
    auto it = expected.find(rows[i].first);
    matching += it != expected.end() && it->second == rows[i].second;
  }
  // All but key 5's row, whose number the fresh key took (or which still holds key 5).
  CHECK_TRUE(matching >= 99);
  // Between sorting a stripe and reading its values: a key goes and a new key takes its
  // row, so its hash reads as zeros (as an absent key serves); a changed row reads as now.
  const int stripe = t.StripeOf(TableHash(keys[20]));
  std::vector<std::pair<uint64_t, uint64_t>> order;
  CHECK_TRUE(t.SortSelected(picks, stripe, &order));
  t.Remove(keys.data() + 20, 1, kSerial);
  uint64_t taker = 777;
  for (; t.StripeOf(TableHash(taker)) != stripe; ++taker) {}
  t.FindOrInsert(&taker, 1, out.data(), kSerial);  // the stripe's one free row: key 20's
  int other = -1;
  for (int i = 0; i < 100 && other < 0; ++i) {
    if (i != 20 && t.StripeOf(TableHash(keys[i])) == stripe) other = i;
  }
  const float now[2] = {-2.0f, 4.0f};
  if (other >= 0) t.Insert(keys.data() + other, 1, now, kSerial);
  std::vector<float> read(order.size() * 2);
  CHECK_TRUE(t.ReadSortedValues(stripe, order, 0, order.size(), read.data()));
  for (size_t i = 0; i < order.size(); ++i) {
    const std::vector<float> got(read.begin() + 2 * i, read.begin() + 2 * i + 2);
    if (order[i].first == TableHash(keys[20])) {
      CHECK_TRUE(got == std::vector<float>({0.0f, 0.0f}));
    } else if (other >= 0 && order[i].first == TableHash(keys[other])) {
      CHECK_TRUE(got == std::vector<float>({-2.0f, 4.0f}));
    }
  }
  CHECK_TRUE(other >= 0);
  t.Clear();
  ReadServingRows(t, picks, &ok);
  CHECK_TRUE(!ok);  // cleared since the picks: the export must fail, not read freed rows
  CHECK_TRUE(t.SelectForServing(0).rows == std::vector<int64_t>(16, 0));
}

// SortSelected buckets a stripe's hashes by the bits below the stripe's own before sorting
// each bucket: with one stripe and with 16, every picked row comes out once, ascending.
void TestServingOrderOfLargeStripesIsSortedAndComplete() {
  for (int log2_stripes : {0, 4}) {
    Table t(Config(1, OptimizerKind::kSgd, InitializerKind::kZeros, log2_stripes));
    std::vector<uint64_t> keys(100000);
    for (size_t i = 0; i < keys.size(); ++i) keys[i] = i * 0x2545F4914F6CDD1DULL + 11;
    std::vector<float> out(keys.size());
    t.FindOrInsert(keys.data(), keys.size(), out.data(), kSerial);
    const Table::ServingSelection picks = t.SelectForServing(0);
    std::vector<uint64_t> got;
    std::vector<std::pair<uint64_t, uint64_t>> order;
    for (int s = 0; s < (1 << log2_stripes); ++s) {
      CHECK_TRUE(t.SortSelected(picks, s, &order));
      for (const auto& [hash, row] : order) got.push_back(hash);
    }
    std::vector<uint64_t> expected;
    for (uint64_t k : keys) expected.push_back(TableHash(k));
    std::sort(expected.begin(), expected.end());
    CHECK_TRUE(got == expected);
  }
}

void TestCrc32cKnownValuesAndExtension() {
  CHECK_TRUE(Crc32c(0, "123456789", 9) == 0xe3069283u);  // the standard check value
  CHECK_TRUE(Crc32c(0, "", 0) == 0);
  std::vector<uint8_t> bytes(1000);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(i * 131 + 7);
  const uint32_t whole = Crc32c(0, bytes.data(), bytes.size());
  for (size_t split : {size_t{0}, size_t{1}, size_t{7}, size_t{8}, size_t{500}, size_t{999}}) {
    CHECK_TRUE(Crc32c(Crc32c(0, bytes.data(), split), bytes.data() + split, bytes.size() - split) ==
               whole);
  }
  bytes[333] ^= 1;
  CHECK_TRUE(Crc32c(0, bytes.data(), bytes.size()) != whole);
  // Long buffers run as interleaved streams: the same CRC as byte-at-a-time, at every
  // length around the block sizes and for every starting CRC.
  std::vector<uint8_t> big(3 * 4096 * 3 + 77);
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<uint8_t>(i * 2654435761u >> 13);
  for (size_t size : {size_t{0}, size_t{12287}, size_t{12288}, size_t{12289}, size_t{24576 + 5}, big.size()}) {
    uint32_t bytewise = 0;
    for (size_t i = 0; i < size; ++i) bytewise = Crc32c(bytewise, big.data() + i, 1);
    CHECK_TRUE(Crc32c(0, big.data(), size) == bytewise);
    CHECK_TRUE(Crc32c(Crc32c(0, big.data(), 3), big.data() + 3, size - std::min<size_t>(size, 3)) ==
               Crc32c(0, big.data(), std::max<size_t>(size, 3)));
  }
}

void TestClearWaitsOnlyForTheInsertsInFlight() {
  // Writers insert without pause. A clear used to wait for a moment when none of them held
  // room in any stripe, which a steady stream seldom leaves, while their calls went on.
  Table t(Config(4, OptimizerKind::kSgd, InitializerKind::kZeros, 3));
  constexpr int kWriters = 4, kClears = 5;
  std::atomic<bool> running{true};
  std::atomic<int64_t> calls{0};
  std::vector<std::thread> writers;
  for (int w = 0; w < kWriters; ++w) {
    writers.emplace_back([&, w] {
      std::vector<uint64_t> keys(16384);
      std::vector<float> out(keys.size() * 4);
      for (uint64_t r = 0; running.load(); ++r) {
        for (size_t i = 0; i < keys.size(); ++i) keys[i] = ((r * keys.size() + i) * kWriters + w) % 1000003;
        t.FindOrInsert(keys.data(), keys.size(), out.data(), kSerial);
        calls.fetch_add(1);
      }
    });
  }
  while (calls.load() < 4 * kWriters) std::this_thread::yield();
  int64_t during_clears = 0;
  for (int c = 0; c < kClears; ++c) {
    const int64_t before = calls.load();
    t.Clear();
    during_clears += calls.load() - before;
  }
  running.store(false);
  for (auto& w : writers) w.join();
  // Each writer finishes the call it is in; a call it starts after that waits. The slack
  // covers calls finished while this thread was descheduled around the clear, or after it
  // woke the writers; waiting for gaps in the stream saw hundreds to thousands.
  std::printf("writer calls finished during %d clears: %lld\n", kClears, static_cast<long long>(during_clears));
  CHECK_TRUE(during_clears <= kClears * 12 * kWriters);
}

void TestScratchPoolKeepsOnlyModestScratch() {
  ScratchPool pool;
  pool.Release(pool.Acquire(1000));
  CHECK_TRUE(pool.Acquire(16)->capacity == 1000);  // reused
  // A restore's removal of a whole shard's keys must not pin its scratch for good.
  pool.Release(pool.Acquire(ScratchPool::kMaxPooledKeys + 1));
  CHECK_TRUE(pool.Acquire(16)->capacity == 16);
}

// Two calls that may insert reserve room before either writes: the exact admission counts
// of both calls' new keys then fit without allocating while they write.
void TestPendingCountsOfConcurrentReservationsFitWithoutGrowing() {
  RegionAllocator rows(false);
  ChangeClock clock;
  const size_t row_bytes = 64;
  Stripe s(&rows, &clock, 0, 1);
  s.ResetIndex(kMinCapacity);
  s.pending.Configure(0);  // exact counts
  s.PrepareInserts(1000, 1000, row_bytes, true);
  s.PrepareInserts(1000, 1000, row_bytes, true);
  const size_t reserved_bytes = s.pending.MemoryBytes();
  for (uint64_t key = 1; key <= 2000; ++key) s.pending.Add(key, 1);
  CHECK_TRUE(s.pending.MemoryBytes() == reserved_bytes);
  CHECK_TRUE(s.pending.EstimateKeys() == 2000);
  s.FinishInserts(1000);
  s.FinishInserts(1000);
  s.FreeAll();
}

}  // namespace
}  // namespace tfps

int main() {
  tfps::TestServingReadsPickedRowsInHashOrderWhileTheTableChanges();
  tfps::TestServingOrderOfLargeStripesIsSortedAndComplete();
  tfps::TestCrc32cKnownValuesAndExtension();
  tfps::TestBlockCacheReusesBackedBlocksWithinItsLimit();
  tfps::TestBlockCacheWithoutRoomUnmapsReturnedBlocks();
  tfps::TestBlockCacheMovesReusedBlocksOntoHugePages();
  tfps::TestPopulateForWriteKeepsContents();
  tfps::TestPopulateForWriteBacksExactlyTheRangesPages();
  tfps::TestBatchInsertMatchesSmallBatches();
  tfps::TestRepeatedKeysSizeTheIndexByDistinctKeys();
  tfps::TestBatchesIntoAnEmptyTableRehashEachStripeOnce();
  tfps::TestEdgeKeysAreOrdinary();
  tfps::TestInitialValuesAreDeterministic();
  tfps::TestGrowthRemoveAndReinsert();
  tfps::TestNonFiniteGradientRejectsWholeApply();
  tfps::TestMemoryFollowsRowsThatHoverAtABlockEnd();
  tfps::TestFindOrInsertCountsOccurrences();
  tfps::TestStateFollowsRowChanges();
  tfps::TestClearKeepingMemoryReusesItForNewRows();
  tfps::TestRecycledRegionsSayWhichBlocksWereHandedOutBefore();
  tfps::TestFiniteCheckCoversEveryPosition();
  tfps::TestStripesGrowThroughStaggeredSizes();
  tfps::TestExportImportRoundTrip();
  tfps::TestConcurrentStressMatchesReplay();
  tfps::TestEveryOperationAtOnceMatchesASerialReplay();
  tfps::TestClearDuringEveryOtherOperationLeavesAConsistentTable();
  tfps::TestClearWaitsOnlyForTheInsertsInFlight();
  tfps::TestScratchPoolKeepsOnlyModestScratch();
  tfps::TestPendingCountsOfConcurrentReservationsFitWithoutGrowing();
  return tfps::Report("table_test");
}
