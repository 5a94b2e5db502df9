#!/usr/bin/env bash
# The main job from a fresh machine: installs, builds, generates Criteo-format data and
# trains the DLRM-style example on a local cluster (2 PS, 2 workers) with tfps-launch.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
DATA_DIR="${DATA_DIR:-${TMPDIR:-/tmp}/tfps-criteo}"
python3 -m tfps.launch --num_ps 2 --num_workers 2 --log_dir "${LOG_DIR:-${TMPDIR:-/tmp}/tfps-logs}" \
  examples/train_ctr.py --data_dir "$DATA_DIR" --epochs 2 "$@"
