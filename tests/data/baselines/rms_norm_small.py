"""A small rms_norm baseline for the benchmark's tests (fast to draw and to run)."""

import torch
import torch.nn.functional as F

EPS = 1e-6


def get_inputs():
    x = torch.randn(64, 256)
    weight = 1.0 + 0.1 * torch.randn(256)
    return [x, weight, EPS]


def get_correctness_inputs():
    return [
        [torch.randn(3, 7), torch.randn(7), EPS],
        [torch.randn(5, 300, dtype=torch.float64), torch.randn(300, dtype=torch.float64), EPS],
    ]


def get_reference_output(x, weight, eps):
    xd = x.double()
    return (xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + eps) * weight.double()).to(x.dtype)


def run_baseline(x, weight, eps):
    return F.rms_norm(x, (x.shape[-1],), weight, eps)


def BYTES(x, weight, eps):
    return 2 * x.numel() * x.element_size() + weight.numel() * weight.element_size()
