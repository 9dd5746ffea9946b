"""A pure-PyTorch stand-in for a built kernel package, used by tests/test_profiler.py.

The profiler only needs an importable package whose functions follow the
catalogue signatures; building C++ here would make the profiler tests slow.
"""

import os

import torch
import torch.nn.functional as F


def rms_norm(x, weight, eps, out=None):
    result = F.rms_norm(x, (x.shape[-1],), weight, eps)
    if out is None:
        return result
    out.copy_(result)
    return out


def silu_and_mul(x, out=None):
    d = x.shape[-1] // 2
    result = F.silu(x[..., :d]) * x[..., d:]
    if out is None:
        return result
    out.copy_(result)
    return out


def softmax(x, out=None):
    return torch.softmax(x, dim=-1, out=out) if out is not None else torch.softmax(x, dim=-1)


def crash(*args, **kwargs):
    os.abort()
