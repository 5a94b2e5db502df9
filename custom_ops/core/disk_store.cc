#include "custom_ops/core/disk_store.h"

#include <rocksdb/cache.h>
#include <rocksdb/db.h>
#include <rocksdb/filter_policy.h>
#include <rocksdb/iterator.h>
#include <rocksdb/options.h>
#include <rocksdb/statistics.h>
#include <rocksdb/table.h>
#include <rocksdb/write_batch.h>

#include <cstring>
#include <filesystem>
#include <system_error>
#include <vector>

namespace tfps {
namespace {

struct KeyBytes {
  char bytes[8];
  explicit KeyBytes(uint64_t key) {
    for (int i = 7; i >= 0; --i, key >>= 8) bytes[i] = static_cast<char>(key & 0xff);
  }
  rocksdb::Slice slice() const { return rocksdb::Slice(bytes, 8); }
};

}  // namespace

struct DiskStore::Rocks {
  std::shared_ptr<rocksdb::Cache> cache;
  std::shared_ptr<rocksdb::Statistics> statistics;
  std::unique_ptr<rocksdb::DB> db;
};

DiskStore::DiskStore(const std::string& directory, int64_t row_bytes, const DiskStoreOptions& options)
    : directory_(directory), path_(directory + "/rows"), row_bytes_(row_bytes), options_(options) {
  if (directory.empty()) throw DiskStoreError("tfps disk store: no directory given for the disk tier");
  if (row_bytes <= 0) throw DiskStoreError("tfps disk store: row_bytes must be positive");
  std::error_code error;
  std::filesystem::create_directories(directory_, error);
  if (error) Fail("cannot create the directory", error.message());
  rocks_ = std::make_unique<Rocks>();
  rocks_->cache = rocksdb::NewLRUCache(static_cast<size_t>(options_.block_cache_bytes));
  rocks_->statistics = rocksdb::CreateDBStatistics();
  Open();
}

DiskStore::~DiskStore() {
  // A cache no table reads any more: its files go, and the directory if nothing else is there.
  rocks_->db.reset();
  rocksdb::DestroyDB(path_, rocksdb::Options());
  std::error_code error;
  std::filesystem::remove_all(path_, error);
  std::filesystem::remove(directory_, error);  // fails, harmlessly, unless empty
}

void DiskStore::Fail(const char* what, const std::string& status) const {
  throw DiskStoreError("tfps disk store in " + directory_ + ": " + what + ": " + status);
}

void DiskStore::Open() {
  rocks_->db.reset();
  // The disk tier is a cache: a store left by an earlier process (perhaps half written by
  // one that was killed) is never read. DestroyDB honours a live store's lock.
  rocksdb::Options options;
  rocksdb::Status status = rocksdb::DestroyDB(path_, options);
  if (!status.ok()) Fail("cannot remove the old disk tier", status.ToString());
  std::error_code error;
  std::filesystem::remove_all(path_, error);
  if (error) Fail("cannot remove the old disk tier", error.message());

  options.create_if_missing = true;
  options.error_if_exists = true;
  options.statistics = rocks_->statistics;
  options.write_buffer_size = static_cast<size_t>(options_.write_buffer_bytes);
  options.max_background_jobs = options_.background_jobs;
  options.compression = rocksdb::kNoCompression;  // float rows barely compress
  options.max_open_files = 256;
  options.info_log_level = rocksdb::WARN_LEVEL;
  options.keep_log_file_num = 1;
  options.max_manifest_file_size = 16 << 20;
  rocksdb::BlockBasedTableOptions table;
  table.block_cache = rocks_->cache;
  table.filter_policy.reset(rocksdb::NewBloomFilterPolicy(options_.bloom_bits_per_key));
  table.cache_index_and_filter_blocks = true;
  table.pin_l0_filter_and_index_blocks_in_cache = true;
  options.table_factory.reset(rocksdb::NewBlockBasedTableFactory(table));
  rocksdb::DB* db = nullptr;
  status = rocksdb::DB::Open(options, path_, &db);
  if (!status.ok()) Fail("cannot open the disk tier", status.ToString());
  rocks_->db.reset(db);
}

namespace {
rocksdb::WriteOptions Unsynced() {
  rocksdb::WriteOptions write;
  write.disableWAL = true;  // a cache: a crash loses it whole anyway
  write.sync = false;
  return write;
}
}  // namespace

void DiskStore::Put(int64_t n, const uint64_t* keys, const void* rows) {
  if (n <= 0) return;
  rocksdb::WriteBatch batch(static_cast<size_t>(n) * (row_bytes_ + 24));
  const char* bytes = static_cast<const char*>(rows);
  for (int64_t i = 0; i < n; ++i) {
    const KeyBytes key(keys[i]);
    batch.Put(key.slice(), rocksdb::Slice(bytes + i * row_bytes_, static_cast<size_t>(row_bytes_)));
  }
  const rocksdb::Status status = rocks_->db->Write(Unsynced(), &batch);
  if (!status.ok()) Fail("writing rows failed", status.ToString());
  bytes_written_ += n * row_bytes_;
}

int64_t DiskStore::Get(int64_t n, const uint64_t* keys, void* rows, uint8_t* found) const {
  if (n <= 0) return 0;
  std::vector<KeyBytes> key_bytes;
  key_bytes.reserve(static_cast<size_t>(n));
  std::vector<rocksdb::Slice> slices(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    key_bytes.emplace_back(keys[i]);
    slices[i] = key_bytes.back().slice();
  }
  std::vector<rocksdb::PinnableSlice> values(static_cast<size_t>(n));
  std::vector<rocksdb::Status> statuses(static_cast<size_t>(n));
  rocks_->db->MultiGet(rocksdb::ReadOptions(), rocks_->db->DefaultColumnFamily(), static_cast<size_t>(n), slices.data(),
                values.data(), statuses.data());
  int64_t hits = 0;
  char* out = static_cast<char*>(rows);
  for (int64_t i = 0; i < n; ++i) {
    found[i] = 0;
    if (statuses[i].IsNotFound()) continue;
    if (!statuses[i].ok()) Fail("reading rows failed", statuses[i].ToString());
    if (static_cast<int64_t>(values[i].size()) != row_bytes_) {
      Fail("a row on disk has the wrong size", std::to_string(values[i].size()) + " bytes, expected " +
                                                  std::to_string(row_bytes_));
    }
    std::memcpy(out + i * row_bytes_, values[i].data(), static_cast<size_t>(row_bytes_));
    found[i] = 1;
    ++hits;
  }
  return hits;
}

int64_t DiskStore::GetAscending(int64_t n, const uint64_t* keys, void* rows, uint8_t* found) const {
  if (n <= 0) return 0;
  rocksdb::ReadOptions options;
  options.fill_cache = false;  // a save's pass would push the hot rows' blocks out
  options.readahead_size = 1 << 20;
  std::unique_ptr<rocksdb::Iterator> it(rocks_->db->NewIterator(options));
  // Keys a save skips (rows in memory) lie between those it reads: a few steps forward
  // pass them; a longer gap seeks.
  constexpr int kStepsBeforeSeek = 8;
  int64_t hits = 0;
  char* out = static_cast<char*>(rows);
  for (int64_t i = 0; i < n; ++i) {
    const KeyBytes key(keys[i]);
    int steps = 0;
    while (it->Valid() && it->key().compare(key.slice()) < 0 && steps < kStepsBeforeSeek) {
      it->Next();
      ++steps;
    }
    if (!it->Valid() || it->key().compare(key.slice()) < 0) it->Seek(key.slice());
    found[i] = 0;
    if (!it->Valid() || it->key().compare(key.slice()) != 0) continue;
    if (static_cast<int64_t>(it->value().size()) != row_bytes_) {
      Fail("a row on disk has the wrong size", std::to_string(it->value().size()) + " bytes, expected " +
                                                  std::to_string(row_bytes_));
    }
    std::memcpy(out + i * row_bytes_, it->value().data(), static_cast<size_t>(row_bytes_));
    found[i] = 1;
    ++hits;
  }
  if (!it->status().ok()) Fail("reading rows failed", it->status().ToString());
  return hits;
}

void DiskStore::Delete(int64_t n, const uint64_t* keys) {
  if (n <= 0) return;
  rocksdb::WriteBatch batch;
  for (int64_t i = 0; i < n; ++i) batch.Delete(KeyBytes(keys[i]).slice());
  const rocksdb::Status status = rocks_->db->Write(Unsynced(), &batch);
  if (!status.ok()) Fail("deleting rows failed", status.ToString());
}

void DiskStore::Clear() { Open(); }

int64_t DiskStore::CountRows() const {
  std::unique_ptr<rocksdb::Iterator> it(rocks_->db->NewIterator(rocksdb::ReadOptions()));
  int64_t rows = 0;
  for (it->SeekToFirst(); it->Valid(); it->Next()) ++rows;
  if (!it->status().ok()) Fail("counting rows failed", it->status().ToString());
  return rows;
}

DiskStoreStats DiskStore::GetStats() const {
  DiskStoreStats stats;
  uint64_t value = 0;
  if (rocks_->db->GetIntProperty(rocksdb::DB::Properties::kTotalSstFilesSize, &value)) stats.disk_bytes += value;
  uint64_t memtables = 0, readers = 0;
  rocks_->db->GetIntProperty(rocksdb::DB::Properties::kSizeAllMemTables, &memtables);
  rocks_->db->GetIntProperty(rocksdb::DB::Properties::kEstimateTableReadersMem, &readers);
  stats.memory_bytes = static_cast<int64_t>(memtables + readers + rocks_->cache->GetUsage());
  stats.bytes_written = bytes_written_.load();
  stats.bytes_flushed = static_cast<int64_t>(rocks_->statistics->getTickerCount(rocksdb::FLUSH_WRITE_BYTES));
  stats.bytes_compacted = static_cast<int64_t>(rocks_->statistics->getTickerCount(rocksdb::COMPACT_WRITE_BYTES));
  return stats;
}

}  // namespace tfps
