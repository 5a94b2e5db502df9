// Plain C++ tests of admission, eviction, the row cap and allocation failure in the table
// core. Exit status 0 means every check passed.
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <unordered_map>
#include <vector>

#include "custom_ops/core/pending.h"
#include "custom_ops/core/table.h"
#include "custom_ops/core/tests/test_util.h"

namespace tfps {
namespace {

std::vector<uint64_t> Keys(int64_t n, uint64_t salt = 0) {
  std::vector<uint64_t> keys(n);
  for (int64_t i = 0; i < n; ++i) keys[i] = (static_cast<uint64_t>(i) + salt) * 0x9e3779b97f4a7c15ULL;
  return keys;
}

bool Has(const Table& t, uint64_t key) {
  std::vector<float> v, s;
  int64_t meta[kNumMetadata];
  return t.DebugRow(key, &v, &s, meta);
}

int64_t Meta(const Table& t, uint64_t key, MetadataColumn column) {
  std::vector<float> v, s;
  int64_t meta[kNumMetadata];
  return t.DebugRow(key, &v, &s, meta) ? meta[column] : -1;
}

// Power-law keys: key k drawn with weight 1 / (k + 1).
std::vector<uint64_t> Zipf(int64_t n, int64_t vocabulary, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  std::vector<uint64_t> keys(n);
  const double log_v = std::log(static_cast<double>(vocabulary));
  for (auto& k : keys) k = static_cast<uint64_t>(std::exp(u(rng) * log_v)) - 1;
  return keys;
}

// A sketch never counts a key below its true count (before it first halves), and halves
// once half of its first row is in use.
void TestSketchNeverUndercountsAndHalvesWhenHalfFull() {
  PendingCounts sketch, exact;
  sketch.Configure(1 << 14);
  exact.Configure(0);
  const auto keys = Zipf(4000, 100000, 1);
  for (uint64_t k : keys) {
    const uint32_t estimated = sketch.Add(k, 1), truth = exact.Add(k, 1);
    CHECK_TRUE(estimated >= truth);
  }
  int64_t over = 0, distinct = exact.EstimateKeys();
  for (uint64_t k = 0; k < 100000; ++k) over += sketch.Add(k, 0) != exact.Add(k, 0);
  CHECK_TRUE(over < 100000 / 100);  // a key overcounts only when all 4 counters collide
  CHECK_TRUE(std::abs(sketch.EstimateKeys() - distinct) < distinct / 20 + 10);
  // A key counted 100 times loses half of it when other keys fill half the first row.
  PendingCounts small;
  small.Configure(64);
  const uint64_t counted = 0x5eed;
  small.Add(counted, 100);
  int64_t most_in_use = 0;
  for (uint64_t k = 1; k <= 1000; ++k) {
    small.Add(k * 7919, 1);
    most_in_use = std::max(most_in_use, small.EstimateKeys());
  }
  CHECK_TRUE(most_in_use <= static_cast<int64_t>(64 * std::log(2.0)) + 1);
  const uint32_t halved = small.Add(counted, 0);
  CHECK_TRUE(halved < 100);
}

// Exact counts against a map, through adds and forgets that shift runs of the probe.
void TestExactCountsMatchAMap() {
  PendingCounts exact;
  exact.Configure(0);
  std::unordered_map<uint64_t, uint32_t> truth;
  std::mt19937_64 rng(3);
  for (int i = 0; i < 200000; ++i) {
    const uint64_t key = rng() % 3000;
    if (rng() % 4 == 0) {
      exact.Forget(key);
      truth.erase(key);
    } else {
      const uint32_t n = 1 + rng() % 3;
      CHECK_TRUE(exact.Add(key, n) == truth[key]);
      truth[key] += n;
    }
  }
  for (uint64_t key = 0; key < 3000; ++key) {
    const auto it = truth.find(key);
    CHECK_TRUE(exact.Add(key, 0) == (it == truth.end() ? 0 : it->second));
  }
  CHECK_TRUE(exact.EstimateKeys() == static_cast<int64_t>(truth.size()));
  int64_t visited = 0;
  exact.ForEachExact([&](uint64_t key, uint32_t count) { visited += truth.at(key) == count; });
  CHECK_TRUE(visited == static_cast<int64_t>(truth.size()));
}

TableConfig Admitting(AdmissionKind kind, int64_t sketch_bytes) {
  TableConfig c = Config(2, OptimizerKind::kSgd, InitializerKind::kUniform);
  c.admission.kind = kind;
  c.admission.min_count = 3;
  c.admission.probability = 0.25f;
  c.admission.sketch_bytes = sketch_bytes;
  return c;
}

// A key gets a row at its third occurrence, however the occurrences are batched; until
// then it reads its initial value, is reported not admitted, and applies skip it.
void TestMinCountAdmitsAtTheNthOccurrence() {
  for (int64_t sketch_bytes : {int64_t{0}, int64_t{1} << 20}) {
    Table t(Admitting(AdmissionKind::kMinCount, sketch_bytes));
    const std::vector<uint64_t> keys = {11, 22, 33};
    const std::vector<int64_t> occurrences = {1, 2, 3};
    std::vector<float> out(6), initial(6);
    std::vector<uint8_t> admitted(3);
    t.Find(keys.data(), 3, initial.data(), nullptr, kSerial);
    t.FindOrInsert(keys.data(), 3, out.data(), kSerial, occurrences.data(), admitted.data());
    CHECK_TRUE(admitted == std::vector<uint8_t>({0, 0, 1}));
    CHECK_TRUE(out == initial);
    CHECK_TRUE(t.Size() == 1 && Meta(t, 33, kCount) == 3);
    const std::vector<float> grads(6, 1.0f);
    CHECK_TRUE(t.ApplyGradients(keys.data(), 3, grads.data(), -1, kSerial));
    CHECK_TRUE(t.Size() == 1);  // the pending keys' gradients were dropped
    t.FindOrInsert(keys.data(), 3, out.data(), kSerial, occurrences.data(), admitted.data());
    CHECK_TRUE(admitted == std::vector<uint8_t>({0, 1, 1}));
    CHECK_TRUE(Meta(t, 22, kCount) == 4 && Meta(t, 33, kCount) == 6);
    t.FindOrInsert(keys.data(), 1, out.data(), kSerial, occurrences.data(), admitted.data());
    CHECK_TRUE(admitted[0] == 1 && Meta(t, 11, kCount) == 3);
    const TableStats stats = t.Stats();
    CHECK_TRUE(stats.admitted == 3 && stats.rejected == 1 + 2 + 1);
    if (sketch_bytes == 0) CHECK_TRUE(stats.pending == 0);  // admitted keys are forgotten
  }
}

// Probability admission depends on (seed, key, occurrence) only: five lookups of one
// occurrence admit exactly the keys that one lookup of five occurrences does, at the rate
// 1 - (1 - p)^5.
void TestProbabilityAdmissionIgnoresBatching() {
  const auto keys = Keys(20000);
  Table once(Admitting(AdmissionKind::kProbability, 0)), five_times(Admitting(AdmissionKind::kProbability, 1 << 20));
  std::vector<float> out(keys.size() * 2);
  std::vector<uint8_t> admitted_once(keys.size()), admitted_last(keys.size());
  const std::vector<int64_t> fives(keys.size(), 5);
  once.FindOrInsert(keys.data(), keys.size(), out.data(), kThreads, fives.data(), admitted_once.data());
  for (int i = 0; i < 5; ++i) {
    five_times.FindOrInsert(keys.data(), keys.size(), out.data(), kThreads, nullptr, admitted_last.data());
  }
  CHECK_TRUE(admitted_once == admitted_last);
  const double rate = static_cast<double>(once.Size()) / keys.size();
  const double expected = 1.0 - std::pow(0.75, 5);
  CHECK_TRUE(std::fabs(rate - expected) < 0.015);
  for (size_t i = 0; i < keys.size(); i += 97) CHECK_TRUE(Has(once, keys[i]) == Has(five_times, keys[i]));
  // At a tiny p, keys counted a billion times in one call are admitted without a draw
  // per occurrence (which under the stripe's lock took about a second a key); at the
  // limit itself they still draw.
  TableConfig rare = Admitting(AdmissionKind::kProbability, 0);
  rare.admission.probability = 1e-9f;
  Table many(rare);
  const std::vector<int64_t> billions(64, int64_t{1} << 30), at_limit(64, kMaxAdmissionDraws);
  std::vector<uint8_t> admitted(64);
  many.FindOrInsert(keys.data(), 64, out.data(), kSerial, billions.data(), admitted.data());
  CHECK_TRUE(std::all_of(admitted.begin(), admitted.end(), [](uint8_t a) { return a == 1; }));
  Table limit(rare);
  limit.FindOrInsert(keys.data(), 64, out.data(), kSerial, at_limit.data(), admitted.data());
  CHECK_TRUE(limit.Size() == 0);  // 64 x 65,536 draws at p = 1e-9: none admits
}

TableConfig Evicting(EvictionKind kind) {
  TableConfig c = Config(2, OptimizerKind::kSgd, InitializerKind::kZeros, 2);
  c.eviction.kind = kind;
  c.eviction.ttl_steps = 3;
  c.eviction.decay = 0.5f;
  c.eviction.threshold = 0.3f;
  return c;
}

void Step(Table& t) {
  const uint64_t key = 0xfeedULL;
  const float grad[2] = {0.0f, 0.0f};
  t.ApplyGradients(&key, 1, grad, -1, kSerial);
}

// TTL in steps: rows unseen for more than 3 steps of the clock go, by the sweeps of later
// lookups or all at once by Evict; fresh rows stay. The sweep's pace follows the clock:
// every row is visited 16 times per TTL, so after 4 steps the next lookup, though all of
// its keys are new, visits every row.
void TestTtlRemovesRowsUnseenForLonger() {
  Table t(Evicting(EvictionKind::kTtl));
  const auto old_keys = Keys(2000), fresh_keys = Keys(2000, 1 << 20);
  std::vector<float> out(2000 * 2);
  t.FindOrInsert(old_keys.data(), 2000, out.data(), kThreads);  // seen at clock 0
  for (int s = 0; s < 3; ++s) Step(t);
  t.FindOrInsert(fresh_keys.data(), 2000, out.data(), kThreads);
  CHECK_TRUE(t.Stats().evicted == 0);  // seen 3 steps ago: not more than 3
  Step(t);
  t.FindOrInsert(fresh_keys.data(), 2000, out.data(), kThreads);
  CHECK_TRUE(t.Stats().evicted == 2000);
  for (int i = 0; i < 2000; i += 7) CHECK_TRUE(Has(t, fresh_keys[i]));
  CHECK_TRUE(t.Evict(kThreads) == 0);
  CHECK_TRUE(t.Size() == 2000 + 1 && t.Stats().evicted == 2000);
  for (int s = 0; s < 3; ++s) Step(t);
  CHECK_TRUE(t.Evict(kSerial) == 0);  // seen 3 steps ago: not more than 3
  Step(t);
  CHECK_TRUE(t.Evict(kSerial) == 2000 + 1 - 1);  // the stepped key was seen at this step
}

// Once lookups narrow to one hot key, TTL and DecayedFrequency sweep the stripes no key
// reaches too: rows past the policy go within the steps of the sweep's pace, with no Evict call.
void TestPacedPoliciesSweepStripesNoLookupReaches() {
  for (EvictionKind kind : {EvictionKind::kTtl, EvictionKind::kDecayedFrequency}) {
    Table t(Evicting(kind));
    const auto old_keys = Keys(2000);
    const uint64_t hot = 1ULL << 40;
    std::vector<float> out(2000 * 2);
    t.FindOrInsert(old_keys.data(), 2000, out.data(), kThreads);  // seen at clock 0
    // TTL 3: gone after 4 steps; DecayedFrequency: 1 * 0.5^2 < 0.3 after 2.
    for (int s = 0; s < 6; ++s) {
      t.FindOrInsert(&hot, 1, out.data(), kSerial);
      t.ApplyGradients(&hot, 1, out.data(), -1, kSerial);
    }
    t.FindOrInsert(&hot, 1, out.data(), kThreads);
    CHECK_TRUE(t.Stats().evicted == 2000);
    CHECK_TRUE(t.Size() == 1 && Has(t, hot));
  }
}

// TTL in seconds maps onto the clock through the record of when each step ran.
void TestTtlInSecondsUsesWhenStepsRan() {
  TableConfig c = Evicting(EvictionKind::kTtl);
  c.eviction.ttl_steps = 0;
  c.eviction.ttl_seconds = 3600;
  Table t(c);
  const auto keys = Keys(100);
  std::vector<float> out(200);
  t.FindOrInsert(keys.data(), 50, out.data(), kSerial);  // seen at clock 0
  for (int s = 0; s < 5; ++s) Step(t);
  t.FindOrInsert(keys.data() + 50, 50, out.data(), kSerial);  // seen at clock 5
  CHECK_TRUE(t.Evict(kSerial) == 0);  // the steps ran just now
  const int64_t now = std::chrono::duration_cast<std::chrono::microseconds>(
                          std::chrono::system_clock::now().time_since_epoch()).count();
  const int64_t hour = int64_t{3600} * 1000000;
  // As if clock 3 had been reached two hours ago and clock 5 one minute ago.
  t.SetClockTimes({{0, now - 3 * hour}, {3, now - 2 * hour}, {5, now - 60 * 1000000}});
  CHECK_TRUE(t.Evict(kSerial) == 50);
  CHECK_TRUE(!Has(t, keys[0]) && Has(t, keys[99]));
}

// DecayedFrequency: a row's score is its occurrences, each halved per step since; rows
// under 0.3 go, and the score survives export and import exactly.
void TestDecayedFrequencyScoresAndRemoves() {
  const TableConfig config = Evicting(EvictionKind::kDecayedFrequency);
  Table t(config);
  const std::vector<uint64_t> keys = {1, 2, 3};
  const std::vector<int64_t> occurrences = {1, 8, 2};
  std::vector<float> out(6);
  t.FindOrInsert(keys.data(), 3, out.data(), kSerial, occurrences.data());
  for (int s = 0; s < 2; ++s) Step(t);
  t.FindOrInsert(keys.data() + 2, 1, out.data(), kSerial, occurrences.data());  // key 3: 2 * 0.25 + 1
  // Key 1 scores 1/4 at clock 2: the lookup's sweep of the stripes it did not reach took it.
  CHECK_TRUE(!Has(t, 1) && Has(t, 2));
  std::vector<float> v, sl;
  int64_t meta[kNumMetadata];
  CHECK_TRUE(t.DebugRow(3, &v, &sl, meta));
  float score;
  const uint32_t bits = static_cast<uint32_t>(meta[kScore]);
  std::memcpy(&score, &bits, sizeof(score));
  CHECK_TRUE(score == 1.5f && meta[kLastStep] == 2);
  Table copy(config);
  const ExportChunk all = t.Export(0, 100);
  copy.Import(reinterpret_cast<const uint64_t*>(all.keys.data()), all.keys.size(), all.values.data(),
              all.slots.data(), all.metadata.data(), kSerial);
  CHECK_TRUE(copy.Export(0, 100).metadata == all.metadata);
  for (int s = 0; s < 2; ++s) Step(t);
  // At clock 4: key 2 scores 8/16, key 3 1.5/4, the stepped key 0.
  CHECK_TRUE(t.Evict(kSerial) == 1);
  CHECK_TRUE(!Has(t, 1) && Has(t, 2) && Has(t, 3));
}

// A cap holds the table at max_rows; a full stripe evicts the lowest-ranked of a few
// sampled rows, and the evicted rows' memory holds the new ones.
void TestCapEvictsByRankAndReusesMemory() {
  for (EvictionKind kind : {EvictionKind::kLru, EvictionKind::kLfu}) {
    TableConfig c = Evicting(kind);
    c.eviction.max_rows = 4000;
    Table t(c);
    const auto hot = Keys(1000, 7);
    std::vector<float> out(100000 * 2);
    std::vector<int64_t> many(1000, 50);
    t.FindOrInsert(hot.data(), hot.size(), out.data(), kThreads, many.data());
    int64_t mapped = 0;
    for (int round = 0; round < 20; ++round) {
      const auto cold = Keys(2000, 1000000 + round * 2000);
      // LRU keeps what is seen every round, LFU what is seen often.
      if (kind == EvictionKind::kLru) t.FindOrInsert(hot.data(), hot.size(), out.data(), kThreads);
      t.FindOrInsert(cold.data(), cold.size(), out.data(), kThreads);
      Step(t);
      CHECK_TRUE(t.Size() <= 4000);
      if (round == 5) mapped = t.RowMemoryBytes();
    }
    CHECK_TRUE(t.Size() >= 3900);
    CHECK_TRUE(t.RowMemoryBytes() == mapped);  // churning rows reuse the evicted ones
    int64_t hot_kept = 0;
    for (uint64_t k : hot) hot_kept += Has(t, k);
    CHECK_TRUE(hot_kept >= 950);
    // Every row made is there or was evicted.
    const TableStats stats = t.Stats();
    CHECK_TRUE(stats.evicted == stats.admitted - t.Size() && stats.admitted >= 41000);
  }
}

// Saved sketch cells merge into a table of other stripes and widths: no key's estimate
// falls below what it was, and the keys waiting are counted once however the saved
// stripes and shards are split.
void TestSavedSketchesMergeIntoOtherLayouts() {
  TableConfig wide = Admitting(AdmissionKind::kMinCount, 1 << 20);
  wide.admission.min_count = 1000000;
  wide.log2_stripes = 4;
  TableConfig narrow = wide;
  narrow.log2_stripes = 2;
  narrow.admission.sketch_bytes = 1 << 14;
  TableConfig more = wide;
  more.log2_stripes = 6;
  Table saved(wide), into_fewer(narrow), into_more(more);
  const auto keys = Zipf(20000, 5000, 9);
  std::vector<float> out(keys.size() * 2);
  saved.FindOrInsert(keys.data(), keys.size(), out.data(), kThreads);
  for (int s = 0; s < 16; ++s) {
    const PendingCounts p = saved.PendingOfStripe(s);
    into_fewer.MergePendingSketch(s, 4, p.cells().data(), p.width());
    into_more.MergePendingSketch(s, 4, p.cells().data(), p.width());
  }
  std::map<uint64_t, uint32_t> truth;
  for (uint64_t k : keys) ++truth[k];
  bool never_below = true;
  for (const auto& [key, count] : truth) {
    uint64_t hash = TableHash(key);
    for (Table* t : {&into_fewer, &into_more}) {
      const int stripe = static_cast<int>(hash >> (64 - t->log2_stripes()));
      PendingCounts p = t->PendingOfStripe(stripe);
      never_below &= p.Add(key, 0) >= count;
    }
  }
  CHECK_TRUE(never_below);
  // As shard i of 3 restoring a save of one shard: each holds a third of its keys.
  std::vector<std::unique_ptr<Table>> shards;
  for (int i = 0; i < 3; ++i) shards.push_back(std::make_unique<Table>(more));
  for (int s = 0; s < 16; ++s) {
    const PendingCounts p = saved.PendingOfStripe(s);
    for (auto& shard : shards) shard->MergePendingSketch(s, 4, p.cells().data(), p.width(), 1.0 / 3);
  }
  const int64_t waiting = saved.Stats().pending;
  int64_t split = 0;
  for (const auto& shard : shards) split += shard->Stats().pending;
  CHECK_TRUE(std::abs(waiting - static_cast<int64_t>(truth.size())) < static_cast<int64_t>(truth.size()) / 20);
  for (int64_t restored : {into_fewer.Stats().pending, into_more.Stats().pending, split}) {
    CHECK_TRUE(std::abs(restored - waiting) < waiting / 10);
  }
}

// A shard restored from a saved sketch of every shard's keys counts only its part of them,
// and halvings age the other shards' part as they age the counters: after one, what is
// left is the keys saved with a count of 2 or more, of which its own are a third.
void TestMergedShareAgesWithHalvings() {
  const size_t width = 1 << 14;
  const int n = static_cast<int>(width * 0.45);
  for (double twice : {0.1, 0.5, 0.9}) {  // the share of saved keys seen twice
    PendingCounts saved, restored;
    saved.Configure(width);
    restored.Configure(width);
    for (int i = 0; i < n; ++i) saved.Add(Mix64(i + 1), i < twice * n ? 2 : 1);
    restored.MergeCells(saved.cells().data(), width, 1.0 / 3);
    const int64_t own = std::llround(n / 3.0);
    CHECK_TRUE(std::abs(restored.EstimateKeys() - own) < own / 10);
    // New keys of its own, once each, until the sketch halves.
    for (uint64_t k = 1ull << 40;; ++k) {
      const int64_t estimate = restored.EstimateKeys();
      restored.Add(Mix64(k), 1);
      if (restored.EstimateKeys() < estimate) break;
    }
    const int64_t surviving = std::llround(twice * n / 3);
    CHECK_TRUE(std::abs(restored.EstimateKeys() - surviving) < surviving / 4 + 30);
  }
}

size_t VirtualBytes() {
  long pages = 0;
  std::FILE* f = std::fopen("/proc/self/statm", "r");
  if (f != nullptr) {
    if (std::fscanf(f, "%ld", &pages) != 1) pages = 0;
    std::fclose(f);
  }
  return static_cast<size_t>(pages) * static_cast<size_t>(sysconf(_SC_PAGESIZE));
}

// Under an address-space limit a growing table runs out of memory: the call that cannot
// get it throws AllocationFailure and leaves the table exactly as it was, and the table
// goes on working. Runs in a child process, whose limit the rest of the tests do not share.
void TestOutOfMemoryLeavesTheTableUnchanged() {
#if defined(__SANITIZE_THREAD__)
  return;  // ThreadSanitizer reserves its shadow memory: an address-space limit kills it
#else
  std::fflush(nullptr);
  const pid_t child = fork();
  if (child == 0) {
    TableConfig c = Config(256, OptimizerKind::kAdagrad, InitializerKind::kUniform);
    Table t(c);
    std::vector<float> out(4096 * 256), found(256);
    std::vector<uint64_t> keys(4096);
    ExportChunk chunk;
    chunk.keys.reserve(1024);
    chunk.values.reserve(1024 * 256);
    chunk.slots.reserve(1024 * 256);
    chunk.metadata.reserve(1024 * kNumMetadata);
    // A digest of every row, read through one preallocated chunk: no memory needed.
    auto digest = [&] {
      uint64_t h = 0;
      for (int64_t cursor = 0; cursor >= 0; cursor = chunk.next_cursor) {
        t.ExportInto(cursor, 1024, &chunk);
        for (size_t i = 0; i < chunk.keys.size(); ++i) {
          uint32_t bits[3];
          std::memcpy(&bits[0], &chunk.values[i * 256 + 7], 4);
          std::memcpy(&bits[1], &chunk.slots[i * 256 + 3], 4);
          bits[2] = static_cast<uint32_t>(chunk.metadata[i * kNumMetadata]);
          h += Mix64(static_cast<uint64_t>(chunk.keys[i]) ^ bits[0] ^ (uint64_t{bits[1]} << 32) ^ bits[2]);
        }
      }
      return h;
    };
    rlimit limit{VirtualBytes() + (size_t{96} << 20), RLIM_INFINITY};
    setrlimit(RLIMIT_AS, &limit);
    int64_t failures_seen = 0;
    bool unchanged = true, works = true;
    for (int batch = 0; batch < 200 && failures_seen < 3; ++batch) {
      for (int64_t i = 0; i < 4096; ++i) keys[i] = (static_cast<uint64_t>(batch) << 20 | i) * 0x9e3779b97f4a7c15ULL;
      const int64_t size = t.Size();
      const uint64_t before = digest();
      try {
        t.FindOrInsert(keys.data(), keys.size(), out.data(), kSerial);
      } catch (const AllocationFailure& e) {
        ++failures_seen;
        unchanged &= t.Size() == size && digest() == before && e.bytes() > 0;
        // The table goes on working: a key saved before is found.
        const uint64_t old_key = 0x9e3779b97f4a7c15ULL;
        uint8_t exists = 0;
        t.Find(&old_key, 1, found.data(), &exists, kSerial);
        works &= size == 0 || exists == 1;
      }
    }
    std::_Exit(failures_seen > 0 && unchanged && works ? 0 : 1 + (failures_seen == 0) + 2 * !unchanged + 4 * !works);
  }
  int status = 0;
  waitpid(child, &status, 0);
  CHECK_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::fprintf(stderr, "out-of-memory child: %s %d\n", WIFEXITED(status) ? "exit" : "signal",
                 WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
  }
#endif
}

}  // namespace
}  // namespace tfps

int main() {
  tfps::TestSketchNeverUndercountsAndHalvesWhenHalfFull();
  tfps::TestExactCountsMatchAMap();
  tfps::TestMinCountAdmitsAtTheNthOccurrence();
  tfps::TestProbabilityAdmissionIgnoresBatching();
  tfps::TestMergedShareAgesWithHalvings();
  tfps::TestTtlRemovesRowsUnseenForLonger();
  tfps::TestPacedPoliciesSweepStripesNoLookupReaches();
  tfps::TestTtlInSecondsUsesWhenStepsRan();
  tfps::TestDecayedFrequencyScoresAndRemoves();
  tfps::TestCapEvictsByRankAndReusesMemory();
  tfps::TestSavedSketchesMergeIntoOtherLayouts();
  tfps::TestOutOfMemoryLeavesTheTableUnchanged();
  return tfps::Report("policies_test");
}
