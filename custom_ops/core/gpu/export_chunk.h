// The host side of a chunked export (the kernels are in export_kernels.h): rows leave in
// slot order from a starting slot, a window of slots at a time. Each window costs one sync,
// since where a tile's rows go in the chunk depends on the counts of the tiles before it;
// a window of twice the chunk's rows usually holds the chunk (the load is about a third or
// more), so most chunks take one.
#ifndef TFPS_CORE_GPU_EXPORT_CHUNK_H_
#define TFPS_CORE_GPU_EXPORT_CHUNK_H_

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "custom_ops/core/gpu/device_memory.h"
#include "custom_ops/core/gpu/export_kernels.h"
#include "custom_ops/core/gpu/gpu_table.h"

namespace tfps {
namespace gpu {

struct ExportScratch {
  void* block = nullptr;
  uint64_t tiles = 0;             // tiles of a window
  uint32_t* counts = nullptr;     // [tiles] rows per tile
  int64_t* first_rows = nullptr;  // [tiles] chunk row of each tile's first row
  uint64_t* picked = nullptr;     // [max_rows] slot of each chunk row
  uint64_t* next_slot = nullptr;  // slot of the first row past the chunk
};

// Places the rows of `range` after the *rows already placed: counts each tile's rows,
// numbers the tiles' first rows on the host and picks the rows on the device. Sets
// *found_next once the row past the chunk is seen.
inline Status ExportWindow(const char* op, cudaStream_t stream, const TableView& view,
                           SlotRange range, int64_t max_rows, const ExportScratch& scratch,
                           const RowBuffers& out, int64_t* rows, bool* found_next) {
  const int64_t tiles =
      static_cast<int64_t>((range.end - range.begin + kExportTileSlots - 1) / kExportTileSlots);
  TFPS_GPU_RETURN_IF_ERROR(
      TFPS_LAUNCH(op, CountRowsKernel, tiles, stream, view, range, tiles, scratch.counts));
  std::vector<uint32_t> counts(tiles);
  TFPS_GPU_RETURN_IF_ERROR(
      CopyToHost(op, "row counts", stream, counts.data(), scratch.counts, tiles));
  std::vector<int64_t> first_rows(tiles);
  int64_t placed = *rows;
  for (int64_t t = 0; t < tiles; ++t) {
    first_rows[t] = placed;
    placed += counts[t];
  }
  TFPS_RETURN_IF_CUDA_ERROR(
      op, "copying row numbers to the device",
      cudaMemcpyAsync(scratch.first_rows, first_rows.data(), tiles * sizeof(int64_t),
                      cudaMemcpyHostToDevice, stream));
  TFPS_GPU_RETURN_IF_ERROR(TFPS_LAUNCH(op, PickRowsKernel, tiles, stream, view, range, tiles,
                                       scratch.first_rows, max_rows, out.keys, scratch.picked,
                                       scratch.next_slot));
  // first_rows (host memory) must outlive the copy that reads it.
  TFPS_RETURN_IF_CUDA_ERROR(op, "waiting for picked rows", cudaStreamSynchronize(stream));
  *found_next = placed > max_rows;
  *rows = std::min(placed, max_rows);
  return Status::OK();
}

// Up to max_rows rows of the slots from `begin` into `out`; *rows says how many, and
// *next_slot the slot of the first row left for the next chunk (-1: none).
inline Status ExportChunkFrom(const char* op, cudaStream_t stream, const TableView& view,
                              uint64_t capacity, uint64_t begin, int64_t max_rows,
                              const RowBuffers& out, int64_t* rows, int64_t* next_slot) {
  ExportScratch scratch;
  const uint64_t wanted = 2 * static_cast<uint64_t>(max_rows + 1);
  scratch.tiles = std::max<uint64_t>(64, (wanted + kExportTileSlots - 1) / kExportTileSlots);
  DeviceBlock block;
  block.Add(&scratch.counts, scratch.tiles);
  block.Add(&scratch.first_rows, scratch.tiles);
  block.Add(&scratch.picked, std::max<int64_t>(max_rows, 1));
  block.Add(&scratch.next_slot, 1);
  TFPS_GPU_RETURN_IF_ERROR(block.Allocate(
      op, "an export chunk of " + std::to_string(max_rows) + " rows", stream, &scratch.block));
  *rows = 0;
  *next_slot = -1;
  bool found_next = false;
  const uint64_t window = scratch.tiles * kExportTileSlots;
  Status status;
  for (uint64_t from = begin; status.ok() && from < capacity && !found_next; from += window) {
    status = ExportWindow(op, stream, view, SlotRange{from, std::min(capacity, from + window)},
                          max_rows, scratch, out, rows, &found_next);
  }
  if (status.ok()) {
    status = TFPS_LAUNCH(op, ExportRowsKernel, *rows * view.dim, stream, view, *rows,
                         scratch.picked, out.values, out.slots, out.metadata);
  }
  uint64_t slot = 0;
  if (status.ok() && found_next) {
    status = CopyToHost(op, "the next cursor", stream, &slot, scratch.next_slot, 1);
    if (status.ok()) *next_slot = static_cast<int64_t>(slot);
  }
  const Status freed = FreeBlock(op, stream, &scratch.block);
  return status.ok() ? freed : status;
}

}  // namespace gpu
}  // namespace tfps

#endif  // TFPS_CORE_GPU_EXPORT_CHUNK_H_
