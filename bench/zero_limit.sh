#!/usr/bin/env bash
# The largest model each backend trains on 2 ranks within a fixed memory limit per rank: data
# parallel and ZeRO stages 1, 2 and 3 run bench_zero's MLP with AdamW (2 steps) inside a memory
# cgroup limited to 2 x the limit (swap off for it), at growing sizes, until a run fails; a run
# killed for memory is the kernel's OOM killer at work, not an estimate. Needs root and cgroup
# v1 or v2 with the memory controller (as the development machines have).
#
#   bench/zero_limit.sh [build-dir] [MB-per-rank] [sizes in millions of parameters...]
#   bench/zero_limit.sh build 1500 40 60 80 100 120 140 160 180 200
# BACKENDS (default "ddp zero1 zero2 zero3") picks the backends; EXTRA_ARGS are passed to
# bench_zero and name the results file, e.g. stage 3 with the least memory:
#   BACKENDS=zero3 EXTRA_ARGS="--prefetch-units 0 --buckets-in-flight 0" bench/zero_limit.sh build 2500 190 220 250
set -euo pipefail
cd "$(dirname "$0")/.."
build="${1:-build}"
limit_mb="${2:-1500}"
shift $(( $# >= 2 ? 2 : $# ))
sizes=("$@")
((${#sizes[@]})) || sizes=(40 60 80 100 120 140 160 180 200)
backends=(${BACKENDS:-ddp zero1 zero2 zero3})
read -r -a extra_args <<< "${EXTRA_ARGS:-}"
suffix="$(tr -c 'a-z0-9\n' '_' <<< "${EXTRA_ARGS:-}" | tr -s '_' | sed 's/^_//; s/_$//')"
out="bench/results/zero_limit_${limit_mb}${suffix:+_$suffix}.jsonl"
mkdir -p bench/results
: > "$out"
export OMP_NUM_THREADS=1
world=2
limit=$((limit_mb * 1000000 * world))

# A fresh memory cgroup under this shell's own, limited to `limit` bytes with swap off.
make_cgroup() {
  local name="accelerate-zero-limit-$$-$1"
  if [[ -f /sys/fs/cgroup/cgroup.controllers ]]; then  # v2
    local parent="/sys/fs/cgroup$(sed -n 's/^0:://p' /proc/self/cgroup)"
    mkdir "$parent/$name"
    echo "$limit" > "$parent/$name/memory.max"
    echo 0 > "$parent/$name/memory.swap.max" 2>/dev/null || true
    echo "$parent/$name"
  else  # v1
    local parent="/sys/fs/cgroup/memory$(sed -n 's/^[0-9]*:memory://p' /proc/self/cgroup)"
    mkdir "$parent/$name"
    echo 0 > "$parent/$name/memory.swappiness" 2>/dev/null || true
    echo "$limit" > "$parent/$name/memory.limit_in_bytes"
    echo "$limit" > "$parent/$name/memory.memsw.limit_in_bytes" 2>/dev/null || true
    echo "$parent/$name"
  fi
}

# Whether the kernel killed something in the cgroup for memory.
oom_kills() {
  if [[ -f "$1/memory.events" ]]; then sed -n 's/^oom_kill //p' "$1/memory.events"
  else sed -n 's/^oom_kill //p' "$1/memory.oom_control"; fi
}

for backend in "${backends[@]}"; do
  for millions in "${sizes[@]}"; do
    cg="$(make_cgroup "$backend-$millions")"
    set +e
    line="$(bash -c 'echo $$ > "$1/cgroup.procs"; shift; exec "$@"' _ "$cg" \
      "$build/bench/bench_zero" --nproc "$world" --backend "$backend" --params-millions "$millions" --steps 2 "${extra_args[@]}" \
      2>/dev/null | grep '^{' | paste -sd, -)"
    status=$?
    set -e
    killed="$(oom_kills "$cg")"
    rmdir "$cg" 2>/dev/null || true
    fits=false
    [[ "$(grep -o '"rank"' <<< "$line" | wc -l)" == "$world" ]] && fits=true  # every rank finished
    echo "{\"backend\":\"$backend\",\"params_millions\":$millions,\"limit_mb_per_rank\":$limit_mb,\"fits\":$fits,\"oom_kills\":${killed:-0},\"ranks\":[$line]}" >> "$out"
    echo "$backend ${millions}M: $([[ $fits == true ]] && echo trains || echo "does not fit (OOM kills: ${killed:-0}, status $status)")" >&2
    [[ $fits == true ]] || break
  done
done

.venv/bin/python - "$out" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
limit = rows[0]["limit_mb_per_rank"]
print(f"| backend | largest model that trains in {limit} MB per rank | its peak RSS MB (worst rank) | first size that does not | OOM kills there |")
print("|---|---|---|---|---|")
for backend in ("ddp", "zero1", "zero2", "zero3"):
    mine = [r for r in rows if r["backend"] == backend]
    if not mine:
        continue
    fitting = [r for r in mine if r["fits"]]
    failing = [r for r in mine if not r["fits"]]
    best = max(fitting, key=lambda r: r["params_millions"]) if fitting else None
    largest = "%dM" % best["params_millions"] if best else "none"
    rss = "%.0f" % (max(r["peak_rss_bytes"] for r in best["ranks"]) / 1e6) if best else "-"
    first = "%dM" % failing[0]["params_millions"] if failing else "(all fit)"
    kills = str(failing[0]["oom_kills"]) if failing else "-"
    print(f"| {backend} | {largest} | {rss} | {first} | {kills} |")
EOF
