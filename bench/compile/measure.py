#!/usr/bin/env python3
"""Compile cost of a trainer: the same loop with only <torch/torch.h> (plain_torch_trainer.cpp)
and through <accelerate/accelerate.hpp> (accelerate_trainer.cpp), compiled alternately, round
after round, with a user's flags (-O2, no precompiled header, no ccache). Prints one JSON object:
wall seconds and peak resident memory (MiB) per side and round, and the ratios per round.

    bench/compile/measure.py [rounds] [--cxx c++] [--out bench/results/compile.json]
"""
import argparse
import glob
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def torch_include():
    found = sorted(glob.glob(os.path.join(ROOT, ".venv/lib/python3*/site-packages/torch/include")))
    if not found:
        sys.exit("measure.py: no .venv with torch; run scripts/quickstart.sh first")
    return found[-1]


def compile_once(cxx, source, flags):
    """Compiles `source` to an object file; returns (wall seconds, peak RSS in MiB)."""
    with tempfile.TemporaryDirectory() as tmp:
        start = time.monotonic()
        process = subprocess.Popen([cxx, *flags, "-c", source, "-o", os.path.join(tmp, "trainer.o")])
        _, status, usage = os.wait4(process.pid, 0)
        wall = time.monotonic() - start
        if os.waitstatus_to_exitcode(status) != 0:
            sys.exit(f"measure.py: compiling {source} failed")
        return wall, usage.ru_maxrss / 1024.0  # ru_maxrss is in KiB on Linux


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("rounds", nargs="?", type=int, default=3)
    parser.add_argument("--cxx", default=os.environ.get("CXX", "c++"))
    parser.add_argument("--out")
    args = parser.parse_args()
    torch = torch_include()
    flags = ["-std=c++20", "-O2", "-DNDEBUG", "-DUSE_C10D_GLOO", "-DUSE_DISTRIBUTED",
             "-I", os.path.join(ROOT, "include"),
             "-isystem", torch, "-isystem", os.path.join(torch, "torch/csrc/api/include")]
    if os.path.isdir("/usr/local/cuda/include"):
        flags += ["-isystem", "/usr/local/cuda/include"]
    sides = {"plain": os.path.join(HERE, "plain_torch_trainer.cpp"),
             "accelerate": os.path.join(HERE, "accelerate_trainer.cpp")}
    rounds = []
    for r in range(args.rounds):
        order = list(sides) if r % 2 == 0 else list(reversed(list(sides)))  # alternate who goes first
        row = {}
        for side in order:
            wall, rss = compile_once(args.cxx, sides[side], flags)
            row[side] = {"seconds": round(wall, 2), "peak_mib": round(rss, 1)}
            print(f"round {r + 1} {side}: {wall:.1f} s, {rss:.0f} MiB", file=sys.stderr)
        row["wall_ratio"] = round(row["accelerate"]["seconds"] / row["plain"]["seconds"], 3)
        row["memory_ratio"] = round(row["accelerate"]["peak_mib"] / row["plain"]["peak_mib"], 3)
        rounds.append(row)
    summary = {
        "compiler": subprocess.run([args.cxx, "--version"], capture_output=True, text=True).stdout.splitlines()[0],
        "flags": "-std=c++20 -O2 -DNDEBUG (no precompiled header, no ccache)",
        "rounds": rounds,
        "wall_ratio_median": statistics.median(r["wall_ratio"] for r in rounds),
        "memory_ratio_median": statistics.median(r["memory_ratio"] for r in rounds),
    }
    text = json.dumps(summary, indent=2)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
