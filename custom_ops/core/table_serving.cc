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

Table::ServingSelection Table::SelectForServing(int64_t min_count) const {
  const RowLayout layout = LayoutOf(config_);
  ServingSelection out;
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
        for (int d = 0; d < config_.dim; ++d) {
          if (std::fabs(row.value[d]) > out.max_abs_value) {
            out.max_abs_value = std::fabs(row.value[d]);
            out.max_abs_key = row.header->key;
          }
        }
      }
    }
  }
  return out;
}

bool Table::SortSelected(const ServingSelection& selection, int s,
                         std::vector<std::pair<uint64_t, uint64_t>>* order) const {
  const Stripe& stripe = *stripes_[s];
  const std::vector<uint64_t>& picked = selection.picked[s];
  order->clear();
  order->reserve(static_cast<size_t>(selection.rows[s]));
  {
    std::shared_lock<std::shared_mutex> lock(stripe.mu);
    for (size_t word = 0; word < picked.size(); ++word) {
      for (uint64_t bits = picked[word]; bits != 0; bits &= bits - 1) {
        const uint64_t r = word * 64 + __builtin_ctzll(bits);
        if (r >= stripe.rows_used) return false;  // cleared or restored since the picks
        order->emplace_back(TableHash(reinterpret_cast<const RowHeader*>(stripe.Row(r, row_bytes_))->key), r);
      }
    }
  }
  std::sort(order->begin(), order->end());
  return true;
}

bool Table::ReadSortedValues(int s, const std::vector<std::pair<uint64_t, uint64_t>>& order,
                             size_t begin, size_t end, float* values) const {
  const RowLayout layout = LayoutOf(config_);
  const int dim = config_.dim;
  const Stripe& stripe = *stripes_[s];
  std::shared_lock<std::shared_mutex> lock(stripe.mu);
  for (size_t i = begin; i < end; ++i) {
    const auto [hash, r] = order[i];
    if (r >= stripe.rows_used) return false;
    const RowView row = layout.View(stripe.Row(r, row_bytes_));
    float* out = values + (i - begin) * dim;
    if (TableHash(row.header->key) == hash) {
      std::memcpy(out, row.value, sizeof(float) * dim);
    } else {
      std::fill(out, out + dim, 0.0f);  // its key went, and another key took the row
    }
  }
  return true;
}

}  // namespace tfps
