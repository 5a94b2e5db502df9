# Sourced by the harness builds (build.sh, run_emulated.sh): CORE_SOURCES, the CPU table's
# sources the harness compares against, and CORE_LIBS, what they link with. A machine
# with only CUDA has no RocksDB: there the table works but for a tiered one.
CORE_SOURCES=(custom_ops/core/*.cc)
CORE_LIBS=(-lpthread)
if [[ -e /usr/include/rocksdb/db.h ]]; then
  CORE_LIBS+=(-lrocksdb)
else
  CORE_SOURCES=("${CORE_SOURCES[@]/custom_ops\/core\/disk_store.cc/custom_ops/core/gpu/disk_store_absent.cc}")
fi
