#!/usr/bin/env bash
# Activation checkpointing: peak memory above the model's and step time of an L-block stack,
# every block checkpointed or none, one process per measurement, alternating round after
# round; ratios within a round, reported as median (min-max).
#
#   bench/activation_checkpoint.sh [build-dir] [rounds] [blocks...]     (after scripts/quickstart.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
build="${1:-build}"
rounds="${2:-5}"
shift $(($# < 2 ? $# : 2))
blocks=("$@")
[ ${#blocks[@]} -eq 0 ] && blocks=(4 8 16)
out="bench/results/activation_checkpoint.jsonl"
mkdir -p bench/results
: > "$out"
export OMP_NUM_THREADS=1
for round in $(seq 0 $((rounds - 1))); do
  for l in "${blocks[@]}"; do
    for v in plain checkpointed; do
      "$build/bench/bench_activation_checkpoint" --variant "$v" --blocks "$l" --round "$round" >> "$out"
    done
  done
done
python3 - "$out" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
def get(v, l, r, key):
    return next(x[key] for x in rows if x["variant"] == v and x["blocks"] == l and x["round"] == r)
rounds = sorted({x["round"] for x in rows})
def summary(xs):
    return f"{statistics.median(xs):.2f} ({min(xs):.2f}–{max(xs):.2f})"
print("| blocks | peak above base, plain (MB) | checkpointed (MB) | memory checkpointed / plain | time checkpointed / plain | block input (MB) |")
print("|---|---|---|---|---|---|")
for l in sorted({x["blocks"] for x in rows}):
    plain = [get("plain", l, r, "peak_above_base_mb") for r in rounds]
    ckpt = [get("checkpointed", l, r, "peak_above_base_mb") for r in rounds]
    mem = [get("checkpointed", l, r, "peak_above_base_mb") / get("plain", l, r, "peak_above_base_mb") for r in rounds]
    time = [get("checkpointed", l, r, "ms_per_step") / get("plain", l, r, "ms_per_step") for r in rounds]
    block_input = get("plain", l, rounds[0], "block_input_mb")
    print(f"| {l} | {statistics.median(plain):.0f} | {statistics.median(ckpt):.0f} | {summary(mem)} | {summary(time)} | {block_input:.1f} |")
PY
