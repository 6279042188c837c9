"""PyTorch's torch.distributed.checkpoint.async_save on bench_async_save's state, in a fresh
process: the same ~300 MB (six 2048x2048 linear layers with Adam after one step, one thread),
two saves, each waited for before the next. Prints {"mode": "dcp_async", "first_ms",
"second_ms"}: the time each async_save call blocked the caller (its staging copy included).
A process group of one over Gloo, as DCP's asynchronous path uses collectives.

usage: async_save_dcp.py DIR
"""
import json
import os
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp


def main():
    directory = sys.argv[1]
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as rendezvous:
        dist.init_process_group("gloo", init_method=f"file://{rendezvous}/store", rank=0, world_size=1)
        torch.manual_seed(0)
        model = torch.nn.Sequential(*[torch.nn.Linear(2048, 2048) for _ in range(6)])
        optimizer = torch.optim.Adam(model.parameters())
        model(torch.randn(2, 2048)).sum().backward()
        optimizer.step()
        blocked = []
        for k in range(2):
            state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
            start = time.perf_counter()
            future = dcp.async_save(state, checkpoint_id=os.path.join(directory, f"state{k}"))
            blocked.append((time.perf_counter() - start) * 1e3)
            future.result()
        dist.destroy_process_group()
    print(json.dumps({"mode": "dcp_async", "first_ms": blocked[0], "second_ms": blocked[1]}))


if __name__ == "__main__":
    main()
