#!/usr/bin/env bash
# Load time of a resharded checkpoint (written by 2 processes, loaded by 1) next to one of the
# same size written by 1 process: ZeRO stage 2, AdamW, ~300 MB of training state.
# Usage: bench/reshard.sh [build-dir] [output.json]
set -euo pipefail
build=${1:-build}
out=${2:-bench/results/reshard.json}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
"$build/bench/bench_reshard" --nproc 2 save "$dir/two"
"$build/bench/bench_reshard" save "$dir/one"
"$build/bench/bench_reshard" load "$dir" | tee "$out"
