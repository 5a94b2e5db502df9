#include "custom_ops/core/table.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <mutex>
#include <shared_mutex>
#include <thread>

#include "custom_ops/core/memory.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace tfps {
namespace {

constexpr uint8_t kEmpty = 0x80;
constexpr uint8_t kDeleted = 0xFE;
constexpr size_t kGroup = 16;
constexpr size_t kMinCapacity = kGroup;
constexpr uint64_t kFirstChunkRows = 16;
constexpr int kCursorRowBits = 40;
constexpr int64_t kCursorRowMask = (int64_t{1} << kCursorRowBits) - 1;

struct RowHeader {
  uint64_t key;
  uint32_t count;
  uint32_t last_step;
};
static_assert(sizeof(RowHeader) == 16, "row header must stay 16 bytes");

// Bit i set where control byte i of the group equals b.
inline uint32_t MatchByte(const uint8_t* group, uint8_t b) {
#if defined(__SSE2__)
  const __m128i ctrl = _mm_load_si128(reinterpret_cast<const __m128i*>(group));
  return static_cast<uint32_t>(_mm_movemask_epi8(_mm_cmpeq_epi8(ctrl, _mm_set1_epi8(static_cast<char>(b)))));
#else
  uint32_t mask = 0;
  for (size_t i = 0; i < kGroup; ++i) mask |= static_cast<uint32_t>(group[i] == b) << i;
  return mask;
#endif
}

// Empty and deleted bytes are exactly those with the top bit set.
inline uint32_t MatchFree(const uint8_t* group) {
#if defined(__SSE2__)
  const __m128i ctrl = _mm_load_si128(reinterpret_cast<const __m128i*>(group));
  return static_cast<uint32_t>(_mm_movemask_epi8(ctrl));
#else
  uint32_t mask = 0;
  for (size_t i = 0; i < kGroup; ++i) mask |= static_cast<uint32_t>(group[i] >> 7) << i;
  return mask;
#endif
}

inline int LowestBit(uint32_t mask) { return __builtin_ctz(mask); }

template <int kWrite = 0>
inline void PrefetchLines(const void* p, size_t bytes) {
  const char* c = static_cast<const char*>(p);
  for (size_t off = 0; off < bytes; off += 64) __builtin_prefetch(c + off, kWrite);
}

inline uint32_t ClampToU32(int64_t v) {
  if (v < 0) return 0;
  if (v > static_cast<int64_t>(UINT32_MAX)) return UINT32_MAX;
  return static_cast<uint32_t>(v);
}

}  // namespace

struct Table::Stripe {
  explicit Stripe(RegionAllocator* row_memory) : row_memory(row_memory) {}

  mutable std::shared_mutex mu;
  RegionAllocator* row_memory;  // the table's; chunks are released with it
  uint8_t* ctrl = nullptr;
  uint32_t* slot_rows = nullptr;
  size_t capacity = 0;
  size_t size = 0;
  size_t tombstones = 0;
  // Row arena: chunk c holds kFirstChunkRows << c rows, so a row number maps to its
  // chunk with one count-leading-zeros and rows never move as the arena grows.
  std::vector<char*> chunks;
  uint64_t rows_used = 0;
  std::vector<uint32_t> free_rows;
  std::vector<uint64_t> live;  // bit per row number

  static uint64_t ChunkRows(size_t c) { return kFirstChunkRows << c; }

  char* Row(uint64_t r, size_t row_bytes) const {
    const uint64_t q = r / kFirstChunkRows + 1;
    const int c = 63 - __builtin_clzll(q);
    const uint64_t first = kFirstChunkRows * ((uint64_t{1} << c) - 1);
    return chunks[c] + (r - first) * row_bytes;
  }
  bool IsLive(uint64_t r) const { return (live[r >> 6] >> (r & 63)) & 1; }

  void ResetIndex(size_t new_capacity) {
    ctrl = static_cast<uint8_t*>(AllocateZeroed(new_capacity));
    std::memset(ctrl, kEmpty, new_capacity);
    slot_rows = static_cast<uint32_t*>(AllocateZeroed(new_capacity * sizeof(uint32_t)));
    capacity = new_capacity;
    tombstones = 0;
  }

  // Frees the index; row chunks go back with the table's RegionAllocator.
  void FreeAll() {
    Deallocate(ctrl, capacity);
    Deallocate(slot_rows, capacity * sizeof(uint32_t));
    chunks.clear();
    std::vector<uint32_t>().swap(free_rows);
    std::vector<uint64_t>().swap(live);
    ctrl = nullptr;
    slot_rows = nullptr;
    capacity = size = tombstones = rows_used = 0;
  }

  // Slot holding `key`, or -1.
  int64_t FindSlot(uint64_t key, uint64_t hash, size_t row_bytes) const {
    const size_t mask = capacity / kGroup - 1;
    const uint8_t h2 = hash & 0x7f;
    size_t g = (hash >> 7) & mask;
    for (size_t probe = 1;; ++probe) {
      const uint8_t* group = ctrl + g * kGroup;
      for (uint32_t m = MatchByte(group, h2); m != 0; m &= m - 1) {
        const size_t slot = g * kGroup + LowestBit(m);
        const auto* header = reinterpret_cast<const RowHeader*>(Row(slot_rows[slot], row_bytes));
        if (header->key == key) return static_cast<int64_t>(slot);
      }
      if (MatchByte(group, kEmpty) != 0) return -1;
      g = (g + probe) & mask;
    }
  }

  void PrefetchGroup(uint64_t hash) const {
    const size_t g = (hash >> 7) & (capacity / kGroup - 1);
    __builtin_prefetch(ctrl + g * kGroup);
    __builtin_prefetch(slot_rows + g * kGroup);
  }

  // Prefetches the first `bytes` of the row of the first hash-fragment match in the key's
  // home group, which is the key's row in nearly every case.
  void PrefetchLikelyRow(uint64_t hash, size_t row_bytes, size_t bytes) const {
    const size_t g = (hash >> 7) & (capacity / kGroup - 1);
    const uint32_t m = MatchByte(ctrl + g * kGroup, hash & 0x7f);
    if (m != 0) PrefetchLines(Row(slot_rows[g * kGroup + LowestBit(m)], row_bytes), bytes);
  }

  // First empty or deleted slot on the probe path of `hash`.
  size_t FreeSlot(uint64_t hash) const {
    const size_t mask = capacity / kGroup - 1;
    size_t g = (hash >> 7) & mask;
    for (size_t probe = 1;; ++probe) {
      const uint32_t m = MatchFree(ctrl + g * kGroup);
      if (m != 0) return g * kGroup + LowestBit(m);
      g = (g + probe) & mask;
    }
  }

  // Rebuilds the index from the row arena, read in address order: far cheaper than
  // chasing each row from the old index, since rows are many times the index's size.
  void Rehash(size_t new_capacity, size_t row_bytes) {
    Deallocate(ctrl, capacity);
    Deallocate(slot_rows, capacity * sizeof(uint32_t));
    ResetIndex(new_capacity);
    for (uint64_t word = 0; word * 64 < rows_used; ++word) {
      for (uint64_t bits = live[word]; bits != 0; bits &= bits - 1) {
        const uint64_t r = word * 64 + __builtin_ctzll(bits);
        const uint64_t hash = TableHash(reinterpret_cast<const RowHeader*>(Row(r, row_bytes))->key);
        const size_t slot = FreeSlot(hash);
        ctrl[slot] = hash & 0x7f;
        slot_rows[slot] = static_cast<uint32_t>(r);
      }
    }
  }

  uint64_t AllocateRow(size_t row_bytes) {
    uint64_t r;
    if (!free_rows.empty()) {
      r = free_rows.back();
      free_rows.pop_back();
    } else {
      r = rows_used++;
      if (r >= kFirstChunkRows * ((uint64_t{1} << chunks.size()) - 1)) {
        const size_t c = chunks.size();
        chunks.push_back(static_cast<char*>(row_memory->Allocate(ChunkRows(c) * row_bytes)));
      }
      if ((r >> 6) >= live.size()) live.resize(live.size() * 2 + 1, 0);
    }
    live[r >> 6] |= uint64_t{1} << (r & 63);
    return r;
  }

  // Row of `key`, inserting an uninitialized one if absent; *inserted says which.
  char* FindOrAddRow(uint64_t key, uint64_t hash, size_t row_bytes, bool* inserted) {
    const int64_t found = FindSlot(key, hash, row_bytes);
    if (found >= 0) {
      *inserted = false;
      return Row(slot_rows[found], row_bytes);
    }
    if ((size + tombstones + 1) * 8 > capacity * 7) {
      // Grow when at least half of the 7/8 budget is live; otherwise only sweep tombstones.
      Rehash(size * 16 >= capacity * 7 ? capacity * 2 : capacity, row_bytes);
    }
    const size_t slot = FreeSlot(hash);
    if (ctrl[slot] == kDeleted) --tombstones;
    const uint64_t r = AllocateRow(row_bytes);
    ctrl[slot] = hash & 0x7f;
    slot_rows[slot] = static_cast<uint32_t>(r);
    ++size;
    *inserted = true;
    char* row = Row(r, row_bytes);
    reinterpret_cast<RowHeader*>(row)->key = key;
    return row;
  }

  bool RemoveKey(uint64_t key, uint64_t hash, size_t row_bytes) {
    const int64_t slot = FindSlot(key, hash, row_bytes);
    if (slot < 0) return false;
    const uint32_t r = slot_rows[slot];
    // A probe stops at the first group with an empty byte, so a slot in such a group can
    // become empty again; elsewhere it must stay a tombstone.
    const uint8_t* group = ctrl + (slot / kGroup) * kGroup;
    if (MatchByte(group, kEmpty) != 0) {
      ctrl[slot] = kEmpty;
    } else {
      ctrl[slot] = kDeleted;
      ++tombstones;
    }
    live[r >> 6] &= ~(uint64_t{1} << (r & 63));
    free_rows.push_back(r);
    --size;
    return true;
  }
};

namespace {

// Visits a stripe's keys in order while the index groups and rows of keys further ahead
// are being fetched, so a lookup waits on memory once per many keys instead of three
// times per key. body(j) handles key j of the batch; prefetch(j) may fetch its own data.
template <typename Body, typename Prefetch>
void PipelinedForEach(const Table::Stripe& s, const StripeBatch& batch, size_t row_bytes,
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
void PipelinedForEach(const Table::Stripe& s, const StripeBatch& batch, size_t row_bytes,
                      size_t row_prefix_bytes, Body&& body) {
  PipelinedForEach(s, batch, row_bytes, row_prefix_bytes, body, [](int64_t) {});
}

struct RowView {
  RowHeader* header;
  float* value;
  float* slots;
  uint32_t* optimizer_step;  // null unless the optimizer keeps a per-row step (Adam)
};

struct RowLayout {
  int dim;
  int num_slots;
  bool has_step;

  RowView View(char* row) const {
    float* value = reinterpret_cast<float*>(row + sizeof(RowHeader));
    float* slots = value + dim;
    uint32_t* step = has_step ? reinterpret_cast<uint32_t*>(slots + dim * num_slots) : nullptr;
    return RowView{reinterpret_cast<RowHeader*>(row), value, slots, step};
  }
};

RowLayout LayoutOf(const TableConfig& config) {
  return RowLayout{config.dim, NumSlots(config.optimizer.kind),
                   config.optimizer.kind == OptimizerKind::kAdam};
}

void InitializeValue(const TableConfig& config, uint64_t key, float* out) {
  InitialRow(config.initializer, config.seed, key, config.dim, out);
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
}

}  // namespace

Table::Table(const TableConfig& config) : config_(config), row_memory_(config.huge_pages) {
  const RowLayout layout = LayoutOf(config);
  const size_t floats =
      static_cast<size_t>(config.dim) * (1 + layout.num_slots) + (layout.has_step ? 1 : 0);
  row_bytes_ = (sizeof(RowHeader) + floats * sizeof(float) + 7) & ~size_t{7};
  const int stripes = 1 << config.log2_stripes;
  stripes_.reserve(stripes);
  for (int i = 0; i < stripes; ++i) {
    stripes_.push_back(std::make_unique<Stripe>(&row_memory_));
    stripes_.back()->ResetIndex(kMinCapacity);
  }
}

Table::~Table() {
  for (auto& s : stripes_) s->FreeAll();
  row_memory_.ReleaseAll();
  ReleaseFreedHeapMemory();
}

template <typename Fn>
void Table::ForEachStripeGroup(const uint64_t* keys, int64_t n, int64_t cost_per_key,
                               const ParallelFor& parallel_for, Fn&& fn) const {
  if (n <= 0) return;
  const int64_t num_stripes = static_cast<int64_t>(stripes_.size());
  const int shift = 64 - config_.log2_stripes;
  std::vector<uint64_t> hashes(n);
  std::vector<int64_t> order(n);
  std::vector<uint64_t> grouped_keys(n), grouped_hashes(n);
  // Stable counting sort by stripe, in blocks so both phases run in parallel.
  const int64_t blocks = std::min<int64_t>(16, (n + 32767) / 32768);
  const int64_t block_size = (n + blocks - 1) / blocks;
  std::vector<int64_t> offsets(blocks * num_stripes, 0);
  parallel_for(blocks, block_size * 10, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      int64_t* count = offsets.data() + b * num_stripes;
      for (int64_t i = b * block_size, end = std::min(n, i + block_size); i < end; ++i) {
        hashes[i] = TableHash(keys[i]);
        ++count[hashes[i] >> shift];
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
        const int64_t pos = next[hashes[i] >> shift]++;
        order[pos] = i;
        grouped_keys[pos] = keys[i];
        grouped_hashes[pos] = hashes[i];
      }
    }
  });
  parallel_for(num_stripes, std::max<int64_t>(1, cost_per_key * n / num_stripes),
               [&](int64_t s0, int64_t s1) {
                 for (int64_t s = s0; s < s1; ++s) {
                   const int64_t begin = stripe_begin[s], end = stripe_begin[s + 1];
                   if (begin < end) {
                     fn(*stripes_[s], StripeBatch{order.data() + begin, grouped_keys.data() + begin,
                                                  grouped_hashes.data() + begin, end - begin});
                   }
                 }
               });
}

void Table::Find(const uint64_t* keys, int64_t n, float* values, uint8_t* exists,
                 const ParallelFor& parallel_for) const {
  const RowLayout layout = LayoutOf(config_);
  const int dim = config_.dim;
  const size_t value_bytes = sizeof(RowHeader) + dim * sizeof(float);
  ForEachStripeGroup(keys, n, 40 + dim, parallel_for,
                     [&](Stripe& s, const StripeBatch& batch) {
    std::shared_lock<std::shared_mutex> lock(s.mu);
    PipelinedForEach(s, batch, row_bytes_, value_bytes, [&](int64_t j) {
      const int64_t i = batch.order[j];
      float* out = values + i * dim;
      const int64_t slot = s.FindSlot(batch.keys[j], batch.hashes[j], row_bytes_);
      if (slot >= 0) {
        std::memcpy(out, layout.View(s.Row(s.slot_rows[slot], row_bytes_)).value,
                    dim * sizeof(float));
      } else {
        InitializeValue(config_, batch.keys[j], out);
      }
      if (exists != nullptr) exists[i] = slot >= 0;
    }, [&](int64_t j) { PrefetchLines<1>(values + batch.order[j] * dim, dim * sizeof(float)); });
  });
}

void Table::FindOrInsert(const uint64_t* keys, int64_t n, float* values,
                         const ParallelFor& parallel_for) {
  const RowLayout layout = LayoutOf(config_);
  const int dim = config_.dim;
  const size_t value_bytes = sizeof(RowHeader) + dim * sizeof(float);
  ForEachStripeGroup(keys, n, 60 + 2 * dim, parallel_for,
                     [&](Stripe& s, const StripeBatch& batch) {
    std::unique_lock<std::shared_mutex> lock(s.mu);
    PipelinedForEach(s, batch, row_bytes_, value_bytes, [&](int64_t j) {
      const int64_t i = batch.order[j];
      bool inserted;
      const RowView row = layout.View(s.FindOrAddRow(batch.keys[j], batch.hashes[j], row_bytes_, &inserted));
      if (inserted) InitializeRow(config_, row);
      std::memcpy(values + i * dim, row.value, dim * sizeof(float));
    }, [&](int64_t j) { PrefetchLines<1>(values + batch.order[j] * dim, dim * sizeof(float)); });
  });
}

bool Table::ApplyGradients(const uint64_t* keys, int64_t n, const float* grads, int64_t step,
                           const ParallelFor& parallel_for) {
  const RowLayout layout = LayoutOf(config_);
  const int dim = config_.dim;
  const int64_t total = n * dim;
  std::atomic<bool> finite{true};
  const int64_t chunk = 1 << 16;
  parallel_for((total + chunk - 1) / chunk, chunk, [&](int64_t c0, int64_t c1) {
    bool ok = true;
    for (int64_t k = c0 * chunk, end = std::min(total, c1 * chunk); k < end; ++k) {
      ok &= std::isfinite(grads[k]);
    }
    if (!ok) finite.store(false, std::memory_order_relaxed);
  });
  if (!finite.load()) return false;
  const uint32_t last_step = ClampToU32(step);
  ForEachStripeGroup(keys, n, 60 + 6 * dim, parallel_for,
                     [&](Stripe& s, const StripeBatch& batch) {
    std::unique_lock<std::shared_mutex> lock(s.mu);
    PipelinedForEach(s, batch, row_bytes_, row_bytes_, [&](int64_t j) {
      const int64_t i = batch.order[j];
      bool inserted;
      const RowView row = layout.View(s.FindOrAddRow(batch.keys[j], batch.hashes[j], row_bytes_, &inserted));
      if (inserted) InitializeRow(config_, row);
      uint32_t opt_step = 1;
      if (row.optimizer_step != nullptr) {
        if (*row.optimizer_step != UINT32_MAX) ++*row.optimizer_step;
        opt_step = *row.optimizer_step;
      }
      ApplyRow(config_.optimizer, dim, grads + i * dim, row.value, row.slots, opt_step);
      if (row.header->count != UINT32_MAX) ++row.header->count;
      row.header->last_step = last_step;
    }, [&](int64_t j) { PrefetchLines(grads + batch.order[j] * dim, dim * sizeof(float)); });
  });
  return true;
}

void Table::Insert(const uint64_t* keys, int64_t n, const float* values,
                   const ParallelFor& parallel_for) {
  const RowLayout layout = LayoutOf(config_);
  const int dim = config_.dim;
  ForEachStripeGroup(keys, n, 60 + 2 * dim, parallel_for,
                     [&](Stripe& s, const StripeBatch& batch) {
    std::unique_lock<std::shared_mutex> lock(s.mu);
    PipelinedForEach(s, batch, row_bytes_, row_bytes_, [&](int64_t j) {
      const int64_t i = batch.order[j];
      bool inserted;
      const RowView row = layout.View(s.FindOrAddRow(batch.keys[j], batch.hashes[j], row_bytes_, &inserted));
      if (inserted) InitializeRow(config_, row);
      std::memcpy(row.value, values + i * dim, dim * sizeof(float));
    });
  });
}

void Table::Import(const uint64_t* keys, int64_t n, const float* values, const float* slots,
                   const int64_t* metadata, const ParallelFor& parallel_for) {
  const RowLayout layout = LayoutOf(config_);
  const int dim = config_.dim;
  const int64_t slot_width = static_cast<int64_t>(layout.num_slots) * dim;
  ForEachStripeGroup(keys, n, 60 + 3 * dim, parallel_for,
                     [&](Stripe& s, const StripeBatch& batch) {
    std::unique_lock<std::shared_mutex> lock(s.mu);
    PipelinedForEach(s, batch, row_bytes_, row_bytes_, [&](int64_t j) {
      const int64_t i = batch.order[j];
      bool inserted;
      const RowView row = layout.View(s.FindOrAddRow(batch.keys[j], batch.hashes[j], row_bytes_, &inserted));
      std::memcpy(row.value, values + i * dim, dim * sizeof(float));
      std::memcpy(row.slots, slots + i * slot_width, slot_width * sizeof(float));
      const int64_t* meta = metadata + i * kNumMetadata;
      row.header->count = ClampToU32(meta[kCount]);
      row.header->last_step = ClampToU32(meta[kLastStep]);
      if (row.optimizer_step != nullptr) *row.optimizer_step = ClampToU32(meta[kOptimizerStep]);
    });
  });
}

int64_t Table::Remove(const uint64_t* keys, int64_t n, const ParallelFor& parallel_for) {
  std::atomic<int64_t> removed{0};
  ForEachStripeGroup(keys, n, 60, parallel_for,
                     [&](Stripe& s, const StripeBatch& batch) {
    std::unique_lock<std::shared_mutex> lock(s.mu);
    int64_t local = 0;
    for (int64_t j = 0; j < batch.count; ++j) {
      local += s.RemoveKey(batch.keys[j], batch.hashes[j], row_bytes_);
    }
    removed += local;
  });
  return removed.load();
}

void Table::Clear() {
  // Row memory is shared by all stripes, so all of them are held while it is released.
  // Other calls take one stripe lock at a time, so taking them all in order cannot deadlock.
  std::vector<std::unique_lock<std::shared_mutex>> locks;
  locks.reserve(stripes_.size());
  for (auto& s : stripes_) locks.emplace_back(s->mu);
  for (auto& s : stripes_) {
    s->FreeAll();
    s->ResetIndex(kMinCapacity);
  }
  row_memory_.ReleaseAll();
}

int64_t Table::Size() const {
  int64_t total = 0;
  for (const auto& s : stripes_) {
    std::shared_lock<std::shared_mutex> lock(s->mu);
    total += static_cast<int64_t>(s->size);
  }
  return total;
}

int64_t Table::MemoryBytes() const {
  int64_t total = 0;
  for (const auto& s : stripes_) {
    std::shared_lock<std::shared_mutex> lock(s->mu);
    total += static_cast<int64_t>(s->capacity * (1 + sizeof(uint32_t)));
    total += static_cast<int64_t>(s->free_rows.capacity() * sizeof(uint32_t) +
                                  s->live.capacity() * sizeof(uint64_t));
  }
  return total + static_cast<int64_t>(row_memory_.MappedBytes());
}

ExportChunk Table::Export(int64_t cursor, int64_t max_rows) const {
  const RowLayout layout = LayoutOf(config_);
  const int dim = config_.dim;
  const int64_t slot_width = static_cast<int64_t>(layout.num_slots) * dim;
  ExportChunk chunk;
  int64_t s = std::max<int64_t>(0, cursor) >> kCursorRowBits;
  uint64_t r = static_cast<uint64_t>(std::max<int64_t>(0, cursor) & kCursorRowMask);
  const int64_t num_stripes = static_cast<int64_t>(stripes_.size());
  for (; s < num_stripes; ++s, r = 0) {
    const Stripe& stripe = *stripes_[s];
    std::shared_lock<std::shared_mutex> lock(stripe.mu);
    for (; r < stripe.rows_used; ++r) {
      if (!stripe.IsLive(r)) continue;
      if (static_cast<int64_t>(chunk.keys.size()) == max_rows) {
        chunk.next_cursor = (s << kCursorRowBits) | static_cast<int64_t>(r);
        return chunk;
      }
      const RowView row = layout.View(stripe.Row(r, row_bytes_));
      chunk.keys.push_back(static_cast<int64_t>(row.header->key));
      chunk.values.insert(chunk.values.end(), row.value, row.value + dim);
      chunk.slots.insert(chunk.slots.end(), row.slots, row.slots + slot_width);
      chunk.metadata.push_back(row.header->count);
      chunk.metadata.push_back(row.header->last_step);
      chunk.metadata.push_back(row.optimizer_step != nullptr ? *row.optimizer_step : 0);
    }
  }
  chunk.next_cursor = -1;
  return chunk;
}

bool Table::DebugRow(uint64_t key, std::vector<float>* value, std::vector<float>* slots,
                     int64_t metadata[kNumMetadata]) const {
  const RowLayout layout = LayoutOf(config_);
  const uint64_t hash = TableHash(key);
  const Stripe& s = *stripes_[hash >> (64 - config_.log2_stripes)];
  std::shared_lock<std::shared_mutex> lock(s.mu);
  const int64_t slot = s.FindSlot(key, hash, row_bytes_);
  if (slot < 0) return false;
  const RowView row = layout.View(s.Row(s.slot_rows[slot], row_bytes_));
  value->assign(row.value, row.value + config_.dim);
  slots->assign(row.slots, row.slots + layout.num_slots * config_.dim);
  metadata[kCount] = row.header->count;
  metadata[kLastStep] = row.header->last_step;
  metadata[kOptimizerStep] = row.optimizer_step != nullptr ? *row.optimizer_step : 0;
  return true;
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

bool ParseOptimizerKind(const std::string& name, OptimizerKind* kind) {
  if (name == "sgd") *kind = OptimizerKind::kSgd;
  else if (name == "adagrad") *kind = OptimizerKind::kAdagrad;
  else if (name == "adam") *kind = OptimizerKind::kAdam;
  else if (name == "ftrl") *kind = OptimizerKind::kFtrl;
  else return false;
  return true;
}

bool ParseInitializerKind(const std::string& name, InitializerKind* kind) {
  if (name == "zeros") *kind = InitializerKind::kZeros;
  else if (name == "uniform") *kind = InitializerKind::kUniform;
  else if (name == "truncated_normal") *kind = InitializerKind::kTruncatedNormal;
  else return false;
  return true;
}

}  // namespace tfps
