"""Input dtype differs from the output's: bf16 rows summed into fp32, shape [N]."""
import torch


def get_inputs():
    return [torch.randn(128, 1024).to(torch.bfloat16)]


def get_correctness_inputs():
    return [[torch.randn(5, 33).to(torch.bfloat16)]]


def get_reference_output(x):
    return x.float().sum(-1)
