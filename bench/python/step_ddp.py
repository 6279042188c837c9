"""Per-step time of plain PyTorch DDP (gloo) on bench/compare_step.cpp's workload.

    torchrun --nproc_per_node N step_ddp.py --model tiny --accum K
Accumulation uses no_sync on the micro-steps, as a careful hand-written loop does.
"""
import contextlib
import json
import os
import statistics
import time

import torch
import torch.distributed as dist

from models import make_model, parse_args

args = parse_args()

torch.set_num_threads(1)
distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
if distributed:
    dist.init_process_group("gloo")
torch.manual_seed(0)
model, n_in, classes, batch = make_model(args.model)
if distributed:
    model = torch.nn.parallel.DistributedDataParallel(model)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
x = torch.randn(batch, n_in)
y = torch.randint(0, classes, (batch,))
times = []
for i in range(args.warmup + args.steps):
    start = time.perf_counter()
    boundary = (i + 1) % args.accum == 0
    context = model.no_sync() if distributed and not boundary else contextlib.nullcontext()
    with context:
        loss = torch.nn.functional.cross_entropy(model(x), y) / args.accum
        loss.backward()
    if boundary:
        optimizer.step()
        optimizer.zero_grad()
    if i >= args.warmup:
        times.append((time.perf_counter() - start) * 1e6)
if not distributed or dist.get_rank() == 0:
    print(json.dumps({"impl": "pytorch-ddp", "model": args.model, "nproc": int(os.environ.get("WORLD_SIZE", "1")),
                      "accum": args.accum, "median_step_us": statistics.median(times), "steps": args.steps}))
if distributed:
    dist.destroy_process_group()
