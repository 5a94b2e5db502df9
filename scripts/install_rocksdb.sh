#!/usr/bin/env bash
# Installs RocksDB's headers and library (Debian's librocksdb-dev), which the op library
# links against for tiered tables' rows on disk, unless they are there already.
set -euo pipefail
if [[ -e /usr/include/rocksdb/db.h ]] && ldconfig -p | grep -q 'librocksdb\.so '; then
  exit 0
fi
sudo_if_needed=()
[[ "$(id -u)" == 0 ]] || sudo_if_needed=(sudo)
export DEBIAN_FRONTEND=noninteractive
"${sudo_if_needed[@]}" apt-get install -y -q librocksdb-dev >/dev/null || {
  "${sudo_if_needed[@]}" apt-get update -q >/dev/null
  "${sudo_if_needed[@]}" apt-get install -y -q librocksdb-dev >/dev/null
}
