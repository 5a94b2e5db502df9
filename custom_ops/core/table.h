// A growable hash table from 64-bit keys to fixed-width float rows, with optimizer slots
// and per-key metadata, safe under concurrent calls from many threads.
//
// Layout. The key space is split over 2^k stripes by the top bits of the key's hash; each
// stripe has its own lock, its own open-addressing index and its own row arena, so a
// stripe that grows stalls only the keys that hash to it. The index is SwissTable-like:
// one control byte per slot (empty, deleted, or 7 bits of the hash) probed 16 at a time,
// beside a 32-bit row number. Occupancy lives in the control bytes, so every 64-bit key,
// including 0 and -1, is an ordinary key. A row is [key | count | last step | value |
// slots (| Adam step)], contiguous; rows never move, so growing rehashes only 5 bytes per
// key and never copies values. Each stripe's index grows through its own staggered sizes
// (not powers of two), so while the table doubles its stripes' rebuilds spread evenly
// over the calls instead of landing together.
//
// Batch calls group keys by stripe (a stable counting sort), then hand whole stripes to a
// parallel-for, taking each stripe's lock once per call. Calls that may insert first
// reserve room in every stripe they touch (all of their allocation happens there), so a
// call that runs out of memory throws AllocationFailure with the table unchanged.
//
// A tiered table (TierConfig) keeps only the key and metadata in a row, with a reference to
// its payload (value and slots) in the stripe's PayloadArena, or to its record in the
// table's DiskStore (RocksDB, keyed by the row's stripe and number) once demoted (tiers.cc).
//
// Admission and eviction (policies.h) live in the stripes too: the counts of keys not yet
// admitted, and a sweep cursor that every training lookup advances at a pace set by the
// clock (EvictionConfig's horizon) and at least a row per key, in the stripes its keys
// reach, and once per clock tick in all the others.
#ifndef TFPS_CORE_TABLE_H_
#define TFPS_CORE_TABLE_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "custom_ops/core/disk_store.h"
#include "custom_ops/core/hashing.h"
#include "custom_ops/core/memory.h"
#include "custom_ops/core/optimizer.h"
#include "custom_ops/core/pending.h"
#include "custom_ops/core/policies.h"
#include "custom_ops/core/scratch.h"

namespace tfps {

struct Stripe;
struct RowView;

// The table's change clock, which every stripe stamps its changes with. A save advances
// it (Table::BeginSave), so a change after a save carries a later stamp than the save's.
// Removals are recorded only once some save has begun: before that no chain needs them.
struct ChangeClock {
  std::atomic<int64_t> now{0};
  std::atomic<bool> removals_wanted{false};
};


// Runs fn(begin, end) over disjoint ranges covering [0, total), possibly in parallel;
// cost_per_unit is a rough cost of one unit in nanoseconds so a runner can decide how
// finely to split. TensorFlow kernels pass the device's intra-op thread pool.
using ParallelFor =
    std::function<void(int64_t total, int64_t cost_per_unit,
                       const std::function<void(int64_t, int64_t)>& fn)>;

// Backs the pages of [begin, begin + bytes) before it is written, each thread a
// contiguous piece. Rows are written to an output in key order, so into fresh memory every
// thread would fault pages all over it and they would contend for them.
void PopulateInParallel(void* begin, int64_t bytes, const ParallelFor& parallel_for);

// Runs everything on the calling thread.
ParallelFor SerialParallelFor();
// Splits work over `num_threads` std::threads (for tests and tools without TensorFlow).
ParallelFor ThreadedParallelFor(int num_threads);

// A tiered table keeps at most memory_rows payloads (values and optimizer slots) in
// memory, split evenly over the stripes, and the rest in a DiskStore in `directory` (which
// the table wipes when it opens it: the disk tier is a cache, never a checkpoint). Keys and
// metadata always stay in memory. memory_rows 0: not tiered.
struct TierConfig {
  int64_t memory_rows = 0;
  std::string directory;
  int64_t cache_bytes = int64_t{32} << 20;  // the store's block cache
};

struct TableConfig {
  int dim = 8;
  OptimizerConfig optimizer;
  InitializerConfig initializer;
  uint64_t seed = 0;
  int log2_stripes = 8;
  bool huge_pages = false;  // rows on transparent huge pages (see RegionAllocator)
  AdmissionConfig admission;
  EvictionConfig eviction;
  TierConfig tier;
};

// Metadata columns of Export/Import. kScore holds the bits of the float decayed-frequency
// score (0 where the table keeps none).
enum MetadataColumn {
  kCount = 0, kLastStep = 1, kOptimizerStep = 2, kScore = 3, kNumMetadata = 4
};

// What a table holds and has done, for statistics.
struct TableStats {
  int64_t rows = 0;
  int64_t memory_bytes = 0;      // index, row blocks, and admission counts
  int64_t row_memory_bytes = 0;  // of those, the row blocks
  int64_t clock = 0;
  int64_t admitted = 0;  // rows created by training lookups and applies
  int64_t pending = 0;   // keys counted for admission (estimated, for a sketch)
  int64_t rejected = 0;  // occurrences of keys looked up without a row (their gradients dropped)
  int64_t evicted = 0;   // rows removed by eviction
  int64_t skipped_steps = 0;  // optimizer steps skipped for a non-finite gradient
  // A tiered table's (for another, every row is in memory and the rest are 0):
  int64_t rows_in_memory = 0;        // rows whose payload is in memory
  int64_t payload_memory_bytes = 0;  // the payload blocks (part of memory_bytes)
  int64_t disk_bytes = 0;            // the disk tier's files
  int64_t lookup_hits = 0;           // rows lookups found with their payloads in memory
  int64_t lookup_misses = 0;         // ... whose payloads they read from disk
  int64_t payloads_read = 0;         // read from disk by any call (lookups, updates, saves)
  int64_t payloads_demoted = 0;      // payloads moved to disk to keep within memory_rows
};

// The counters a table keeps of what training did to it, in their checkpoint order.
enum Counter { kAdmitted = 0, kRejected = 1, kEvicted = 2, kSkippedSteps = 3, kNumCounters = 4 };

struct ExportChunk {
  std::vector<int64_t> keys;
  std::vector<float> values;    // keys.size() * dim
  std::vector<float> slots;     // keys.size() * num_slots * dim
  std::vector<int64_t> metadata;  // keys.size() * kNumMetadata
  std::vector<int64_t> removed;   // SaveChunk only: keys removed after its stamp
  bool changes_incomplete = false;  // SaveChunk only: see there
  int64_t next_cursor = -1;     // -1 when the whole table has been visited
};

// The keys of one call that fall in one stripe, in input order: their positions in the
// call (order), and the keys and hashes themselves, stored contiguously.
struct StripeBatch {
  const int64_t* order;
  const uint64_t* keys;
  const uint64_t* hashes;
  int64_t count;
};

class Table {
 public:
  explicit Table(const TableConfig& config);
  ~Table();
  Table(const Table&) = delete;
  Table& operator=(const Table&) = delete;

  const TableConfig& config() const { return config_; }
  int dim() const { return config_.dim; }
  int num_slots() const { return NumSlots(config_.optimizer.kind); }

  // values[i*dim..] = row of keys[i], or its initial value if absent (then exists[i] = 0).
  // exists may be null. Never inserts.
  void Find(const uint64_t* keys, int64_t n, float* values, uint8_t* exists,
            const ParallelFor& parallel_for) const;

  // Like Find, but absent keys are inserted with their initial value and fresh slots. Each
  // key's occurrence count grows by occurrences[i] (1 when occurrences is null): a training
  // lookup counts every time its key occurs in the data, however the batch repeats it, and
  // records the clock as the key's last-seen step. Under an admission policy an absent key
  // is only counted until admitted: it reads its initial value and admitted[i] = 0
  // (admitted may be null). Then runs a little of the eviction sweep.
  void FindOrInsert(const uint64_t* keys, int64_t n, float* values,
                    const ParallelFor& parallel_for, const int64_t* occurrences = nullptr,
                    uint8_t* admitted = nullptr);

  // Applies the optimizer to each key's row with its gradient row (n x dim), inserting
  // absent keys first (under an admission policy, absent keys are skipped: their
  // gradients dropped), and records `step` as last seen
  // (a negative step stands for this table's own count of ApplyGradients calls).
  // Returns false and changes nothing if any gradient is NaN or infinite. A key repeated
  // in one call is updated once per occurrence, in input order. A learning_rate >= 0
  // replaces the configured one for this call (a schedule's value at this step).
  bool ApplyGradients(const uint64_t* keys, int64_t n, const float* grads, int64_t step,
                      const ParallelFor& parallel_for, float learning_rate = -1.0f);

  // Sets the value of each key (inserting absent keys with fresh slots); slots and
  // metadata of present keys are kept.
  void Insert(const uint64_t* keys, int64_t n, const float* values,
              const ParallelFor& parallel_for);

  // Sets value, slots and metadata of each key, as saved by Export. Under a row cap no row
  // is evicted to make room: a restore into another number of shards routes the saved
  // rows to other stripes, some of which get more than their share of the cap. Such a
  // stripe evicts back down to its share at its next insert.
  void Import(const uint64_t* keys, int64_t n, const float* values, const float* slots,
              const int64_t* metadata, const ParallelFor& parallel_for);

  // Removes the keys that are present; returns how many were.
  int64_t Remove(const uint64_t* keys, int64_t n, const ParallelFor& parallel_for);

  // Sweeps every row now, removing those the eviction policy says go (TTL,
  // DecayedFrequency); returns how many went. Without such a policy, none.
  int64_t Evict(const ParallelFor& parallel_for);

  // Removes every row. Their memory goes back to the OS, or with keep_memory (a restore
  // about to refill the table) stays mapped for the rows that come next.
  void Clear(bool keep_memory = false);
  // Sizes every stripe's index for `expected_keys` keys in all, so a restore or a bulk
  // import does not rebuild the indexes as the keys arrive.
  void Reserve(int64_t expected_keys);
  int64_t Size() const;
  // The table's clock: how many ApplyGradients calls it has run, the step recorded for a
  // negative `step`. Checkpoints save and restore it.
  int64_t ApplyCalls() const { return apply_calls_.load(); }
  void SetApplyCalls(int64_t calls) { apply_calls_.store(calls); }
  // Bytes held by the index and by the rows: the memory the table occupies.
  int64_t MemoryBytes() const;
  // Of those, the rows' (with their change stamps): the rows backed so far, which is what
  // a stripe's row blocks occupy (they double in size as it grows, and their pages are
  // backed a piece at a time as rows fill them), or what a clear that kept its memory
  // still holds, whichever is more.
  int64_t RowMemoryBytes() const;
  // The bytes of the row blocks handed out, backed or not (address space, not memory).
  int64_t MappedRowBytes() const { return static_cast<int64_t>(row_memory_.HandedOutBytes()); }
  TableStats Stats() const;
  // How many times a stripe's index has been rebuilt, over all stripes: once per growth
  // step or tombstone cleanup.
  int64_t IndexRehashes() const;

  // Up to max_rows rows starting at `cursor` (0 to begin). Each stripe is read under its
  // lock; rows changed by concurrent calls between chunks may be seen in either state.
  ExportChunk Export(int64_t cursor, int64_t max_rows) const;
  // The same into *out, whose vectors keep their capacity from call to call (a save
  // streaming a whole table reuses one chunk's memory).
  void ExportInto(int64_t cursor, int64_t max_rows, ExportChunk* out) const;

  // Saves and their chains. Every change of a row stamps it with the table's change clock,
  // and every removal is recorded with it; a save begins by advancing the clock
  // (BeginSave), so whatever changes after it carries a later stamp than the save's. A
  // chain (saves that build on one another, named by the caller: a backup directory, a
  // checkpoint directory) remembers the id and stamp of its last save, and its next save
  // of changes takes the rows stamped after that stamp and the removals recorded after it.
  // Saves change nothing the chains read, so any number of chains, whole saves and
  // snapshots interleave without affecting each other, and a failed save loses nothing.
  struct ChainPoint {
    uint64_t save_id = 0;
    int64_t stamp = -1;
  };
  // Advances the change clock and returns the stamp a save that starts now reads the table
  // as of: every change it does not see is stamped later.
  int64_t BeginSave();
  // The last save of `chain`, when the changes since can all be told; false when the chain
  // is unknown here, or a clear (or a restore) or a dropped removal record came after it:
  // its next save must be whole.
  bool LastSaveOfChain(const std::string& chain, ChainPoint* point) const;
  // `chain`'s last save is now `point` (a save just written, or the save just restored).
  // The table keeps the newest kMaxChains chains; an older one saves whole next.
  void RecordChainSave(const std::string& chain, const ChainPoint& point);
  static constexpr size_t kMaxChains = 32;
  // One chunk of a save, visiting the table like ExportInto (cursor 0 begins): every live
  // row, or with changed_after >= 0 the rows stamped after it and, in each stripe it
  // enters, the keys removed after it (out->removed). A stripe is read under its shared
  // lock, so each row is saved as of one moment. Sets out->changes_incomplete when a
  // stripe has dropped removal records the save needed (it must then be whole).
  void SaveChunk(int64_t cursor, int64_t max_rows, int64_t changed_after, ExportChunk* out) const;
  // The saves the rows equal, which a restore of changes must follow. A save (of any kind:
  // saving changes no row) or a restore with id `id` that read the table as of change stamp
  // `stamp` records it, unless a row changed since: beside the ids recorded before when no
  // row has changed since those, else in their place (the first of them and the newest
  // kept, at most kMaxStateIds). A change stamped later, or Clear, ends them all. Stamps
  // are 32 bits: a table saved 2^32 times would wrap them (saves of changes too).
  // `where`: the file the save wrote or the restore read, for errors.
  void RecordState(uint64_t id, int64_t stamp, const std::string& where = "");
  bool EqualsState(uint64_t id) const;
  // For errors: the ids recorded, and whether a row changed since.
  std::string DescribeState() const;

  // Serving exports read the rows in passes: SelectForServing picks the live rows whose
  // occurrence count is at least min_count (a bit per row number); SortSelected orders one
  // stripe's picks by TableHash (at most 20 bytes a row), and ReadSortedValues reads their
  // values a slice at a time. Stripes are ranges of TableHash, so stripe after stripe the table
  // comes out in hash order, with one stripe's order and one slice of values in memory.
  // Rows never move, so the picks stay valid while training goes on: a row changed in
  // between is read as it is then, and one whose key went (its row taken by another key)
  // reads as zeros, as an absent key serves. Only a Clear or restore in between, which
  // shrinks the stripes, makes SortSelected or ReadSortedValues return false.
  struct ServingSelection {
    std::vector<std::vector<uint64_t>> picked;  // per stripe, a bit per row number
    std::vector<int64_t> rows;                   // per stripe
    float max_abs_value = 0.0f;
    uint64_t max_abs_key = 0;  // a key whose row holds max_abs_value
  };
  ServingSelection SelectForServing(int64_t min_count) const;
  // The picked rows of `stripe` as (TableHash of the row's key, row number), ascending.
  bool SortSelected(const ServingSelection& selection, int stripe,
                    std::vector<std::pair<uint64_t, uint64_t>>* order) const;
  // The values of rows order[begin, end) (from SortSelected of `stripe`) into values
  // ((end - begin) x dim).
  bool ReadSortedValues(int stripe, const std::vector<std::pair<uint64_t, uint64_t>>& order,
                        size_t begin, size_t end, float* values) const;

  // An optimizer step that included the table was skipped for a non-finite gradient: its
  // rows are as they were, and the step is counted (Stats().skipped_steps).
  void CountSkippedStep() { skipped_steps_.fetch_add(1); }

  // Admission and eviction state beyond the rows, for checkpoints. Counters: the
  // statistics of those names, in Counter order.
  void Counters(int64_t out[kNumCounters]) const;
  void SetCounters(const int64_t counters[kNumCounters]);
  // When the clock reached each sampled value: (clock, wall-clock microseconds) pairs,
  // oldest first, which map a TTL in seconds onto steps.
  std::vector<std::pair<int64_t, int64_t>> ClockTimes() const;
  void SetClockTimes(const std::vector<std::pair<int64_t, int64_t>>& times);
  int log2_stripes() const { return config_.log2_stripes; }
  // The stripe of a key's TableHash: its top log2_stripes bits.
  size_t StripeOf(uint64_t hash) const {
    return config_.log2_stripes == 0 ? 0 : static_cast<size_t>(hash >> (64 - config_.log2_stripes));
  }
  // A copy of stripe `stripe`'s counts of keys waiting for admission (read under its lock).
  PendingCounts PendingOfStripe(int stripe) const;
  void ClearPending();
  // Both restore counts of keys waiting for admission, which a table without admission
  // drops. Merges a saved sketch of one stripe of a table with `saved_log2_stripes` stripes
  // into the stripes that hold its keys here (each counter the largest of the ones it covers).
  // `shard_share` is the part of the saved keys this table holds (1 / shards when every
  // new shard reads every saved one), so the estimate of keys waiting counts only those.
  void MergePendingSketch(int saved_stripe, int saved_log2_stripes, const uint16_t* cells,
                          size_t width, double shard_share = 1.0);
  // Adds saved exact counts of keys not yet admitted. May throw AllocationFailure.
  void AddPending(const uint64_t* keys, const uint32_t* counts, int64_t n);

  // The rows a tiered table's disk tier holds, counted by reading it (for tests).
  int64_t DiskRows() const { return tiered() ? store_->CountRows() : 0; }

  // Returns the row of `key` (value, slots and metadata) for tests; false if absent.
  bool DebugRow(uint64_t key, std::vector<float>* value, std::vector<float>* slots,
                int64_t metadata[kNumMetadata]) const;

 private:
  template <typename Fn>
  // Groups keys by stripe and calls fn(stripe, batch) for each group, in parallel. With
  // shared_lock (fn only reads), a stripe's group may be split over several calls. With
  // inserts, every stripe first reserves room for its group (Stripe::PrepareInserts),
  // and if any cannot, AllocationFailure is thrown before fn runs anywhere.
  void ForEachStripeGroup(const uint64_t* keys, int64_t n, int64_t cost_per_key, bool shared_lock,
                          const ParallelFor& parallel_for, Fn&& fn, bool inserts = false) const;
  // Runs a row-removing sweep of up to `budget` rows of stripe `s` (held exclusively) from
  // its sweep cursor; returns the rows removed.
  int64_t SweepStripe(Stripe& s, uint64_t budget, int64_t clock, int64_t ttl_cutoff) const;
  // The rows a training lookup of `keys` keys sweeps in stripe `s` (held exclusively) at
  // `clock`: at least one per key, and enough that every row is visited
  // kSweepsPerHorizon times per expiry horizon, however many of the keys are new.
  uint64_t SweepBudget(Stripe& s, int64_t keys, int64_t clock) const;
  // Once per clock tick, sweeps what their pace owes in the stripes no key of the ticking
  // lookups reached; a stripe another call holds is left to the next tick.
  void SweepIdleStripes(int64_t clock, int64_t ttl_cutoff, const ParallelFor& parallel_for);
  // The step before which a row is older than the TTL in seconds (-1: none is).
  int64_t TtlCutoff() const;
  // Makes room for one more row in stripe `s` (held exclusively) under the row cap,
  // evicting the lowest-ranked of a few sampled rows, as many times as the stripe is over
  // its share (an import may have left it so).
  void MakeRoomUnderCap(Stripe& s, int64_t clock);
  void EvictOneUnderCap(Stripe& s, int64_t clock);
  void RecordClockTime(int64_t clock);
  // Whether absent `key`, now seen `seen` more times, gets a row; if so *count is its
  // occurrences before these. Counts it in stripe `s` (held exclusively).
  bool Admits(Stripe& s, uint64_t key, int64_t seen, uint32_t* count) const;
  // The row of key j of the batch (stripe held exclusively, room prepared), inserted with
  // its initial value and fresh slots if absent; *inserted says which. `slot` is the
  // key's index slot if the caller found it, kSlotAbsent if it found none, kSlotUnknown
  // if it did not look. Under a row cap an insert into a full stripe first evicts where
  // `under_cap` (an import's does not). `touch`: the caller changes the row, so it counts
  // as changed since the last save.
  static constexpr int64_t kSlotAbsent = -1, kSlotUnknown = -2;
  RowView AcquireRow(Stripe& s, const StripeBatch& batch, int64_t j, bool touch, int64_t clock,
                     bool* inserted, int64_t slot = kSlotUnknown, bool under_cap = true);
  // Sum of count(stripe) over the stripes, each read under its shared lock.
  template <typename Fn>
  int64_t SumOverStripes(Fn&& count) const;
  // The disk tier (tiers.cc). A stripe's batch that writes first loads the payloads of its
  // keys that are on disk (stripe held exclusively, payload blocks reserved; throws
  // DiskStoreError before changing anything), and when done moves the lowest-ranked
  // payloads (EvictionRank) to disk until the stripe is within its share of memory_rows,
  // and deletes the disk records of rows it removed.
  bool tiered() const { return store_ != nullptr; }
  // `lookup`: the call is a lookup, whose hits and misses the statistics count.
  void LoadPayloads(Stripe& s, const StripeBatch& batch, bool lookup = false);
  void DemoteOverBudget(Stripe& s);
  // Removes the row of `key` if present (returns whether it was): its payload block goes
  // back, and its disk record is deleted by the stripe's next FlushDoomed (at the latest,
  // when its batch ends).
  bool RemoveRow(Stripe& s, uint64_t key, uint64_t hash) const;
  void FlushDoomed(Stripe& s);
  void FlushAllDoomed();  // every stripe's, each under its lock
  // Copies the values of rows whose payloads are on disk to their outputs ((output, disk
  // id) pairs, Stripe::DiskId), for Find (the stripe held shared).
  void CopyValuesFromDisk(const std::vector<std::pair<float*, uint64_t>>& on_disk) const;
  // The same for exports: fills the rows of `chunk` at the places listed (with their disk
  // ids) in `on_disk`, and empties it.
  void FillFromDisk(std::vector<std::pair<size_t, uint64_t>>* on_disk, ExportChunk* chunk) const;
  // Reads the payloads (value and slots) of rows on disk, by disk id, into payloads
  // (n x payload floats); `ascending` ids (a walk in row order) are read in one pass.
  // For callers holding the stripes' locks shared.
  void ReadPayloads(const std::vector<uint64_t>& ids, float* payloads, bool ascending = false) const;
  // Calls write(row, i) with the row of each keys[i], inserted (initial value, fresh
  // slots) if absent, under its stripe's exclusive lock; the row counts as changed.
  // `under_cap`: inserts evict under the row cap (AcquireRow).
  template <typename Write>
  void WriteRows(const uint64_t* keys, int64_t n, int64_t cost_per_key, bool under_cap,
                 const ParallelFor& parallel_for, Write&& write);

  // Holds calls that would insert while a clear waits, so the clear waits only for those
  // already between making room and writing, not for a gap in a stream of them.
  class ClearGate {
   public:
    void WaitWhileClearing() {
      if (clears_.load() == 0) return;
      std::unique_lock<std::mutex> lock(mu_);
      open_.wait(lock, [&] { return clears_.load() == 0; });
    }
    void Close() { clears_.fetch_add(1); }
    void Open() {
      {
        std::lock_guard<std::mutex> lock(mu_);
        clears_.fetch_sub(1);
      }
      open_.notify_all();
    }

   private:
    std::atomic<int> clears_{0};
    std::mutex mu_;
    std::condition_variable open_;
  };

  TableConfig config_;
  size_t row_bytes_;
  mutable ClearGate clear_gate_;
  RegionAllocator row_memory_;
  // The row bytes a clear that kept its memory left backed, for RowMemoryBytes.
  std::atomic<int64_t> recycled_row_bytes_{0};
  std::atomic<int64_t> apply_calls_{0};
  mutable std::atomic<int64_t> admitted_{0}, rejected_{0}, evicted_{0}, skipped_steps_{0};
  std::atomic<int64_t> idle_stripes_swept_at_{-1};  // the clock SweepIdleStripes last ran at
  mutable std::mutex clock_times_mu_;
  std::vector<std::pair<int64_t, int64_t>> clock_times_;
  ChangeClock change_clock_;
  static constexpr size_t kMaxStateIds = 8;  // an unchanged table's saves beyond are rare
  mutable std::mutex state_mu_;
  std::vector<std::pair<uint64_t, std::string>> state_;  // (id, file), oldest first
  int64_t state_stamp_ = -1;
  bool ChangedSince(int64_t stamp) const;
  struct ChainRecord {
    std::string name;
    ChainPoint point;
  };
  mutable std::mutex chains_mu_;
  std::vector<ChainRecord> chains_;  // least recently saved first
  std::vector<std::unique_ptr<Stripe>> stripes_;
  // The disk tier (null: not tiered).
  std::unique_ptr<DiskStore> store_;
  mutable std::atomic<bool> doomed_waiting_{false};  // some stripe's doomed_on_disk is not empty
  mutable std::atomic<int64_t> lookup_hits_{0}, lookup_misses_{0}, payloads_read_{0}, payloads_demoted_{0};
};

// "zeros", "uniform", "truncated_normal"; false if the name is unknown (optimizers:
// ParseOptimizerKind in optimizer.h).
bool ParseInitializerKind(const std::string& name, InitializerKind* kind);

}  // namespace tfps

#endif  // TFPS_CORE_TABLE_H_
