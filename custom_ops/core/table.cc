#include "custom_ops/core/table.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <exception>
#include <mutex>
#include <shared_mutex>
#include <thread>

#include "custom_ops/core/memory.h"
#include "custom_ops/core/row_layout.h"
#include "custom_ops/core/stripe.h"

namespace tfps {
namespace {

// NaN and Inf are the floats whose exponent bits are all ones. Testing the bits (rather
// than std::isfinite, which compiles to a scalar compare) vectorizes, so the check runs at
// memory speed.
bool AllFinite(const float* x, int64_t n) {
  constexpr uint32_t kExponent = 0x7f800000u;
  uint32_t non_finite = 0;
  for (int64_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, x + i, sizeof(bits));
    non_finite |= static_cast<uint32_t>((bits & kExponent) == kExponent);
  }
  return non_finite == 0;
}

// Writes rows to a call's output. With kStream, by streaming stores, which skip reading
// each line before overwriting it: half the memory traffic of a large output written in
// scattered order (the caller reads the output only after the call). Otherwise each row's
// lines are fetched a few keys ahead and the row is copied.
template <bool kStream>
struct RowWriter {
  static void Prefetch(const float* out, int dim) {
    if (!kStream) PrefetchLines<1>(out, dim * sizeof(float));
  }
  static void Copy(const float* value, int dim, float* out) {
#if defined(__SSE2__)
    // Whole 16-byte pieces (always so with kStream) are copied inline instead of by a
    // memcpy call per row: for narrow rows the call costs more than the copy.
    if (dim % 4 == 0) {
      for (int k = 0; k < dim; k += 4) {
        const __m128 piece = _mm_loadu_ps(value + k);
        if (kStream) {
          _mm_stream_ps(out + k, piece);
        } else {
          _mm_storeu_ps(out + k, piece);
        }
      }
      return;
    }
#endif
    std::memcpy(out, value, dim * sizeof(float));
  }
  // Streaming stores are weakly ordered: fence them before the work item reports done.
  static void Finish() {
#if defined(__SSE2__)
    if (kStream) _mm_sfence();
#endif
  }
};

// Calls fn(RowWriter<true>()) when the output's rows fill whole cache lines, else
// fn(RowWriter<false>()): the choice is made once per call, not per row.
template <typename Fn>
void WithRowWriter(const float* out, int dim, Fn&& fn) {
#if defined(__SSE2__)
  if (dim * sizeof(float) % kCacheLineBytes == 0 &&
      reinterpret_cast<uintptr_t>(out) % kCacheLineBytes == 0) {
    fn(RowWriter<true>());
    return;
  }
#endif
  fn(RowWriter<false>());
}

// Visits a stripe's keys in order while the index groups and rows of keys further ahead
// are being fetched, so a lookup waits on memory once per many keys instead of three
// times per key. body(j) handles key j of the batch; prefetch(j) may fetch its own data.
template <typename Body, typename Prefetch>
void PipelinedForEach(const Stripe& s, const StripeBatch& batch, size_t row_bytes,
                      size_t row_prefix_bytes, Body&& body, Prefetch&& prefetch) {
  constexpr int64_t kGroupAhead = 16, kRowAhead = 8;
  const int64_t count = batch.count;
  for (int64_t j = 0; j < std::min(count, kGroupAhead); ++j) s.PrefetchGroup(batch.hashes[j]);
  for (int64_t j = 0; j < count; ++j) {
    if (j + kGroupAhead < count) s.PrefetchGroup(batch.hashes[j + kGroupAhead]);
    if (j + kRowAhead < count) {
      s.PrefetchLikelyRow(batch.hashes[j + kRowAhead], row_bytes, row_prefix_bytes);
      prefetch(j + kRowAhead);
    }
    body(j);
  }
}

template <typename Body>
void PipelinedForEach(const Stripe& s, const StripeBatch& batch, size_t row_bytes,
                      size_t row_prefix_bytes, Body&& body) {
  PipelinedForEach(s, batch, row_bytes, row_prefix_bytes, body, [](int64_t) {});
}

// PipelinedForEach for a call that writes each key's row to an output: body(j, out) gets
// key j's output row (values + order[j] * dim), which the writer fetches ahead, and the
// writer's stores are fenced once the batch is done.
template <typename Writer, typename Body>
void PipelinedForEachOutputRow(const Stripe& s, const StripeBatch& batch, size_t row_bytes,
                               size_t row_prefix_bytes, float* values, int dim, Body&& body) {
  PipelinedForEach(s, batch, row_bytes, row_prefix_bytes,
                   [&](int64_t j) { body(j, values + batch.order[j] * dim); },
                   [&](int64_t j) { Writer::Prefetch(values + batch.order[j] * dim, dim); });
  Writer::Finish();
}

// Drawing initial values is most of an insert's arithmetic. AVX2, where the CPU has it,
// draws twice as wide with bit-identical results. Dispatched by hand: the load-time
// resolver of target_clones crashes under ThreadSanitizer.
__attribute__((target("avx2"), flatten))
void InitialRowAvx2(const TableConfig& config, uint64_t key, float* out) {
  InitialRow(config.initializer, config.seed, key, config.dim, out);
}

__attribute__((flatten))
void InitialRowBaseline(const TableConfig& config, uint64_t key, float* out) {
  InitialRow(config.initializer, config.seed, key, config.dim, out);
}

void InitializeValue(const TableConfig& config, uint64_t key, float* out) {
  static const bool has_avx2 = __builtin_cpu_supports("avx2");
  if (has_avx2) {
    InitialRowAvx2(config, key, out);
  } else {
    InitialRowBaseline(config, key, out);
  }
}

// Distinct keys among a stripe batch, estimated by linear counting: each hash sets one bit
// of a bitmap (4 bits per hash, at most 64 Ki bits) and the share of bits left clear gives
// the count: within about 1% up to 16 Ki keys per stripe, coarser beyond. A batch repeats
// its hot keys many times over (a third of a 1M-key power-law batch is distinct), and
// sizing the index by the raw count left it up to 10 times too large. It reads the 16 hash
// bits above those the index uses (kIndexHashBits), below the stripe's top log2_stripes
// (8 by default, at most 9 for these bits to stay free).
int64_t EstimateDistinct(const uint64_t* hashes, int64_t n) {
  constexpr int kMaxLog2Bits = 16;
  int log2_bits = 6;
  while (log2_bits < kMaxLog2Bits && (int64_t{1} << log2_bits) < 4 * n) ++log2_bits;
  const int64_t bits = int64_t{1} << log2_bits;
  uint64_t bitmap[(int64_t{1} << kMaxLog2Bits) / 64];
  std::fill(bitmap, bitmap + bits / 64, 0);  // the words in use: a small batch clears 8 bytes
  for (int64_t j = 0; j < n; ++j) {
    const uint64_t bit = (hashes[j] >> kIndexHashBits) & (bits - 1);
    bitmap[bit >> 6] |= uint64_t{1} << (bit & 63);
  }
  int64_t clear = 0;
  for (int64_t w = 0; w < bits / 64; ++w) clear += 64 - __builtin_popcountll(bitmap[w]);
  if (clear == 0) return n;  // saturated: no estimate beyond "all of them"
  const double estimate = static_cast<double>(bits) * std::log(static_cast<double>(bits) / clear);
  return std::min<int64_t>(n, static_cast<int64_t>(estimate * 1.05) + 16);
}

// Fresh row: initial value, initial slots, zero metadata.
void InitializeRow(const TableConfig& config, const RowView& row) {
  row.header->count = 0;
  row.header->last_step = 0;
  InitializeValue(config, row.header->key, row.value);
  const int nslots = NumSlots(config.optimizer.kind);
  for (int s = 0; s < nslots; ++s) {
    const float v = InitialSlotValue(config.optimizer, s);
    std::fill(row.slots + s * config.dim, row.slots + (s + 1) * config.dim, v);
  }
  if (row.optimizer_step != nullptr) *row.optimizer_step = 0;
  if (row.score != nullptr) *row.score = 0.0f;
}

// A training lookup saw the row `seen` times at `clock`: its count and score grow, and it
// was last seen now.
void SeeRow(const EvictionConfig& eviction, const RowView& row, int64_t seen, int64_t clock) {
  row.header->count = static_cast<uint32_t>(
      std::min<int64_t>(int64_t{row.header->count} + seen, UINT32_MAX));
  const uint32_t now = ClampToU32(clock);
  if (row.score != nullptr) {
    *row.score = DecayedScore(*row.score, eviction.decay, row.header->last_step, now) +
                 static_cast<float>(seen);
  }
  row.header->last_step = now;
}

// The row was updated at `step`, its new last-seen step (a score decays up to it first).
void StampRow(const EvictionConfig& eviction, const RowView& row, uint32_t step) {
  if (row.score != nullptr) {
    *row.score = DecayedScore(*row.score, eviction.decay, row.header->last_step, step);
  }
  row.header->last_step = step;
}

// Keys of a batch that may be inserted, for Stripe::PrepareInserts: the estimate of its
// distinct keys sizes the index when they are many for the stripe (a new or young table),
// where a batch that repeats its hot keys many times over (a third of a 1M-key power-law
// batch is distinct) would otherwise size it up to ten times too large.
size_t DistinctKeysToIndex(const Stripe& s, const StripeBatch& batch) {
  if (static_cast<size_t>(batch.count) <= s.size) return static_cast<size_t>(batch.count);
  return static_cast<size_t>(EstimateDistinct(batch.hashes, batch.count));
}

}  // namespace

Table::Table(const TableConfig& config)
    : config_(config), row_bytes_(LayoutOf(config).RowBytes()), row_memory_(config.huge_pages) {
  const int stripes = 1 << config.log2_stripes;
  const AdmissionConfig& admission = config.admission;
  // The sketch's bytes go to the stripes in power-of-two widths of 16-bit counters.
  size_t width = 0;
  if (admission.kind != AdmissionKind::kNone && admission.sketch_bytes > 0) {
    const size_t per_stripe = static_cast<size_t>(admission.sketch_bytes) / stripes /
                              (PendingCounts::kDepth * sizeof(uint16_t));
    width = 64;
    while (width * 2 <= per_stripe) width *= 2;
  }
  const uint64_t max_rows = static_cast<uint64_t>(std::max<int64_t>(0, config.eviction.max_rows));
  stripes_.reserve(stripes);
  for (int i = 0; i < stripes; ++i) {
    stripes_.push_back(std::make_unique<Stripe>(&row_memory_, &change_clock_, i, stripes));
    Stripe& s = *stripes_.back();
    s.ResetIndex(kMinCapacity);
    s.payloads.Configure(LayoutOf(config).PayloadFloats());
    if (admission.kind != AdmissionKind::kNone) s.pending.Configure(width);
    // The cap, split as evenly as whole rows go.
    s.max_rows = max_rows / stripes + (static_cast<uint64_t>(i) < max_rows % stripes ? 1 : 0);
  }
  if (config.eviction.ttl_seconds > 0) RecordClockTime(0);
  if (config.tier.memory_rows > 0) {
    // Split as evenly as whole rows go: a budget below the number of stripes leaves some
    // stripes none, whose payloads all go to disk as each call ends.
    const int64_t budget = config.tier.memory_rows;
    for (int i = 0; i < stripes; ++i) {
      stripes_[i]->payload_budget = static_cast<size_t>(budget / stripes + (i < budget % stripes ? 1 : 0));
    }
    DiskStoreOptions options;
    options.block_cache_bytes = config.tier.cache_bytes;
    store_ = std::make_unique<DiskStore>(config.tier.directory,
                                         LayoutOf(config).PayloadFloats() * sizeof(float), options);
  }
}

Table::~Table() {
  for (auto& s : stripes_) s->FreeAll();
  row_memory_.ReleaseAll();
  ReleaseFreedHeapMemory();
}

template <typename Fn>
void Table::ForEachStripeGroup(const uint64_t* keys, int64_t n, int64_t cost_per_key,
                               bool shared_lock, const ParallelFor& parallel_for, Fn&& fn,
                               bool inserts) const {
  if (n <= 0) return;
  const int64_t num_stripes = static_cast<int64_t>(stripes_.size());
  std::unique_ptr<GroupedKeys> grouped = SharedScratch().Acquire(n);
  int64_t* order = grouped->order.get();
  uint64_t* grouped_keys = grouped->keys.get();
  uint64_t* grouped_hashes = grouped->hashes.get();
  // Stable counting sort by stripe, in blocks so both phases run in parallel.
  const int64_t blocks = std::min<int64_t>(16, (n + 32767) / 32768);
  const int64_t block_size = (n + blocks - 1) / blocks;
  std::vector<int64_t> offsets(blocks * num_stripes, 0);
  parallel_for(blocks, block_size * 10, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      int64_t* count = offsets.data() + b * num_stripes;
      for (int64_t i = b * block_size, end = std::min(n, i + block_size); i < end; ++i) {
        ++count[StripeOf(TableHash(keys[i]))];
      }
    }
  });
  std::vector<int64_t> stripe_begin(num_stripes + 1);
  int64_t running = 0;
  for (int64_t s = 0; s < num_stripes; ++s) {
    stripe_begin[s] = running;
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t c = offsets[b * num_stripes + s];
      offsets[b * num_stripes + s] = running;
      running += c;
    }
  }
  stripe_begin[num_stripes] = running;
  parallel_for(blocks, block_size * 5, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      int64_t* next = offsets.data() + b * num_stripes;
      for (int64_t i = b * block_size, end = std::min(n, i + block_size); i < end; ++i) {
        const uint64_t hash = TableHash(keys[i]);  // recomputing beats storing and reloading
        const int64_t pos = next[StripeOf(hash)]++;
        order[pos] = i;
        grouped_keys[pos] = keys[i];
        grouped_hashes[pos] = hash;
      }
    }
  });
  // Work items are whole stripes, or for readers (which share a stripe's lock) pieces of
  // at most kReaderPiece keys, so a stripe holding a very hot key does not leave the other
  // threads idle.
  constexpr int64_t kReaderPiece = 4096;
  std::vector<StripeBatch> items;
  items.reserve(num_stripes);
  std::vector<Stripe*> item_stripes;
  item_stripes.reserve(num_stripes);
  for (int64_t s = 0; s < num_stripes; ++s) {
    const int64_t end = stripe_begin[s + 1];
    for (int64_t begin = stripe_begin[s]; begin < end;) {
      const int64_t piece_end = shared_lock ? std::min(end, begin + kReaderPiece) : end;
      items.push_back(StripeBatch{order + begin, grouped_keys + begin, grouped_hashes + begin,
                                  piece_end - begin});
      item_stripes.push_back(stripes_[s].get());
      begin = piece_end;
    }
  }
  // Threads take items one at a time instead of the shard ranges parallel_for hands out:
  // its shards are an eighth of the work on two threads, and a thread left with the last
  // shard would run alone while the other waits.
  const int64_t num_items = static_cast<int64_t>(items.size());
  // The pool's threads must not throw: the first error of an item (a disk tier's) is kept
  // and thrown once every item is done.
  std::exception_ptr error;
  std::mutex error_mu;
  auto for_each_item = [&](int64_t cost, auto&& item_fn) {
    std::atomic<int64_t> next_item{0};
    parallel_for(num_items, std::max<int64_t>(1, cost), [&](int64_t, int64_t) {
      for (int64_t i; (i = next_item.fetch_add(1)) < num_items;) {
        try {
          item_fn(i);
        } catch (...) {
          std::lock_guard<std::mutex> lock(error_mu);
          if (!error) error = std::current_exception();
        }
      }
    });
  };
  if (inserts) {
    clear_gate_.WaitWhileClearing();
    // Every stripe makes room first; one that cannot (the pool's threads must not throw)
    // is recorded, and every reservation made is handed back before anything is written.
    std::vector<uint8_t> prepared(num_items, 0);
    std::atomic<int64_t> failed_bytes{0};
    std::atomic<bool> failed{false};
    const bool count_pending = config_.admission.kind != AdmissionKind::kNone;
    for_each_item(200, [&](int64_t i) {
      Stripe& s = *item_stripes[i];
      std::unique_lock<std::shared_mutex> lock(s.mu);
      try {
        s.PrepareInserts(items[i].count, DistinctKeysToIndex(s, items[i]), row_bytes_, count_pending);
        prepared[i] = 1;
        // A batch's keys each get a payload in memory at most (inserted or loaded).
        if (tiered()) s.payloads.Reserve(static_cast<size_t>(items[i].count), s.row_memory);
      } catch (const AllocationFailure& e) {
        failed_bytes.store(e.bytes());
        failed.store(true);
      } catch (const std::bad_alloc&) {
        failed.store(true);
      }
    });
    auto finish = [&](int64_t i) {
      if (!prepared[i]) return;
      std::unique_lock<std::shared_mutex> lock(item_stripes[i]->mu);
      item_stripes[i]->FinishInserts(items[i].count);
    };
    if (failed.load()) {
      for (int64_t i = 0; i < num_items; ++i) finish(i);
      SharedScratch().Release(std::move(grouped));
      throw AllocationFailure(failed_bytes.load() > 0 ? failed_bytes.load() : -1);
    }
    for_each_item(cost_per_key * n / std::max<int64_t>(1, num_items),
                  [&](int64_t i) { fn(*item_stripes[i], items[i]); });
    for_each_item(20, finish);
  } else {
    for_each_item(cost_per_key * n / std::max<int64_t>(1, num_items),
                  [&](int64_t i) { fn(*item_stripes[i], items[i]); });
  }
  SharedScratch().Release(std::move(grouped));
  if (error) std::rethrow_exception(error);
}

RowView Table::AcquireRow(Stripe& s, const StripeBatch& batch, int64_t j, bool touch,
                          int64_t clock, bool* inserted, int64_t slot, bool under_cap) {
  const RowLayout layout = LayoutOf(config_);
  if (slot == kSlotUnknown && s.max_rows > 0 && under_cap) slot = s.FindSlot(batch.keys[j], batch.hashes[j], row_bytes_);
  if (slot >= 0) {
    *inserted = false;
    if (touch) s.Touch(s.slot_rows[slot]);
    return layout.View(s.Row(s.slot_rows[slot], row_bytes_));
  }
  if (slot == kSlotAbsent && s.max_rows > 0 && s.size >= s.max_rows) MakeRoomUnderCap(s, clock);
  char* raw = s.FindOrAddRow(batch.keys[j], batch.hashes[j], row_bytes_, inserted, touch);
  if (*inserted && tiered()) {  // a new row's payload starts in memory, with no disk record
    *reinterpret_cast<uint64_t*>(raw + layout.PayloadReferenceOffset()) =
        reinterpret_cast<uint64_t>(s.payloads.Take(raw));
  }
  const RowView row = layout.View(raw);
  if (*inserted) InitializeRow(config_, row);
  return row;
}

void Table::Find(const uint64_t* keys, int64_t n, float* values, uint8_t* exists,
                 const ParallelFor& parallel_for) const {
  const RowLayout layout = LayoutOf(config_);
  const int dim = config_.dim;
  const size_t value_bytes = sizeof(RowHeader) + dim * sizeof(float);
  WithRowWriter(values, dim, [&](auto writer) {
    using Writer = decltype(writer);
    ForEachStripeGroup(keys, n, 40 + dim, /*shared_lock=*/true, parallel_for,
                       [&](Stripe& s, const StripeBatch& batch) {
      std::shared_lock<std::shared_mutex> lock(s.mu);
      std::vector<std::pair<float*, uint64_t>> on_disk;  // (output, disk id) of payloads on disk
      PipelinedForEachOutputRow<Writer>(s, batch, row_bytes_, value_bytes, values, dim,
                                        [&](int64_t j, float* out) {
        const int64_t slot = s.FindSlot(batch.keys[j], batch.hashes[j], row_bytes_);
        if (slot >= 0) {
          const RowView row = layout.View(s.Row(s.slot_rows[slot], row_bytes_));
          if (row.resident()) {
            Writer::Copy(row.value, dim, out);
          } else {
            on_disk.emplace_back(out, s.DiskId(s.slot_rows[slot]));
          }
        } else {
          InitializeValue(config_, batch.keys[j], out);
        }
        if (exists != nullptr) exists[batch.order[j]] = slot >= 0;
      });
      if (tiered()) {
        lookup_hits_ += batch.count - static_cast<int64_t>(on_disk.size());
        lookup_misses_ += static_cast<int64_t>(on_disk.size());
        CopyValuesFromDisk(on_disk);
      }
    });
  });
}

bool Table::Admits(Stripe& s, uint64_t key, int64_t seen, uint32_t* count) const {
  const AdmissionConfig& admission = config_.admission;
  const uint32_t occurrences = static_cast<uint32_t>(std::min<int64_t>(seen, UINT32_MAX));
  const uint32_t before = s.pending.Add(key, occurrences);
  const uint64_t after = std::min<uint64_t>(uint64_t{before} + occurrences, s.pending.MaxCount());
  bool admit = after >= s.pending.MaxCount();  // a saturated count is frequent enough
  switch (admission.kind) {
    case AdmissionKind::kMinCount:
      admit |= after >= static_cast<uint64_t>(admission.min_count);
      break;
    case AdmissionKind::kProbability:
      // A draw per occurrence, under the stripe's lock: past kMaxAdmissionDraws in one call
      // the key is frequent enough, as a saturated count is.
      admit |= occurrences > kMaxAdmissionDraws;
      for (uint64_t i = before; i < uint64_t{before} + occurrences && !admit; ++i) {
        admit = DrawsAdmission(config_.seed, key, i, admission.probability);
      }
      break;
    case AdmissionKind::kNone:  // not called: every key has a row
      break;
  }
  if (admit) {
    s.pending.Forget(key);
    *count = before;
  }
  return admit;
}

void Table::FindOrInsert(const uint64_t* keys, int64_t n, float* values,
                         const ParallelFor& parallel_for, const int64_t* occurrences,
                         uint8_t* admitted) {
  const int dim = config_.dim;
  const size_t value_bytes = sizeof(RowHeader) + dim * sizeof(float);
  const int64_t clock = apply_calls_.load();
  const bool admits = config_.admission.kind != AdmissionKind::kNone;
  const bool sweeps = Sweeps(config_.eviction);
  const int64_t ttl_cutoff = sweeps ? TtlCutoff() : -1;
  WithRowWriter(values, dim, [&](auto writer) {
    using Writer = decltype(writer);
    ForEachStripeGroup(keys, n, 60 + 2 * dim, /*shared_lock=*/false, parallel_for,
                       [&](Stripe& s, const StripeBatch& batch) {
      std::unique_lock<std::shared_mutex> lock(s.mu);
      LoadPayloads(s, batch, /*lookup=*/true);
      int64_t created = 0, rejected = 0;
      PipelinedForEachOutputRow<Writer>(s, batch, row_bytes_, value_bytes, values, dim,
                                        [&](int64_t j, float* out) {
        const int64_t i = batch.order[j];
        const int64_t seen = occurrences == nullptr ? 1 : std::max<int64_t>(occurrences[i], 0);
        uint32_t pending_count = 0;
        const int64_t slot = admits ? s.FindSlot(batch.keys[j], batch.hashes[j], row_bytes_) : kSlotUnknown;
        if (slot == kSlotAbsent && !Admits(s, batch.keys[j], seen, &pending_count)) {
          InitializeValue(config_, batch.keys[j], out);
          if (admitted != nullptr) admitted[i] = 0;
          rejected += seen;
          return;
        }
        bool inserted;
        // A count that grows is a change the next save of changes must carry.
        const RowView row = AcquireRow(s, batch, j, seen > 0, clock, &inserted, slot);
        if (inserted) {
          row.header->count = pending_count;
          ++created;
        }
        if (seen > 0) SeeRow(config_.eviction, row, seen, clock);
        Writer::Copy(row.value, dim, out);
        if (admitted != nullptr) admitted[i] = 1;
      });
      if (sweeps) evicted_ += SweepStripe(s, SweepBudget(s, batch.count, clock), clock, ttl_cutoff);
      DemoteOverBudget(s);
      admitted_ += created;
      rejected_ += rejected;
    }, /*inserts=*/true);
  });
  if (sweeps) SweepIdleStripes(clock, ttl_cutoff, parallel_for);
}

bool Table::ApplyGradients(const uint64_t* keys, int64_t n, const float* grads, int64_t step,
                           const ParallelFor& parallel_for, float learning_rate) {
  const RowLayout layout = LayoutOf(config_);
  const int dim = config_.dim;
  const int64_t total = n * dim;
  std::atomic<bool> finite{true};
  const int64_t chunk = 1 << 16;
  parallel_for((total + chunk - 1) / chunk, chunk, [&](int64_t c0, int64_t c1) {
    const int64_t begin = c0 * chunk;
    if (!AllFinite(grads + begin, std::min(total, c1 * chunk) - begin)) {
      finite.store(false, std::memory_order_relaxed);
    }
  });
  if (!finite.load()) return false;
  OptimizerConfig optimizer = config_.optimizer;
  if (learning_rate >= 0.0f) optimizer.learning_rate = learning_rate;
  // Under admission, a key without a row was not admitted: its gradient is dropped.
  const bool inserts = config_.admission.kind == AdmissionKind::kNone;
  const int64_t call = apply_calls_.fetch_add(1) + 1;
  const uint32_t last_step = ClampToU32(step < 0 ? call : step);
  const int64_t clock = call - 1;
  auto apply = [&](Stripe& s, const StripeBatch& batch) {
    std::unique_lock<std::shared_mutex> lock(s.mu);
    LoadPayloads(s, batch);
    int64_t created = 0;
    PipelinedForEach(s, batch, row_bytes_, row_bytes_, [&](int64_t j) {
      const int64_t i = batch.order[j];
      RowView row;
      if (inserts) {
        bool inserted;
        row = AcquireRow(s, batch, j, true, clock, &inserted);
        created += inserted;
      } else {
        const int64_t slot = s.FindSlot(batch.keys[j], batch.hashes[j], row_bytes_);
        if (slot < 0) return;
        s.Touch(s.slot_rows[slot]);
        row = layout.View(s.Row(s.slot_rows[slot], row_bytes_));
      }
      uint32_t opt_step = 1;
      if (row.optimizer_step != nullptr) {
        if (*row.optimizer_step != UINT32_MAX) ++*row.optimizer_step;
        opt_step = *row.optimizer_step;
      }
      ApplyRow(optimizer, dim, grads + i * dim, row.value, row.slots, opt_step);
      row.PayloadWritten();
      StampRow(config_.eviction, row, last_step);
    }, [&](int64_t j) { PrefetchLines(grads + batch.order[j] * dim, dim * sizeof(float)); });
    DemoteOverBudget(s);
    admitted_ += created;
  };
  try {
    // A tiered table prepares room even where nothing is inserted: loaded payloads need it.
    ForEachStripeGroup(keys, n, 60 + 6 * dim, /*shared_lock=*/false, parallel_for, apply,
                       inserts || tiered());
  } catch (const std::bad_alloc&) {
    apply_calls_.fetch_sub(1);  // no row changed: neither does the clock
    throw;
  }
  if (config_.eviction.ttl_seconds > 0) RecordClockTime(call);
  return true;
}

template <typename Write>
void Table::WriteRows(const uint64_t* keys, int64_t n, int64_t cost_per_key, bool under_cap,
                      const ParallelFor& parallel_for, Write&& write) {
  const int64_t clock = apply_calls_.load();
  ForEachStripeGroup(keys, n, cost_per_key, /*shared_lock=*/false, parallel_for,
                     [&](Stripe& s, const StripeBatch& batch) {
    std::unique_lock<std::shared_mutex> lock(s.mu);
    LoadPayloads(s, batch);
    PipelinedForEach(s, batch, row_bytes_, row_bytes_, [&](int64_t j) {
      bool inserted;
      const RowView row = AcquireRow(s, batch, j, true, clock, &inserted, kSlotUnknown, under_cap);
      write(row, batch.order[j]);
      row.PayloadWritten();
    });
    DemoteOverBudget(s);
  }, /*inserts=*/true);
}

void Table::Insert(const uint64_t* keys, int64_t n, const float* values,
                   const ParallelFor& parallel_for) {
  const int dim = config_.dim;
  WriteRows(keys, n, 60 + 2 * dim, /*under_cap=*/true, parallel_for, [&](const RowView& row, int64_t i) {
    std::memcpy(row.value, values + i * dim, dim * sizeof(float));
  });
}

void Table::Import(const uint64_t* keys, int64_t n, const float* values, const float* slots,
                   const int64_t* metadata, const ParallelFor& parallel_for) {
  const int dim = config_.dim;
  const int64_t slot_width = static_cast<int64_t>(LayoutOf(config_).num_slots) * dim;
  WriteRows(keys, n, 60 + 3 * dim, /*under_cap=*/false, parallel_for, [&](const RowView& row, int64_t i) {
    std::memcpy(row.value, values + i * dim, dim * sizeof(float));
    std::memcpy(row.slots, slots + i * slot_width, slot_width * sizeof(float));
    const int64_t* meta = metadata + i * kNumMetadata;
    row.header->count = ClampToU32(meta[kCount]);
    row.header->last_step = ClampToU32(meta[kLastStep]);
    if (row.optimizer_step != nullptr) *row.optimizer_step = ClampToU32(meta[kOptimizerStep]);
    if (row.score != nullptr) *row.score = ScoreFromMetadata(meta[kScore]);
  });
}

int64_t Table::Remove(const uint64_t* keys, int64_t n, const ParallelFor& parallel_for) {
  std::atomic<int64_t> removed{0};
  ForEachStripeGroup(keys, n, 60, /*shared_lock=*/false, parallel_for,
                     [&](Stripe& s, const StripeBatch& batch) {
    std::unique_lock<std::shared_mutex> lock(s.mu);
    int64_t local = 0;
    for (int64_t j = 0; j < batch.count; ++j) {
      local += RemoveRow(s, batch.keys[j], batch.hashes[j]);
    }
    removed += local;
    FlushDoomed(s);
  });
  return removed.load();
}

void Table::Reserve(int64_t expected_keys) {
  // Keys spread evenly over the stripes; a little room absorbs the spread.
  const size_t per_stripe =
      static_cast<size_t>(std::max<int64_t>(0, expected_keys) / static_cast<int64_t>(stripes_.size())) * 17 / 16 + 16;
  for (auto& s : stripes_) {
    std::unique_lock<std::shared_mutex> lock(s->mu);
    s->Reserve(per_stripe, row_bytes_);
  }
}

void Table::Clear(bool keep_memory) {
  // Row memory is shared by all stripes, so all of them are held while it is released.
  // Other calls take one stripe lock at a time, so taking them all in order cannot deadlock.
  // A call between making room (PrepareInserts) and writing counts on that room, so the
  // clear waits until no stripe has any reserved, holding back calls that would reserve.
  clear_gate_.Close();
  struct Reopen {
    ClearGate& gate;
    ~Reopen() { gate.Open(); }
  } reopen{clear_gate_};
  std::vector<std::unique_lock<std::shared_mutex>> locks;
  locks.reserve(stripes_.size());
  for (;;) {
    for (auto& s : stripes_) locks.emplace_back(s->mu);
    if (std::none_of(stripes_.begin(), stripes_.end(), [](const auto& s) { return s->reserved > 0; })) break;
    locks.clear();
    std::this_thread::yield();
  }
  // Every stripe's new empty index first, so running out of memory changes nothing.
  std::vector<uint8_t*> ctrls(stripes_.size(), nullptr);
  std::vector<uint32_t*> rows(stripes_.size(), nullptr);
  try {
    for (size_t i = 0; i < stripes_.size(); ++i) {
      ctrls[i] = static_cast<uint8_t*>(AllocateUninitialized(kMinCapacity));
      rows[i] = static_cast<uint32_t*>(AllocateUninitialized(kMinCapacity * sizeof(uint32_t)));
    }
  } catch (...) {
    for (size_t i = 0; i < stripes_.size(); ++i) Stripe::FreeIndexArrays(ctrls[i], rows[i], kMinCapacity);
    throw;
  }
  // What the rows occupy now, which a clear that keeps its memory goes on holding.
  int64_t held_row_bytes = recycled_row_bytes_.load();
  int64_t backed = 0;
  for (const auto& s : stripes_) backed += static_cast<int64_t>(s->rows_backed);
  held_row_bytes = std::max(held_row_bytes, backed * static_cast<int64_t>(row_bytes_ + sizeof(uint32_t)));
  for (size_t i = 0; i < stripes_.size(); ++i) {
    Stripe& s = *stripes_[i];
    s.FreeAll();
    s.spare_ctrl = ctrls[i];
    s.spare_slot_rows = rows[i];
    s.spare_capacity = kMinCapacity;
    s.ResetIndex(kMinCapacity);
  }
  if (keep_memory) {
    recycled_row_bytes_.store(held_row_bytes);
    row_memory_.RecycleAll();
  } else {
    recycled_row_bytes_.store(0);
    row_memory_.ReleaseAll();
  }
  // No record says that every row went: a chain saved before now saves whole next.
  // ... and every save begun before now no longer equals the rows.
  const int64_t now = change_clock_.now.load();
  for (auto& s : stripes_) {
    s->removals_lost_through = now;
    s->NoteChange(static_cast<uint32_t>(now));
  }
  if (tiered()) store_->Clear();
}

template <typename Fn>
int64_t Table::SumOverStripes(Fn&& count) const {
  int64_t total = 0;
  for (const auto& s : stripes_) {
    std::shared_lock<std::shared_mutex> lock(s->mu);
    total += count(*s);
  }
  return total;
}

int64_t Table::Size() const {
  return SumOverStripes([](const Stripe& s) { return static_cast<int64_t>(s.size); });
}

int64_t Table::RowMemoryBytes() const {
  const int64_t backed = SumOverStripes([](const Stripe& s) { return static_cast<int64_t>(s.rows_backed); });
  return std::max(recycled_row_bytes_.load(), backed * static_cast<int64_t>(row_bytes_ + sizeof(uint32_t)));
}

int64_t Table::MemoryBytes() const {
  return RowMemoryBytes() + SumOverStripes([](const Stripe& s) {
    return static_cast<int64_t>(s.capacity * (1 + sizeof(uint32_t)) +
                                s.live.capacity() * sizeof(uint64_t) +
                                s.word_stamps.capacity() * sizeof(uint32_t) +
                                s.removed_keys.capacity() * sizeof(uint64_t) +
                                s.removed_stamps.capacity() * sizeof(uint32_t) +
                                s.pending.MemoryBytes() + s.payloads.MemoryBytes());
  }) + (tiered() ? store_->GetStats().memory_bytes : 0);
}

TableStats Table::Stats() const {
  TableStats stats;
  stats.rows = Size();
  stats.memory_bytes = MemoryBytes();
  stats.row_memory_bytes = RowMemoryBytes();
  stats.clock = ApplyCalls();
  stats.admitted = admitted_.load();
  stats.rejected = rejected_.load();
  stats.evicted = evicted_.load();
  stats.skipped_steps = skipped_steps_.load();
  if (tiered()) {
    stats.rows_in_memory = SumOverStripes([](const Stripe& s) { return static_cast<int64_t>(s.payloads.in_use()); });
    stats.payload_memory_bytes = SumOverStripes([](const Stripe& s) { return static_cast<int64_t>(s.payloads.MemoryBytes()); });
    stats.disk_bytes = store_->GetStats().disk_bytes;
    stats.lookup_hits = lookup_hits_.load();
    stats.lookup_misses = lookup_misses_.load();
    stats.payloads_read = payloads_read_.load();
    stats.payloads_demoted = payloads_demoted_.load();
  } else {
    stats.rows_in_memory = stats.rows;
  }
  if (config_.admission.kind != AdmissionKind::kNone) {
    stats.pending = SumOverStripes([](const Stripe& s) { return s.pending.EstimateKeys(); });
  }
  return stats;
}

int64_t Table::IndexRehashes() const {
  return SumOverStripes([](const Stripe& s) { return static_cast<int64_t>(s.rehashes); });
}

void PopulateInParallel(void* begin, int64_t bytes, const ParallelFor& parallel_for) {
  constexpr int64_t kPiece = int64_t{1} << 22;
  char* base = static_cast<char*>(begin);
  parallel_for((bytes + kPiece - 1) / kPiece, kPiece / 8, [&](int64_t p0, int64_t p1) {
    const int64_t from = p0 * kPiece, to = std::min(bytes, p1 * kPiece);
    PopulateForWrite(base + from, to - from);
  });
}

ParallelFor SerialParallelFor() {
  return [](int64_t total, int64_t, const std::function<void(int64_t, int64_t)>& fn) {
    if (total > 0) fn(0, total);
  };
}

ParallelFor ThreadedParallelFor(int num_threads) {
  return [num_threads](int64_t total, int64_t, const std::function<void(int64_t, int64_t)>& fn) {
    if (total <= 0) return;
    const int64_t parts = std::min<int64_t>(num_threads, total);
    std::vector<std::thread> threads;
    for (int64_t p = 1; p < parts; ++p) {
      threads.emplace_back([&, p] { fn(total * p / parts, total * (p + 1) / parts); });
    }
    fn(0, total / parts);
    for (auto& t : threads) t.join();
  };
}

bool ParseInitializerKind(const std::string& name, InitializerKind* kind) {
  if (name == "zeros") *kind = InitializerKind::kZeros;
  else if (name == "uniform") *kind = InitializerKind::kUniform;
  else if (name == "truncated_normal") *kind = InitializerKind::kTruncatedNormal;
  else return false;
  return true;
}

}  // namespace tfps
