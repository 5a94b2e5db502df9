// The DiskStore of a build without RocksDB (the GPU harness on a machine that has only
// CUDA): every table works but a tiered one, which fails to open saying why.
#include "custom_ops/core/disk_store.h"

namespace tfps {

struct DiskStore::Rocks {};

DiskStore::DiskStore(const std::string& directory, int64_t row_bytes, const DiskStoreOptions& options)
    : directory_(directory), row_bytes_(row_bytes), options_(options) {
  throw DiskStoreError("tfps: this build has no disk tier (it was built without RocksDB)");
}
DiskStore::~DiskStore() = default;
void DiskStore::Put(int64_t, const uint64_t*, const void*) {}
int64_t DiskStore::Get(int64_t, const uint64_t*, void*, uint8_t*) const { return 0; }
int64_t DiskStore::GetAscending(int64_t, const uint64_t*, void*, uint8_t*) const { return 0; }
void DiskStore::Delete(int64_t, const uint64_t*) {}
void DiskStore::Clear() {}
DiskStoreStats DiskStore::GetStats() const { return {}; }
int64_t DiskStore::CountRows() const { return 0; }

}  // namespace tfps
