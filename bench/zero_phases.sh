#!/usr/bin/env bash
# Where a rank's memory goes, phase by phase: data parallel and ZeRO stages 1, 2 and 3 on 2
# ranks (bench_zero's MLP, AdamW), each with freed buffers kept in the heap and handed back to
# the system (AcceleratorOptions::retain_freed_memory = true / false; unset, data parallel keeps
# them and the sharded stages hand them back). Per run, rank 0: the resident memory with the
# model built, the peak of prepare, the resident memory between steps, what the last step's
# forward, backward and optimizer step each add at their peak, the peak over all steps, and
# the median step time. Each also with and without huge pages for large CPU buffers
# (AcceleratorOptions::huge_pages; the table says what LibTorch did). Variants alternate within
# each round; times are medians over rounds.
#
#   bench/zero_phases.sh [build-dir] [rounds] [params-millions]      (after scripts/quickstart.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
build="${1:-build}"
rounds="${2:-2}"
millions="${3:-40}"
out="bench/results/zero_phases.jsonl"
mkdir -p bench/results
: > "$out"
export OMP_NUM_THREADS=1
unset THP_MEM_ALLOC_ENABLE  # the option decides
for round in $(seq "$rounds"); do
  for backend in ddp zero1 zero2 zero3; do
    for retain in 1 0; do
      for huge in 1 0; do
        "$build/bench/bench_zero" --nproc 2 --backend "$backend" --params-millions "$millions" --steps 6 --phases 1 \
          --retain-freed-memory "$retain" --huge-pages "$huge" \
          | grep '^{' | sed "s/}\$/,\"retain_freed_memory\":$retain,\"round\":$round}/" >> "$out"
      done
    done
  done
done
.venv/bin/python - "$out" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print("| backend | freed buffers | huge pages | model state MB | built MB | prepare peak MB | between steps MB | forward adds MB | backward adds MB | step adds MB | peak MB | ms per step |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|")
mb = lambda b: f"{b / 2**20:.0f}"
for backend in ("ddp", "zero1", "zero2", "zero3"):
    for retain, huge in ((1, True), (1, False), (0, True), (0, False)):
        mine = [r for r in rows if r["backend"] == backend and r["retain_freed_memory"] == retain
                and r["huge_pages"] == huge and r["rank"] == 0]
        if not mine:
            continue
        med = lambda key: statistics.median(r["phases"][key] for r in mine)
        state = mine[0]["param_bytes"] + mine[0]["grad_bytes"] + mine[0]["optimizer_bytes"]
        print(f"| {backend} | {'kept' if retain else 'handed back'} | {'yes' if huge else 'no'} | {mb(state)} | {mb(med('resident_built_bytes'))} | "
              f"{mb(med('prepare_peak_bytes'))} | {mb(med('resident_between_steps_bytes'))} | "
              f"{mb(med('forward_added_bytes'))} | {mb(med('backward_added_bytes'))} | {mb(med('step_added_bytes'))} | "
              f"{mb(statistics.median(r['peak_rss_bytes'] for r in mine))} | "
              f"{statistics.median(r['median_step_ms'] for r in mine):.0f} |")
PY
