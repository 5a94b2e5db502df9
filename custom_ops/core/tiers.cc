// The disk tier of a tiered table (TierConfig): which payloads are in memory, and moving
// them between memory and the DiskStore. Rows (keys and metadata) never move; only a row's
// payload reference changes (row_layout.h), so everything that reads rows by position
// (saves, exports, serving, the eviction sweep) sees every row whichever tier holds its
// payload.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "custom_ops/core/row_layout.h"
#include "custom_ops/core/stripe.h"
#include "custom_ops/core/table.h"

namespace tfps {
namespace {

// Blocks sampled for a payload demoted alone: the lowest-ranked of them goes. A stripe
// over its budget by several takes kBatchCandidates samples per payload at once and
// demotes the lowest-ranked of them all, which costs less per payload and ranks alike.
constexpr int kDemotionCandidates = 8;
constexpr size_t kBatchCandidates = 4;

// Steps of recency a row's payload gains for each doubling of its occurrence count.
constexpr double kStepsPerDoubling = 256.0;

// Which payload goes to disk first: the lowest. The table's eviction policy's rank
// (EvictionRank); a table without one ranks by recency with a bonus for frequency: a
// power-law stream's new IDs are mostly seen once, and by recency alone each would push
// out a hot row seen a step before it.
double DemotionRank(const EvictionConfig& eviction, const RowView& row, int64_t clock) {
  if (eviction.kind != EvictionKind::kNone) return EvictionRank(eviction, row, clock);
  return row.header->last_step + kStepsPerDoubling * std::log2(1.0 + row.header->count);
}

std::string MissingPayload(const DiskStore& store, uint64_t disk_id) {
  return "tfps tiered table: the payload of row " + std::to_string(disk_id & ((uint64_t{1} << 40) - 1)) +
         " of stripe " + std::to_string(disk_id >> 40) + " is missing from its disk tier in " + store.directory();
}

}  // namespace

void Table::LoadPayloads(Stripe& s, const StripeBatch& batch, bool lookup) {
  if (!tiered()) return;
  const RowLayout layout = LayoutOf(config_);
  std::vector<std::pair<char*, uint64_t>> on_disk;  // (row, disk id)
  int64_t found = 0;
  for (int64_t j = 0; j < batch.count; ++j) {
    const int64_t slot = s.FindSlot(batch.keys[j], batch.hashes[j], row_bytes_);
    if (slot < 0) continue;
    char* row = s.Row(s.slot_rows[slot], row_bytes_);
    if (layout.View(row).resident()) {
      ++found;
    } else {
      on_disk.emplace_back(row, s.DiskId(s.slot_rows[slot]));
    }
  }
  if (lookup) {
    lookup_hits_ += found;
    lookup_misses_ += static_cast<int64_t>(on_disk.size());
  }
  if (on_disk.empty()) return;
  // A call may repeat a key: its payload is loaded once.
  std::sort(on_disk.begin(), on_disk.end());
  on_disk.erase(std::unique(on_disk.begin(), on_disk.end()), on_disk.end());
  const size_t floats = layout.PayloadFloats();
  std::vector<uint64_t> ids(on_disk.size());
  for (size_t i = 0; i < on_disk.size(); ++i) ids[i] = on_disk[i].second;
  std::vector<float> read(ids.size() * floats);
  ReadPayloads(ids, read.data());
  for (size_t i = 0; i < on_disk.size(); ++i) {
    float* payload = s.payloads.Take(on_disk[i].first);
    std::memcpy(payload, read.data() + i * floats, floats * sizeof(float));
    *layout.View(on_disk[i].first).payload = reinterpret_cast<uint64_t>(payload) | kOnDisk | kDiskCurrent;
  }
  payloads_read_ += static_cast<int64_t>(on_disk.size());
}

void Table::ReadPayloads(const std::vector<uint64_t>& ids, float* payloads, bool ascending) const {
  if (ids.empty()) return;
  std::vector<uint8_t> found(ids.size());
  const int64_t n = static_cast<int64_t>(ids.size());
  if ((ascending ? store_->GetAscending(n, ids.data(), payloads, found.data())
                 : store_->Get(n, ids.data(), payloads, found.data())) != n) {
    const size_t missing = std::find(found.begin(), found.end(), 0) - found.begin();
    throw DiskStoreError(MissingPayload(*store_, ids[missing]));
  }
}

void Table::CopyValuesFromDisk(const std::vector<std::pair<float*, uint64_t>>& on_disk) const {
  if (on_disk.empty()) return;
  const size_t floats = LayoutOf(config_).PayloadFloats();
  std::vector<uint64_t> ids(on_disk.size());
  for (size_t i = 0; i < on_disk.size(); ++i) ids[i] = on_disk[i].second;
  std::vector<float> read(ids.size() * floats);
  ReadPayloads(ids, read.data());
  for (size_t i = 0; i < on_disk.size(); ++i) {
    std::memcpy(on_disk[i].first, read.data() + i * floats, config_.dim * sizeof(float));
  }
  payloads_read_ += static_cast<int64_t>(on_disk.size());
}

void Table::DemoteOverBudget(Stripe& s) {
  if (!tiered()) return;
  const RowLayout layout = LayoutOf(config_);
  const size_t floats = layout.PayloadFloats();
  const int64_t clock = apply_calls_.load();
  struct Victim {
    char* row;
    uint64_t flags;
  };
  std::vector<Victim> victims;
  std::vector<uint64_t> ids, written_ids;
  std::vector<float> payloads;
  const size_t over = s.payloads.in_use() > s.payload_budget ? s.payloads.in_use() - s.payload_budget : 0;
  victims.reserve(over);
  ids.reserve(over);
  payloads.reserve(over * floats);
  auto demote = [&](float* victim) {
    char* row = const_cast<char*>(PayloadArena::RowOf(victim));
    const RowView view = layout.View(row);
    victims.push_back({row, *view.payload & kPayloadFlags});
    const uint64_t key = view.header->key;
    ids.push_back(s.DiskId(s.slot_rows[s.FindSlot(key, TableHash(key), row_bytes_)]));
    payloads.insert(payloads.end(), victim, victim + floats);
    s.payloads.Give(victim);
    *view.payload = kOnDisk;
  };
  if (over > 1) {
    // Many at once: the lowest-ranked `over` of kBatchCandidates samples per payload to go.
    std::vector<std::pair<double, float*>> candidates;
    const size_t wanted = over * kBatchCandidates;
    candidates.reserve(wanted);
    for (size_t tries = 0; candidates.size() < wanted && tries < 4 * wanted; ++tries) {
      float* candidate = s.payloads.Sample(Stripe::NextSample(&s.demotion_sample_state));
      if (candidate == nullptr) continue;
      candidates.emplace_back(
          DemotionRank(config_.eviction, layout.View(const_cast<char*>(PayloadArena::RowOf(candidate))), clock),
          candidate);
    }
    std::sort(candidates.begin(), candidates.end(), [](const auto& a, const auto& b) { return a.second < b.second; });
    candidates.erase(std::unique(candidates.begin(), candidates.end(),
                                 [](const auto& a, const auto& b) { return a.second == b.second; }),
                     candidates.end());
    const size_t chosen = std::min(over, candidates.size());
    std::nth_element(candidates.begin(), candidates.begin() + chosen, candidates.end());
    for (size_t i = 0; i < chosen; ++i) demote(candidates[i].second);
  }
  while (s.payloads.in_use() > s.payload_budget) {
    float* victim = nullptr;
    double lowest = 0;
    for (int sampled = 0, tries = 0; sampled < kDemotionCandidates && tries < 8 * kDemotionCandidates; ++tries) {
      float* candidate = s.payloads.Sample(Stripe::NextSample(&s.demotion_sample_state));
      if (candidate == nullptr) continue;
      ++sampled;
      const double rank = DemotionRank(config_.eviction,
                                       layout.View(const_cast<char*>(PayloadArena::RowOf(candidate))), clock);
      if (victim == nullptr || rank < lowest) {
        victim = candidate;
        lowest = rank;
      }
    }
    // Blocks mostly free (many rows removed): the first block in use from a random one.
    if (victim == nullptr) victim = s.payloads.InUseFrom(Stripe::NextSample(&s.demotion_sample_state));
    demote(victim);
  }
  // Records of removed rows go first: a row removed and taken by another key in this batch
  // may be among the payloads written now.
  FlushDoomed(s);
  // Rows whose disk record is their payload as it is need no write.
  std::vector<float> written;
  for (size_t i = 0; i < victims.size(); ++i) {
    if (victims[i].flags & kDiskCurrent) continue;
    written_ids.push_back(ids[i]);
    written.insert(written.end(), payloads.begin() + i * floats, payloads.begin() + (i + 1) * floats);
  }
  try {
    if (!written_ids.empty()) store_->Put(static_cast<int64_t>(written_ids.size()), written_ids.data(), written.data());
  } catch (...) {
    // Back into memory (the blocks just given back are taken again, no allocation).
    for (size_t i = 0; i < victims.size(); ++i) {
      float* payload = s.payloads.Take(victims[i].row);
      std::memcpy(payload, payloads.data() + i * floats, floats * sizeof(float));
      *layout.View(victims[i].row).payload = reinterpret_cast<uint64_t>(payload) | victims[i].flags;
    }
    throw;
  }
  payloads_demoted_ += static_cast<int64_t>(victims.size());
}

void Table::FlushDoomed(Stripe& s) {
  if (s.doomed_on_disk.empty()) return;
  std::vector<uint64_t> doomed;
  doomed.swap(s.doomed_on_disk);
  store_->Delete(static_cast<int64_t>(doomed.size()), doomed.data());
}

bool Table::RemoveRow(Stripe& s, uint64_t key, uint64_t hash) const {
  if (tiered()) {
    const int64_t slot = s.FindSlot(key, hash, row_bytes_);
    if (slot < 0) return false;
    const RowView row = LayoutOf(config_).View(s.Row(s.slot_rows[slot], row_bytes_));
    if (row.resident()) s.payloads.Give(row.value);
    if (*row.payload & kOnDisk) {
      try {
        s.doomed_on_disk.push_back(s.DiskId(s.slot_rows[slot]));
        doomed_waiting_.store(true, std::memory_order_relaxed);
      } catch (const std::bad_alloc&) {
        // Removing must not fail: the record stays on disk, read by nothing.
      }
    }
  }
  return s.RemoveKey(key, hash, row_bytes_);
}

}  // namespace tfps
