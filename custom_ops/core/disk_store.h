// Rows on disk for a tiered table: a RocksDB database of fixed-size rows keyed by a 64-bit
// id (8 bytes, big-endian, so ids ascend in the store's order; the table's ids are rows'
// places, Stripe::DiskId). It is a cache of the table, never a checkpoint: opening
// wipes whatever an earlier process left in the directory (a killed task's half-written
// files included), the write-ahead log is off, nothing is synced, and closing removes it. RocksDB's own LOCK
// file keeps a second live table out of the same directory. Every call is batched (one
// WriteBatch, one MultiGet) and may come from many threads at once; a failure throws
// DiskStoreError naming the directory and RocksDB's status, the store unchanged by a
// failed Get and a failed Put written whole or not at all (a WriteBatch is atomic).
#ifndef TFPS_CORE_DISK_STORE_H_
#define TFPS_CORE_DISK_STORE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>

namespace tfps {

class DiskStoreError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct DiskStoreOptions {
  int64_t block_cache_bytes = int64_t{32} << 20;
  int64_t write_buffer_bytes = int64_t{32} << 20;
  int bloom_bits_per_key = 10;
  int background_jobs = 2;
};

struct DiskStoreStats {
  int64_t disk_bytes = 0;        // live SST and log files
  int64_t memory_bytes = 0;      // memtables, block cache and index/filter blocks
  int64_t bytes_written = 0;     // rows handed to Put since open
  int64_t bytes_flushed = 0;     // written to SST files by flushes
  int64_t bytes_compacted = 0;   // written by compactions
};

class DiskStore {
 public:
  // Opens an empty store in `directory`/rows (created; an old one there is removed) for
  // rows of `row_bytes` bytes. Destroying the store removes its files.
  DiskStore(const std::string& directory, int64_t row_bytes, const DiskStoreOptions& options = {});
  ~DiskStore();
  DiskStore(const DiskStore&) = delete;
  DiskStore& operator=(const DiskStore&) = delete;

  // Writes rows[i] (row_bytes each) under keys[i], replacing any.
  void Put(int64_t n, const uint64_t* keys, const void* rows);
  // Reads the rows of keys into rows[i]; found[i] says whether key i has one. Returns how
  // many were found.
  int64_t Get(int64_t n, const uint64_t* keys, void* rows, uint8_t* found) const;
  // The same for keys in ascending order (a save's walk), read by one iterator moving
  // forward through the store instead of a lookup each.
  int64_t GetAscending(int64_t n, const uint64_t* keys, void* rows, uint8_t* found) const;
  void Delete(int64_t n, const uint64_t* keys);
  // Removes every row.
  void Clear();
  DiskStoreStats GetStats() const;
  // The rows stored, counted by reading them all (for tests and tools).
  int64_t CountRows() const;
  const std::string& directory() const { return directory_; }

 private:
  void Open();
  [[noreturn]] void Fail(const char* what, const std::string& status) const;

  std::string directory_, path_;
  int64_t row_bytes_;
  DiskStoreOptions options_;
  struct Rocks;  // the database and what it shares with the store (disk_store.cc)
  std::unique_ptr<Rocks> rocks_;
  std::atomic<int64_t> bytes_written_{0};  // Put runs on many stripes at once
};

}  // namespace tfps

#endif  // TFPS_CORE_DISK_STORE_H_
