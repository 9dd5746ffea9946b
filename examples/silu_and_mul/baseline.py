"""Baseline for silu_and_mul: y = silu(x[..., :d]) * x[..., d:] with d = x.shape[-1] // 2.

Headline: bf16, 1024 x (2 * 4096). Kernel signature: ``silu_and_mul(x)``.
"""

import torch
import torch.nn.functional as F

HEADLINE = (1024, 2 * 4096)
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# (rows, d): the input is rows x 2d
CORRECTNESS_SHAPES = ((1, 4096), (33, 7), (33, 1), (4, 4096 + 13), (33, 4096))


def _make_inputs(rows: int, width: int, dtype: torch.dtype) -> list:
    return [(2.0 * torch.randn(rows, width)).to(dtype)]


def get_inputs() -> list:
    return _make_inputs(*HEADLINE, torch.bfloat16)


def get_correctness_inputs() -> list:
    return [_make_inputs(rows, 2 * d, dtype) for dtype in DTYPES for rows, d in CORRECTNESS_SHAPES]


def get_reference_output(x: torch.Tensor) -> torch.Tensor:
    """Ground truth in float64, rounded once to the input dtype."""
    d = x.shape[-1] // 2
    xd = x.double()
    return (F.silu(xd[..., :d]) * xd[..., d:]).to(x.dtype)


def run_baseline(x: torch.Tensor) -> torch.Tensor:
    """The speed reference: PyTorch eager on the original dtype."""
    d = x.shape[-1] // 2
    return F.silu(x[..., :d]) * x[..., d:]


def FLOPS(x: torch.Tensor) -> int:
    # silu is roughly exp + add + divide + multiply, then the gate multiply: count 5 per output
    return 5 * (x.numel() // 2)


def BYTES(x: torch.Tensor) -> int:
    return x.numel() * x.element_size() + (x.numel() // 2) * x.element_size()
