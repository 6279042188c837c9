#!/usr/bin/env python3
"""Compile cost of a trainer: the same loop with only <torch/torch.h> (plain_torch_trainer.cpp)
and through <accelerate/accelerate.hpp> (accelerate_trainer.cpp), compiled alternately, round
after round, with a user's flags (-O2, no precompiled header, no ccache); a third side is the
plain loop with the umbrella header included but unused (what the headers alone cost, the floor
of any trainer that includes them); a fourth compiles the accelerate trainer with
ACCELERATE_SEPARATE_COMPILATION (the library's type-independent bodies left to one other
translation unit per program, whose cost is reported once), and a fifth includes the umbrella
unused in that mode. Prints one JSON object:
wall seconds and peak resident memory (MiB) per side and round, the ratios per round, the front
end's share (the same compile with -fsyntax-only: parsing and template instantiation, no code
generation), the object code each side emits, and where the accelerate side's extra code comes
from (its symbols that the plain side lacks, by origin).

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


def run_compiler(command, source):
    """Runs a compiler command; returns (wall seconds, peak RSS in MiB)."""
    start = time.monotonic()
    process = subprocess.Popen(command)
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.monotonic() - start
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"measure.py: compiling {source} failed")
    return wall, usage.ru_maxrss / 1024.0  # ru_maxrss is in KiB on Linux


def symbol_sizes(obj):
    """Code symbols of an object file: demangled name -> bytes."""
    out = subprocess.run(["nm", "-C", "--size-sort", "-S", obj], capture_output=True, text=True, check=True).stdout
    sizes = {}
    for line in out.splitlines():
        parts = line.split(None, 3)
        if len(parts) == 4 and parts[2] in "tTwW":
            sizes[parts[3]] = int(parts[1], 16)
    return sizes


def origin(symbol):
    """Which part of the code a symbol comes from (its qualified name, before the arguments)."""
    head = symbol.split("(")[0]
    if "accelerate::" in head:
        # Instantiated for the trainer's own policies: these stay in its translation unit.
        if any(t in head for t in ("Accelerator<", "Prepared", "Engine<")):
            return "accelerate: templates of the chosen policies"
        return "accelerate: functions that depend on no user type"
    if "nlohmann" in head:
        return "nlohmann-json"
    if "regex" in symbol or "std::__detail::_" in head:
        return "std::regex"
    return "std, LibTorch and the rest"


# The key prefix of each side's ratios to the plain side in the output ("wall_ratio" is the
# header-only trainer's).
RATIO_PREFIX = {"accelerate": "", "included": "included_", "separate": "separate_",
                "separate_included": "separate_included_"}


def compile_once(cxx, source, flags, keep=None):
    """Compiles `source` to an object file (kept at `keep` if given); returns (wall seconds,
    peak RSS in MiB, code bytes), then its -fsyntax-only wall seconds."""
    with tempfile.TemporaryDirectory() as tmp:
        obj = keep or os.path.join(tmp, "trainer.o")
        wall, rss = run_compiler([cxx, *flags, "-c", source, "-o", obj], source)
        code = sum(symbol_sizes(obj).values())
        front, _ = run_compiler([cxx, *flags, "-fsyntax-only", source], source)
        return wall, rss, code, front


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
    plain = os.path.join(HERE, "plain_torch_trainer.cpp")
    # side -> (source, extra flags)
    trainer = os.path.join(HERE, "accelerate_trainer.cpp")
    separate = ["-DACCELERATE_SEPARATE_COMPILATION"]
    sides = {"plain": (plain, []),
             "included": (plain, ["-include", "accelerate/accelerate.hpp"]),
             "accelerate": (trainer, []),
             # the same trainer with the library's type-independent bodies compiled elsewhere
             # (accelerate::separate_compilation): what each of a program's translation units costs
             "separate": (trainer, separate),
             "separate_included": (plain, ["-include", "accelerate/accelerate.hpp"] + separate)}
    rounds = []
    scratch = tempfile.TemporaryDirectory()
    objects = {side: os.path.join(scratch.name, side + ".o") for side in sides}
    for r in range(args.rounds):
        order = list(sides) if r % 2 == 0 else list(reversed(list(sides)))  # alternate who goes first
        row = {}
        for side in order:
            keep = objects[side] if r == 0 else None
            source, extra_flags = sides[side]
            wall, rss, code, front = compile_once(args.cxx, source, flags + extra_flags, keep)
            row[side] = {"seconds": round(wall, 2), "peak_mib": round(rss, 1), "code_bytes": code,
                         "front_end_seconds": round(front, 2)}
            print(f"round {r + 1} {side}: {wall:.1f} s ({front:.1f} s front end), {rss:.0f} MiB, "
                  f"{code / 1024:.0f} KiB of code", file=sys.stderr)
        for side, prefix in RATIO_PREFIX.items():
            row[prefix + "wall_ratio"] = round(row[side]["seconds"] / row["plain"]["seconds"], 3)
        row["memory_ratio"] = round(row["accelerate"]["peak_mib"] / row["plain"]["peak_mib"], 3)
        rounds.append(row)
    # The separately compiled bodies: one translation unit per program, rebuilt only when the
    # library changes (compiled once, after the rounds).
    with tempfile.TemporaryDirectory() as tmp:
        implementation = os.path.join(tmp, "implementation.cpp")
        with open(implementation, "w") as f:
            f.write("#include <accelerate/implementation.hpp>\n")
        wall, rss, code, _ = compile_once(args.cxx, implementation, flags + separate)
        implementation_tu = {"seconds": round(wall, 2), "peak_mib": round(rss, 1), "code_bytes": code}
        print(f"implementation.hpp, once per program: {wall:.1f} s, {rss:.0f} MiB", file=sys.stderr)
    plain_symbols = symbol_sizes(objects["plain"])
    def extra_code(side):
        """Bytes of the side's code symbols that the plain side lacks, by origin."""
        extra = {}
        for symbol, size in symbol_sizes(objects[side]).items():
            if symbol not in plain_symbols:
                extra[origin(symbol)] = extra.get(origin(symbol), 0) + size
        return extra

    extra = extra_code("accelerate")
    separate_extra = extra_code("separate")
    def median_ratio(side, measure):
        """Median over the rounds of the side's `measure` against the plain side's."""
        return statistics.median(r[side][measure] / r["plain"][measure] for r in rounds)

    summary = {
        "compiler": subprocess.run([args.cxx, "--version"], capture_output=True, text=True).stdout.splitlines()[0],
        "flags": "-std=c++20 -O2 -DNDEBUG (no precompiled header, no ccache)",
        "rounds": rounds,
        "memory_ratio_median": statistics.median(r["memory_ratio"] for r in rounds),
        "separate_memory_ratio_median": median_ratio("separate", "peak_mib"),
    }
    for side, prefix in RATIO_PREFIX.items():
        summary[prefix + "wall_ratio_median"] = statistics.median(r[prefix + "wall_ratio"] for r in rounds)
        summary[prefix + "front_end_ratio_median"] = median_ratio(side, "front_end_seconds")
    summary |= {
        "implementation_translation_unit": implementation_tu,
        "extra_code_bytes_by_origin": dict(sorted(extra.items(), key=lambda item: -item[1])),
        "separate_extra_code_bytes_by_origin": dict(sorted(separate_extra.items(), key=lambda item: -item[1])),
    }
    text = json.dumps(summary, indent=2)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
