"""The models of bench/compare_step.cpp, in Python."""
import torch


def make_model(name):
    if name == "tiny":
        return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)), 8, 4, 16
    return (torch.nn.Sequential(torch.nn.Linear(784, 256), torch.nn.ReLU(), torch.nn.Linear(256, 128),
                                torch.nn.ReLU(), torch.nn.Linear(128, 10)), 784, 10, 64)
