"""Baseline for rms_norm: y = x * rsqrt(mean(x^2, -1) + eps) * weight.

Headline: bf16, 1024 x 4096. Kernel signature: ``rms_norm(x, weight, eps)``.
"""

import torch
import torch.nn.functional as F

EPS = 1e-6
HEADLINE = (1024, 4096)
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# (rows, hidden): tails that are not a multiple of 16 or 8 lanes, a batch of 1,
# a hidden size of 1, and a row count that does not divide among threads.
CORRECTNESS_SHAPES = ((1, 4096), (33, 7), (33, 1), (4, 4096 + 13), (33, 4096), (2, 8192))


def _make_inputs(rows: int, hidden: int, dtype: torch.dtype) -> list:
    x = torch.randn(rows, hidden).to(dtype)
    weight = (1.0 + 0.1 * torch.randn(hidden)).to(dtype)
    return [x, weight, EPS]


def get_inputs() -> list:
    return _make_inputs(*HEADLINE, torch.bfloat16)


def get_correctness_inputs() -> list:
    return [_make_inputs(rows, hidden, dtype) for dtype in DTYPES for rows, hidden in CORRECTNESS_SHAPES]


def get_reference_output(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Ground truth in float64, rounded once to the input dtype."""
    xd = x.double()
    inv_rms = torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + eps)
    return (xd * inv_rms * weight.double()).to(x.dtype)


def run_baseline(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The speed reference: PyTorch eager on the original dtype."""
    return F.rms_norm(x, (x.shape[-1],), weight, eps)


def FLOPS(x: torch.Tensor, weight: torch.Tensor, eps: float) -> int:
    # square+add per element for the sum, two multiplies per element for the output
    return 4 * x.numel()


def BYTES(x: torch.Tensor, weight: torch.Tensor, eps: float) -> int:
    # read x and weight once, write y once
    return 2 * x.numel() * x.element_size() + weight.numel() * weight.element_size()
