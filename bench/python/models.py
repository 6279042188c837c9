"""The models and flags of bench/compare_step.cpp, in Python."""
import argparse

import torch


def parse_args():
    """compare_step's flags: --model tiny|mlp, --accum K, --steps, --warmup."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--accum", type=int, default=1)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=30)
    return parser.parse_args()


def make_model(name):
    if name == "tiny":
        return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)), 8, 4, 16
    return (torch.nn.Sequential(torch.nn.Linear(784, 256), torch.nn.ReLU(), torch.nn.Linear(256, 128),
                                torch.nn.ReLU(), torch.nn.Linear(128, 10)), 784, 10, 64)
