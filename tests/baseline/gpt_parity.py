"""examples/gpt against the same model and loop in PyTorch, step for step.

usage: gpt_parity.py GPT_EXECUTABLE WORK_DIR

Runs the example for 20 optimizer steps (fp32, fused AdamW with weight decay, clipping at norm
1.0, accumulation over 2 micro-batches, warm-up then cosine) with `--dump`, which writes the
initial parameters, every micro-batch, every loss and learning rate, the final model
(`save_model`) and a greedy continuation of the prompt. This script builds the same
architecture with torch.nn, loads the initial parameters, replays the batches through the same
loop written as PyTorch users write it (torch.optim.AdamW(fused=True), clip_grad_norm_,
LambdaLR) and checks:
  - the loss of every micro-step is within a relative 1e-5 of ours, and so is each rate;
  - our saved model loads into the PyTorch model (every name, every shape) and generates the
    same greedy text.
Exits 0 when all hold, else 1 after printing what differs.
"""
import json
import os
import subprocess
import sys

import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from gpt_model import Gpt, generate, schedule

STEPS = 20
ACCUM = 2
TOLERANCE = 1e-5


def relative(a, b):
    return abs(a - b) / max(abs(b), 1e-12)


def main():
    exe, work = sys.argv[1], sys.argv[2]
    threads = torch.get_num_threads()
    dump = os.path.join(work, "dump")
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    subprocess.run([exe, "--dump", dump, "--steps", str(STEPS), "--accum", str(ACCUM), "--warmup", "4", "--lr", "1e-3",
                    "--clip-norm", "1.0", "--eval-batches", "2", "--sample-tokens", "60", "--no-progress"],
                   check=True, env=env, stdout=subprocess.DEVNULL)
    with open(os.path.join(dump, "run.json")) as f:
        run = json.load(f)
    assert run["accum"] == ACCUM and len(run["losses"]) == STEPS * ACCUM, run["losses"]

    def new_model():
        return Gpt(run["vocab_size"], run["block_size"], run["layers"], run["heads"], run["embd"])

    model = new_model()
    model.load_state_dict(load_file(os.path.join(dump, "initial.safetensors")), strict=True)
    decayed = [p for p in model.parameters() if p.dim() >= 2]
    undecayed = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decayed, "weight_decay": run["weight_decay"]},
                                   {"params": undecayed, "weight_decay": 0.0}],
                                  lr=run["lr"], betas=(0.9, 0.95), fused=True)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule(run))
    batches = load_file(os.path.join(dump, "batches.safetensors"))

    failures = []
    model.train()
    for i, (ours, our_lr) in enumerate(zip(run["losses"], run["lrs"])):
        lr = optimizer.param_groups[0]["lr"]
        if relative(our_lr, lr) > TOLERANCE:
            failures.append(f"micro-step {i}: learning rate {our_lr} (ours) vs {lr} (PyTorch)")
        x, y = batches[f"x.{i}"], batches[f"y.{i}"]
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        diff = relative(ours, loss.item())
        print(f"micro-step {i:2d}: loss {ours:.7f} (ours) {loss.item():.7f} (PyTorch), relative difference {diff:.2e}")
        if diff > TOLERANCE:
            failures.append(f"micro-step {i}: loss {ours} (ours) vs {loss.item()} (PyTorch), relative {diff:.2e}")
        (loss / ACCUM).backward()
        if (i + 1) % ACCUM == 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), run["clip_norm"])
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()

    # Our final model, as save_model wrote it, in the PyTorch model; its greedy text.
    trained = new_model()
    trained.load_state_dict(load_file(os.path.join(dump, "model", "model.safetensors")), strict=True)
    trained.eval()
    text = generate(trained, run["prompt"], len(run["greedy"]) - len(run["prompt"]), run["block_size"])
    if text != run["greedy"]:
        failures.append(f"greedy text: ours {bytes(run['greedy'])!r}, PyTorch's {bytes(text)!r}")
    drift = max((a - b).abs().max().item() for a, b in zip(trained.state_dict().values(), model.state_dict().values()))
    print(f"greedy text equal: {text == run['greedy']}; largest parameter difference after "
          f"{STEPS} steps: {drift:.2e}")
    for failure in failures:
        print("FAIL:", failure)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
