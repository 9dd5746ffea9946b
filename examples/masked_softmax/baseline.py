"""Masked, scaled softmax over the last dimension: an op outside the catalogue (issue 20).

x [B, H, T, S] in bf16 or fp32, a bool mask [B, 1, T, S] (True = keep, shared by
every head) and a float scale; the result has x's shape and dtype:

    out = softmax(where(mask, x * scale, -inf), dim=-1), a row with no kept element -> 0

The ground truth is computed in float64 and rounded once to x's dtype; the
speed reference (run_baseline) is eager PyTorch in x's dtype. The correctness
sets reach the tail of every tier (S = 17, 33, 100), a row masked entirely,
batch and head 1, and both dtypes.
"""

import torch

HEADLINE = (2, 16, 512, 512)  # batch, heads, queries, keys


def _case(B: int, H: int, T: int, S: int, dtype: torch.dtype, scale: float = 0.125, keep: float = 0.8) -> list:
    x = (torch.randn(B, H, T, S) * 4).to(dtype)
    mask = torch.rand(B, 1, T, S) < keep
    return [x, mask, scale]


def get_inputs():
    return _case(*HEADLINE, torch.bfloat16)


def get_correctness_inputs():
    masked_row = _case(1, 2, 3, 33, torch.bfloat16)
    masked_row[1][0, 0, 1, :] = False  # one query sees no key: its row is 0
    return [
        _case(2, 3, 5, 17, torch.float32, scale=0.5),
        masked_row,
        _case(1, 1, 1, 1, torch.bfloat16, keep=1.0),
        _case(2, 4, 16, 100, torch.bfloat16, scale=1.0, keep=0.3),
        _case(1, 2, 8, 256, torch.float32),
    ]


def get_reference_output(x, mask, scale):
    s = (x.double() * scale).masked_fill(~mask, float("-inf"))
    return torch.softmax(s, dim=-1).nan_to_num(0.0).to(x.dtype)


def run_baseline(x, mask, scale):
    return (x * scale).masked_fill(~mask, float("-inf")).softmax(-1).nan_to_num(0.0)


def BYTES(x, mask, scale):
    return 2 * x.numel() * x.element_size() + mask.numel()
