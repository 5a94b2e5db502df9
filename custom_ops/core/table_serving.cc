// The part of Table that serving exports read: the rows picked by occurrence count, one
// stripe at a time in TableHash order.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <mutex>
#include <shared_mutex>
#include <utility>

#include "custom_ops/core/row_layout.h"
#include "custom_ops/core/stripe.h"
#include "custom_ops/core/table.h"

namespace tfps {
namespace {
constexpr size_t kDiskBatch = 4096;  // rows read from the disk tier at once
}  // namespace

Table::ServingSelection Table::SelectForServing(int64_t min_count) const {
  const RowLayout layout = LayoutOf(config_);
  ServingSelection out;
  const auto track_largest = [&](const float* value, uint64_t key) {
    for (int d = 0; d < config_.dim; ++d) {
      if (std::fabs(value[d]) > out.max_abs_value) {
        out.max_abs_value = std::fabs(value[d]);
        out.max_abs_key = key;
      }
    }
  };
  // Rows whose payloads are on disk, read a batch at a time.
  std::vector<std::pair<float*, uint64_t>> on_disk;  // (value, disk id)
  std::vector<uint64_t> on_disk_keys;
  std::vector<float> values;
  const auto read_on_disk = [&] {
    if (on_disk.empty()) return;
    values.resize(on_disk.size() * config_.dim);
    for (size_t i = 0; i < on_disk.size(); ++i) on_disk[i].first = values.data() + i * config_.dim;
    CopyValuesFromDisk(on_disk);
    for (size_t i = 0; i < on_disk.size(); ++i) track_largest(on_disk[i].first, on_disk_keys[i]);
    on_disk.clear();
    on_disk_keys.clear();
  };
  out.picked.resize(stripes_.size());
  out.rows.assign(stripes_.size(), 0);
  for (size_t s = 0; s < stripes_.size(); ++s) {
    const Stripe& stripe = *stripes_[s];
    std::shared_lock<std::shared_mutex> lock(stripe.mu);
    std::vector<uint64_t>& picked = out.picked[s];
    picked.assign(std::min<size_t>(stripe.live.size(), (stripe.rows_used + 63) / 64), 0);
    for (size_t word = 0; word < picked.size(); ++word) {
      for (uint64_t bits = stripe.live[word]; bits != 0; bits &= bits - 1) {
        const uint64_t r = word * 64 + __builtin_ctzll(bits);
        const RowView row = layout.View(stripe.Row(r, row_bytes_));
        if (static_cast<int64_t>(row.header->count) < min_count) continue;
        picked[word] |= uint64_t{1} << (r & 63);
        ++out.rows[s];
        if (row.resident()) {
          track_largest(row.value, row.header->key);
        } else {
          on_disk.emplace_back(nullptr, stripe.DiskId(r));
          on_disk_keys.push_back(row.header->key);
          if (on_disk.size() == kDiskBatch) read_on_disk();
        }
      }
    }
    read_on_disk();  // under the stripe's lock, so each value is one moment's
  }
  return out;
}

bool Table::SortSelected(const ServingSelection& selection, int s,
                         std::vector<std::pair<uint64_t, uint64_t>>* order) const {
  const Stripe& stripe = *stripes_[s];
  const std::vector<uint64_t>& picked = selection.picked[s];
  const size_t rows = static_cast<size_t>(selection.rows[s]);
  // A stripe's hashes share their top log2_stripes bits and are uniform below them: a
  // counting sort on the next bits (about a row per bucket) places each pair near its
  // spot, and sorting each small bucket finishes the order.
  int bucket_bits = 0;
  while (bucket_bits < 24 && (size_t{2} << bucket_bits) <= rows) ++bucket_bits;
  const int shift = 64 - bucket_bits;
  const auto bucket_of = [&](uint64_t hash) {
    return bucket_bits == 0 ? 0 : static_cast<size_t>((hash << config_.log2_stripes) >> shift);
  };
  // ends[b]: first the end of bucket b in `order`; placing a pair moves it down, so once
  // all are placed it is the bucket's start.
  std::vector<uint32_t> ends(size_t{1} << bucket_bits, 0);
  order->resize(rows);
  {
    std::shared_lock<std::shared_mutex> lock(stripe.mu);
    const auto for_each_pick = [&](const auto& fn) {
      for (size_t word = 0; word < picked.size(); ++word) {
        for (uint64_t bits = picked[word]; bits != 0; bits &= bits - 1) {
          const uint64_t r = word * 64 + __builtin_ctzll(bits);
          if (r >= stripe.rows_used) return false;  // cleared or restored since the picks
          fn(TableHash(reinterpret_cast<const RowHeader*>(stripe.Row(r, row_bytes_))->key), r);
        }
      }
      return true;
    };
    if (!for_each_pick([&](uint64_t hash, uint64_t) { ++ends[bucket_of(hash)]; })) return false;
    for (size_t b = 1; b < ends.size(); ++b) ends[b] += ends[b - 1];
    for_each_pick([&](uint64_t hash, uint64_t r) { (*order)[--ends[bucket_of(hash)]] = {hash, r}; });
  }
  for (size_t b = 0; b < ends.size(); ++b) {
    const size_t end = b + 1 < ends.size() ? ends[b + 1] : rows;
    if (end - ends[b] > 1) std::sort(order->begin() + ends[b], order->begin() + end);
  }
  return true;
}

bool Table::ReadSortedValues(int s, const std::vector<std::pair<uint64_t, uint64_t>>& order,
                             size_t begin, size_t end, float* values) const {
  const RowLayout layout = LayoutOf(config_);
  const int dim = config_.dim;
  const Stripe& stripe = *stripes_[s];
  std::shared_lock<std::shared_mutex> lock(stripe.mu);
  std::vector<std::pair<float*, uint64_t>> on_disk;
  for (size_t i = begin; i < end; ++i) {
    const auto [hash, r] = order[i];
    if (r >= stripe.rows_used) return false;
    const RowView row = layout.View(stripe.Row(r, row_bytes_));
    float* out = values + (i - begin) * dim;
    if (TableHash(row.header->key) != hash) {
      std::fill(out, out + dim, 0.0f);  // its key went, and another key took the row
    } else if (row.resident()) {
      std::memcpy(out, row.value, sizeof(float) * dim);
    } else {
      on_disk.emplace_back(out, stripe.DiskId(r));
    }
  }
  CopyValuesFromDisk(on_disk);
  return true;
}

}  // namespace tfps
