#!/usr/bin/env bash
# Per-step time of this library next to Hugging Face Accelerate (Python) and plain PyTorch DDP
# on the same model, data and optimizer: tiny and MNIST-MLP models, 1 and 2 processes, with
# and without accumulation. The three run one after another, round after round, so they
# share the machine's state; each configuration reports the median over rounds of each
# implementation's median step time, and the ratio of medians.
#
#   bench/compare_python.sh [build-dir] [rounds]      (after scripts/quickstart.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
build="${1:-build}"
rounds="${2:-5}"
python=".venv/bin/python"
out="bench/results/compare_python.jsonl"
mkdir -p bench/results
: > "$out"
export PYTHONPATH="$PWD/bench/python" OMP_NUM_THREADS=1

run_ours() { "$build/bench/compare_step" --model "$1" --nproc "$2" --accum "$3" | tail -1; }
# A Python side: one process directly, several as a torchrun job (Accelerate then joins as
# MULTI_CPU over gloo, as `accelerate launch` arranges). Each side has its own port.
run_python() {  # script port model nproc accum
  if [[ "$4" == 1 ]]; then
    "$python" "bench/python/$1" --model "$3" --accum "$5"
  else
    "$python" -m torch.distributed.run --nproc_per_node "$4" --master_port "$2" \
      "bench/python/$1" --model "$3" --accum "$5" 2>/dev/null
  fi | tail -1
}
run_accelerate() { run_python step_accelerate.py 29534 "$@"; }
run_ddp() { run_python step_ddp.py 29533 "$@"; }

for model in tiny mlp; do
  for nproc in 1 2; do
    for accum in 1 4; do
      for ((round = 0; round < rounds; ++round)); do
        for impl in ours accelerate ddp; do
          line="$(run_$impl "$model" "$nproc" "$accum")"
          echo "$line" | tee -a "$out"
        done
      done
    done
  done
done

"$python" - "$out" "$rounds" <<'PY'
import collections, json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
groups = collections.defaultdict(lambda: collections.defaultdict(list))
for r in rows:
    groups[(r["model"], r["nproc"], r["accum"])][r["impl"]].append(r["median_step_us"])
print("\n| model | processes | accumulation | accelerate-cpp (us/step) | Python Accelerate | PyTorch DDP | Accelerate / ours (median, min-max of rounds) | DDP / ours |")
print("|---|---|---|---|---|---|---|---|")
for (model, nproc, accum), impls in sorted(groups.items()):
    ours, acc, ddp = impls["accelerate-cpp"], impls["python-accelerate"], impls["pytorch-ddp"]
    r_acc = [a / o for a, o in zip(acc, ours)]  # round by round: the three ran back to back
    r_ddp = [d / o for d, o in zip(ddp, ours)]
    print(f"| {model} | {nproc} | {accum} | {statistics.median(ours):.0f} | {statistics.median(acc):.0f} | "
          f"{statistics.median(ddp):.0f} | {statistics.median(r_acc):.2f} ({min(r_acc):.2f}-{max(r_acc):.2f}) | "
          f"{statistics.median(r_ddp):.2f} ({min(r_ddp):.2f}-{max(r_ddp):.2f}) |")
PY
