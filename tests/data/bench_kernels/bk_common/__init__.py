"""Shared honest rms_norm used by several test kernels (written differently from the baseline)."""

import torch


def rms_norm_honest(x, weight, eps):
    # sum of squares through einsum instead of pow + mean: a different op sequence
    n = x.shape[-1]
    ss = torch.einsum("...i,...i->...", x, x).unsqueeze(-1)
    return x * torch.rsqrt(ss / n + eps) * weight
