#include "custom_ops/table/kernels/row_file.h"

#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "custom_ops/core/crc32c.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "row files are little-endian");

namespace tfps {
namespace {

constexpr char kMagic[8] = {'T', 'F', 'P', 'S', 'R', 'O', 'W', 'S'};
constexpr uint32_t kChunkMagic = 0x4b4e4843;   // "CHNK"
constexpr uint32_t kRemovedMagic = 0x44564d52;  // "RMVD"
constexpr uint32_t kTableMagic = 0x4c424154;    // "TABL"
constexpr uint32_t kSketchMagic = 0x48434b53;   // "SKCH"
constexpr uint32_t kPendingMagic = 0x444e4550;  // "PEND"
constexpr size_t kSketchHeadBytes = 16;
constexpr uint32_t kFooterMagic = 0x444e4554;  // "TEND"
constexpr size_t kHeaderBytes = 64, kFooterBytes = 40;

template <typename T>
void Put(char* at, T value) {
  std::memcpy(at, &value, sizeof(T));
}

template <typename T>
T Get(const char* at) {
  T value;
  std::memcpy(&value, at, sizeof(T));
  return value;
}

void EncodeHeader(const RowFileHeader& h, char* out) {
  std::memset(out, 0, kHeaderBytes);
  std::memcpy(out, kMagic, sizeof(kMagic));
  Put(out + 8, h.version);
  Put(out + 12, h.dim);
  Put(out + 16, h.num_slots);
  Put(out + 20, h.optimizer);
  Put(out + 24, h.clock);
  Put(out + 32, h.shard_index);
  Put(out + 36, h.num_shards);
  Put(out + 40, h.kind);
  Put(out + 44, h.save_id);
  Put(out + 52, h.base_id);
  Put(out + 60, Crc32c(0, out, 60));
}

}  // namespace

std::string TempPathOf(::tensorflow::Env* env, const std::string& path) {
  return absl::StrCat(path, ".tmp-", env->NowMicros());
}

// Metadata columns per row: version 1 had no score column.
uint64_t MetadataColumns(const RowFileHeader& h) { return h.version == 1 ? kScore : kNumMetadata; }

std::string ChainOf(const std::string& chain, const std::string& path) {
  if (!chain.empty()) return chain;
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? std::string() : path.substr(0, slash);
}

uint64_t RowBytes(const RowFileHeader& h) {
  return sizeof(int64_t) * (1 + MetadataColumns(h)) + sizeof(float) * uint64_t{h.dim} * (1 + h.num_slots);
}

RowFileWriter::RowFileWriter(::tensorflow::Env* env, std::string path, std::string temp_path,
                             std::unique_ptr<::tensorflow::WritableFile> file,
                             const RowFileHeader& header)
    : env_(env), path_(std::move(path)), temp_path_(std::move(temp_path)),
      file_(std::move(file)), header_(header) {}

RowFileWriter::~RowFileWriter() {
  if (!finished_) {
    file_.reset();
    env_->DeleteFile(temp_path_).IgnoreError();
  }
}

absl::Status RowFileWriter::Create(::tensorflow::Env* env, const std::string& path,
                                   const RowFileHeader& header,
                                   std::unique_ptr<RowFileWriter>* out) {
  const std::string temp_path = TempPathOf(env, path);
  // The checkpoint's directory, made on this task as TensorFlow's own savers make theirs:
  // the chief made it where it sees it, which on several machines may be other storage.
  const size_t slash = path.rfind('/');
  if (slash != std::string::npos && slash > 0) {
    const std::string directory = path.substr(0, slash);
    if (!env->FileExists(directory).ok()) TF_RETURN_IF_ERROR(env->RecursivelyCreateDir(directory));
  }
  std::unique_ptr<::tensorflow::WritableFile> file;
  TF_RETURN_IF_ERROR(env->NewWritableFile(temp_path, &file));
  out->reset(new RowFileWriter(env, path, temp_path, std::move(file), header));
  char bytes[kHeaderBytes];
  EncodeHeader(header, bytes);
  return (*out)->Write(bytes, kHeaderBytes, nullptr);
}

absl::Status RowFileWriter::Write(const void* data, size_t size, uint32_t* crc) {
  if (crc != nullptr) *crc = Crc32c(*crc, data, size);
  absl::Status status =
      file_->Append(absl::string_view(static_cast<const char*>(data), size));
  if (!status.ok()) {
    return absl::Status(status.code(), absl::StrCat("writing tfps checkpoint file '", path_,
                                                    "': ", status.message()));
  }
  return absl::OkStatus();
}

absl::Status RowFileWriter::WriteRecord(
    uint32_t magic, uint32_t n, std::initializer_list<std::pair<const void*, size_t>> parts) {
  uint32_t crc = 0;
  char head[8];
  Put(head, magic);
  Put(head + 4, n);
  TF_RETURN_IF_ERROR(Write(head, sizeof(head), &crc));
  for (const auto& [data, bytes] : parts) TF_RETURN_IF_ERROR(Write(data, bytes, &crc));
  return Write(&crc, sizeof(crc), nullptr);
}

absl::Status RowFileWriter::Append(const ExportChunk& chunk) {
  if (!chunk.removed.empty()) {
    const uint32_t n = static_cast<uint32_t>(chunk.removed.size());
    TF_RETURN_IF_ERROR(WriteRecord(kRemovedMagic, n, {{chunk.removed.data(), n * sizeof(int64_t)}}));
    removed_ += n;
  }
  const uint32_t n = static_cast<uint32_t>(chunk.keys.size());
  if (n == 0) return absl::OkStatus();
  TF_RETURN_IF_ERROR(WriteRecord(
      kChunkMagic, n,
      {{chunk.keys.data(), n * sizeof(int64_t)},
       {chunk.metadata.data(), chunk.metadata.size() * sizeof(int64_t)},
       {chunk.values.data(), chunk.values.size() * sizeof(float)},
       {chunk.slots.data(), chunk.slots.size() * sizeof(float)}}));
  rows_ += n;
  ++chunks_;
  return absl::OkStatus();
}

absl::Status RowFileWriter::AppendState(const StateRecord& r) {
  switch (r.kind) {
    case StateRecord::kTable:
      return WriteRecord(kTableMagic, static_cast<uint32_t>(r.table.size()),
                         {{r.table.data(), r.table.size() * sizeof(int64_t)}});
    case StateRecord::kSketch: {
      const uint32_t head[4] = {r.stripe, r.log2_stripes, r.width, 0};
      return WriteRecord(kSketchMagic, static_cast<uint32_t>(r.cells.size()),
                         {{head, sizeof(head)}, {r.cells.data(), r.cells.size() * sizeof(uint16_t)}});
    }
    case StateRecord::kPending:
      return WriteRecord(kPendingMagic, static_cast<uint32_t>(r.keys.size()),
                         {{r.keys.data(), r.keys.size() * sizeof(int64_t)},
                          {r.counts.data(), r.counts.size() * sizeof(uint32_t)}});
    case StateRecord::kNone:
      break;
  }
  return absl::OkStatus();
}

absl::Status RowFileWriter::Finish() {
  char footer[kFooterBytes] = {};
  Put(footer, kFooterMagic);
  Put(footer + 8, static_cast<uint64_t>(rows_));
  Put(footer + 16, static_cast<uint64_t>(chunks_));
  Put(footer + 24, static_cast<uint64_t>(removed_));
  Put(footer + 36, Crc32c(0, footer, 36));
  TF_RETURN_IF_ERROR(Write(footer, kFooterBytes, nullptr));
  TF_RETURN_IF_ERROR(file_->Close());
  TF_RETURN_IF_ERROR(env_->RenameFile(temp_path_, path_));
  finished_ = true;
  return absl::OkStatus();
}

RowFileReader::RowFileReader(std::string path,
                             std::unique_ptr<::tensorflow::RandomAccessFile> file, uint64_t size)
    : path_(std::move(path)), file_(std::move(file)), size_(size) {}

absl::Status RowFileReader::Corrupt(const std::string& what) const {
  return absl::DataLossError(
      absl::StrCat("tfps checkpoint file '", path_, "' is corrupt or truncated: ", what));
}

absl::Status RowFileReader::Open(::tensorflow::Env* env, const std::string& path,
                                 std::unique_ptr<RowFileReader>* out, bool verify_records) {
  uint64_t size = 0;
  absl::Status status = env->GetFileSize(path, &size);
  if (!status.ok()) {
    return absl::NotFoundError(absl::StrCat("tfps checkpoint file '", path,
                                            "' cannot be read: ", status.message()));
  }
  std::unique_ptr<::tensorflow::RandomAccessFile> file;
  TF_RETURN_IF_ERROR(env->NewRandomAccessFile(path, &file));
  out->reset(new RowFileReader(path, std::move(file), size));
  RowFileReader& reader = **out;
  reader.verify_records_ = verify_records;
  char bytes[kHeaderBytes];
  TF_RETURN_IF_ERROR(reader.Read(kHeaderBytes, bytes, nullptr));
  if (std::memcmp(bytes, kMagic, sizeof(kMagic)) != 0) {
    return reader.Corrupt("it does not start with TFPSROWS (not a tfps row file)");
  }
  if (Get<uint32_t>(bytes + 60) != Crc32c(0, bytes, 60)) return reader.Corrupt("header checksum");
  RowFileHeader& h = reader.header_;
  h.version = Get<uint32_t>(bytes + 8);
  h.dim = Get<uint32_t>(bytes + 12);
  h.num_slots = Get<uint32_t>(bytes + 16);
  h.optimizer = Get<uint32_t>(bytes + 20);
  h.clock = Get<int64_t>(bytes + 24);
  h.shard_index = Get<uint32_t>(bytes + 32);
  h.num_shards = Get<uint32_t>(bytes + 36);
  h.kind = Get<uint32_t>(bytes + 40);
  h.save_id = Get<uint64_t>(bytes + 44);
  h.base_id = Get<uint64_t>(bytes + 52);
  if (h.version < 1 || h.version > kRowFileVersion) {
    return absl::FailedPreconditionError(absl::StrCat(
        "tfps checkpoint file '", path, "' has format version ", h.version,
        "; this tfps reads versions 1 to ", kRowFileVersion));
  }
  if (h.dim == 0) return reader.Corrupt("dim 0 in the header");
  if (h.kind != kWholeShard && h.kind != kShardChanges) return reader.Corrupt("unknown kind");
  return absl::OkStatus();
}

absl::Status RowFileReader::Read(uint64_t size, void* data, uint32_t* crc) {
  if (size > size_ - offset_) {
    return Corrupt(absl::StrCat("it ends at byte ", size_, " but ", size,
                                " more bytes are due at byte ", offset_));
  }
  char* out = static_cast<char*>(data);
  uint64_t done = 0;
  while (done < size) {
    absl::string_view piece;
    absl::Status status = file_->Read(offset_ + done, size - done, &piece, out + done);
    if (piece.data() != out + done && !piece.empty()) std::memmove(out + done, piece.data(), piece.size());
    done += piece.size();
    if (!status.ok() && done < size) {
      return absl::Status(status.code(), absl::StrCat("reading tfps checkpoint file '", path_,
                                                      "': ", status.message()));
    }
    if (piece.empty() && done < size) return Corrupt("short read");
  }
  offset_ += size;
  if (crc != nullptr) *crc = Crc32c(*crc, data, size);
  return absl::OkStatus();
}

absl::Status RowFileReader::Next(ExportChunk* chunk, bool* done, StateRecord* state) {
  *done = false;
  if (state != nullptr) state->kind = StateRecord::kNone;
  uint32_t crc = 0;
  uint32_t* record_crc = verify_records_ ? &crc : nullptr;
  char head[8];
  TF_RETURN_IF_ERROR(Read(4, head, record_crc));
  const uint32_t magic = Get<uint32_t>(head);
  if (magic == kFooterMagic) {
    char footer[kFooterBytes];
    std::memcpy(footer, head, 4);
    TF_RETURN_IF_ERROR(Read(kFooterBytes - 4, footer + 4, nullptr));
    if (Get<uint32_t>(footer + 36) != Crc32c(0, footer, 36)) return Corrupt("footer checksum");
    if (Get<uint64_t>(footer + 8) != static_cast<uint64_t>(rows_) ||
        Get<uint64_t>(footer + 16) != static_cast<uint64_t>(chunks_) ||
        Get<uint64_t>(footer + 24) != static_cast<uint64_t>(removed_)) {
      return Corrupt(absl::StrCat("the footer counts ", Get<uint64_t>(footer + 8), " rows in ",
                                  Get<uint64_t>(footer + 16), " chunks and ",
                                  Get<uint64_t>(footer + 24), " removed keys, the file holds ",
                                  rows_, " in ", chunks_, " and ", removed_));
    }
    if (offset_ != size_) return Corrupt(absl::StrCat(size_ - offset_, " bytes after the footer"));
    *done = true;
    return absl::OkStatus();
  }
  const bool state_record =
      header_.version >= 2 && (magic == kTableMagic || magic == kSketchMagic || magic == kPendingMagic);
  if (magic != kChunkMagic && magic != kRemovedMagic && !state_record) {
    return Corrupt(absl::StrCat("no record or footer at byte ", offset_ - 4));
  }
  TF_RETURN_IF_ERROR(Read(4, head + 4, record_crc));
  const uint64_t n = Get<uint32_t>(head + 4);
  uint64_t entry_bytes = sizeof(int64_t), fixed_bytes = 0;
  if (magic == kChunkMagic) entry_bytes = RowBytes(header_);
  if (magic == kSketchMagic) entry_bytes = sizeof(uint16_t), fixed_bytes = kSketchHeadBytes;
  if (magic == kPendingMagic) entry_bytes = sizeof(int64_t) + sizeof(uint32_t);
  if ((n == 0 && !state_record) || fixed_bytes + n * entry_bytes > size_ - offset_) {
    return Corrupt(absl::StrCat("a record of ", n, " entries does not fit in the file"));
  }
  chunk->keys.clear();
  chunk->removed.clear();
  StateRecord skipped;
  StateRecord& record = state != nullptr ? *state : skipped;
  if (magic == kRemovedMagic) {
    chunk->removed.resize(n);
    TF_RETURN_IF_ERROR(Read(n * sizeof(int64_t), chunk->removed.data(), record_crc));
  } else if (magic == kChunkMagic) {
    const size_t dim = header_.dim, slot_width = size_t{header_.num_slots} * dim;
    const uint64_t columns = MetadataColumns(header_);
    chunk->keys.resize(n);
    chunk->metadata.assign(n * kNumMetadata, 0);
    chunk->values.resize(n * dim);
    chunk->slots.resize(n * slot_width);
    TF_RETURN_IF_ERROR(Read(n * sizeof(int64_t), chunk->keys.data(), record_crc));
    TF_RETURN_IF_ERROR(Read(n * columns * sizeof(int64_t), chunk->metadata.data(), record_crc));
    if (columns != kNumMetadata) {  // spread version 1's rows out, their scores 0
      for (uint64_t i = n; i-- > 0;) {
        for (uint64_t c = columns; c-- > 0;) chunk->metadata[i * kNumMetadata + c] = chunk->metadata[i * columns + c];
        for (uint64_t c = columns; c < kNumMetadata; ++c) chunk->metadata[i * kNumMetadata + c] = 0;
      }
    }
    TF_RETURN_IF_ERROR(Read(chunk->values.size() * sizeof(float), chunk->values.data(), record_crc));
    TF_RETURN_IF_ERROR(Read(chunk->slots.size() * sizeof(float), chunk->slots.data(), record_crc));
  } else if (magic == kTableMagic) {
    record.kind = StateRecord::kTable;
    record.table.resize(n);
    TF_RETURN_IF_ERROR(Read(n * sizeof(int64_t), record.table.data(), record_crc));
    const uint64_t counters = header_.version < 3 ? kSkippedSteps : kNumCounters;
    if (n < counters || (n - counters) % 2 != 0) return Corrupt(absl::StrCat("a TABL record of ", n, " values"));
    // Version 2 counted no skipped steps: read as none.
    if (counters < kNumCounters) record.table.insert(record.table.begin() + kSkippedSteps, 0);
  } else if (magic == kSketchMagic) {
    uint32_t sketch_head[4];
    TF_RETURN_IF_ERROR(Read(sizeof(sketch_head), sketch_head, record_crc));
    record.kind = StateRecord::kSketch;
    record.stripe = sketch_head[0];
    record.log2_stripes = sketch_head[1];
    record.width = sketch_head[2];
    record.cells.resize(n);
    TF_RETURN_IF_ERROR(Read(n * sizeof(uint16_t), record.cells.data(), record_crc));
    const uint64_t width = record.width;
    if (record.log2_stripes > 16 || record.stripe >= (1u << record.log2_stripes) || width == 0 ||
        (width & (width - 1)) != 0 || n != 4 * width) {
      return Corrupt(absl::StrCat("a SKCH record of stripe ", record.stripe, " of 2^",
                                  record.log2_stripes, " and width ", width, " with ", n, " cells"));
    }
  } else {
    record.kind = StateRecord::kPending;
    record.keys.resize(n);
    record.counts.resize(n);
    TF_RETURN_IF_ERROR(Read(n * sizeof(int64_t), record.keys.data(), record_crc));
    TF_RETURN_IF_ERROR(Read(n * sizeof(uint32_t), record.counts.data(), record_crc));
  }
  uint32_t stored = 0;
  TF_RETURN_IF_ERROR(Read(sizeof(stored), &stored, nullptr));
  if (verify_records_ && stored != crc) return Corrupt(absl::StrCat("checksum of the record ending at byte ", offset_));
  if (magic == kChunkMagic) {
    rows_ += static_cast<int64_t>(n);
    ++chunks_;
  } else if (magic == kRemovedMagic) {
    removed_ += static_cast<int64_t>(n);
  }
  return absl::OkStatus();
}

absl::Status CheckRowFile(::tensorflow::Env* env, const std::string& path, int64_t expected_rows,
                          uint32_t dim, uint32_t num_slots, uint32_t optimizer,
                          RowFileHeader* header) {
  std::unique_ptr<RowFileReader> reader;
  TF_RETURN_IF_ERROR(RowFileReader::Open(env, path, &reader));
  const RowFileHeader& h = reader->header();
  if (h.dim != dim || h.num_slots != num_slots || h.optimizer != optimizer) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tfps checkpoint file '", path, "' holds rows of dim ", h.dim, " with ", h.num_slots,
        " slots of optimizer ", OptimizerName(static_cast<OptimizerKind>(h.optimizer)),
        "; the table has dim ", dim, " with ", num_slots, " slots of optimizer ",
        OptimizerName(static_cast<OptimizerKind>(optimizer))));
  }
  ExportChunk chunk;
  for (bool done = false; !done;) TF_RETURN_IF_ERROR(reader->Next(&chunk, &done));
  if (expected_rows >= 0 && reader->rows() != expected_rows) {
    return absl::DataLossError(absl::StrCat("tfps checkpoint file '", path, "' holds ",
                                            reader->rows(), " rows; the checkpoint recorded ",
                                            expected_rows));
  }
  *header = h;
  return absl::OkStatus();
}

}  // namespace tfps
