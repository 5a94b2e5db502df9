// The file one table shard is checkpointed to, written and read in chunks through
// TensorFlow's file systems (local, ram://, gs://, ...). Layout, little-endian: a 64-byte
// header (magic "TFPSROWS", format version, dim, slot count, optimizer, the shard's clock,
// shard index and count, kind: whole or changes since the last save, the save's id and
// the id of the save the changes follow, CRC-32C of the header); then records, each [magic | count n | payload | CRC-32C of the record]: "CHNK"
// rows (keys int64[n], metadata int64[n, 4] (version 1: [n, 3], no score), values
// float[n, dim], slots float[n, slots, dim]) and, in a file of changes, "RMVD" removed keys
// (int64[n]), which come before any row of the same keys; since version 2, after the rows,
// the admission and eviction state: "TABL" (int64[n]: admitted, rejected, evicted, since
// version 3 skipped steps, then (clock, wall-clock microseconds) pairs), and the counts of keys waiting for admission,
// per stripe, "SKCH" (uint32 stripe, log2 of the stripe count, width, 0, then uint16
// cells[n = 4 * width]) or "PEND" (keys int64[n], counts uint32[n]); then a 40-byte footer
// [magic "TEND" | 0 | rows | row records | removed keys | 0 | CRC-32C of the footer], which
// must end the file. A writer streams to a temporary file and renames it into place only
// when the footer is written, so a file at the final path is always whole.
// docs/checkpoints.md gives the same layout for readers.
#ifndef TFPS_TABLE_KERNELS_ROW_FILE_H_
#define TFPS_TABLE_KERNELS_ROW_FILE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "custom_ops/core/table.h"
#include "tensorflow/core/platform/env.h"
#include "tensorflow/core/platform/file_system.h"

namespace tfps {

inline constexpr uint32_t kRowFileVersion = 3;
// RowFileHeader::kind: every row of the shard, or the changes since the shard's last save.
inline constexpr uint32_t kWholeShard = 0, kShardChanges = 1;

struct RowFileHeader {
  uint32_t version = kRowFileVersion;
  uint32_t dim = 0;
  uint32_t num_slots = 0;
  uint32_t optimizer = 0;  // OptimizerKind
  int64_t clock = 0;       // the saved shard's ApplyCalls when the save began
  uint32_t shard_index = 0;
  uint32_t num_shards = 1;
  uint32_t kind = kWholeShard;
  // Which save wrote the file, and for a file of changes, the save they follow (0: not
  // known, as in files before these fields, and snapshots); every shard of one save of a
  // table shares the id.
  uint64_t save_id = 0;
  uint64_t base_id = 0;
};

// The chain a save to (or a restore from) `path` belongs to: `chain` when given, else the
// file's directory, so the saves into one directory (a CheckpointManager's, a backup's)
// form one chain and saves elsewhere never disturb it.
std::string ChainOf(const std::string& chain, const std::string& path);

// Where a file bound for `path` is written first, to be renamed into place once whole.
std::string TempPathOf(::tensorflow::Env* env, const std::string& path);

// Bytes of one row in a chunk record: key and metadata, value and slots.
uint64_t RowBytes(const RowFileHeader& header);

// A record of a table's admission and eviction state (all but rows and removed keys).
struct StateRecord {
  enum Kind { kNone, kTable, kSketch, kPending };
  Kind kind = kNone;
  std::vector<int64_t> table;  // kTable: the Counter values, then (clock, micros) pairs
  uint32_t stripe = 0, log2_stripes = 0, width = 0;  // kSketch
  std::vector<uint16_t> cells;                       // kSketch: 4 * width
  std::vector<int64_t> keys;                         // kPending
  std::vector<uint32_t> counts;                      // kPending
};

class RowFileWriter {
 public:
  // Opens a temporary file beside `path` and writes the header.
  static absl::Status Create(::tensorflow::Env* env, const std::string& path,
                             const RowFileHeader& header, std::unique_ptr<RowFileWriter>* out);
  ~RowFileWriter();

  // Writes the chunk's removed keys (if any), then its rows.
  absl::Status Append(const ExportChunk& chunk);
  // Writes a state record (after every row).
  absl::Status AppendState(const StateRecord& record);
  // Writes the footer, closes the file and renames it to the final path.
  absl::Status Finish();
  int64_t rows() const { return rows_; }

 private:
  RowFileWriter(::tensorflow::Env* env, std::string path, std::string temp_path,
                std::unique_ptr<::tensorflow::WritableFile> file, const RowFileHeader& header);
  absl::Status Write(const void* data, size_t size, uint32_t* crc);

  ::tensorflow::Env* env_;
  std::string path_, temp_path_;
  std::unique_ptr<::tensorflow::WritableFile> file_;
  RowFileHeader header_;
  absl::Status WriteRecord(uint32_t magic, uint32_t n,
                           std::initializer_list<std::pair<const void*, size_t>> parts);

  int64_t rows_ = 0, chunks_ = 0, removed_ = 0;
  bool finished_ = false;
};

// Reads a row file front to back, checking every checksum and that the footer ends it.
class RowFileReader {
 public:
  // Opens `path` and reads its header; the error names the file. Without
  // verify_records, records' checksums are not computed (a reader of files that
  // CheckRowFile has just verified); the header, footer and record framing still are.
  static absl::Status Open(::tensorflow::Env* env, const std::string& path,
                           std::unique_ptr<RowFileReader>* out, bool verify_records = true);

  const RowFileHeader& header() const { return header_; }
  const std::string& path() const { return path_; }
  // Reads the next record: rows into *chunk (chunk->removed empty), removed keys
  // (chunk->keys empty), or a state record into *state (state->kind; kNone otherwise; with
  // state null such records are checked and skipped). At the footer, sets *done and checks
  // the totals.
  absl::Status Next(ExportChunk* chunk, bool* done, StateRecord* state = nullptr);
  int64_t rows() const { return rows_; }
  int64_t removed() const { return removed_; }

 private:
  RowFileReader(std::string path, std::unique_ptr<::tensorflow::RandomAccessFile> file,
                uint64_t size);
  absl::Status Read(uint64_t size, void* data, uint32_t* crc);
  absl::Status Corrupt(const std::string& what) const;

  std::string path_;
  std::unique_ptr<::tensorflow::RandomAccessFile> file_;
  uint64_t size_, offset_ = 0;
  bool verify_records_ = true;
  RowFileHeader header_;
  int64_t rows_ = 0, chunks_ = 0, removed_ = 0;
};

// Reads every row of `path` and checks that its header matches dim, num_slots and
// optimizer and that it holds `expected_rows` rows (-1: any); returns its header.
absl::Status CheckRowFile(::tensorflow::Env* env, const std::string& path, int64_t expected_rows,
                          uint32_t dim, uint32_t num_slots, uint32_t optimizer,
                          RowFileHeader* header);

}  // namespace tfps

#endif  // TFPS_TABLE_KERNELS_ROW_FILE_H_
