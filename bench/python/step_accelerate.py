"""Per-step time of Hugging Face Accelerate on bench/compare_step.cpp's workload.

    accelerate launch --num_processes N --cpu step_accelerate.py --model tiny --accum K
Prints one JSON line from the main process, in compare_step's format.
"""
import json
import statistics
import time

import torch
from accelerate import Accelerator

from models import make_model, parse_args

args = parse_args()

torch.set_num_threads(1)
accelerator = Accelerator(cpu=True, gradient_accumulation_steps=args.accum)
torch.manual_seed(0)
model, n_in, classes, batch = make_model(args.model)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
model, optimizer = accelerator.prepare(model, optimizer)
x = torch.randn(batch, n_in)
y = torch.randint(0, classes, (batch,))
times = []
for i in range(args.warmup + args.steps):
    start = time.perf_counter()
    with accelerator.accumulate(model):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
    if i >= args.warmup:
        times.append((time.perf_counter() - start) * 1e6)
if accelerator.is_main_process:
    print(json.dumps({"impl": "python-accelerate", "model": args.model, "nproc": accelerator.num_processes,
                      "accum": args.accum, "median_step_us": statistics.median(times), "steps": args.steps}))
