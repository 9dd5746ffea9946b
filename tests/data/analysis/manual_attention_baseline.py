"""Hand-written attention (matmul, softmax, matmul): must still trace as attention, not GEMM."""

import math

import torch

B, H, S, D = 1, 8, 256, 64


def get_inputs():
    return [torch.randn(B, H, S, D), torch.randn(B, H, S, D), torch.randn(B, H, S, D)]


def get_reference_output(q, k, v):
    scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    return torch.matmul(torch.softmax(scores, dim=-1), v)
