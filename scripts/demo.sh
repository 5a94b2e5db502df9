#!/usr/bin/env bash
# The main job from a fresh machine: installs, builds, and runs the table demo.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
python3 examples/table_demo.py "$@"
