"""Interoperability with the Python tools users already have (run by interop_test.cpp).

  interop.py read <single_dir> <sharded_dir> <io.safetensors>
      Load accelerate-cpp's save_model output with safetensors.torch.load_file and with
      Accelerate's load_checkpoint_in_model into the same architecture written in Python, and
      check its outputs equal the C++ outputs stored in io.safetensors.
  interop.py write <out_dir> <io.safetensors> <max_shard_size>
      Save a Python model with Accelerate's save_model, and its input/output for C++ to check.
"""
import sys

import torch
from accelerate import Accelerator
from accelerate.utils import load_checkpoint_in_model
from safetensors.torch import load_file, save_file


class Wide(torch.nn.Module):
    # The same parameter and buffer names as the C++ Wide module.
    def __init__(self):
        super().__init__()
        self.big = torch.nn.Linear(64, 64)
        self.small1 = torch.nn.Linear(8, 8)
        self.small2 = torch.nn.Linear(8, 8)
        self.norm = torch.nn.BatchNorm1d(8)

    def forward(self, x):
        return self.norm(self.small2(self.small1(self.big(x)[:, :8])))


def read(single_dir, sharded_dir, io_path):
    io = load_file(io_path)
    x, expected = io["input"], io["output"]

    model = Wide().eval()
    model.load_state_dict(load_file(f"{single_dir}/model.safetensors"), strict=True)
    assert torch.equal(model(x), expected), "safetensors.torch.load_file: outputs differ"

    for folder in (single_dir, sharded_dir):
        model = Wide().eval()
        load_checkpoint_in_model(model, folder, strict=True)
        assert torch.equal(model(x), expected), f"accelerate load_checkpoint_in_model({folder}): outputs differ"
    print("python read accelerate-cpp's files: outputs equal")


def write(out_dir, io_path, max_shard_size):
    torch.manual_seed(7)
    model = Wide()
    with torch.no_grad():  # make the running statistics matter
        model.norm.running_mean.uniform_(-1, 1)
        model.norm.running_var.uniform_(0.5, 2)
    model.eval()
    x = torch.randn(4, 64)
    Accelerator(cpu=True).save_model(model, out_dir, max_shard_size=max_shard_size)
    save_file({"input": x, "output": model(x).detach()}, io_path)
    print("python wrote", out_dir)


if __name__ == "__main__":
    {"read": read, "write": write}[sys.argv[1]](*sys.argv[2:])
