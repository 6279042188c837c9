#!/usr/bin/env bash
# Prints one SHA-256 over every source file the GPU check's programs are built from (path and
# content), so that scripts/gpu-check.sh runs programs prebuilt by scripts/prepare-gpu-carry.sh
# only when they were built from these very sources, never from an older working tree.
set -euo pipefail
cd "$(dirname "$0")/.."
find include tests examples bench cmake CMakeLists.txt -type f ! -name '*.pyc' ! -path '*/__pycache__/*' -print0 |
  LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum | cut -d' ' -f1
