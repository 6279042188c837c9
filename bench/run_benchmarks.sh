#!/usr/bin/env bash
# Runs every benchmark in one window and regenerates bench/results/ (JSON, tables, plots)
# for bench/README.md.   bench/run_benchmarks.sh [build-dir]   (after scripts/quickstart.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
build="${1:-build}"
out=bench/results
mkdir -p "$out"
export OMP_NUM_THREADS=1

echo "== bench_step (sides interleaved at random, 12 repetitions)"
"$build/bench/bench_step" --benchmark_repetitions=12 --benchmark_enable_random_interleaving=true \
  --benchmark_min_time=0.3 --benchmark_format=json --benchmark_out="$out/bench_step.json" > /dev/null
echo "== bench_sync on 2 ranks, then on 1 for the compute-only floor"
"$build/bench/bench_sync" --nproc 2 --benchmark_format=json --benchmark_out="$out/bench_sync.json" > /dev/null
"$build/bench/bench_sync" --nproc 1 --benchmark_filter='BM_BucketedReducer/4/' --benchmark_format=json \
  --benchmark_out="$out/bench_sync_1proc.json" > /dev/null
echo "== gradient sums in rank order against Gloo's ring all-reduce, on 3 ranks"
"$build/bench/bench_sync" --nproc 3 --benchmark_filter='BM_SumOrder' --benchmark_format=json \
  --benchmark_out="$out/bench_sync_sum_order.json" > /dev/null
echo "== bench_checkpoint"
"$build/bench/bench_checkpoint" --benchmark_repetitions=3 --benchmark_format=json \
  --benchmark_out="$out/bench_checkpoint.json" > /dev/null
echo "== instruction counts"
bench/instructions.sh "$build" 200 | tee "$out/instructions.txt"
echo "== compile cost of a trainer: <torch/torch.h> alone vs the umbrella header, header-only and separately compiled"
bench/compile/measure.py 3 --out "$out/compile.json"
echo "== data parallel against ZeRO stages 1, 2 and 3 (memory, bytes, step time)"
bench/zero.sh "$build" 5 | tee "$out/zero.txt"
echo "== where a rank's memory goes, freed buffers kept and handed back"
bench/zero_phases.sh "$build" 2 40 | tee "$out/zero_phases.txt"
echo "== Gloo's reduce-scatter: c10d's against an all-to-all"
bench/reduce_scatter.sh "$build" 3 40 | tee "$out/reduce_scatter.txt"
echo "== what a save blocks the loop for, a process's first and a later one, against dcp.async_save"
bench/async_save.sh "$build" 10 "$out/async_save.jsonl" | tee "$out/async_save.txt"
echo "== load_state of a resharded checkpoint (2 processes -> 1) against a same-size one"
bench/reshard.sh "$build" "$out/reshard.json"
echo "== the prepared DataLoader's workers, and the loader against torch's DataLoader"
bench/loader.sh "$build" 5 28 | tee "$out/loader_28.txt"
bench/loader.sh "$build" 5 56 | tee "$out/loader_56.txt"
echo "== FusedAdamW against torch::optim::AdamW (150 tensors), bf16 moments, Fp16's unscale"
OMP_NUM_THREADS=1 "$build/bench/bench_optimizer" --rounds 5 --steps 10 | tee "$out/optimizer.txt"
echo "== activation checkpointing: peak memory and step time of 4, 8 and 16 blocks"
bench/activation_checkpoint.sh "$build" 3 4 8 16 | tee "$out/activation_checkpoint.txt"
echo "== examples/gpt against PyTorch eager, DDP and FSDP2: the default model, and a 10.7M-parameter one"
bench/gpt.sh "$build" 3 150 | tee "$out/gpt.txt"
bench/gpt.sh "$build" 3 40 "--layers 6 --embd 384 --heads 6 --batch-size 8" gpt_medium | tee "$out/gpt_medium.txt"
echo "== Python Accelerate and PyTorch DDP"
bench/compare_python.sh "$build" 5 | tee "$out/compare_python.txt"
.venv/bin/python bench/summarize.py "$out"
