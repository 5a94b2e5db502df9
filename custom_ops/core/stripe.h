// One stripe of a Table: a SwissTable-style open-addressing index (control bytes holding
// 7 hash bits, probed 16 at a time) over a row arena whose rows never move, the counts of
// its keys waiting for admission, where its eviction sweep stands, and its record of
// changes for saves (a change stamp per row and per 64 rows, stamped removals). A removed
// row's number is reused from the live bitmap (a free count and a scan cursor), so
// removing never allocates. Calls that may insert first reserve room (PrepareInserts), which is
// where all of an insert's allocation happens: the writes that follow cannot fail. Not
// thread-safe by itself: callers hold `mu`.
#ifndef TFPS_CORE_STRIPE_H_
#define TFPS_CORE_STRIPE_H_

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <new>
#include <shared_mutex>
#include <vector>

#include "custom_ops/core/hashing.h"
#include "custom_ops/core/memory.h"
#include "custom_ops/core/payload_arena.h"
#include "custom_ops/core/pending.h"
#include "custom_ops/core/table.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace tfps {

constexpr uint8_t kEmpty = 0x80;
constexpr uint8_t kDeleted = 0xFE;
constexpr size_t kGroup = 16;
constexpr size_t kMinCapacity = kGroup;
constexpr size_t kMaxLoad32nds = 28;  // the index grows beyond this load
constexpr uint64_t kFirstChunkRows = 16;
// Removals a stripe remembers for saves of changes (12 bytes each): this many, or half the
// stripe's rows if more; past that the older half goes, and a chain whose last save is
// older than what went saves whole instead (a list that long would be as large as a good
// part of the rows it stands for).
constexpr size_t kMinRemovedKeysKept = 1024;
constexpr size_t kBackedPieceBytes = size_t{64} << 10;
// Hash bits the index uses: the control byte's low 7, then HomeGroup's 32. The bits above
// them, up to the stripe's top bits, are free for other uses (EstimateDistinct).
constexpr int kControlHashBits = 7;
constexpr int kIndexHashBits = kControlHashBits + 32;
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
  for (size_t off = 0; off < bytes; off += kCacheLineBytes) __builtin_prefetch(c + off, kWrite);
}

inline uint32_t ClampToU32(int64_t v) {
  if (v < 0) return 0;
  if (v > static_cast<int64_t>(UINT32_MAX)) return UINT32_MAX;
  return static_cast<uint32_t>(v);
}

struct Stripe {
  // Stripes fill at the same pace under well-spread keys, so indexes that all doubled
  // through powers of two would all rebuild in the same call (a stall of a rebuild of the
  // whole table). Each stripe's index instead takes the sizes growth_phase * 2^k groups,
  // with phases spread evenly (in log scale) over [1, 2) across the stripes: while the
  // table doubles, every call rebuilds about the same share of it.
  Stripe(RegionAllocator* row_memory, const ChangeClock* change_clock, int stripe_index,
         int num_stripes)
      : index(static_cast<uint32_t>(stripe_index)),
        row_memory(row_memory),
        change_clock(change_clock),
        growth_phase(std::exp2(static_cast<double>(stripe_index) / num_stripes)),
        sample_state(Mix64(static_cast<uint64_t>(stripe_index) + 1)),
        demotion_sample_state(Mix64(static_cast<uint64_t>(stripe_index) + 0x9e3779b97f4a7c15ULL)) {}

  // A tiered row's name in the disk tier: its stripe and row number, which it keeps for
  // life (rows never move), so a save or export walking rows in order reads the disk in
  // its key order.
  uint64_t DiskId(uint64_t row) const { return (uint64_t{index} << 40) | row; }

  const uint32_t index;
  mutable std::shared_mutex mu;
  RegionAllocator* row_memory;  // the table's; chunks are released with it
  const ChangeClock* change_clock;  // the table's
  const double growth_phase;
  uint8_t* ctrl = nullptr;
  uint32_t* slot_rows = nullptr;
  size_t capacity = 0;
  // Index arrays not in use, for a PrepareInserts whose batch could outgrow the index:
  // growing into them in the middle of the batch needs no memory (uninitialized).
  uint8_t* spare_ctrl = nullptr;
  uint32_t* spare_slot_rows = nullptr;
  size_t spare_capacity = 0;
  size_t size = 0;
  size_t tombstones = 0;
  uint64_t rehashes = 0;  // index rebuilds so far (growth or tombstone cleanup)
  // Row arena: chunk c holds kFirstChunkRows << c rows, so a row number maps to its
  // chunk with one count-leading-zeros and rows never move as the arena grows.
  std::vector<char*> chunks;
  // Whether each chunk's memory was handed out before a clear that kept it: BackRowsFrom
  // does not populate its pages again (which walks their page tables, each time a worker
  // cache empties).
  std::vector<bool> chunk_recycled;
  uint64_t rows_used = 0;
  uint64_t rows_backed = 0;  // rows below this number have their pages populated
  uint64_t free_rows = 0;    // rows below rows_used that are not live
  uint64_t free_cursor = 0;  // where the search for a free row resumes
  std::vector<uint64_t> live;  // bit per row number
  // Keys that calls between their PrepareInserts and their writes may still add.
  size_t reserved = 0;
  size_t max_rows = 0;  // rows this stripe may hold (0: no cap)
  PendingCounts pending;
  uint64_t sweep_cursor = 0;  // the next row the eviction sweep looks at
  // Where the sweep's pace stands: the clock (or for a TTL in seconds, the time) of its
  // last run, and the rows it is owed but has not yet visited (a fraction of a row).
  int64_t swept_at = -1;
  double sweep_owed = 0.0;
  // xorshift states for sampling candidates: the cap's evictions, and a tiered table's
  // demotions (apart, so that tiering never changes which rows the cap evicts).
  uint64_t sample_state;
  uint64_t demotion_sample_state;
  // A tiered table's payloads in memory, and the disk ids whose records the batch under
  // way removed (deleted from the disk when it ends).
  PayloadArena payloads;
  size_t payload_budget = 0;  // its share of TierConfig::memory_rows
  std::vector<uint64_t> doomed_on_disk;
  // Changes for saves of changes: the change clock when each row and each 64 rows (the
  // newest of theirs, so a save of few changes skips the rest) last changed, and the keys
  // removed with the clock when they went, oldest first. A chunk's row stamps follow its
  // rows in the chunk's memory (chunk_stamps[c] points there), so their pages are backed
  // as rows are used, not when a batch that repeats its keys reserves room for them all.
  std::vector<uint32_t*> chunk_stamps;
  std::vector<uint32_t> word_stamps;
  std::vector<uint64_t> removed_keys;
  std::vector<uint32_t> removed_stamps;
  // Removals stamped up to this may have been dropped from the record (-1: none was).
  int64_t removals_lost_through = -1;
  // The newest stamp of any change here, row or removal (written under `mu` exclusively,
  // read under it shared).
  uint32_t last_change = 0;

  // The next draw of the stripe's sampler (xorshift).
  static uint64_t NextSample(uint64_t* state) {
    uint64_t x = *state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    *state = x;
    return x;
  }

  static uint64_t ChunkRows(size_t c) { return kFirstChunkRows << c; }
  static uint64_t ChunkFirstRow(size_t c) { return kFirstChunkRows * ((uint64_t{1} << c) - 1); }
  static size_t ChunkOf(uint64_t r) { return 63 - __builtin_clzll(r / kFirstChunkRows + 1); }

  char* Row(uint64_t r, size_t row_bytes) const {
    const size_t c = ChunkOf(r);
    return chunks[c] + (r - ChunkFirstRow(c)) * row_bytes;
  }
  static bool OverLoaded(size_t used_slots, size_t index_capacity) {
    return used_slots * 32 > index_capacity * kMaxLoad32nds;
  }
  // The next index size of this stripe's sequence after `index_capacity`.
  size_t GrownCapacity(size_t index_capacity) const {
    for (int level = 1;; ++level) {
      const size_t groups = static_cast<size_t>(std::ldexp(growth_phase, level));
      if (groups * kGroup > index_capacity) return groups * kGroup;
    }
  }
  // Group counts need not be powers of two: a hash maps to its home group by a
  // multiply-shift of 32 of its bits, and probing steps through the groups in turn.
  size_t HomeGroup(uint64_t hash) const {
    const uint64_t bits = (hash >> kControlHashBits) & 0xffffffffu;
    return static_cast<size_t>((bits * (capacity / kGroup)) >> 32);
  }
  size_t NextGroup(size_t g) const { return g + 1 == capacity / kGroup ? 0 : g + 1; }
  bool IsLive(uint64_t r) const { return (live[r >> 6] >> (r & 63)) & 1; }
  // Stamps row r as changed now. Callers hold `mu` exclusively; a save holds it (shared)
  // after advancing the clock, so a change it does not see carries a later stamp.
  void Touch(uint64_t r) {
    const uint32_t now = static_cast<uint32_t>(change_clock->now.load());
    RowStamp(r) = now;
    word_stamps[r >> 6] = std::max(word_stamps[r >> 6], now);
    NoteChange(now);
  }
  void NoteChange(uint32_t now) { last_change = std::max(last_change, now); }
  uint32_t& RowStamp(uint64_t r) const {
    const size_t c = ChunkOf(r);
    return chunk_stamps[c][r - ChunkFirstRow(c)];
  }
  bool ChangedAfter(uint64_t r, int64_t stamp) const { return RowStamp(r) > stamp; }
  // Removal records with stamps up to `stamp` go: no chain still needs them.
  void ForgetRemovalsThrough(int64_t stamp) {
    const auto end = std::upper_bound(removed_stamps.begin(), removed_stamps.end(), stamp,
                                      [](int64_t s, uint32_t r) { return s < int64_t{r}; });
    const size_t n = static_cast<size_t>(end - removed_stamps.begin());
    removed_stamps.erase(removed_stamps.begin(), end);
    removed_keys.erase(removed_keys.begin(), removed_keys.begin() + n);
    if (removed_keys.empty()) {  // a long list's memory goes back once no chain needs it
      std::vector<uint64_t>().swap(removed_keys);
      std::vector<uint32_t>().swap(removed_stamps);
    }
  }

  static void FreeIndexArrays(uint8_t* c, uint32_t* rows, size_t slots) {
    Deallocate(c, slots);
    Deallocate(rows, slots * sizeof(uint32_t));
  }

  // Makes `new_capacity` slots the index, emptied: the spare's arrays when it has that
  // many, else fresh ones allocated before the old are freed, so a failed allocation
  // (AllocationFailure) leaves the stripe as it was.
  void ResetIndex(size_t new_capacity) {
    uint8_t* new_ctrl;
    uint32_t* new_slot_rows;
    if (spare_capacity == new_capacity) {
      new_ctrl = spare_ctrl;
      new_slot_rows = spare_slot_rows;
      spare_ctrl = nullptr;
      spare_slot_rows = nullptr;
      spare_capacity = 0;
    } else {
      new_ctrl = static_cast<uint8_t*>(AllocateUninitialized(new_capacity));
      try {
        new_slot_rows = static_cast<uint32_t*>(AllocateUninitialized(new_capacity * sizeof(uint32_t)));
      } catch (...) {
        Deallocate(new_ctrl, new_capacity);
        throw;
      }
    }
    FreeIndexArrays(ctrl, slot_rows, capacity);
    std::memset(new_ctrl, kEmpty, new_capacity);
    ctrl = new_ctrl;
    slot_rows = new_slot_rows;
    capacity = new_capacity;
    tombstones = 0;
  }

  void DropSpare() {
    FreeIndexArrays(spare_ctrl, spare_slot_rows, spare_capacity);
    spare_ctrl = nullptr;
    spare_slot_rows = nullptr;
    spare_capacity = 0;
  }

  // Frees the index; row chunks go back with the table's RegionAllocator.
  void FreeAll() {
    payloads.Reset();
    std::vector<uint64_t>().swap(doomed_on_disk);
    FreeIndexArrays(ctrl, slot_rows, capacity);
    DropSpare();
    chunks.clear();
    chunk_stamps.clear();
    chunk_recycled.clear();
    std::vector<uint64_t>().swap(live);
    std::vector<uint32_t>().swap(word_stamps);
    std::vector<uint64_t>().swap(removed_keys);
    std::vector<uint32_t>().swap(removed_stamps);
    ctrl = nullptr;
    slot_rows = nullptr;
    capacity = size = tombstones = rows_used = rows_backed = free_rows = free_cursor = 0;
    sweep_cursor = 0;
    swept_at = -1;
    sweep_owed = 0.0;
  }

  // Slot holding `key`, or -1.
  int64_t FindSlot(uint64_t key, uint64_t hash, size_t row_bytes) const {
    const uint8_t h2 = hash & 0x7f;
    for (size_t g = HomeGroup(hash);; g = NextGroup(g)) {
      const uint8_t* group = ctrl + g * kGroup;
      for (uint32_t m = MatchByte(group, h2); m != 0; m &= m - 1) {
        const size_t slot = g * kGroup + LowestBit(m);
        const auto* header = reinterpret_cast<const RowHeader*>(Row(slot_rows[slot], row_bytes));
        if (header->key == key) return static_cast<int64_t>(slot);
      }
      if (MatchByte(group, kEmpty) != 0) return -1;
    }
  }

  void PrefetchGroup(uint64_t hash) const {
    const size_t g = HomeGroup(hash);
    __builtin_prefetch(ctrl + g * kGroup);
    __builtin_prefetch(slot_rows + g * kGroup);
  }

  // Prefetches the first `bytes` of the row of the first hash-fragment match in the key's
  // home group, which is the key's row in nearly every case.
  void PrefetchLikelyRow(uint64_t hash, size_t row_bytes, size_t bytes) const {
    const size_t g = HomeGroup(hash);
    const uint32_t m = MatchByte(ctrl + g * kGroup, hash & 0x7f);
    if (m != 0) PrefetchLines(Row(slot_rows[g * kGroup + LowestBit(m)], row_bytes), bytes);
  }

  // First empty or deleted slot on the probe path of `hash`.
  size_t FreeSlot(uint64_t hash) const {
    for (size_t g = HomeGroup(hash);; g = NextGroup(g)) {
      const uint32_t m = MatchFree(ctrl + g * kGroup);
      if (m != 0) return g * kGroup + LowestBit(m);
    }
  }

  // Rebuilds the index from the row arena, read in address order: far cheaper than
  // chasing each row from the old index, since rows are many times the index's size.
  void Rehash(size_t new_capacity, size_t row_bytes) {
    ResetIndex(new_capacity);
    ++rehashes;
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

  // Grows the index once to hold `expected_size` keys, instead of doubling step by step
  // while they arrive.
  void Reserve(size_t expected_size, size_t row_bytes) {
    size_t new_capacity = capacity;
    while (OverLoaded(expected_size + tombstones + 1, new_capacity)) {
      new_capacity = GrownCapacity(new_capacity);
    }
    if (new_capacity != capacity) Rehash(new_capacity, row_bytes);
  }

  // Backs fresh rows a piece at a time (the piece's pages in one call) before the first
  // of them is used: the kernel backs a range faster than it serves a fault per page, and
  // at most one piece per stripe is backed ahead of use. A piece is at most 1/32 of the
  // rows in use, so a stripe whose rows stay level, hovering about a piece's end, backs
  // little beyond them.
  void BackRowsFrom(uint64_t r, size_t row_bytes) {
    const uint64_t chunk_end = ChunkFirstRow(ChunkOf(r) + 1);
    const uint64_t piece = std::min<uint64_t>(kBackedPieceBytes / row_bytes, r / 32);
    const uint64_t end = std::min(chunk_end, r + std::max<uint64_t>(1, piece));
    // Memory handed out before a clear that kept it is backed already.
    if (!chunk_recycled[ChunkOf(r)]) PopulateForWrite(Row(r, row_bytes), (end - r) * row_bytes);
    rows_backed = end;
  }

  // The first free row at or after free_cursor, wrapping (free_rows > 0).
  uint64_t FindFreeRow() const {
    const uint64_t words = (rows_used + 63) / 64;
    uint64_t word = free_cursor >> 6;
    uint64_t clear = ~live[word] & (~uint64_t{0} << (free_cursor & 63));
    for (;;) {
      if (word + 1 == words && (rows_used & 63) != 0) clear &= (uint64_t{1} << (rows_used & 63)) - 1;
      if (clear != 0) return word * 64 + __builtin_ctzll(clear);
      word = word + 1 == words ? 0 : word + 1;
      clear = ~live[word];
    }
  }

  // A row number for a new row: a free one, or the next unused one, whose chunk and bitmap
  // words PrepareInserts has made.
  uint64_t AllocateRow(size_t row_bytes) {
    uint64_t r;
    if (free_rows > 0) {
      r = FindFreeRow();
      --free_rows;
      free_cursor = r + 1 < rows_used ? r + 1 : 0;
    } else {
      r = rows_used++;
      if (r >= rows_backed) BackRowsFrom(r, row_bytes);
    }
    live[r >> 6] |= uint64_t{1} << (r & 63);
    Touch(r);
    return r;
  }

  // The smallest index size of this stripe's sequence that holds `keys` keys.
  size_t CapacityFor(size_t keys) const {
    size_t fit = kMinCapacity;
    while (OverLoaded(keys, fit)) fit = GrownCapacity(fit);
    return fit;
  }

  // Makes room, before any write, for up to `keys` more keys and rows on top of what other
  // calls have reserved, so the writes that follow never need memory: the index is grown
  // now for `index_keys` of them (an estimate of the distinct ones) at its usual load,
  // and if all `keys` could overload it, a spare index that holds them is set aside.
  // Throws AllocationFailure (or std::bad_alloc) when memory runs out, the stripe's
  // contents unchanged.
  void PrepareInserts(size_t keys, size_t index_keys, size_t row_bytes, bool count_pending) {
    const size_t live_keys = size + reserved;
    if (OverLoaded(live_keys + tombstones + index_keys, capacity)) {
      size_t target = std::max(capacity, CapacityFor(live_keys + index_keys));
      // Sweeping tombstones in place only while live keys leave a quarter of the budget,
      // so a stripe refilled after removals keeps its index; otherwise grow.
      if (target == capacity && (live_keys + index_keys) * 32 * 4 > capacity * kMaxLoad32nds * 3) {
        target = GrownCapacity(capacity);
      }
      Rehash(target, row_bytes);
    }
    if (OverLoaded(live_keys + tombstones + keys, capacity)) {
      const size_t spare = std::max(GrownCapacity(capacity), CapacityFor(live_keys + keys));
      if (spare_capacity < spare) {
        uint8_t* c = static_cast<uint8_t*>(AllocateUninitialized(spare));
        uint32_t* rows = nullptr;
        try {
          rows = static_cast<uint32_t*>(AllocateUninitialized(spare * sizeof(uint32_t)));
        } catch (...) {
          Deallocate(c, spare);
          throw;
        }
        DropSpare();
        spare_ctrl = c;
        spare_slot_rows = rows;
        spare_capacity = spare;
      }
    }
    const uint64_t fresh_rows = reserved + keys > free_rows ? reserved + keys - free_rows : 0;
    const uint64_t rows_needed = rows_used + fresh_rows;
    while (ChunkFirstRow(chunks.size()) < rows_needed) {
      chunks.reserve(chunks.size() + 1);
      chunk_stamps.reserve(chunks.size() + 1);
      chunk_recycled.reserve(chunks.size() + 1);
      const uint64_t rows = ChunkRows(chunks.size());
      bool recycled = false;
      char* chunk = static_cast<char*>(row_memory->Allocate(rows * (row_bytes + sizeof(uint32_t)), &recycled));
      chunks.push_back(chunk);
      chunk_stamps.push_back(reinterpret_cast<uint32_t*>(chunk + rows * row_bytes));
      chunk_recycled.push_back(recycled);
    }
    const size_t words = (rows_needed + 63) / 64;
    if (words > live.size()) {
      // All reserved first: a failed reservation leaves the bitmaps as they were.
      const size_t grown = std::max(words, live.size() * 2);
      word_stamps.reserve(grown);
      live.reserve(grown);
      word_stamps.resize(words, 0);
      live.resize(words, 0);
    }
    // The other calls' reserved keys may be counted too before any of them finishes.
    if (count_pending) pending.Reserve(reserved + keys);
    reserved += keys;
  }

  // Ends what PrepareInserts reserved; the spare goes once no call counts on it.
  void FinishInserts(size_t keys) {
    reserved -= keys;
    if (reserved == 0) DropSpare();
  }

  // Row of `key`, inserting an uninitialized one if absent; *inserted says which. A new
  // row, or a found one the caller will change (`touch`), counts as changed since the
  // last save.
  char* FindOrAddRow(uint64_t key, uint64_t hash, size_t row_bytes, bool* inserted,
                     bool touch) {
    const int64_t found = FindSlot(key, hash, row_bytes);
    if (found >= 0) {
      *inserted = false;
      if (touch) Touch(slot_rows[found]);
      return Row(slot_rows[found], row_bytes);
    }
    if (OverLoaded(size + tombstones + 1, capacity)) {
      // More of the batch's keys were new than PrepareInserts estimated: it set a spare
      // aside that holds them all.
      Rehash(spare_capacity > capacity ? spare_capacity : GrownCapacity(capacity), row_bytes);
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

  // For the saves of changes that follow; past kMinRemovedKeysKept or half the rows the
  // older half goes, and without memory for the list all of it (removing must not fail):
  // chains whose last save is older than what went then save whole.
  void RememberRemoved(uint64_t key) {
    const int64_t now = change_clock->now.load();
    NoteChange(static_cast<uint32_t>(now));
    if (!change_clock->removals_wanted.load()) return;
    if (removed_keys.size() >= std::max(kMinRemovedKeysKept, size / 2)) {
      const size_t half = removed_keys.size() / 2;
      removals_lost_through = removed_stamps[half - 1];
      ForgetRemovalsThrough(removals_lost_through);
    }
    try {
      removed_keys.push_back(key);
      try {
        removed_stamps.push_back(static_cast<uint32_t>(now));
      } catch (const std::bad_alloc&) {
        removed_keys.pop_back();
        throw;
      }
    } catch (const std::bad_alloc&) {
      removals_lost_through = now;
      std::vector<uint64_t>().swap(removed_keys);
      std::vector<uint32_t>().swap(removed_stamps);
    }
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
    RememberRemoved(key);
    ++free_rows;
    --size;
    return true;
  }
};


}  // namespace tfps

#endif  // TFPS_CORE_STRIPE_H_
