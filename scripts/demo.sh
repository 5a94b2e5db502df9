#!/usr/bin/env bash
# The main job from a fresh machine: installs, builds, generates Criteo-format data, trains
# the DLRM-style example on a local cluster (2 PS, 2 workers) with tfps-launch, printing
# each epoch, then evaluates every eval line once beside the best AUC the data allows,
# exports a serving model and serves a few eval examples from it in a fresh process that
# never imports tfps. Everything goes under $OUT_DIR: data, checkpoints (the last 2
# epochs'), backups (removed when training ends), logs, TensorBoard logs and exports.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
OUT_DIR="${OUT_DIR:-${TMPDIR:-/tmp}/tfps-demo}"
DATA_DIR="${DATA_DIR:-$OUT_DIR/data}"
EXPORT_DIR="$OUT_DIR/export/$(date +%Y%m%d-%H%M%S)"
python3 -m tfps.launch --num_ps 2 --num_workers 2 --log_dir "${LOG_DIR:-$OUT_DIR/logs}" \
  examples/train_ctr.py --data_dir "$DATA_DIR" --rows_per_file 100000 --epochs 8 --export_dir "$EXPORT_DIR" \
  --tensorboard_dir "$OUT_DIR/tensorboard" --backup_dir "$OUT_DIR/backup" --checkpoint_dir "$OUT_DIR/checkpoints" "$@"
env -u PYTHONPATH python3 examples/serve_export.py "$EXPORT_DIR"
