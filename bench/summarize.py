"""Turns bench/results/*.json into the tables of bench/results/summary.md and the PNG plots
(gnuplot). Ratios are taken pair by pair (the same repetition of both sides) and reported as
median with min-max spread; absolute times are context only."""
import json
import os
import statistics
import subprocess
import sys
from collections import defaultdict

out = sys.argv[1]


def runs(name):
    with open(os.path.join(out, name)) as f:
        data = json.load(f)
    return data["context"], [b for b in data["benchmarks"] if b.get("run_type") == "iteration"]


lines = []
context, step = runs("bench_step.json")
lines.append(f"Machine: {context.get('num_cpus')} CPUs at {context.get('mhz_per_cpu')} MHz, "
             f"{context.get('host_name')}; one intra-op thread; {context.get('date')}.\n")

# bench_step: per repetition, ratio Accelerator/raw and runtime-dispatch/raw.
times = defaultdict(lambda: defaultdict(list))
for b in step:
    side, model = b["run_name"].split("/")[0], b["run_name"].split("/")[1]
    times[model][side].append(b["real_time"])
lines.append("| model | raw loop (us/step, median) | Accelerator<> | runtime dispatch | Accelerator / raw (median, min-max) | runtime / raw |")
lines.append("|---|---|---|---|---|---|")
for model in ("tiny", "mlp"):
    t = times[model]
    raw, acc, dyn = t["BM_RawLoopStep"], t["BM_AcceleratorStep"], t["BM_RuntimeDispatchStep"]
    r_acc = [a / r for a, r in zip(acc, raw)]
    r_dyn = [d / r for d, r in zip(dyn, raw)]
    lines.append(f"| {model} | {statistics.median(raw) / 1e3:.1f} | {statistics.median(acc) / 1e3:.1f} | "
                 f"{statistics.median(dyn) / 1e3:.1f} | {statistics.median(r_acc):.3f} ({min(r_acc):.3f}-{max(r_acc):.3f}) | "
                 f"{statistics.median(r_dyn):.3f} ({min(r_dyn):.3f}-{max(r_dyn):.3f}) |")
lines.append("")

# bench_sync: medians over rounds.
_, sync = runs("bench_sync.json")
by = defaultdict(list)
comm = {}
for b in sync:
    name = b["run_name"].split("/iterations")[0]
    by[name].append(b["real_time"])
    comm[name] = b.get("comm_MB", 0)
flat = statistics.median(by["BM_FlatAllreduce"])
lines.append("| 2 ranks, ~9.5M-parameter MLP | ms per step (median of rounds) | vs flat all-reduce | MB all-reduced per step |")
lines.append("|---|---|---|---|")
sweep = []
for name in ["BM_FlatAllreduce"] + [f"BM_BucketedReducer/{mb}" for mb in (1, 4, 25, 100)]:
    m = statistics.median(by[name])
    lines.append(f"| {name} | {m:.1f} | {m / flat:.2f} | {comm[name]:.1f} |")
    if name != "BM_FlatAllreduce":
        sweep.append((int(name.split("/")[1]), m))
no_sync = statistics.median(by["BM_Accumulate8/no_sync/0"])
every = statistics.median(by["BM_Accumulate8/sync_every/1"])
lines.append(f"| BM_Accumulate8/no_sync (per optimizer step) | {no_sync:.1f} | | {comm['BM_Accumulate8/no_sync/0']:.1f} |")
lines.append(f"| BM_Accumulate8/sync_every (per optimizer step) | {every:.1f} | | {comm['BM_Accumulate8/sync_every/1']:.1f} |")
lines.append(f"\nno_sync communicates {comm['BM_Accumulate8/no_sync/0'] / comm['BM_Accumulate8/sync_every/1']:.4f} of the "
             f"bytes of syncing every micro-step and takes {no_sync / every:.2f} of its time.\n")
# Gradient communication (bench_sync): bucket views, arrival order, compression, exposed time.
counter = defaultdict(lambda: defaultdict(list))
for b in sync:
    name = b["run_name"].split("/iterations")[0]
    for key in ("comm_MB", "gradient_MB", "comm_ms", "exposed_ms"):
        if key in b:
            counter[name][key].append(b[key])


def paired(a, b):
    r = [x / y for x, y in zip(by[a], by[b])]
    return f"{statistics.median(r):.3f} ({min(r):.3f}-{max(r):.3f})"


views = "BM_BucketedReducer/4"
lines.append("| 2 ranks, ~9.5M-parameter MLP | ms per step | / base, median (min-max) | comm MB per step | gradient MB | comm ms per step | exposed ms | overlap |")
lines.append("|---|---|---|---|---|---|---|---|")
for name, base in ((views, views), ("BM_GradientCopies/4", views), ("BM_BucketViewsZeroed/4", views),
                   ("BM_ReversedOrder/registration/0", "BM_ReversedOrder/registration/0"),
                   ("BM_ReversedOrder/arrival/1", "BM_ReversedOrder/registration/0"),
                   ("BM_Compression/fp16/1", views), ("BM_Compression/bf16/2", views),
                   ("BM_Compression/power_sgd/3", views)):
    c = {k: statistics.median(v) for k, v in counter[name].items()}
    busy, exposed = c.get("comm_ms", 0), c.get("exposed_ms", 0)
    overlap = 1 - exposed / busy if busy > 0 else 0
    lines.append(f"| {name} | {statistics.median(by[name]):.1f} | {paired(name, base)} | {c.get('comm_MB', 0):.2f} | "
                 f"{c.get('gradient_MB', 0):.1f} | {busy:.1f} | {exposed:.1f} | {overlap:.2f} |")
lines.append("")
# Gradient sums in rank order against Gloo's ring all-reduce, on 3 ranks (bench_sync --nproc 3).
_, order = runs("bench_sync_sum_order.json")
sums = defaultdict(lambda: defaultdict(list))
for b in order:
    name = b["run_name"].split("/iterations")[0]
    sums[name]["ms"].append(b["real_time"])
    for key in ("comm_MB", "gradient_MB", "comm_ms", "exposed_ms"):
        sums[name][key].append(b[key])
ring, ordered = sums["BM_SumOrder/ring/0"], sums["BM_SumOrder/rank_order/1"]
r = [o / g for o, g in zip(ordered["ms"], ring["ms"])]
lines.append("| 3 ranks, ~9.5M-parameter MLP | ms per step | / ring, median (min-max) | comm MB per step | gradient MB | comm ms per step | exposed ms |")
lines.append("|---|---|---|---|---|---|---|")
for name, side, ratio in (("ring all-reduce (`sum_in_rank_order = false`)", ring, "1"),
                          ("sums in rank order (default)", ordered,
                           f"{statistics.median(r):.3f} ({min(r):.3f}-{max(r):.3f})")):
    c = {k: statistics.median(v) for k, v in side.items()}
    lines.append(f"| {name} | {c['ms']:.1f} | {ratio} | {c['comm_MB']:.2f} | {c['gradient_MB']:.2f} | "
                 f"{c['comm_ms']:.1f} | {c['exposed_ms']:.1f} |")
lines.append("")
_, one = runs("bench_sync_1proc.json")
one_proc = statistics.median([b["real_time"] for b in one])
two_proc = statistics.median(by["BM_BucketedReducer/4"])

# bench_checkpoint
_, ck = runs("bench_checkpoint.json")
rates = defaultdict(list)
for b in ck:
    rates[b["run_name"].split("/")[0]].append(b["bytes_per_second"] / 1e6)
lines.append("| checkpoint (~300 MB: 25M weights and two Adam moments) | MB/s (median of 3) |")
lines.append("|---|---|")
for name in ("BM_SaveState", "BM_PlainWrite", "BM_LoadState", "BM_PlainRead"):
    lines.append(f"| {name} | {statistics.median(rates[name]):.0f} |")
lines.append("")

with open(os.path.join(out, "summary.md"), "w") as f:
    f.write("\n".join(lines) + "\n")
print("\n".join(lines))

with open(os.path.join(out, "bucket_sweep.dat"), "w") as f:
    f.write(f"# cap_MB ms_per_step (flat all-reduce: {flat:.2f})\n")
    for mb, m in sweep:
        f.write(f"{mb} {m:.3f}\n")
with open(os.path.join(out, "processes.dat"), "w") as f:
    f.write(f"1 {one_proc:.3f}\n2 {two_proc:.3f}\n")
plot = f"""
set terminal png size 720,420
set output '{out}/bucket_sweep.png'
set title 'Step time against bucket cap (2 ranks, Gloo, 9.5M parameters)'
set xlabel 'bucket cap (MB)'; set ylabel 'ms per step'; set logscale x; set grid
set yrange [0:*]
plot '{out}/bucket_sweep.dat' using 1:2 with linespoints lw 2 title 'bucketed, overlapped reducer', \\
     {flat:.3f} with lines dt 2 lw 2 title 'one flat all-reduce after backward'
set output '{out}/processes.png'
unset logscale x
set title 'Step time of the same per-rank batch on 1 and 2 processes'
set xlabel 'processes'; set xrange [0.5:2.5]; set xtics 1
set style fill solid 0.6; set boxwidth 0.5
plot '{out}/processes.dat' using 1:2 with boxes title 'ms per step (4 MB buckets)'
"""
subprocess.run(["gnuplot"], input=plot, text=True, check=True)
