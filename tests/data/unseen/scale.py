"""One tensor of any rank and a float scalar (rank varies across the input sets)."""
import torch


def get_inputs():
    return [torch.randn(64, 100), 0.5]


def get_correctness_inputs():
    return [[torch.randn(2, 3, 17).to(torch.bfloat16), 2.0], [torch.randn(5), -1.5]]


def get_reference_output(x, alpha):
    return (x.float() * alpha).to(x.dtype)
