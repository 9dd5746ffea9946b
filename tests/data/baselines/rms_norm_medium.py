"""An fp32 rms_norm of a few hundred microseconds (256 x 4096): big enough that a
C++ kernel's own time, not the call overhead, is what is timed
(scripts/bench_harness_precision.py --mode slower)."""

import torch
import torch.nn.functional as F

EPS = 1e-6


def get_inputs():
    x = torch.randn(256, 4096)
    weight = 1.0 + 0.1 * torch.randn(4096)
    return [x, weight, EPS]


def get_correctness_inputs():
    return [[torch.randn(3, 7), torch.randn(7), EPS], [torch.randn(33, 300), torch.randn(300), EPS]]


def get_reference_output(x, weight, eps):
    xd = x.double()
    return (xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + eps) * weight.double()).to(x.dtype)


def run_baseline(x, weight, eps):
    return F.rms_norm(x, (x.shape[-1],), weight, eps)


def BYTES(x, weight, eps):
    return 2 * x.numel() * x.element_size() + weight.numel() * weight.element_size()
