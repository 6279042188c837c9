"""PyTorch's own torch.optim.LBFGS, full batch, against what accelerate-cpp's prepared LBFGS
reached on two ranks (tests/distributed/regression_test.cpp, Lbfgs.TwoRanksRunFullBatchLbfgs).

usage: lbfgs_full_batch.py JOB_DIR STEPS
JOB_DIR holds initial.safetensors (the model's parameters before the first step, by name),
data.safetensors (x and y: both ranks' halves together) and final_rank0.safetensors (where the
two ranks ended). The model is the test's bias_free_net(): Linear(8, 16) and Linear(16, 4)
without biases around a ReLU; the loss is the mean squared error; the options are the test's
lbfgs_options().
Exits 0 when every parameter is within 1e-5 of ours, else 1 after printing the differences.
"""
import sys

import torch
from safetensors.torch import load_file


def main():
    job, steps = sys.argv[1], int(sys.argv[2])
    torch.set_num_threads(1)
    model = torch.nn.Sequential(
        torch.nn.Linear(8, 16, bias=False), torch.nn.ReLU(), torch.nn.Linear(16, 4, bias=False)
    )
    model.load_state_dict(load_file(f"{job}/initial.safetensors"))
    data = load_file(f"{job}/data.safetensors")
    x, y = data["x"], data["y"]
    optimizer = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=8, history_size=5)

    def closure():
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        return loss

    for _ in range(steps):
        optimizer.step(closure)
    ours = load_file(f"{job}/final_rank0.safetensors")
    worst = 0.0
    for name, tensor in model.state_dict().items():
        difference = (tensor - ours[name]).abs().max().item()
        print(f"{name}: max |torch - ours| = {difference:.3g}")
        worst = max(worst, difference)
    return 0 if worst <= 1e-5 else 1


if __name__ == "__main__":
    sys.exit(main())
