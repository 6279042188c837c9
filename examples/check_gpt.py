"""Checks of examples/gpt (CTest: example.gpt.*).

usage: check_gpt.py GPT_EXE WORK_DIR train [FLAGS...]
    A short run: exits 0, prints every field of its JSON line, the held-out loss is below the
    unigram baseline (what a model ignoring context reaches), and the generated text has the
    length asked for.
usage: check_gpt.py GPT_EXE WORK_DIR resume [FLAGS...]
    SIGTERM mid-epoch, then --resume, ends byte-identical to an uninterrupted run: the same
    model file, the same losses and the same generated text. Then a run stopped by SIGTERM on
    the same flags resumes on one rank more (--nproc + 1) and finishes.
usage: check_gpt.py GPT_EXE WORK_DIR bad-input
    Malformed flags exit 2 naming the flag; a corpus too short exits 1 naming the file.
"""
import json
import os
import shutil
import signal
import subprocess
import sys

FIELDS = ["world_size", "backend", "precision", "zero", "accum", "checkpoint_activations", "parameters",
          "micro_steps", "optimizer_steps", "tokens", "train_loss", "validation_loss", "unigram_loss",
          "tokens_per_second", "train_seconds", "peak_memory_mb", "greedy", "sample", "seconds"]
STEPS = 40
STOP_AFTER = 12  # the signal is sent once this step is printed

exe, work, mode, flags = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
failures = []


def last_json(output):
    return json.loads(output.strip().splitlines()[-1])


def flag_value(name, default):
    return flags[flags.index(name) + 1] if name in flags else default


def train():
    r = subprocess.run([exe, "--no-progress", "--sample-tokens", "40", *flags], capture_output=True, text=True,
                       timeout=600)
    if r.returncode != 0:
        sys.exit(f"gpt {' '.join(flags)} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
    report = last_json(r.stdout)
    print(json.dumps(report))
    failures.extend(f"no '{key}' in the JSON line" for key in FIELDS if key not in report)
    if not report["validation_loss"] < report["unigram_loss"]:
        failures.append(f"held-out loss {report['validation_loss']} not below the unigram "
                        f"baseline {report['unigram_loss']}")
    for key in ("greedy", "sample"):
        if len(report[key].encode("utf-8", "replace")) < len("The ") + 40:
            failures.append(f"{key} text too short: {report[key]!r}")
    if report["optimizer_steps"] != int(flag_value("--steps", 300)):
        failures.append(f"{report['optimizer_steps']} optimizer steps, asked for {flag_value('--steps', 300)}")


def start(project, extra=()):
    return subprocess.Popen([exe, "--no-progress", "--log-every", "1", "--steps", str(STEPS), "--sample-tokens", "20",
                             "--eval-batches", "4", "--project-dir", project, *flags, *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finish(job, what):
    output = job.communicate(timeout=600)[0]
    if job.returncode != 0:
        sys.exit(f"{what} failed ({job.returncode}):\n{output}")
    return output


def stop_mid_epoch(project):
    """Starts a run and sends SIGTERM (to the launcher with --nproc) once step STOP_AFTER is
    printed; returns its output after it exits."""
    job = start(project)
    output = []
    for line in job.stdout:
        output.append(line)
        if line.startswith(f"step {STOP_AFTER} "):
            job.send_signal(signal.SIGTERM)
            break
    output.append(finish(job, "the run stopped by SIGTERM"))
    text = "".join(output)
    if "stopped by signal" not in text:
        failures.append(f"the run did not stop on SIGTERM:\n{text}")
    return text


def resume():
    straight = last_json(finish(start(os.path.join(work, "straight")), "the uninterrupted run"))
    stopped = stop_mid_epoch(os.path.join(work, "resumed"))
    resumed = last_json(finish(start(os.path.join(work, "resumed"), ["--resume"]), "the resumed run"))
    for key in ("optimizer_steps", "micro_steps", "tokens", "train_loss", "validation_loss", "greedy", "sample"):
        if straight[key] != resumed[key]:
            failures.append(f"{key}: {straight[key]!r} uninterrupted, {resumed[key]!r} resumed")
    with open(os.path.join(work, "straight", "model", "model.safetensors"), "rb") as a, \
            open(os.path.join(work, "resumed", "model", "model.safetensors"), "rb") as b:
        if a.read() != b.read():
            failures.append("the resumed model differs from the uninterrupted one")
    print("stopped at:", [line for line in stopped.splitlines() if "stopped by signal" in line])
    # The same kind of checkpoint resumed on one rank more: it loads and finishes the run.
    nproc = int(flag_value("--nproc", 1))
    stop_mid_epoch(os.path.join(work, "elastic"))
    flags[:] = [f for i, f in enumerate(flags) if f != "--nproc" and (i == 0 or flags[i - 1] != "--nproc")]
    other = last_json(finish(start(os.path.join(work, "elastic"), ["--resume", "--allow-world-size-change", "--nproc", str(nproc + 1)]),
                             f"the run resumed on {nproc + 1} ranks"))
    if other["world_size"] != nproc + 1 or other["optimizer_steps"] != STEPS:
        failures.append(f"resumed on {nproc + 1} ranks: {other}")


def bad_input():
    for flag, value in [("--steps", "-3"), ("--lr", "fast"), ("--embd", "1.5"), ("--precision", "fp8"),
                        ("--zero", "4")]:
        r = subprocess.run([exe, flag, value], capture_output=True, text=True, timeout=120)
        if r.returncode != 2 or flag not in r.stderr:
            failures.append(f"{flag} {value!r}: exit {r.returncode}, stderr: {r.stderr.strip()[:300]}")
    short = os.path.join(work, "short.txt")
    with open(short, "w") as f:
        f.write("too short\n")
    r = subprocess.run([exe, "--data", short], capture_output=True, text=True, timeout=120)
    if r.returncode != 1 or short not in r.stderr:
        failures.append(f"a short corpus: exit {r.returncode}, stderr: {r.stderr.strip()[:300]}")


shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
{"train": train, "resume": resume, "bad-input": bad_input}[mode]()
for failure in failures:
    print("FAIL:", failure)
shutil.rmtree(work, ignore_errors=True)
sys.exit(1 if failures else 0)
