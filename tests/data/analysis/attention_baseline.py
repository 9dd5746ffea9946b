"""Attention baseline for the analysis tests: causal scaled dot-product attention in bf16."""

import torch
import torch.nn.functional as F

B, H, S, D = 2, 16, 1024, 128


def get_inputs():
    q = torch.randn(B, H, S, D, dtype=torch.bfloat16)
    k = torch.randn(B, H, S, D, dtype=torch.bfloat16)
    v = torch.randn(B, H, S, D, dtype=torch.bfloat16)
    return [q, k, v]


def get_reference_output(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)
