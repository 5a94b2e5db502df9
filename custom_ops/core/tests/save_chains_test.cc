// Plain C++ tests of the table's saves: chains of saves of changes that interleave without
// affecting each other, checked by restoring each chain into a replica table and comparing
// it, row by row, with the table as of that chain's last save; and saves taken while
// training runs, whose every row must be a state that row actually passed through.
#include <algorithm>
#include <array>
#include <atomic>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "custom_ops/core/table.h"
#include "custom_ops/core/tests/test_util.h"

namespace tfps {
namespace {

struct RowState {
  std::vector<float> value, slots;
  std::array<int64_t, kNumMetadata> metadata;
  bool operator==(const RowState& o) const {
    return value == o.value && slots == o.slots && metadata == o.metadata;
  }
};

std::map<int64_t, RowState> Rows(const Table& t) {
  std::map<int64_t, RowState> rows;
  const int dim = t.dim(), slot_width = t.num_slots() * t.dim();
  ExportChunk chunk;
  for (int64_t cursor = 0; cursor >= 0; cursor = chunk.next_cursor) {
    t.ExportInto(cursor, 333, &chunk);
    for (size_t i = 0; i < chunk.keys.size(); ++i) {
      RowState& row = rows[chunk.keys[i]];
      row.value.assign(chunk.values.begin() + i * dim, chunk.values.begin() + (i + 1) * dim);
      row.slots.assign(chunk.slots.begin() + i * slot_width, chunk.slots.begin() + (i + 1) * slot_width);
      std::copy_n(&chunk.metadata[i * kNumMetadata], kNumMetadata, row.metadata.begin());
    }
  }
  return rows;
}

// One save as the save kernel makes it: of changes when the chain allows, else whole.
struct Saved {
  uint64_t save_id = 0;
  bool whole = true;
  uint64_t base_id = 0;
  std::vector<int64_t> keys, removed;
  std::vector<float> values, slots;
  std::vector<int64_t> metadata;
};

Saved Save(Table& t, const std::string& chain, bool changes, uint64_t save_id, int64_t chunk_rows = 7) {
  Table::ChainPoint base;
  const bool of_changes = changes && t.LastSaveOfChain(chain, &base);
  const int64_t stamp = t.BeginSave();
  for (bool whole_after_all = false;; whole_after_all = true) {
    Saved saved;
    saved.save_id = save_id;
    saved.whole = !of_changes || whole_after_all;
    saved.base_id = saved.whole ? 0 : base.save_id;
    ExportChunk chunk;
    bool incomplete = false;
    for (int64_t cursor = 0; cursor >= 0 && !incomplete; cursor = chunk.next_cursor) {
      t.SaveChunk(cursor, chunk_rows, saved.whole ? -1 : base.stamp, &chunk);
      CHECK_TRUE(static_cast<int64_t>(chunk.keys.size()) <= chunk_rows);
      incomplete = chunk.changes_incomplete;
      saved.keys.insert(saved.keys.end(), chunk.keys.begin(), chunk.keys.end());
      saved.removed.insert(saved.removed.end(), chunk.removed.begin(), chunk.removed.end());
      saved.values.insert(saved.values.end(), chunk.values.begin(), chunk.values.end());
      saved.slots.insert(saved.slots.end(), chunk.slots.begin(), chunk.slots.end());
      saved.metadata.insert(saved.metadata.end(), chunk.metadata.begin(), chunk.metadata.end());
    }
    if (incomplete) continue;
    t.RecordChainSave(chain, Table::ChainPoint{save_id, stamp});
    t.RecordState(save_id, stamp);
    return saved;
  }
}

// Restores `saved` into `replica` as the restore kernel does: a whole save replaces every
// row, one of changes removes its removed keys and writes its rows.
void Restore(const Saved& saved, Table* replica) {
  if (saved.whole) {
    replica->Clear();
  } else {
    CHECK_TRUE(replica->EqualsState(saved.base_id));
    replica->Remove(reinterpret_cast<const uint64_t*>(saved.removed.data()),
                    static_cast<int64_t>(saved.removed.size()), kSerial);
  }
  replica->Import(reinterpret_cast<const uint64_t*>(saved.keys.data()),
                  static_cast<int64_t>(saved.keys.size()), saved.values.data(), saved.slots.data(),
                  saved.metadata.data(), kSerial);
  replica->RecordState(saved.save_id, replica->BeginSave());  // as a restore does
}

std::vector<int64_t> Sorted(std::vector<int64_t> v) {
  std::sort(v.begin(), v.end());
  return v;
}

void TestSavesTakeExactlyTheChangesSinceTheChainsLastSave() {
  Table t(Config(2, OptimizerKind::kAdagrad, InitializerKind::kZeros));
  std::vector<uint64_t> keys(200);
  for (size_t i = 0; i < keys.size(); ++i) keys[i] = i * 0x9e3779b97f4a7c15ULL;
  std::vector<float> out(keys.size() * 2), grads(keys.size() * 2, 0.5f);
  t.FindOrInsert(keys.data(), keys.size(), out.data(), kThreads);
  CHECK_TRUE(Save(t, "a", true, 1).whole);  // a chain unknown here starts whole
  CHECK_TRUE(Save(t, "a", false, 2).keys.size() == 200);
  Saved none = Save(t, "a", true, 3);
  CHECK_TRUE(!none.whole && none.base_id == 2 && none.keys.empty());  // nothing changed since
  t.FindOrInsert(keys.data(), 50, out.data(), kThreads);  // a lookup counts: a delta carries it
  CHECK_TRUE(Save(t, "a", true, 4).keys.size() == 50);
  std::vector<int64_t> no_occurrences(50, 0);
  t.FindOrInsert(keys.data(), 50, out.data(), kThreads, no_occurrences.data());
  CHECK_TRUE(Save(t, "a", true, 5).keys.empty());  // one that counts nothing changes nothing
  t.ApplyGradients(keys.data() + 10, 5, grads.data(), -1, kThreads);
  t.Insert(keys.data() + 100, 2, grads.data(), kThreads);
  const uint64_t fresh[2] = {7, 8};
  t.FindOrInsert(fresh, 2, out.data(), kThreads);
  t.Remove(keys.data() + 150, 3, kThreads);
  t.Remove(fresh, 1, kThreads);  // inserted and removed between saves
  const Saved delta = Save(t, "a", true, 6);
  std::vector<int64_t> expected = {8};
  for (int i : {10, 11, 12, 13, 14, 100, 101}) expected.push_back(static_cast<int64_t>(keys[i]));
  CHECK_TRUE(Sorted(delta.keys) == Sorted(expected));
  std::vector<int64_t> removed = {7};
  for (int i : {150, 151, 152}) removed.push_back(static_cast<int64_t>(keys[i]));
  CHECK_TRUE(Sorted(delta.removed) == Sorted(removed));
  const Saved again = Save(t, "a", true, 7);
  CHECK_TRUE(!again.whole && again.keys.empty() && again.removed.empty());
  // A clear leaves no record of the rows it removed: the chain's next save is whole.
  t.Clear();
  t.FindOrInsert(keys.data(), 20, out.data(), kThreads);  // 20 new rows
  Table::ChainPoint point;
  CHECK_TRUE(!t.LastSaveOfChain("a", &point));
  const Saved after_clear = Save(t, "a", true, 8);
  CHECK_TRUE(after_clear.whole && after_clear.keys.size() == 20);
  CHECK_TRUE(Save(t, "a", true, 9).keys.empty());
}

// Three savers of their own (two chains of changes, one of whole saves) and snapshots,
// interleaved in every order with training that looks up, inserts, updates and removes
// rows (and once clears the table): restoring each chain's saves in order always gives the
// table as of that chain's last save, row for row with slots and metadata.
void TestChainsInterleavedInEveryOrderEachRestoreToTheirLastSave() {
  std::array<int, 3> order = {0, 1, 2};
  const std::string names[3] = {"/backups/chief", "/ckpt", "ram://other"};
  int permutation = 0;
  do {
    Table t(Config(3, OptimizerKind::kAdam, InitializerKind::kUniform, /*log2_stripes=*/2));
    std::vector<std::unique_ptr<Table>> replicas;
    for (int i = 0; i < 3; ++i) replicas.push_back(std::make_unique<Table>(t.config()));
    std::mt19937_64 rng(permutation);
    uint64_t next_id = 1;
    int saves_of_changes = 0;
    auto train = [&] {
      std::vector<uint64_t> keys(64);
      for (auto& k : keys) k = rng() % 400;
      std::vector<float> out(keys.size() * 3), grads(keys.size() * 3);
      for (auto& g : grads) g = static_cast<float>(rng() % 100) / 100.0f - 0.5f;
      t.FindOrInsert(keys.data(), 32, out.data(), kSerial);
      t.ApplyGradients(keys.data() + 16, 48, grads.data(), -1, kSerial);
      t.Insert(keys.data() + 40, 4, grads.data(), kSerial);
      t.Remove(keys.data() + 50, 10, kSerial);
    };
    for (int round = 0; round < 6; ++round) {
      if (round == 3) t.Clear();
      for (int saver : order) {
        train();
        const Saved saved = Save(t, names[saver], /*changes=*/saver != 1 && round % 4 != 0, next_id++);
        saves_of_changes += !saved.whole;
        if (round == 3) CHECK_TRUE(saved.whole);
        Restore(saved, replicas[saver].get());
        CHECK_TRUE(Rows(*replicas[saver]) == Rows(t));
        // A snapshot reads every row and belongs to no chain.
        ExportChunk chunk;
        int64_t rows = 0;
        for (int64_t cursor = 0; cursor >= 0; cursor = chunk.next_cursor) {
          t.SaveChunk(cursor, 50, -1, &chunk);
          rows += static_cast<int64_t>(chunk.keys.size());
        }
        CHECK_TRUE(rows == t.Size());
      }
    }
    CHECK_TRUE(saves_of_changes == 6);  // rounds 1, 2 and 5 of the two chains of changes
    ++permutation;
  } while (std::next_permutation(order.begin(), order.end()));
  CHECK_TRUE(permutation == 6);
}

// Removal records beyond the stripe's limit go oldest first: a chain saved before them
// must save whole, one saved after them still saves its changes exactly.
void TestDroppedRemovalRecordsMakeOnlyOlderChainsSaveWhole() {
  Table t(Config(2, OptimizerKind::kSgd, InitializerKind::kZeros, /*log2_stripes=*/0));
  std::vector<uint64_t> keys(6000);
  for (size_t i = 0; i < keys.size(); ++i) keys[i] = i + 1;
  std::vector<float> out(keys.size() * 2);
  t.FindOrInsert(keys.data(), keys.size(), out.data(), kSerial);
  Save(t, "old", false, 1);
  t.Remove(keys.data(), 3000, kSerial);  // over the 1,024 or half-the-rows limit
  Table::ChainPoint point;
  CHECK_TRUE(!t.LastSaveOfChain("old", &point));
  Save(t, "new", false, 2);
  t.Remove(keys.data() + 3000, 10, kSerial);
  CHECK_TRUE(t.LastSaveOfChain("new", &point) && point.save_id == 2);
  const Saved changes = Save(t, "new", true, 3);
  CHECK_TRUE(!changes.whole && changes.keys.empty());
  CHECK_TRUE(Sorted(changes.removed) == std::vector<int64_t>(keys.begin() + 3000, keys.begin() + 3010));
  // The 1,000 records kept for "old" go once its next save moves it past them.
  const int64_t memory_before = t.MemoryBytes();
  CHECK_TRUE(Save(t, "old", true, 4).whole);
  CHECK_TRUE(memory_before - t.MemoryBytes() >= 1000 * 12);
}

// A save of changes gathers rows in batches (to prefetch them); chunks of any size, ending
// inside a batch or between two, must still take each changed row once, with its values.
void TestChangesSavedInChunksOfAnySizeTakeEachChangedRowOnce() {
  Table t(Config(2, OptimizerKind::kSgd, InitializerKind::kZeros, /*log2_stripes=*/0));
  std::vector<uint64_t> keys(1000);
  for (size_t i = 0; i < keys.size(); ++i) keys[i] = i * 0x9e3779b97f4a7c15ULL + 1;
  std::vector<float> out(keys.size() * 2);
  std::map<int64_t, size_t> index_of;
  for (size_t i = 0; i < keys.size(); ++i) index_of[static_cast<int64_t>(keys[i])] = i;
  t.FindOrInsert(keys.data(), keys.size(), out.data(), kSerial);
  uint64_t id = 1;
  for (int64_t max_rows : {1, 7, 15, 16, 17, 33, 1000}) {
    Save(t, "c", false, id++);
    std::vector<uint64_t> changed;
    std::vector<float> values;
    for (size_t i = max_rows % 3; i < keys.size(); i += 3) {
      changed.push_back(keys[i]);
      values.push_back(static_cast<float>(i));
      values.push_back(static_cast<float>(max_rows));
    }
    t.Insert(changed.data(), changed.size(), values.data(), kSerial);
    const Saved saved = Save(t, "c", true, id++, max_rows);
    bool values_match = !saved.whole;
    for (size_t j = 0; j < saved.keys.size(); ++j) {
      const size_t i = index_of.at(saved.keys[j]);
      values_match &= saved.values[2 * j] == static_cast<float>(i) &&
                      saved.values[2 * j + 1] == static_cast<float>(max_rows);
    }
    CHECK_TRUE(Sorted(saved.keys) == Sorted(std::vector<int64_t>(changed.begin(), changed.end())));
    CHECK_TRUE(values_match);
    CHECK_TRUE(Save(t, "c", true, id++).keys.empty());  // the chain moved past those rows
  }
}

// Saves (whole, of changes, snapshots) taken while two threads keep applying the same
// known gradient to the same keys: every saved row, with its slots and step, must equal
// the state a row reaches after some number of those applies (zeros initializer, so every
// key follows one trajectory, computed on a table of its own).
void TestSavesDuringTrainingHoldEachRowAsOfOneMoment() {
  for (OptimizerKind kind : {OptimizerKind::kAdam, OptimizerKind::kAdagrad, OptimizerKind::kSgd}) {
    constexpr int kDim = 4, kKeys = 300, kApplies = 400;
    const TableConfig config = Config(kDim, kind, InitializerKind::kZeros, /*log2_stripes=*/2);
    Table t(config), reference(config);
    std::vector<float> grad(kDim);
    for (int j = 0; j < kDim; ++j) grad[j] = 0.01f * (j + 1);
    std::vector<RowState> trajectory;  // the row after k applies
    const uint64_t probe = 12345;
    std::vector<float> probe_row(kDim);
    reference.FindOrInsert(&probe, 1, probe_row.data(), kSerial);
    for (int k = 0; k <= 2 * kApplies; ++k) {
      RowState state;
      int64_t metadata[kNumMetadata];
      reference.DebugRow(probe, &state.value, &state.slots, metadata);
      std::copy_n(metadata, kNumMetadata, state.metadata.begin());
      trajectory.push_back(state);
      reference.ApplyGradients(&probe, 1, grad.data(), 0, kSerial);
    }
    std::multimap<float, size_t> by_first_value;
    for (size_t k = 0; k < trajectory.size(); ++k) {
      trajectory[k].metadata[kLastStep] = 0;
      trajectory[k].metadata[kCount] = 1;
      by_first_value.emplace(trajectory[k].value[0], k);
    }
    std::vector<uint64_t> keys(kKeys);
    for (int i = 0; i < kKeys; ++i) keys[i] = static_cast<uint64_t>(i) * 7919 + 3;
    std::vector<float> out(kKeys * kDim);
    t.FindOrInsert(keys.data(), kKeys, out.data(), kSerial);
    std::vector<float> grads(kKeys * kDim);
    for (int i = 0; i < kKeys; ++i) std::copy(grad.begin(), grad.end(), grads.begin() + i * kDim);
    std::atomic<int> running{2};
    std::vector<std::thread> appliers;
    for (int th = 0; th < 2; ++th) {
      appliers.emplace_back([&] {
        for (int a = 0; a < kApplies; ++a) t.ApplyGradients(keys.data(), kKeys, grads.data(), 0, kSerial);
        --running;
      });
    }
    int64_t rows_checked = 0, off_trajectory = 0;
    uint64_t id = 1;
    for (int round = 0; running.load() > 0 || round < 3; ++round) {
      const Saved saved = Save(t, "during", round % 3 != 0, id++, 64);
      for (size_t i = 0; i < saved.keys.size(); ++i) {
        RowState row;
        row.value.assign(saved.values.begin() + i * kDim, saved.values.begin() + (i + 1) * kDim);
        const int64_t slot_width = t.num_slots() * kDim;
        row.slots.assign(saved.slots.begin() + i * slot_width, saved.slots.begin() + (i + 1) * slot_width);
        std::copy_n(&saved.metadata[i * kNumMetadata], kNumMetadata, row.metadata.begin());
        row.metadata[kLastStep] = 0;  // the step each apply records, not part of the trajectory
        row.metadata[kCount] = 1;     // the one lookup
        bool found = false;
        for (auto [it, end] = by_first_value.equal_range(row.value[0]); it != end && !found; ++it) {
          found = row == trajectory[it->second];
        }
        off_trajectory += !found;
        ++rows_checked;
      }
    }
    for (auto& th : appliers) th.join();
    CHECK_TRUE(rows_checked > kKeys);
    CHECK_TRUE(off_trajectory == 0);
    // And at the end every row made all 2 * kApplies steps.
    const auto rows = Rows(t);
    bool all_done = rows.size() == static_cast<size_t>(kKeys);
    for (const auto& [key, row] : rows) {
      all_done &= row.value == trajectory.back().value && row.slots == trajectory.back().slots;
    }
    CHECK_TRUE(all_done);
  }
}

}  // namespace
}  // namespace tfps

int main() {
  tfps::TestSavesTakeExactlyTheChangesSinceTheChainsLastSave();
  tfps::TestChainsInterleavedInEveryOrderEachRestoreToTheirLastSave();
  tfps::TestDroppedRemovalRecordsMakeOnlyOlderChainsSaveWhole();
  tfps::TestChangesSavedInChunksOfAnySizeTakeEachChangedRowOnce();
  tfps::TestSavesDuringTrainingHoldEachRowAsOfOneMoment();
  return tfps::Report("save_chains_test");
}
