// The parts of Table that read it out and bring state back: exports, the chunks of a
// checkpoint save with the changes since the last one, and the admission and eviction
// state besides the rows.
#include <algorithm>
#include <mutex>
#include <shared_mutex>
#include <string>

#include "custom_ops/core/row_layout.h"
#include "custom_ops/core/stripe.h"
#include "custom_ops/core/table.h"

namespace tfps {
namespace {

constexpr int kPrefetchRows = 16;

// Empties a chunk's rows, keeping the vectors' capacity.
void ClearChunk(ExportChunk* chunk) {
  chunk->keys.clear();
  chunk->values.clear();
  chunk->slots.clear();
  chunk->metadata.clear();
}

// Appends a row; one whose payload is on disk gets zeros, and its place and disk id go to
// `on_disk` for Table::FillFromDisk.
void AppendRow(const RowView& row, uint64_t disk_id, int dim, int64_t slot_width, ExportChunk* chunk,
               std::vector<std::pair<size_t, uint64_t>>* on_disk) {
  if (row.resident()) {
    chunk->values.insert(chunk->values.end(), row.value, row.value + dim);
    chunk->slots.insert(chunk->slots.end(), row.slots, row.slots + slot_width);
  } else {
    on_disk->emplace_back(chunk->keys.size(), disk_id);
    chunk->values.resize(chunk->values.size() + dim);
    chunk->slots.resize(chunk->slots.size() + slot_width);
  }
  chunk->keys.push_back(static_cast<int64_t>(row.header->key));
  chunk->metadata.push_back(row.header->count);
  chunk->metadata.push_back(row.header->last_step);
  chunk->metadata.push_back(row.optimizer_step != nullptr ? *row.optimizer_step : 0);
  chunk->metadata.push_back(row.score != nullptr ? ScoreToMetadata(*row.score) : 0);
}

}  // namespace

void Table::FillFromDisk(std::vector<std::pair<size_t, uint64_t>>* on_disk, ExportChunk* chunk) const {
  if (on_disk->empty()) return;
  const RowLayout layout = LayoutOf(config_);
  const size_t dim = config_.dim, slot_width = layout.num_slots * dim, floats = layout.PayloadFloats();
  std::vector<uint64_t> ids(on_disk->size());
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = (*on_disk)[i].second;
  std::vector<float> read(ids.size() * floats);
  ReadPayloads(ids, read.data(), /*ascending=*/true);  // rows are appended in row order
  for (size_t i = 0; i < ids.size(); ++i) {
    const size_t at = (*on_disk)[i].first;
    const float* payload = read.data() + i * floats;
    std::copy(payload, payload + dim, chunk->values.begin() + at * dim);
    std::copy(payload + dim, payload + floats, chunk->slots.begin() + at * slot_width);
  }
  payloads_read_ += static_cast<int64_t>(ids.size());
  on_disk->clear();
}

ExportChunk Table::Export(int64_t cursor, int64_t max_rows) const {
  ExportChunk chunk;
  ExportInto(cursor, max_rows, &chunk);
  return chunk;
}

void Table::ExportInto(int64_t cursor, int64_t max_rows, ExportChunk* out) const {
  const RowLayout layout = LayoutOf(config_);
  const int dim = config_.dim;
  const int64_t slot_width = static_cast<int64_t>(layout.num_slots) * dim;
  ExportChunk& chunk = *out;
  ClearChunk(&chunk);
  int64_t s = std::max<int64_t>(0, cursor) >> kCursorRowBits;
  uint64_t r = static_cast<uint64_t>(std::max<int64_t>(0, cursor) & kCursorRowMask);
  const int64_t num_stripes = static_cast<int64_t>(stripes_.size());
  // Payloads on disk are read while their stripe is held, so each row is one moment's.
  std::vector<std::pair<size_t, uint64_t>> on_disk;
  for (; s < num_stripes; ++s, r = 0) {
    const Stripe& stripe = *stripes_[s];
    std::shared_lock<std::shared_mutex> lock(stripe.mu);
    for (; r < stripe.rows_used; ++r) {
      if (!stripe.IsLive(r)) continue;
      if (static_cast<int64_t>(chunk.keys.size()) == max_rows) {
        FillFromDisk(&on_disk, &chunk);
        chunk.next_cursor = (s << kCursorRowBits) | static_cast<int64_t>(r);
        return;
      }
      AppendRow(layout.View(stripe.Row(r, row_bytes_)), stripe.DiskId(r), dim, slot_width, &chunk, &on_disk);
    }
    FillFromDisk(&on_disk, &chunk);
  }
  chunk.next_cursor = -1;
}

int64_t Table::BeginSave() {
  // Wanted before the clock moves: a removal stamped after this save is recorded.
  change_clock_.removals_wanted.store(true);
  return change_clock_.now.fetch_add(1);
}

bool Table::ChangedSince(int64_t stamp) const {
  for (const auto& s : stripes_) {
    std::shared_lock<std::shared_mutex> lock(s->mu);
    if (int64_t{s->last_change} > stamp) return true;
  }
  return false;
}

void Table::RecordState(uint64_t id, int64_t stamp, const std::string& where) {
  std::lock_guard<std::mutex> lock(state_mu_);
  if (id == 0) {  // none known: a restore from files of several saves
    state_.clear();
    return;
  }
  if (ChangedSince(stamp)) return;  // rows changed after this save read them
  if (!state_.empty() && ChangedSince(state_stamp_)) state_.clear();
  if (state_.empty()) {
    state_.push_back({id, where});
    state_stamp_ = stamp;
    return;
  }
  // The first id is the save or restore the rows first equalled (a follower's restore,
  // which the next changes follow): saves beyond the cap replace later ones. Commits may
  // come out of order, so the stamp kept is the oldest, which nothing has changed since.
  if (state_.size() == kMaxStateIds) state_.erase(state_.begin() + 1);
  state_.push_back({id, where});
  state_stamp_ = std::min(state_stamp_, stamp);
}

bool Table::EqualsState(uint64_t id) const {
  std::lock_guard<std::mutex> lock(state_mu_);
  return std::any_of(state_.begin(), state_.end(), [id](const auto& s) { return s.first == id; }) &&
         !ChangedSince(state_stamp_);
}

std::string Table::DescribeState() const {
  std::lock_guard<std::mutex> lock(state_mu_);
  if (state_.empty()) return "has no save or restore it equals";
  std::string saves;
  for (const auto& [id, where] : state_) {
    saves += (saves.empty() ? "" : ", ") + std::to_string(id) + (where.empty() ? "" : " (" + where + ")");
  }
  return ChangedSince(state_stamp_) ? "has changed since its last save or restore, of " + saves
                                    : "equals the save(s) " + saves;
}

bool Table::LastSaveOfChain(const std::string& chain, ChainPoint* point) const {
  {
    std::lock_guard<std::mutex> lock(chains_mu_);
    const auto it = std::find_if(chains_.begin(), chains_.end(),
                                 [&](const ChainRecord& c) { return c.name == chain; });
    if (it == chains_.end()) return false;
    *point = it->point;
  }
  for (const auto& s : stripes_) {
    std::shared_lock<std::shared_mutex> lock(s->mu);
    if (s->removals_lost_through > point->stamp) return false;
  }
  return true;
}

void Table::RecordChainSave(const std::string& chain, const ChainPoint& point) {
  int64_t oldest = point.stamp;
  {
    std::lock_guard<std::mutex> lock(chains_mu_);
    chains_.erase(std::remove_if(chains_.begin(), chains_.end(),
                                 [&](const ChainRecord& c) { return c.name == chain; }),
                  chains_.end());
    if (chains_.size() == kMaxChains) chains_.erase(chains_.begin());
    chains_.push_back(ChainRecord{chain, point});
    for (const ChainRecord& c : chains_) oldest = std::min(oldest, c.point.stamp);
  }
  // Removals no chain kept here can ask for go, so a table saved now and then keeps only
  // the removals since its oldest chain's last save.
  for (auto& s : stripes_) {
    std::unique_lock<std::shared_mutex> lock(s->mu);
    s->ForgetRemovalsThrough(oldest);
  }
}

void Table::SaveChunk(int64_t cursor, int64_t max_rows, int64_t changed_after,
                      ExportChunk* out) const {
  const RowLayout layout = LayoutOf(config_);
  const int dim = config_.dim;
  const int64_t slot_width = static_cast<int64_t>(layout.num_slots) * dim;
  const bool changed_only = changed_after >= 0;
  ExportChunk& chunk = *out;
  ClearChunk(&chunk);
  chunk.removed.clear();
  chunk.changes_incomplete = false;
  int64_t s = std::max<int64_t>(0, cursor) >> kCursorRowBits;
  uint64_t r = static_cast<uint64_t>(std::max<int64_t>(0, cursor) & kCursorRowMask);
  const int64_t num_stripes = static_cast<int64_t>(stripes_.size());
  for (; s < num_stripes; ++s, r = 0) {
    const Stripe& stripe = *stripes_[s];
    std::shared_lock<std::shared_mutex> lock(stripe.mu);
    if (changed_only && r == 0) {
      chunk.changes_incomplete |= stripe.removals_lost_through > changed_after;
      for (size_t i = 0; i < stripe.removed_keys.size(); ++i) {
        if (stripe.removed_stamps[i] > changed_after) {
          chunk.removed.push_back(static_cast<int64_t>(stripe.removed_keys[i]));
        }
      }
    }
    // The rows of a few changes lie far apart, each a cache (and TLB) miss: they are
    // gathered kPrefetchRows at a time and prefetched, so their misses overlap. (A whole
    // save reads rows in order, which the hardware prefetches itself.)
    const int batch_rows = changed_only ? kPrefetchRows : 1;
    uint64_t batch[kPrefetchRows];
    int batched = 0;
    std::vector<std::pair<size_t, uint64_t>> on_disk;
    auto append_batch = [&] {
      for (int i = 0; i < batched; ++i) {
        AppendRow(layout.View(stripe.Row(batch[i], row_bytes_)), stripe.DiskId(batch[i]), dim, slot_width, &chunk,
                  &on_disk);
      }
      batched = 0;
    };
    // Whole words of the live bitmap, and with changes only those with a change after the
    // stamp, so a save of few changes skips the rest.
    for (uint64_t word = r >> 6; word < stripe.live.size(); ++word) {
      if (changed_only && stripe.word_stamps[word] <= changed_after) continue;
      uint64_t bits = stripe.live[word];
      if (word == (r >> 6)) bits &= ~uint64_t{0} << (r & 63);
      for (; bits != 0; bits &= bits - 1) {
        const uint64_t row_number = word * 64 + __builtin_ctzll(bits);
        if (changed_only && !stripe.ChangedAfter(row_number, changed_after)) continue;
        if (static_cast<int64_t>(chunk.keys.size()) + batched == max_rows) {
          append_batch();
          FillFromDisk(&on_disk, &chunk);
          chunk.next_cursor = (s << kCursorRowBits) | static_cast<int64_t>(row_number);
          return;
        }
        if (changed_only) {
          const char* row = stripe.Row(row_number, row_bytes_);
          for (size_t line = 0; line < row_bytes_; line += 64) __builtin_prefetch(row + line);
        }
        batch[batched++] = row_number;
        if (batched == batch_rows) append_batch();
      }
    }
    append_batch();
    FillFromDisk(&on_disk, &chunk);
  }
  chunk.next_cursor = -1;
}

bool Table::DebugRow(uint64_t key, std::vector<float>* value, std::vector<float>* slots,
                     int64_t metadata[kNumMetadata]) const {
  const RowLayout layout = LayoutOf(config_);
  const uint64_t hash = TableHash(key);
  const Stripe& s = *stripes_[StripeOf(hash)];
  std::shared_lock<std::shared_mutex> lock(s.mu);
  const int64_t slot = s.FindSlot(key, hash, row_bytes_);
  if (slot < 0) return false;
  ExportChunk chunk;
  std::vector<std::pair<size_t, uint64_t>> on_disk;
  AppendRow(layout.View(s.Row(s.slot_rows[slot], row_bytes_)), s.DiskId(s.slot_rows[slot]), config_.dim,
            layout.num_slots * config_.dim, &chunk, &on_disk);
  FillFromDisk(&on_disk, &chunk);
  *value = std::move(chunk.values);
  *slots = std::move(chunk.slots);
  std::copy(chunk.metadata.begin(), chunk.metadata.end(), metadata);
  return true;
}

void Table::Counters(int64_t out[kNumCounters]) const {
  out[kAdmitted] = admitted_.load();
  out[kRejected] = rejected_.load();
  out[kEvicted] = evicted_.load();
  out[kSkippedSteps] = skipped_steps_.load();
}

void Table::SetCounters(const int64_t counters[kNumCounters]) {
  admitted_.store(counters[kAdmitted]);
  rejected_.store(counters[kRejected]);
  evicted_.store(counters[kEvicted]);
  skipped_steps_.store(counters[kSkippedSteps]);
}

std::vector<std::pair<int64_t, int64_t>> Table::ClockTimes() const {
  std::lock_guard<std::mutex> lock(clock_times_mu_);
  return clock_times_;
}

void Table::SetClockTimes(const std::vector<std::pair<int64_t, int64_t>>& times) {
  std::lock_guard<std::mutex> lock(clock_times_mu_);
  clock_times_ = times;
}

PendingCounts Table::PendingOfStripe(int stripe) const {
  std::shared_lock<std::shared_mutex> lock(stripes_[stripe]->mu);
  return stripes_[stripe]->pending;
}

void Table::ClearPending() {
  for (auto& s : stripes_) {
    std::unique_lock<std::shared_mutex> lock(s->mu);
    s->pending.Clear();
  }
}

void Table::MergePendingSketch(int saved_stripe, int saved_log2_stripes, const uint16_t* cells,
                               size_t width, double shard_share) {
  if (config_.admission.kind == AdmissionKind::kNone) return;  // a table that admits every key
  // A key's stripe is the top bits of its hash: with more stripes here, the saved stripe's
  // keys spread over several of them; with fewer, several saved stripes share one.
  const int here = config_.log2_stripes;
  const int first = here >= saved_log2_stripes ? saved_stripe << (here - saved_log2_stripes)
                                               : saved_stripe >> (saved_log2_stripes - here);
  const int count = here >= saved_log2_stripes ? 1 << (here - saved_log2_stripes) : 1;
  for (int i = first; i < first + count; ++i) {
    std::unique_lock<std::shared_mutex> lock(stripes_[i]->mu);
    stripes_[i]->pending.MergeCells(cells, width, shard_share / count);
  }
}

void Table::AddPending(const uint64_t* keys, const uint32_t* counts, int64_t n) {
  if (config_.admission.kind == AdmissionKind::kNone) return;  // would hold them for nothing
  for (int64_t i = 0; i < n; ++i) {
    Stripe& s = *stripes_[StripeOf(TableHash(keys[i]))];
    std::unique_lock<std::shared_mutex> lock(s.mu);
    // Room made for calls between reserving and writing stays theirs.
    s.pending.Reserve(s.reserved + 1);
    s.pending.AddExact(keys[i], counts[i]);
  }
}

}  // namespace tfps
