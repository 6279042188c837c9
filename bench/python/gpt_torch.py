"""examples/gpt's model and loop in Python PyTorch: eager on one process, DDP or FSDP2 on several.

    gpt_torch.py --impl eager [--steps N] ...                     one process
    torchrun --nproc_per_node 2 gpt_torch.py --impl ddp|fsdp2 ...  gloo, one rank per process

The same corpus, windows, model (tests/baseline/gpt_model.py), initialisation law, AdamW
(fused, betas 0.9/0.95, decay on matrices), clipping at norm 1, warm-up then cosine schedule
and batch per rank as `gpt` with its defaults; the batches are drawn by a seeded sampler, as
ours are. FSDP2 shards each block and then the root (`fully_shard`), as `gpt --zero 3` shards
each block as a unit. Prints one JSON line: tokens/s over the training loop (every rank's
tokens, from the first step to the last, as the example reports it), the last step's loss,
the held-out loss and the largest peak resident set among the ranks.
"""
import argparse
import json
import math
import os
import resource
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tests", "baseline"))
from gpt_model import Gpt, read_corpus, schedule  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--impl", choices=["eager", "ddp", "fsdp2"], required=True)
parser.add_argument("--steps", type=int, default=300)
parser.add_argument("--batch-size", type=int, default=16)
parser.add_argument("--layers", type=int, default=4)
parser.add_argument("--heads", type=int, default=4)
parser.add_argument("--embd", type=int, default=128)
parser.add_argument("--block-size", type=int, default=128)
parser.add_argument("--lr", type=float, default=2e-3)
parser.add_argument("--eval-batches", type=int, default=16)
parser.add_argument("--checkpoint-activations", action="store_true")
parser.add_argument("--data", default="/usr/share/games/fortunes")
args = parser.parse_args()

distributed = args.impl != "eager"
if distributed:
    dist.init_process_group("gloo")
rank, world = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
torch.manual_seed(1337)

tokens = read_corpus(args.data)
cut = tokens.numel() * 9 // 10
T = args.block_size


def windows(part):
    n = (part.numel() - 1) // T
    return part[:n * T].view(n, T), part[1:1 + n * T].view(n, T)


train_x, train_y = windows(tokens[:cut])
val_x, val_y = windows(tokens[cut:])

model = Gpt(256, T, args.layers, args.heads, args.embd)
with torch.no_grad():  # GPT-2's initialisation, as the example's
    for name, p in model.named_parameters():
        if name.endswith(".bias"):
            p.zero_()
        elif "ln" in name:
            p.fill_(1.0)
        elif name.endswith("proj.weight"):
            p.normal_(0.0, 0.02 / math.sqrt(2 * args.layers))
        else:
            p.normal_(0.0, 0.02)


class Checkpointed(torch.nn.Module):
    """A block recomputed in backward (torch.utils.checkpoint, non-reentrant), called through
    its module so that FSDP2's hooks gather it for the forward and for the recompute."""

    def __init__(self, block):
        super().__init__()
        self.block = block

    def forward(self, x):
        from torch.utils.checkpoint import checkpoint
        return checkpoint(self.block, x, use_reentrant=False)


if args.checkpoint_activations:
    model.blocks = torch.nn.ModuleList(Checkpointed(block) for block in model.blocks)
if args.impl == "ddp":
    model = torch.nn.parallel.DistributedDataParallel(model)
elif args.impl == "fsdp2":
    from torch.distributed.fsdp import fully_shard
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)

decayed = [p for p in model.parameters() if p.dim() >= 2]
undecayed = [p for p in model.parameters() if p.dim() < 2]
optimizer = torch.optim.AdamW([{"params": decayed, "weight_decay": 0.1}, {"params": undecayed, "weight_decay": 0.0}],
                              lr=args.lr, betas=(0.9, 0.95), fused=True)
scheduler = torch.optim.lr_scheduler.LambdaLR(
    optimizer, schedule({"warmup": args.steps // 10, "steps": args.steps, "min_lr_ratio": 0.1}))
generator = torch.Generator().manual_seed(1337)

model.train()
start = time.perf_counter()
step = 0
while step < args.steps:
    order = torch.randperm(train_x.size(0), generator=generator)
    per_rank = order.numel() // world
    mine = order[rank * per_rank:(rank + 1) * per_rank]
    for first in range(0, mine.numel() - args.batch_size + 1, args.batch_size):
        batch = mine[first:first + args.batch_size]
        loss = F.cross_entropy(model(train_x[batch]).flatten(0, 1), train_y[batch].flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        step += 1
        if step == args.steps:
            break
last_loss = loss.item()
seconds = time.perf_counter() - start

model.eval()
with torch.no_grad():
    losses = []
    for b in range(args.eval_batches):  # batches dealt to the ranks in turn, as the example's loader deals them
        first = (b * world + rank) * args.batch_size
        rows = slice(first, first + args.batch_size)
        losses.append(F.cross_entropy(model(val_x[rows]).flatten(0, 1), val_y[rows].flatten()))
    validation = torch.stack(losses).mean()
peak = torch.tensor([resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024])
if distributed:
    dist.all_reduce(validation)
    validation /= world
    dist.all_reduce(peak, op=dist.ReduceOp.MAX)
if rank == 0:
    print(json.dumps({"impl": {"eager": "pytorch-eager", "ddp": "pytorch-ddp", "fsdp2": "pytorch-fsdp2"}[args.impl],
                      "world_size": world, "steps": args.steps,
                      "tokens_per_second": args.steps * args.batch_size * T * world / seconds,
                      "train_seconds": seconds, "train_loss": last_loss, "validation_loss": validation.item(),
                      "peak_memory_mb": peak.item(), "checkpoint_activations": args.checkpoint_activations}))
if distributed:
    dist.destroy_process_group()
