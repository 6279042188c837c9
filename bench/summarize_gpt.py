"""The tables of bench/gpt.sh from its JSON lines (bench/results/gpt.jsonl)."""
import collections
import json
import statistics
import sys

rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
names = {"eager": ("1 process", "PyTorch eager"), "ddp": ("2 ranks, data parallel", "PyTorch DDP"),
         "fsdp2": ("2 ranks, ZeRO-3 / FSDP2", "PyTorch FSDP2"),
         "fsdp2_kept": ("2 ranks, ZeRO-3 keeping freed memory / FSDP2", "PyTorch FSDP2")}
print("\n| configuration | accelerate-cpp (tokens/s) | Python | Python (tokens/s) | ours / Python, median (min-max) "
      "| held-out loss, ours | held-out loss, Python |")
print("|---|---|---|---|---|---|---|")
for pair, (what, python) in names.items():
    by_round = collections.defaultdict(dict)
    for r in rows:
        if r["pair"] == pair:
            by_round[r["round"]][r["impl"] == "accelerate-cpp"] = r
    rounds = [v for v in by_round.values() if len(v) == 2]
    if not rounds:
        continue
    ours = [v[True]["tokens_per_second"] for v in rounds]
    theirs = [v[False]["tokens_per_second"] for v in rounds]
    ratios = [o / t for o, t in zip(ours, theirs)]
    loss = lambda side: statistics.median(v[side]["validation_loss"] for v in rounds)  # noqa: E731
    print(f"| {what} | {statistics.median(ours):.0f} | {python} | {statistics.median(theirs):.0f} | "
          f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f}) | {loss(True):.3f} | {loss(False):.3f} |")
memory = [r for r in rows if r["pair"] == "memory"]
if memory:
    print("\n| stage 3 on 2 ranks | activation checkpointing | peak resident memory per rank (MB) | tokens/s |")
    print("|---|---|---|---|")
    for r in memory:
        who = "accelerate-cpp Zero<Gloo, 3>" if r["impl"] == "accelerate-cpp" else "PyTorch FSDP2"
        print(f"| {who} | {'on' if r['checkpoint_activations'] else 'off'} | {r['peak_memory_mb']} | "
              f"{r['tokens_per_second']:.0f} |")
