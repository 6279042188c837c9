#!/usr/bin/env bash
# examples/gpt against the same model and loop in Python PyTorch (bench/python/gpt_torch.py):
#   1 process:  ours (SingleProcess) vs PyTorch eager
#   2 ranks:    ours (Gloo)          vs PyTorch DDP
#   2 ranks:    ours (Zero<Gloo, 3>) vs PyTorch FSDP2 (fully_shard per block, then the root)
# Each pair runs back to back, in alternating order, round after round; ratios are taken pair by
# pair and reported as median and min-max. Then, once, peak resident memory per rank of the
# stage-3 runs with and without activation checkpointing, ours and FSDP2's.
#
#   bench/gpt.sh [build-dir] [rounds] [steps] [model flags] [output name]   (after scripts/quickstart.sh)
#   bench/gpt.sh build 3 150                                    the example's default model
#   bench/gpt.sh build 3 40 "--layers 6 --embd 384 --heads 6 --batch-size 8" gpt_medium
set -euo pipefail
cd "$(dirname "$0")/.."
build="${1:-build}"
rounds="${2:-3}"
steps="${3:-150}"
read -r -a model <<< "${4:-}"
python=".venv/bin/python"
out="bench/results/${5:-gpt}.jsonl"
mkdir -p bench/results
[[ -n "${APPEND:-}" ]] || : > "$out"  # APPEND=1 adds to the file (to rerun some pairs)
common=(--steps "$steps" --eval-batches 16 "${model[@]}")
threads="$(nproc)"

ours() {  # nproc [flags...]
  local n="$1"; shift
  local launch=()
  ((n > 1)) && launch=(--nproc "$n")
  OMP_NUM_THREADS=$((threads / n)) "$build/examples/gpt" "${launch[@]}" "${common[@]}" --no-progress \
    --sample-tokens 1 "$@" | tail -1 |
    "$python" -c 'import json,sys; d=json.loads(sys.stdin.read()); d.pop("greedy"); d.pop("sample"); d["impl"]="accelerate-cpp"; print(json.dumps(d))'
}
theirs() {  # impl nproc [flags...]
  local impl="$1" n="$2"; shift 2
  if ((n == 1)); then
    OMP_NUM_THREADS="$threads" "$python" bench/python/gpt_torch.py --impl "$impl" "${common[@]}" "$@"
  else
    OMP_NUM_THREADS=$((threads / n)) "$python" -m torch.distributed.run --nproc_per_node "$n" --master_port 29561 \
      bench/python/gpt_torch.py --impl "$impl" "${common[@]}" "$@" 2>/dev/null
  fi | tail -1
}
record() {  # pair-name then the command
  local pair="$1"; shift
  "$@" | "$python" -c 'import json,sys; d=json.loads(sys.stdin.read()); d["pair"]=sys.argv[1]; d["round"]=int(sys.argv[2]); print(json.dumps(d))' "$pair" "$round" | tee -a "$out"
}

# PAIRS="eager ddp fsdp2 fsdp2_kept memory" (the default) picks what runs.
want="${PAIRS:-eager ddp fsdp2 fsdp2_kept memory}"
for ((round = 0; round < rounds; ++round)); do
  # fsdp2_kept: stage 3 keeping the buffers it frees (--freed-memory keep) instead of handing
  # them back to the system every step, its default under ZeRO.
  pairs=("eager|ours 1|theirs eager 1" "ddp|ours 2|theirs ddp 2" "fsdp2|ours 2 --zero 3|theirs fsdp2 2"
         "fsdp2_kept|ours 2 --zero 3 --freed-memory keep|theirs fsdp2 2")
  for pair in "${pairs[@]}"; do
    name="${pair%%|*}" pair="${pair#*|}"
    [[ " $want " == *" $name "* ]] || continue
    first="${pair%%|*}" second="${pair##*|}"
    if ((round % 2)); then record "$name" $second; record "$name" $first
    else record "$name" $first; record "$name" $second; fi
  done
done
round=-1  # memory: once each
if [[ " $want " == *" memory "* ]]; then
  record memory ours 2 --zero 3
  record memory ours 2 --zero 3 --checkpoint-activations
  record memory theirs fsdp2 2
  record memory theirs fsdp2 2 --checkpoint-activations
fi

"$python" bench/summarize_gpt.py "$out"
