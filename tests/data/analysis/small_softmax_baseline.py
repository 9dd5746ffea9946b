"""A small softmax baseline (fp32 256 x 1024) for the profiler tests."""

import torch


def get_inputs():
    return [torch.randn(256, 1024)]


def get_reference_output(x):
    return torch.softmax(x, dim=-1)
