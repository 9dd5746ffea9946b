"""Kernels for baselines/silu_mul_bf16.py.

`eager` computes like PyTorch eager in bf16 (rounds silu(x) to bf16 before the
multiply), so it misses the float64-rounded-once reference by one ulp on many
elements, exactly as the baseline itself does: as accurate as the baseline.
`sloppy` adds a few ulps of error on top: less accurate than the baseline.
"""

import torch
import torch.nn.functional as F


def eager(x):
    d = x.shape[-1] // 2
    return F.silu(x[..., :d]) * x[..., d:]


def sloppy(x):
    out = eager(x).float()
    return (out * (1 + 2.0**-5)).to(x.dtype)
