"""Rotary position embedding, neox style: an op outside the catalogue (issue 20).

q [T, H, D] in bf16 or fp32; cos and sin [T, D/2] in fp32 (one row per
position, shared by every head); the result has q's shape and dtype:

    out[..., :D/2] = q1 * cos - q2 * sin
    out[..., D/2:] = q2 * cos + q1 * sin      (q1 = q[..., :D/2], q2 = q[..., D/2:])

The ground truth is computed in float64 and rounded once to q's dtype; the
speed reference (run_baseline) is eager PyTorch in the inputs' own dtypes. The
correctness sets reach the tail of every tier (D/2 not a multiple of 8 or 16),
a single position and head, and both dtypes.
"""

import torch

HEADLINE = (2048, 32, 128)  # positions, heads, head dim


def _angles(T: int, D: int) -> tuple[torch.Tensor, torch.Tensor]:
    inv = 1.0 / (10000.0 ** (torch.arange(0, D, 2, dtype=torch.float32) / D))
    ang = torch.arange(T, dtype=torch.float32)[:, None] * inv[None, :] + torch.rand(T, D // 2)
    return ang.cos(), ang.sin()


def _case(T: int, H: int, D: int, dtype: torch.dtype) -> list[torch.Tensor]:
    cos, sin = _angles(T, D)
    return [torch.randn(T, H, D).to(dtype), cos, sin]


def get_inputs():
    return _case(*HEADLINE, torch.bfloat16)


def get_correctness_inputs():
    return [
        _case(7, 3, 40, torch.float32),  # D/2 = 20: a partial vector in every tier
        _case(1, 1, 2, torch.bfloat16),  # one position, one head, one pair
        _case(33, 5, 72, torch.bfloat16),
        _case(16, 4, 128, torch.float32),
        _case(3, 2, 34, torch.bfloat16),  # D/2 = 17
    ]


def get_reference_output(q, cos, sin):
    d = q.shape[-1] // 2
    x1, x2 = q[..., :d].double(), q[..., d:].double()
    c, s = cos[:, None, :].double(), sin[:, None, :].double()
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1).to(q.dtype)


def run_baseline(q, cos, sin):
    d = q.shape[-1] // 2
    x1, x2 = q[..., :d], q[..., d:]
    c, s = cos[:, None, :], sin[:, None, :]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1).to(q.dtype)


def BYTES(q, cos, sin):
    return 2 * q.numel() * q.element_size() + (cos.numel() + sin.numel()) * 4


def FLOPS(q, cos, sin):
    return 3 * q.numel()
