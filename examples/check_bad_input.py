"""The example refuses bad input with a message naming it (CTest: example.fashion_mnist.bad_input).

Every malformed flag exits with code 2 naming the flag and the value; an IDX label file with a
label outside 0..9 exits with code 1 naming the file and the record, never with SIGABRT; a
learning rate that drives the loss to NaN/inf stops training naming the backward call (unless
--allow-nonfinite-loss).
Usage: check_bad_input.py FASHION_MNIST_EXE WORK_DIR
"""
import gzip
import os
import struct
import subprocess
import sys

exe, work = sys.argv[1], sys.argv[2]
failures = []


def run(args):
    return subprocess.run([exe, "--no-progress", *args], capture_output=True, text=True, timeout=300)


for flag, value in [("--accum", "-1"), ("--batch-size", "-1"), ("--epochs", "1.5"), ("--lr", "1e-3junk"),
                    ("--seed", "12x"), ("--clip-norm", "nan"), ("--epochs", "")]:
    r = run([flag, value])
    if r.returncode != 2 or flag not in r.stderr or f"'{value}'" not in r.stderr:
        failures.append(f"{flag} {value!r}: exit {r.returncode}, stderr: {r.stderr.strip()[:300]}")

# A tiny dataset whose second training label is 200.
data = os.path.join(work, "corrupt-fashion-mnist")
os.makedirs(data, exist_ok=True)
for prefix, labels in [("train", [3, 200]), ("t10k", [1, 2])]:
    with gzip.open(os.path.join(data, f"{prefix}-images-idx3-ubyte.gz"), "wb") as f:
        f.write(struct.pack(">IIII", 0x803, len(labels), 28, 28) + bytes(28 * 28 * len(labels)))
    with gzip.open(os.path.join(data, f"{prefix}-labels-idx1-ubyte.gz"), "wb") as f:
        f.write(struct.pack(">II", 0x801, len(labels)) + bytes(labels))
r = run(["--data", data, "--epochs", "1"])
if r.returncode != 1 or "train-labels-idx1-ubyte.gz" not in r.stderr or "record 1 has label 200" not in r.stderr:
    failures.append(f"corrupt labels: exit {r.returncode}, stderr: {r.stderr.strip()[:300]}")

# A valid tiny dataset of bright images: Adam with lr 1e30 moves every weight by about 1e30 in
# its first step, so the second forward overflows and the loss is no longer finite. (Not 1e38:
# the first step is lr / (1 - beta1) = 10 lr, which must itself fit in a float.)
data = os.path.join(work, "tiny-fashion-mnist")
os.makedirs(data, exist_ok=True)
for prefix, labels in [("train", [3, 1, 4, 1]), ("t10k", [1, 2])]:
    with gzip.open(os.path.join(data, f"{prefix}-images-idx3-ubyte.gz"), "wb") as f:
        f.write(struct.pack(">IIII", 0x803, len(labels), 28, 28) + bytes([200]) * (28 * 28 * len(labels)))
    with gzip.open(os.path.join(data, f"{prefix}-labels-idx1-ubyte.gz"), "wb") as f:
        f.write(struct.pack(">II", 0x801, len(labels)) + bytes(labels))
r = run(["--data", data, "--epochs", "1", "--batch-size", "1", "--lr", "1e30"])
if r.returncode != 1 or "backward: the loss is" not in r.stderr or "backward call 2 " not in r.stderr:
    failures.append(f"non-finite loss: exit {r.returncode}, stderr: {r.stderr.strip()[:300]}")
r = run(["--data", data, "--epochs", "1", "--batch-size", "1", "--lr", "1e30", "--allow-nonfinite-loss"])
if r.returncode != 0:
    failures.append(f"--allow-nonfinite-loss: exit {r.returncode}, stderr: {r.stderr.strip()[:300]}")

for f in failures:
    print("FAIL:", f)
print(f"{7 + 3 - len(failures)} passed, {len(failures)} failed")
sys.exit(1 if failures else 0)
