#!/usr/bin/env bash
# The prepared DataLoader with 0, 1 and 2 workers against the same batches in memory (step
# time of the MNIST MLP), and the loader alone against torch's Python DataLoader on the same
# gzip'd images with as many workers. The sides alternate round after round; ratios are taken
# within a round and reported as median (min-max).
#
#   bench/loader.sh [build-dir] [rounds] [image-side]     (after scripts/quickstart.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
build="${1:-build}"
rounds="${2:-5}"
side="${3:-28}"
out="bench/results/loader_${side}.jsonl"
images="$(mktemp -d)/images.bin"
trap 'rm -rf "$(dirname "$images")"' EXIT
mkdir -p bench/results
: > "$out"
export OMP_NUM_THREADS=1
"$build/bench/bench_loader" --write "$images" --samples 9600 --side "$side"
for round in $(seq 0 $((rounds - 1))); do
  "$build/bench/bench_loader" --read "$images" --rounds 1 | sed "s/\"round\":0/\"round\":$round/" >> "$out"
  .venv/bin/python bench/python/loader_torch.py "$images" "$round" >> "$out"
done
.venv/bin/python - "$out" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
def value(side, variant, rnd):
    for r in rows:
        if r["side"] == side and r["variant"] == variant and r["round"] == rnd:
            return r.get("us_per_step", r.get("samples_per_s"))
rounds = sorted({r["round"] for r in rows})
def summary(xs):
    return f"{statistics.median(xs):.3f} ({min(xs):.3f}–{max(xs):.3f})"
print("| training loop | us per step (median) | / in memory, median (min–max) |")
print("|---|---|---|")
for v in ("in_memory", "workers_0", "workers_1", "workers_2"):
    times = [value("accelerate-cpp", v, r) for r in rounds]
    ratios = [value("accelerate-cpp", v, r) / value("accelerate-cpp", "in_memory", r) for r in rounds]
    print(f"| {v.replace('_', ' ')} | {statistics.median(times):.0f} | {summary(ratios)} |")
print()
print("| loader alone | accelerate-cpp samples/s | torch DataLoader samples/s | ours / torch, median (min–max) |")
print("|---|---|---|---|")
for w in (0, 1, 2):
    v = f"loader_only_workers_{w}"
    ours = [value("accelerate-cpp", v, r) for r in rounds]
    torch_ = [value("torch", v, r) for r in rounds]
    print(f"| {w} workers | {statistics.median(ours):.0f} | {statistics.median(torch_):.0f} | "
          f"{summary([a / b for a, b in zip(ours, torch_)])} |")
PY
