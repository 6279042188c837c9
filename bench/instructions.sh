#!/usr/bin/env bash
# Extra instructions per training step of Accelerator<> over the hand-written loop, on the
# tiny model, counted by callgrind (repeatable, unlike wall time). Each side runs N and 2N
# steps; the difference cancels start-up, so (I(2N) - I(N)) / N is the cost of one step.
#
#   bench/instructions.sh [build-dir] [N]
set -euo pipefail
cd "$(dirname "$0")/.."
build="${1:-build}"
steps="${2:-200}"
count() {  # side steps -> total instructions of the run
  local log
  log="$(mktemp)"
  OMP_NUM_THREADS=1 valgrind --tool=callgrind --callgrind-out-file=/dev/null \
    "$build/bench/bench_step" --count-steps "$1" "$2" 2> "$log" > /dev/null
  grep -o 'Collected : [0-9]*' "$log" | grep -o '[0-9]*$'
  rm -f "$log"
}
declare -A per_step
for side in raw accelerator; do
  one="$(count "$side" "$steps")"
  two="$(count "$side" "$((2 * steps))")"
  per_step[$side]=$(( (two - one) / steps ))
  echo "$side: $one instructions for $steps steps, $two for $((2 * steps)); ${per_step[$side]} per step"
done
extra=$(( per_step[accelerator] - per_step[raw] ))
echo "extra instructions per step: $extra ($(awk "BEGIN { printf \"%.3f\", 100 * $extra / ${per_step[raw]} }")% of the raw step)"
