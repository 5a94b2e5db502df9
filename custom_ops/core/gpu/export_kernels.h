// Kernels of a chunked export, driven by export_chunk.h. Rows leave in slot order, so a
// cursor is a slot position. The slots from the cursor are cut into tiles; CountRowsKernel
// counts each tile's rows, the host turns the counts into each tile's first row in the
// chunk, PickRowsKernel walks each tile in order writing keys and the slot of every chunk
// row (and the slot of the first row past the chunk, the next cursor), and
// ExportRowsKernel copies values, slots and metadata, one thread per element, into the
// CPU table's export layout.
#ifndef TFPS_CORE_GPU_EXPORT_KERNELS_H_
#define TFPS_CORE_GPU_EXPORT_KERNELS_H_

#include <cstdint>

#include "custom_ops/core/gpu/hash_index.h"
#include "custom_ops/core/gpu/row_kernels.h"

namespace tfps {
namespace gpu {

constexpr int64_t kExportTileSlots = 1024;

// The slots [begin, end) as tiles of kExportTileSlots.
struct SlotRange {
  uint64_t begin;
  uint64_t end;

  TFPS_DEVICE uint64_t TileBegin(int64_t tile) const { return begin + tile * kExportTileSlots; }
  TFPS_DEVICE uint64_t TileEnd(int64_t tile) const {
    const uint64_t e = TileBegin(tile) + kExportTileSlots;
    return e < end ? e : end;
  }
};

__global__ void CountRowsKernel(TableView t, SlotRange range, int64_t tiles, uint32_t* counts) {
  const int64_t tile = GlobalThread();
  if (tile >= tiles) return;
  uint32_t count = 0;
  for (uint64_t s = range.TileBegin(tile); s < range.TileEnd(tile); ++s)
    count += SlotIsFull(t.ctrl, s);
  counts[tile] = count;
}

// first_row[tile]: the chunk's row number of the tile's first row. Rows numbered
// max_rows and beyond are not written; the slot of row max_rows goes to *next_slot.
__global__ void PickRowsKernel(TableView t, SlotRange range, int64_t tiles,
                               const int64_t* first_row, int64_t max_rows, uint64_t* keys,
                               uint64_t* picked, uint64_t* next_slot) {
  const int64_t tile = GlobalThread();
  if (tile >= tiles) return;
  int64_t row = first_row[tile];
  for (uint64_t s = range.TileBegin(tile); s < range.TileEnd(tile) && row <= max_rows; ++s) {
    if (!SlotIsFull(t.ctrl, s)) continue;
    if (row == max_rows) {
      *next_slot = s;
      return;
    }
    keys[row] = t.keys[s];
    picked[row] = s;
    ++row;
  }
}

// values [rows, dim], slots [rows, num_slots, dim], metadata [rows, kMetadataColumns]
// (count, last step, optimizer step, score: 0, the GPU table keeping none) of the picked slots.
__global__ void ExportRowsKernel(TableView t, int64_t rows, const uint64_t* picked, float* values,
                                 float* slots, int64_t* metadata) {
  const int64_t g = GlobalThread();
  const int64_t row = g / t.dim;
  const int e = static_cast<int>(g - row * t.dim);
  if (row >= rows) return;
  const uint64_t slot = picked[row];
  values[row * t.dim + e] = t.values[slot * t.dim + e];
  for (int s = 0; s < t.num_slots; ++s) {
    slots[(row * t.num_slots + s) * t.dim + e] = t.slots[(slot * t.dim + e) * t.num_slots + s];
  }
  if (e == 0) {
    int64_t* m = metadata + row * kMetadataColumns;
    m[0] = t.counts[slot];
    m[1] = t.last_steps[slot];
    m[2] = t.opt_steps != nullptr ? t.opt_steps[slot] : 0;
    m[3] = 0;
  }
}

}  // namespace gpu
}  // namespace tfps

#endif  // TFPS_CORE_GPU_EXPORT_KERNELS_H_
