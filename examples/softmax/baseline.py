"""Baseline for softmax over the last dimension.

Headline: bf16, 1024 x 4096. Kernel signature: ``softmax(x)``.
"""

import torch

HEADLINE = (1024, 4096)
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
CORRECTNESS_SHAPES = ((1, 4096), (33, 7), (33, 1), (4, 4096 + 13), (33, 4096))


def _make_inputs(rows: int, width: int, dtype: torch.dtype) -> list:
    return [(3.0 * torch.randn(rows, width)).to(dtype)]


def get_inputs() -> list:
    return _make_inputs(*HEADLINE, torch.bfloat16)


def get_correctness_inputs() -> list:
    return [_make_inputs(rows, width, dtype) for dtype in DTYPES for rows, width in CORRECTNESS_SHAPES]


def get_reference_output(x: torch.Tensor) -> torch.Tensor:
    """Ground truth in float64, rounded once to the input dtype."""
    return torch.softmax(x.double(), dim=-1).to(x.dtype)


def run_baseline(x: torch.Tensor) -> torch.Tensor:
    """The speed reference: PyTorch eager on the original dtype."""
    return torch.softmax(x, dim=-1)


def FLOPS(x: torch.Tensor) -> int:
    # max, subtract, exp (~10 flops), sum, scale
    return 14 * x.numel()


def BYTES(x: torch.Tensor) -> int:
    return 2 * x.numel() * x.element_size()
