"""Baseline for linear_int8: y = x @ (qweight * scales[:, None]).T + bias.

int8 weights [N, K] with one fp32 scale per output channel (weight-only
quantisation), activations x [..., K] in bf16 or fp32.
Headline: decode, bf16, M = 1, N = K = 4096 (``baseline_m16.py``: M = 16).
Kernel signature: ``linear_int8(x, qweight, scales, bias)``.
"""

import torch
import torch.nn.functional as F

N = K = 4096
HEADLINE_M = 1
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# (M, N, K, bias): tails in M (not a multiple of the 2- or 4-row register tile),
# N (not a multiple of the 4-channel block) and K (not a multiple of 4 or 8
# doubles, shorter than one vector, longer than one 512-column panel), a batch
# of one, a single output channel, 3-d activations and both with and without
# bias. Kept small: the headline sets (N = K = 4096) are checked too, and the
# benchmark checks every case on every tier.
CORRECTNESS_SHAPES = (
    ((1, 4096), 600, True),
    ((3, 13), 7, False),
    ((5, 1), 3, True),
    ((4, 40), 1, True),
    ((17, 515), 37, True),
    ((2, 3, 1030), 65, False),
    ((16, 1100), 300, False),
    ((70, 260), 33, True),
)


# qweight, scales and bias: a model reads them once per token, after its other layers
# streamed theirs, so each timed call gets them from memory (kernel_harness/bench/eviction.py)
PERSISTENT_INPUTS = (1, 2, 3)


def make_inputs(x_shape: tuple, n: int, bias: bool, dtype: torch.dtype) -> list:
    """x ~ N(0, 1); qweight uniform in [-127, 127] (symmetric absmax quantisation);
    scales ~ 0.02 / 127 per channel, so the dequantised weight is ~N(0, 0.01)-sized."""
    k = x_shape[-1]
    x = torch.randn(*x_shape).to(dtype)
    qweight = torch.randint(-127, 128, (n, k), dtype=torch.int8)
    scales = (0.02 / 127) * (1.0 + 0.1 * torch.rand(n))
    b = (0.1 * torch.randn(n)).to(dtype) if bias else None
    return [x, qweight, scales, b]


def get_inputs() -> list:
    return make_inputs((HEADLINE_M, K), N, False, torch.bfloat16)


def get_correctness_inputs() -> list:
    return [make_inputs(shape, n, bias, dtype) for dtype in DTYPES for shape, n, bias in CORRECTNESS_SHAPES]


def get_reference_output(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, bias) -> torch.Tensor:
    """Ground truth: dequantised and multiplied in float64, rounded once to x's dtype."""
    w = qweight.double() * scales.double()[:, None]
    y = x.double() @ w.T
    if bias is not None:
        y = y + bias.double()
    return y.to(x.dtype)


def run_baseline(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, bias) -> torch.Tensor:
    """The speed reference: dequantise to fp32, then F.linear, cast to x's dtype."""
    w = qweight.float() * scales[:, None]
    return F.linear(x.float(), w, None if bias is None else bias.float()).to(x.dtype)


def FLOPS(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, bias) -> int:
    return 2 * (x.numel() // x.shape[-1]) * qweight.numel()


def BYTES(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, bias) -> int:
    # the int8 weight once, the scales, x, and the output
    m = x.numel() // x.shape[-1]
    return qweight.numel() + 4 * scales.numel() + x.numel() * x.element_size() + m * qweight.shape[0] * x.element_size()
