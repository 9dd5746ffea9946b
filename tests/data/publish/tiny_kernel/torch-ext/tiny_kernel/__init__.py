"""Row-wise RMS normalisation for tests of the publisher (pure Python stand-in)."""

import os

import torch


def available_tiers() -> list[str]:
    return ["generic"]


def rms_norm(x, weight, eps, out=None):
    """y = x / sqrt(mean(x^2) + eps) * weight over the last dimension."""
    xd = x.double()
    y = (xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + eps) * weight.double()).to(x.dtype)
    if os.environ.get("TINY_KERNEL_BREAK"):
        y = y + 1  # lets tests make the kernel incorrect without another build
    if out is not None:
        out.copy_(y)
        return out
    return y
