#!/usr/bin/env bash
# What a save blocks the training loop for, the process's first save and a later one, each
# measured in a fresh process: our asynchronous save_state, our synchronous save_state, what
# allocating and mapping the host buffers costs alone, and PyTorch's dcp.async_save, on the same
# ~300 MB state (bench_async_save.cpp, python/async_save_dcp.py), and a copy into fresh memory
# that faults its pages in as it goes (what the first save did before populate_pages). Rounds
# interleave them all, so a slow moment of the disk or the machine spreads over all of them.
# With BEFORE=<another build's bench_async_save> (a build of an earlier commit), each round also
# times that build's asynchronous saves, reported as async_before: a before/after in one run.
# Usage: [BEFORE=path] bench/async_save.sh [build-dir] [rounds] [output.jsonl]
set -euo pipefail
build=${1:-build}
rounds=${2:-8}
out=${3:-bench/results/async_save.jsonl}
python=${PYTHON:-.venv/bin/python}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
: > "$out"
for ((round = 0; round < rounds; ++round)); do
  for mode in async sync allocate fault dcp ${BEFORE:+before}; do
    rm -rf "$dir/state"
    if [[ $mode == before ]]; then
      OMP_NUM_THREADS=1 "$BEFORE" async "$dir/state" | sed 's/"mode": "async"/"mode": "async_before"/' >> "$out"
    elif [[ $mode == dcp ]]; then
      OMP_NUM_THREADS=1 "$python" bench/python/async_save_dcp.py "$dir/state" 2>/dev/null | tail -1 >> "$out"
    else
      OMP_NUM_THREADS=1 "$build/bench/bench_async_save" "$mode" "$dir/state" >> "$out"
    fi
  done
done
"$python" - "$out" <<'PY'
import json, statistics, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
print(f"{'mode':10} {'first save: median (min-max) ms':34} {'later save: median (min-max) ms':34} n")
for mode in ["async", "async_before", "dcp_async", "sync", "allocate", "fault"]:
    picked = [r for r in rows if r["mode"] == mode]
    if not picked:
        continue
    def cell(key):
        values = [r[key] for r in picked]
        return f"{statistics.median(values):7.1f} ({min(values):.1f}-{max(values):.1f})"
    print(f"{mode:10} {cell('first_ms'):34} {cell('second_ms'):34} {len(picked)}")
PY
