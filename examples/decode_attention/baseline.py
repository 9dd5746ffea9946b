"""Baseline for decode_attention: one query token per sequence against its KV cache (issue 21, op 3).

q [B, H, D], k_cache and v_cache [B, H_kv, S, D] with H_kv dividing H (grouped-query attention:
query head h reads kv head h // (H / H_kv)), a float scale; the result is [B, H, D] like q:

    out = scaled_dot_product_attention(q.unsqueeze(2), k_cache, v_cache, scale=scale, enable_gqa=True).squeeze(2)

Headline: bf16, B = 1, H = H_kv = 32, S = 2048, D = 128 (one decode step of a 7B-class model at a
2k context); ``baseline_b8.py`` is the same at B = 8. The ground truth is computed in float64 and
rounded once to q's dtype; the speed reference (run_baseline) is PyTorch's
scaled_dot_product_attention in q's dtype. The correctness sets reach the tails of every tier
(D = 1, 7, 33, 80, S = 1, 17, 100), grouped-query heads (H / H_kv = 2, 4, 8), a batch of 1 and
both dtypes.
"""

import torch
import torch.nn.functional as F

# the KV cache: a model reads each layer's once per token, after the other layers read
# theirs, so each timed call gets it from memory (kernel_harness/bench/eviction.py)
PERSISTENT_INPUTS = (1, 2)

HEADLINE = (1, 32, 32, 2048, 128)  # batch, heads, kv heads, keys, head dim
# (B, H, H_kv, S, D): tails in S and D, grouped-query heads, one key, long single-head sequences.
CORRECTNESS_SHAPES = (
    (1, 1, 1, 1, 1),
    (2, 4, 4, 17, 7),
    (2, 8, 2, 100, 33),
    (3, 8, 1, 257, 80),
    (1, 32, 8, 300, 128),
    (1, 2, 1, 1500, 64),
)


def _case(B: int, H: int, H_kv: int, S: int, D: int, dtype: torch.dtype) -> list:
    q = torch.randn(B, H, D).to(dtype)
    k_cache = torch.randn(B, H_kv, S, D).to(dtype)
    v_cache = torch.randn(B, H_kv, S, D).to(dtype)
    return [q, k_cache, v_cache, D**-0.5]


def get_inputs() -> list:
    return _case(*HEADLINE, torch.bfloat16)


def get_correctness_inputs() -> list:
    return [_case(*shape, dtype) for dtype in (torch.bfloat16, torch.float32) for shape in CORRECTNESS_SHAPES]


def get_reference_output(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, scale: float) -> torch.Tensor:
    """Ground truth in float64 (the query heads of a group against their kv head), rounded once to q's dtype."""
    B, H, D = q.shape
    H_kv = k_cache.shape[1]
    qd = q.double().reshape(B, H_kv, H // H_kv, D)
    weights = torch.softmax((qd @ k_cache.double().transpose(-1, -2)) * scale, dim=-1)
    return (weights @ v_cache.double()).reshape(B, H, D).to(q.dtype)


def run_baseline(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, scale: float) -> torch.Tensor:
    """The speed reference: PyTorch's scaled_dot_product_attention in q's dtype."""
    gqa = q.shape[1] != k_cache.shape[1]
    return F.scaled_dot_product_attention(q.unsqueeze(2), k_cache, v_cache, scale=scale, enable_gqa=gqa).squeeze(2)


def FLOPS(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, scale: float) -> int:
    # q . k and p * v: two multiply-adds per query head and cache element
    B, H, D = q.shape
    return 4 * B * H * k_cache.shape[2] * D


def BYTES(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, scale: float) -> int:
    # the caches once (the KV-streaming floor), q in, out
    return (k_cache.numel() + v_cache.numel() + 2 * q.numel()) * q.element_size()
