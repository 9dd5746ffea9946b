"""A bool mask tensor and a float scale: softmax(x * scale) where mask, else 0."""
import torch


def get_inputs():
    B, H, T, S = 2, 4, 16, 48
    return [torch.randn(B, H, T, S), torch.rand(B, 1, T, S) > 0.2, 0.125]


def get_correctness_inputs():
    return [[torch.randn(1, 2, 3, 17).to(torch.bfloat16), torch.rand(1, 1, 3, 17) > 0.2, 1.0]]


def get_reference_output(x, mask, scale):
    s = (x.double() * scale).masked_fill(~mask, float("-inf"))
    return torch.softmax(s, dim=-1).nan_to_num(0.0).to(x.dtype)
