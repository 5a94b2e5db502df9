#!/usr/bin/env bash
# Installs Debian's Bazel 4.2.3 and the rule packages the offline Bazel build uses.
set -euo pipefail
if command -v bazel >/dev/null && [ -d /usr/share/bazel/rules/java ] && [ -d /usr/share/bazel/tools/platforms ]; then
  exit 0
fi
SUDO=""
[ "$(id -u)" = 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq bazel-bootstrap bazel-platforms bazel-rules-java bazel-rules-proto >/dev/null
