#!/usr/bin/env bash
# Gloo's reduce-scatter as c10d makes it (an all-reduce of a copy of the input, then one slice)
# against the all-to-all the Communicator uses (ProcessGroupOptions::reduce_scatter_all_to_all):
# bench_zero's MLP with AdamW, data parallel (which reduce-scatters nothing: the control) and
# ZeRO stages 2 and 3 on 2 ranks, stages 2 and 3 on 3 ranks; the two kinds alternate within each
# round. Rank 0's step time (median of the steps after the first), communication time and peak
# RSS per run; the table shows each run's step time and the medians of the rest.
#
#   bench/reduce_scatter.sh [build-dir] [rounds] [params-millions]   (after scripts/quickstart.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
build="${1:-build}"
rounds="${2:-3}"
millions="${3:-40}"
out="bench/results/zero_reduce_scatter.jsonl"
mkdir -p bench/results
: > "$out"
export OMP_NUM_THREADS=1
unset THP_MEM_ALLOC_ENABLE
for round in $(seq "$rounds"); do
  for run in "2 ddp" "2 zero2" "2 zero3" "3 zero2" "3 zero3"; do
    read -r ranks backend <<< "$run"
    for kind in c10d all-to-all; do
      "$build/bench/bench_zero" --nproc "$ranks" --backend "$backend" --params-millions "$millions" --steps 6 \
        --reduce-scatter "$kind" | grep '^{' | grep '"rank":0' | sed "s/}\$/,\"round\":$round}/" >> "$out"
    done
  done
done
.venv/bin/python - "$out" <<'PY'
import collections, json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
runs = collections.defaultdict(list)
for r in rows:
    runs[(r["world_size"], r["backend"], r["reduce_scatter"])].append(r)
print("| ranks | backend | reduce-scatter | ms per step, each round | median | comm ms per step | of which exposed | peak RSS MB |")
print("|---|---|---|---|---|---|---|---|")
order = {"ddp": 0, "zero2": 1, "zero3": 2}
for (w, b, kind), rs in sorted(runs.items(), key=lambda k: (k[0][0], order[k[0][1]], k[0][2] != "c10d")):
    med = lambda key: statistics.median(x[key] for x in rs)
    steps = " / ".join(f"{x['median_step_ms']:.0f}" for x in rs)
    print(f"| {w} | {b} | {kind} | {steps} | {med('median_step_ms'):.0f} | {med('comm_ms_per_step'):.0f} "
          f"| {med('exposed_comm_ms_per_step'):.0f} | {med('peak_rss_bytes') / 2**20:.0f} |")
PY
