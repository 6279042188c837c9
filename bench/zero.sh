#!/usr/bin/env bash
# Data parallel against ZeRO stages 1, 2 and 3 on Gloo: model-state bytes per rank counted from
# the tensors against the ZeRO formula, peak RSS, bytes communicated per step, communication
# time per step (all of it, and the part the training thread waited for), step time, and what
# save_model (100 MB shards) and gathering the whole model add to a rank's peak memory, for a
# ~100M-parameter MLP with AdamW on 2 and 4 ranks. The four backends run one after another,
# round after round; memory and bytes are the same every round, times are the median over
# rounds of each run's median step, with the range over rounds, and each stage's time against
# data parallel's is the median (and range) of the per-round ratios, data parallel having run
# in the same round moments before.
#
#   bench/zero.sh [build-dir] [rounds] [params-millions]      (after scripts/quickstart.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
build="${1:-build}"
rounds="${2:-2}"
millions="${3:-100}"
out="bench/results/zero.jsonl"
mkdir -p bench/results
: > "$out"
export OMP_NUM_THREADS=1
saved="$(mktemp -d)"
trap 'rm -rf "$saved"' EXIT
for world in 2 4; do
  for round in $(seq "$rounds"); do
    for backend in ddp zero1 zero2 zero3; do
      "$build/bench/bench_zero" --nproc "$world" --backend "$backend" --params-millions "$millions" --steps 4 \
        --save-model "$saved/$backend" \
        | grep '^{' | sed "s/}\$/,\"round\":$round}/" >> "$out"
    done
  done
done
.venv/bin/python - "$out" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print("| ranks | backend | parameters | params MB | grads MB | optimizer MB | model state MB | ZeRO formula MB | state / formula | peak RSS MB | MB sent per step | comm ms per step | of which exposed | ms per step: median (range) | vs data parallel: median (range) | save_model adds MB (rank 0 / others) | whole-model gather adds MB |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
for world in sorted({r["world_size"] for r in rows}):
    for backend in ("ddp", "zero1", "zero2", "zero3"):
        mine = [r for r in rows if r["world_size"] == world and r["backend"] == backend]
        if not mine:
            continue
        rank0 = [r for r in mine if r["rank"] == 0]
        psi = rank0[0]["parameters"]
        formula = {"ddp": 16 * psi, "zero1": 8 * psi + 8 * psi / world, "zero2": 4 * psi + 12 * psi / world,
                   "zero3": 16 * psi / world}[backend]
        # The largest rank: padding puts a few more elements on some ranks.
        state = max(r["param_bytes"] + r["grad_bytes"] + r["optimizer_bytes"] for r in mine)
        worst = max(mine, key=lambda r: r["param_bytes"] + r["grad_bytes"] + r["optimizer_bytes"])
        rss = max(r["peak_rss_bytes"] for r in mine)
        sent = max(r["comm_bytes_per_step"] for r in mine)
        steps = [r["median_step_ms"] for r in rank0]
        ms = statistics.median(steps)
        ddp = {r["round"]: r["median_step_ms"] for r in rows
               if r["world_size"] == world and r["backend"] == "ddp" and r["rank"] == 0}
        ratios = [r["median_step_ms"] / ddp[r["round"]] for r in rank0 if r["round"] in ddp]
        comm = statistics.median(r["comm_ms_per_step"] for r in rank0)
        exposed = statistics.median(r["exposed_comm_ms_per_step"] for r in rank0)
        mb = lambda b: f"{b / 1e6:.0f}"
        print(f"| {world} | {backend} | {psi / 1e6:.1f}M | {mb(worst['param_bytes'])} | {mb(worst['grad_bytes'])} | "
              f"{mb(worst['optimizer_bytes'])} | {mb(state)} | {mb(formula)} | {state / formula:.3f} | {mb(rss)} | "
              f"{mb(sent)} | {comm:.0f} | {exposed:.0f} | {ms:.0f} ({min(steps):.0f}-{max(steps):.0f}) | "
              f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f}) | "
              f"{mb(max(r['save_model_added_bytes'] for r in rank0))} / "
              f"{mb(max([r['save_model_added_bytes'] for r in mine if r['rank'] > 0] or [0]))} | "
              f"{mb(max(r['gather_whole_added_bytes'] for r in mine))} |")
EOF
