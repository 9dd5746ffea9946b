"""Baseline for linear: y = x @ weight.T + bias (torch.nn.functional.linear).

Headline: bf16 decode, M = 1, N = K = 4096 (the weight-streaming case).
Kernel signature: ``linear(x, weight, bias=None)``; the benchmark passes the
plain [N, K] weight (``prepack``'s packed weight is timed by ``sweep.py``).
``LINEAR_M`` (environment) sets the headline M, e.g. ``LINEAR_M=128``, and
``LINEAR_DTYPE`` its dtype (``bfloat16``, the default, or ``float32``).

The values are small integers times powers of two (x in k/8, weight in k/64,
bias in k/8, |k| <= 8): every product is a multiple of 2^-9 and every partial
sum stays below 2^12, so each sum is exact in fp32 whatever the summation
order, and the kernel's single rounding to bf16 must give the float64
reference rounded once, bit for bit. The check is then strict (half an ulp)
and order-free: it catches any indexing, tail, bias or rounding mistake
without widening a tolerance. (With continuous random data an fp32 GEMM is
not correctly rounded in bf16 — neither is F.linear — and the comparison
needs --accept-if-as-accurate; tests/test_gemm_linear.py checks that case
against float64 with an error bound.)
"""

import os

import torch
import torch.nn.functional as F

# the weight and the bias: a model reads them once per token, after its other layers
# streamed theirs, so each timed call gets them from memory (kernel_harness/bench/eviction.py)
PERSISTENT_INPUTS = (1, 2)

N = K = 4096
HEADLINE_M = int(os.environ.get("LINEAR_M", "1"))
_DTYPE_NAMES = {"bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float32": torch.float32, "fp32": torch.float32}
if os.environ.get("LINEAR_DTYPE", "bfloat16") not in _DTYPE_NAMES:
    raise ValueError(f"LINEAR_DTYPE={os.environ['LINEAR_DTYPE']!r}: use one of {', '.join(_DTYPE_NAMES)}.")
HEADLINE_DTYPE = _DTYPE_NAMES[os.environ.get("LINEAR_DTYPE", "bfloat16")]
DTYPES = (torch.float32, torch.bfloat16)
# (M, N, K): tails in M, N and K (not multiples of 6, 8, 16 or 32), one row,
# one output, one input feature, M just above the decode range.
CORRECTNESS_SHAPES = ((1, 4096, 4096), (1, 37, 7), (3, 33, 4096 + 13), (8, 97, 129), (9, 31, 17), (33, 65, 100), (1, 1, 1))


def _exact(*shape: int, scale: float) -> torch.Tensor:
    return torch.randint(-8, 9, shape).to(torch.float32) * scale


def _make_inputs(m: int, n: int, k: int, dtype: torch.dtype) -> list:
    return [_exact(m, k, scale=1 / 8).to(dtype), _exact(n, k, scale=1 / 64).to(dtype), _exact(n, scale=1 / 8).to(dtype)]


def get_inputs() -> list:
    return _make_inputs(HEADLINE_M, N, K, HEADLINE_DTYPE)


def get_correctness_inputs() -> list:
    return [_make_inputs(m, n, k, dtype) for dtype in DTYPES for m, n, k in CORRECTNESS_SHAPES]


def get_reference_output(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """Ground truth in float64, rounded once to the input dtype."""
    return F.linear(x.double(), weight.double(), bias.double()).to(x.dtype)


def run_baseline(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """The speed reference: PyTorch eager (oneDNN/MKL) on the original dtype."""
    return F.linear(x, weight, bias)


def FLOPS(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> int:
    return 2 * x.numel() // x.shape[-1] * weight.shape[0] * weight.shape[1]


def BYTES(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> int:
    # the weight once (the decode floor), x and bias once, y once
    m = x.numel() // x.shape[-1]
    return (weight.numel() + x.numel() + bias.numel() + m * weight.shape[0]) * x.element_size()
