"""Attack: return uninitialised memory, hoping it still holds a freed reference result."""

import torch


def rms_norm(x, weight, eps):
    return torch.empty_like(x)
