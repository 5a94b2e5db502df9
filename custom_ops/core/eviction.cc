// Eviction inside the table (policies.h): the sweep that every training lookup advances a
// few rows per key (and once per clock tick in every stripe), Table::Evict's sweep of
// everything, the row cap's victims, and the record of when the clock ran that maps a TTL
// in seconds onto steps.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <mutex>
#include <shared_mutex>

#include "custom_ops/core/row_layout.h"
#include "custom_ops/core/stripe.h"
#include "custom_ops/core/table.h"

namespace tfps {
namespace {

// Rows the cap samples for each victim (the lowest-ranked goes).
constexpr int kCapCandidates = 8;
// The sweep visits every row this many times per expiry horizon, so a row outlives its
// expiry by at most 1/kSweepsPerHorizon of the horizon.
constexpr double kSweepsPerHorizon = 16.0;
// The clock record keeps this many samples, one per 1/kClockSamplesPerTtl of the TTL.
constexpr size_t kClockSamples = 256;
constexpr int64_t kClockSamplesPerTtl = 64;

bool Expired(const EvictionConfig& e, const RowView& row, int64_t clock, int64_t ttl_cutoff) {
  const int64_t last = row.header->last_step;
  switch (e.kind) {
    case EvictionKind::kTtl:
      return e.ttl_steps > 0 ? clock - last > e.ttl_steps : last < ttl_cutoff;
    case EvictionKind::kDecayedFrequency:
      return DecayedScore(*row.score, e.decay, last, clock) < e.threshold;
    default:
      return false;
  }
}

int64_t NowMicros() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

int64_t Table::SweepStripe(Stripe& s, uint64_t budget, int64_t clock, int64_t ttl_cutoff) const {
  if (s.rows_used == 0) return 0;
  const RowLayout layout = LayoutOf(config_);
  budget = std::min<uint64_t>(budget, s.rows_used);  // at most one pass
  int64_t removed = 0;
  uint64_t r = s.sweep_cursor < s.rows_used ? s.sweep_cursor : 0;
  for (uint64_t visited = 0; visited < budget;) {
    if (r >= s.rows_used) r = 0;
    const uint64_t word_end = std::min((r | 63) + 1, s.rows_used);
    const uint64_t live = s.live[r >> 6] >> (r & 63);  // no live bits lie past rows_used
    if (live == 0) {
      visited += word_end - r;
      r = word_end;
      continue;
    }
    const uint64_t next = r + __builtin_ctzll(live);
    visited += next - r + 1;
    r = next + 1;
    const RowView row = layout.View(s.Row(next, row_bytes_));
    if (Expired(config_.eviction, row, clock, ttl_cutoff)) {
      const uint64_t key = row.header->key;
      RemoveRow(s, key, TableHash(key));
      ++removed;
    }
  }
  s.sweep_cursor = r;
  return removed;
}

uint64_t Table::SweepBudget(Stripe& s, int64_t keys, int64_t clock) const {
  // The pace follows the clock (or for a TTL in seconds, the time), not the keys: new rows
  // arrive where the sweep stands, so a pace of one row per key looked up only ever
  // revisits the rows just inserted when most keys are new.
  const EvictionConfig& e = config_.eviction;
  double horizon;  // steps (or microseconds) after which an untouched row may go
  int64_t now = clock;
  if (e.kind == EvictionKind::kTtl && e.ttl_steps <= 0) {
    horizon = e.ttl_seconds * 1e6;
    now = NowMicros();
  } else if (e.kind == EvictionKind::kTtl) {
    horizon = static_cast<double>(e.ttl_steps);
  } else if (e.decay < 1.0f && e.threshold > 0.0f && e.threshold < 1.0f) {
    // A row seen once (score 1) falls under the threshold after this many steps.
    horizon = std::log(static_cast<double>(e.threshold)) / std::log(static_cast<double>(e.decay));
  } else {
    // Scores that never decay, or rows that go at their first visit: the traffic's pace.
    return static_cast<uint64_t>(std::max<int64_t>(0, keys));
  }
  if (s.swept_at >= 0 && now > s.swept_at) {
    s.sweep_owed += static_cast<double>(s.rows_used) * static_cast<double>(now - s.swept_at) *
                    kSweepsPerHorizon / std::max(1.0, horizon);
  }
  s.swept_at = std::max(s.swept_at, now);
  const double owed = std::min(s.sweep_owed, static_cast<double>(s.rows_used));
  const uint64_t paced = static_cast<uint64_t>(owed);
  s.sweep_owed = owed - static_cast<double>(paced);
  return std::max<uint64_t>(paced, static_cast<uint64_t>(std::max<int64_t>(0, keys)));
}

void Table::SweepIdleStripes(int64_t clock, int64_t ttl_cutoff, const ParallelFor& parallel_for) {
  // A stripe sweeps where lookups' keys land. Once traffic narrows to a few hot keys, most
  // stripes see none, and without this their expired rows would stay for good.
  int64_t last = idle_stripes_swept_at_.load();
  if (last == clock || !idle_stripes_swept_at_.compare_exchange_strong(last, clock)) return;
  std::atomic<int64_t> removed{0};
  parallel_for(static_cast<int64_t>(stripes_.size()), 200, [&](int64_t s0, int64_t s1) {
    for (int64_t i = s0; i < s1; ++i) {
      Stripe& s = *stripes_[i];
      std::unique_lock<std::shared_mutex> lock(s.mu, std::try_to_lock);
      // A stripe this tick's lookups already swept owes next to nothing.
      if (lock.owns_lock()) removed += SweepStripe(s, SweepBudget(s, 0, clock), clock, ttl_cutoff);
    }
  });
  evicted_ += removed.load();
  FlushAllDoomed();
}

int64_t Table::TtlCutoff() const {
  const double seconds = config_.eviction.ttl_seconds;
  if (config_.eviction.kind != EvictionKind::kTtl || seconds <= 0) return -1;
  const int64_t before = NowMicros() - static_cast<int64_t>(seconds * 1e6);
  std::lock_guard<std::mutex> lock(clock_times_mu_);
  // A row last seen at a step before the clock of a sample older than the TTL is older
  // than the TTL too.
  int64_t cutoff = -1;
  for (const auto& [clock, micros] : clock_times_) {
    if (micros > before) break;
    cutoff = clock;
  }
  return cutoff;
}

void Table::RecordClockTime(int64_t clock) {
  const int64_t now = NowMicros();
  const int64_t every = std::max<int64_t>(
      1, static_cast<int64_t>(config_.eviction.ttl_seconds * 1e6) / kClockSamplesPerTtl);
  std::lock_guard<std::mutex> lock(clock_times_mu_);
  if (!clock_times_.empty() && now - clock_times_.back().second < every) return;
  if (clock_times_.size() == kClockSamples) clock_times_.erase(clock_times_.begin());
  clock_times_.emplace_back(clock, now);
}

void Table::MakeRoomUnderCap(Stripe& s, int64_t clock) {
  while (s.size >= s.max_rows) EvictOneUnderCap(s, clock);
}

void Table::EvictOneUnderCap(Stripe& s, int64_t clock) {
  const RowLayout layout = LayoutOf(config_);
  int64_t victim = -1;
  double lowest = 0;
  for (int sampled = 0, tries = 0; sampled < kCapCandidates && tries < 8 * kCapCandidates; ++tries) {
    const uint64_t r = Stripe::NextSample(&s.sample_state) % s.rows_used;
    if (!s.IsLive(r)) continue;
    ++sampled;
    const double rank = EvictionRank(config_.eviction, layout.View(s.Row(r, row_bytes_)), clock);
    if (victim < 0 || rank < lowest) {
      victim = static_cast<int64_t>(r);
      lowest = rank;
    }
  }
  if (victim < 0) {
    // An arena mostly free (the cap was met after heavy removals): the first live row on.
    uint64_t r = Stripe::NextSample(&s.sample_state) % s.rows_used;
    while (!s.IsLive(r)) r = r + 1 == s.rows_used ? 0 : r + 1;
    victim = static_cast<int64_t>(r);
  }
  const uint64_t key = reinterpret_cast<const RowHeader*>(s.Row(victim, row_bytes_))->key;
  RemoveRow(s, key, TableHash(key));
  ++evicted_;
}

int64_t Table::Evict(const ParallelFor& parallel_for) {
  if (!Sweeps(config_.eviction)) return 0;
  const int64_t clock = apply_calls_.load();
  const int64_t ttl_cutoff = TtlCutoff();
  std::atomic<int64_t> removed{0};
  parallel_for(static_cast<int64_t>(stripes_.size()), 10000, [&](int64_t s0, int64_t s1) {
    for (int64_t i = s0; i < s1; ++i) {
      Stripe& s = *stripes_[i];
      std::unique_lock<std::shared_mutex> lock(s.mu);
      removed += SweepStripe(s, s.rows_used, clock, ttl_cutoff);
    }
  });
  evicted_ += removed.load();
  FlushAllDoomed();
  return removed.load();
}

void Table::FlushAllDoomed() {
  // Only when some stripe has records to delete: sweeps run after every training lookup,
  // and most remove nothing on disk.
  if (!tiered() || !doomed_waiting_.exchange(false)) return;
  // Outside the parallel sweeps, whose threads must not throw.
  for (auto& s : stripes_) {
    std::unique_lock<std::shared_mutex> lock(s->mu);
    FlushDoomed(*s);
  }
}

}  // namespace tfps
