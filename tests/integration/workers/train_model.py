"""The model, data and hyperparameters shared by the training worker and its reference."""

import torch

STEPS = 20
LR = 0.05
PER_RANK = 8


def make_model():
    torch.manual_seed(42)
    return torch.nn.Sequential(torch.nn.Linear(10, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))


def batch(step, rank):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(PER_RANK, 10, generator=g), torch.randn(PER_RANK, 3, generator=g)
