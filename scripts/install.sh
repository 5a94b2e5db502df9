#!/usr/bin/env bash
# Installs what tfps needs on a fresh machine and builds the op library in place.
# TFPS_TF_VERSION picks the TensorFlow release (default 2.21.0).
set -euo pipefail
cd "$(dirname "$0")/.."
TF_VERSION="${TFPS_TF_VERSION:-2.21.0}"
PY="${PYTHON:-python3}"
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
"$PY" -m pip install -q "tensorflow==${TF_VERSION}" "tf_keras==${TF_VERSION%.*}.*" \
  "tensorboard==${TF_VERSION%.*}.*" numpy pytest scikit-learn setuptools wheel matplotlib
bash scripts/install_rocksdb.sh  # tiered tables keep rows on disk in RocksDB
"$PY" -m pip install -q --no-build-isolation -e .
# The table ops' GPU kernels, where a CUDA 12 nvcc (TensorFlow's CUDA major version) is at
# hand ($NVCC, or nvcc on the PATH), or with any supported nvcc under TFPS_BUILD_GPU=1.
# Elsewhere the CPU build stands alone.
nvcc_path="${NVCC:-$(command -v nvcc || true)}"
if [[ -n "$nvcc_path" ]] && { [[ "${TFPS_BUILD_GPU:-0}" == "1" ]] || "$nvcc_path" --version | grep -q "release 12\."; }; then
  NVCC="$nvcc_path" "$PY" scripts/build_gpu_ops.py cuda
fi
