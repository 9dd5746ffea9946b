"""The knowledge base in references/ is checked, not just read.

* schema: every YAML entry file follows references/README.md;
* ids: every id the shared brief promises exists, in the file that owns it;
* compile: every `code` compiles with its declared `flags` (g++ -std=c++20 -O2 -c);
* run: every entry with a `test_harness` is built into a shared library, called
  through ctypes on this CPU and checked against numpy/PyTorch (skipped with the
  missing CPU flags as reason); math entries assert their stated max_ulp_error;
* cross references: every ref(<quoted id>) in kernel_harness/ and scripts/ and every
  [ref:<id>] in references/*.md names an existing entry;
* huggingface-kernels-integration.md: the kernels API it documents matches the
  installed version and works on a locally built kernel.

Snippet builds are cached under ~/.cache/kernel_harness/snippets/ (content hash).
"""

from __future__ import annotations

import ctypes
import inspect
import math
import mmap
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch  # noqa: F401  (loaded first, as in a real process: kernels share its OpenMP runtime)

from kernel_harness import references
from kernel_harness.cpu import cpu_flags
from kernel_harness.paths import PROJECT_ROOT, REFERENCES_DIR
from kernel_harness.snippets import build_shared, compile_object

ENTRIES = references.load_entries()
BY_ID = {e.id: e for e in ENTRIES}
RUNNABLE = [e for e in ENTRIES if e.test_harness]

# The ids the shared brief promises, and the file each must live in.
PROMISED_IDS: dict[str, list[str]] = {
    "simd_optimization_patterns.yaml": [
        "bf16-rne-conversion", "bf16-truncation-bug", "fp16-f16c-conversion", "horizontal-sum",
        "horizontal-max", "masked-tail", "vectorized-exp", "vectorized-tanh", "vectorized-erf",
        "vectorized-sigmoid", "reduction-order", "multiple-accumulators", "unroll-and-prefetch",
    ],
    "memory_patterns.yaml": [
        "software-prefetch", "non-temporal-stores", "first-touch-page-faults", "out-parameter-api",
        "single-pass-row-in-cache", "cache-blocking",
    ],
    "threading_patterns.yaml": ["omp-row-parallel", "omp-small-size-threshold", "shared-openmp-runtime"],
    "dtype_optimizations.yaml": ["avx512-bf16-dot", "bf16-accumulate-fp32", "fp16-accumulate-fp32"],
    "brgemm_patterns.yaml": ["amx-tile-config", "amx-linux-permission", "cpublas-brgemm", "vnni-packing"],
    "quantized_gemm_patterns.yaml": ["int8-dequant-gemm", "int4-dequant-gemm"],
    "optimization_levels.yaml": [
        "level-vectorize", "level-threading", "level-memory-traffic", "level-fusion", "level-algorithm",
    ],
}


# --------------------------------------------------------------------------- helpers


class Lib:
    """A snippet's shared library with a forgiving ctypes calling convention."""

    def __init__(self, path: Path):
        self.cdll = ctypes.CDLL(str(path))

    def __call__(self, name: str, *args, restype=None):
        fn = getattr(self.cdll, name)
        fn.restype = restype
        converted = []
        for a in args:
            if isinstance(a, np.ndarray):
                converted.append(ctypes.c_void_p(a.ctypes.data))
            elif isinstance(a, bool):
                converted.append(ctypes.c_int(int(a)))
            elif isinstance(a, int):
                converted.append(ctypes.c_int64(a))
            elif isinstance(a, float):
                converted.append(ctypes.c_float(a))
            else:
                converted.append(a)
        return fn(*converted)


def missing_isa(entry: references.Entry) -> list[str]:
    flags = cpu_flags()
    return [f for f in entry.isa if f not in flags]


def load_lib(entry: references.Entry) -> Lib:
    missing = missing_isa(entry)
    if missing:
        pytest.skip(f"{entry.id}: this CPU lacks {', '.join(missing)} (from /proc/cpuinfo)")
    path = build_shared(
        entry.code, entry.test_harness, entry.flags, torch_headers=entry.needs_torch_headers, label=entry.id
    )
    return Lib(path)


def ulp_error(y: np.ndarray, ref64: np.ndarray) -> np.ndarray:
    """|y - ref| in units of the fp32 spacing at ref (ref in float64)."""
    spacing = np.spacing(np.abs(ref64).astype(np.float32)).astype(np.float64)
    return np.abs(y.astype(np.float64) - ref64) / spacing


def bf16_bits_torch(x: np.ndarray) -> np.ndarray:
    import torch

    return torch.from_numpy(x).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)


def random_float_bits(count: int, seed: int) -> np.ndarray:
    """Uniform 32-bit patterns (covers NaN, inf, denormals, both signs) plus hand-picked cases."""
    rng = np.random.default_rng(seed)
    bits = rng.integers(0, 2**32, size=count, dtype=np.uint64).astype(np.uint32)
    special = np.array(
        [0x7F80FFFF, 0xFF80FFFF, 0x7FC00000, 0x7F800000, 0xFF800000, 0x00000001, 0x807FFFFF,
         0x3F808000, 0x3F818000, 0x3F808001, 0x7F7FFFFF, 0x7F7F8000, 0x00008000, 0x00018000],
        dtype=np.uint32,
    )
    bits[: special.size] = special
    return bits.view(np.float32)


# --------------------------------------------------------------------------- run checks
# Each takes (entry, lib) and asserts; registered by the name used in `check:`.

CHECKS: dict[str, Callable[[references.Entry, Lib], None]] = {}


def check(name: str):
    def register(fn):
        CHECKS[name] = fn
        return fn

    return register


@check("bf16_rne")
def _bf16_rne(entry, lib):
    import torch

    # every bf16 pattern: widen (must be exact) then narrow (must give the pattern back, NaN -> NaN)
    patterns = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    widened = np.empty(65536, np.float32)
    lib("f32_from_bf16", patterns, widened, 65536)
    torch_widened = torch.from_numpy(patterns.view(np.int16)).view(torch.bfloat16).float().numpy()
    assert np.array_equal(widened.view(np.uint32), torch_widened.view(np.uint32))
    narrowed = np.empty(65536, np.uint16)
    lib("bf16_from_f32", widened, narrowed, 65536)
    assert np.array_equal(narrowed, bf16_bits_torch(widened))
    # a million random floats (NaN, inf, denormals, ties included), and an odd length for the masked tail
    x = random_float_bits(1_000_003, seed=1)
    ours = np.empty(x.size, np.uint16)
    lib("bf16_from_f32", x, ours, x.size)
    theirs = bf16_bits_torch(x)
    nan = np.isnan(x)
    assert nan.sum() > 1000, "the sample must contain NaNs"
    # bit-identical, NaN included (torch's tensor conversion writes 0xFFFF for NaN, and so does the snippet)
    assert np.array_equal(ours, theirs)
    assert np.all(ours[nan] == 0xFFFF)


@check("fp_contraction")
def _fp_contraction(entry, lib):
    import torch

    # Inputs from numpy's PCG64 and float64 cos/sin rounded to fp32: the count is exact
    # IEEE arithmetic only if the inputs are the same bits in every process. torch.randn
    # is not (its normal fill has a SIMD path per CPU capability), and one fresh-clone CI
    # run read 24 flips, one of them 2 ulps (a cancellation in x1*c - x2*s), where every
    # other run read 23 from the same torch-drawn inputs.
    rng = np.random.default_rng(0)
    n = 1_000_000
    x = torch.from_numpy(rng.standard_normal((2, n), dtype=np.float32)).to(torch.bfloat16).float()
    angle = rng.random(n) * 100.0
    c, s = (torch.from_numpy(f(angle).astype(np.float32)) for f in (np.cos, np.sin))
    x1, x2 = x[0].contiguous(), x[1].contiguous()
    eager = (x1 * c - x2 * s).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    arrays = [t.numpy() for t in (x1, c, x2, s)]
    as_written, contracted = np.empty(n, np.uint16), np.empty(n, np.uint16)
    lib("rope_half_bf16", *arrays, as_written, n, 0)
    lib("rope_half_bf16", *arrays, contracted, n, 1)
    assert np.array_equal(as_written, eager), "with -ffp-contract=off the snippet must match eager bit for bit"
    flipped = contracted != eager
    assert flipped.sum() == 18, flipped.sum()  # the count expected_effect states (exact arithmetic)
    assert np.all(np.abs(contracted[flipped].astype(np.int32) - eager[flipped].astype(np.int32)) == 1)


@check("bf16_truncation")
def _bf16_truncation(entry, lib):
    import torch

    x = torch.randn(1_000_000, generator=torch.Generator().manual_seed(0)).numpy()
    ours = np.empty(x.size, np.uint16)
    lib("bf16_from_f32_truncate", x, ours, x.size)
    theirs = bf16_bits_torch(x)
    differ = ours != theirs
    fraction = differ.mean()
    assert 0.4 < fraction < 0.6, f"truncation should disagree on about half the values, got {fraction:.3f}"
    # every disagreement is one bf16 ulp toward zero
    assert np.all(theirs[differ].astype(np.int32) - ours[differ].astype(np.int32) == 1)


@check("fp16_f16c")
def _fp16_f16c(entry, lib):
    import torch

    patterns = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    widened = np.empty(65536, np.float32)
    lib("f32_from_fp16", patterns, widened, 65536)
    ref = torch.from_numpy(patterns.view(np.int16)).view(torch.float16).float().numpy()
    nan = np.isnan(ref)
    assert np.array_equal(np.isnan(widened), nan)
    assert np.array_equal(widened[~nan].view(np.uint32), ref[~nan].view(np.uint32))
    rng = np.random.default_rng(2)
    x = (rng.standard_normal(1_000_000) * 10.0 ** rng.uniform(-8, 5, 1_000_000)).astype(np.float32)
    x[:6] = [np.nan, np.inf, -np.inf, 65504.0, 65520.0, 2.0**-24]
    ours = np.empty(x.size, np.uint16)
    lib("fp16_from_f32", x, ours, x.size)
    theirs = torch.from_numpy(x).half().view(torch.int16).numpy().view(np.uint16)
    nan = np.isnan(x)
    assert np.array_equal(ours[~nan], theirs[~nan])
    assert np.all((ours[nan] & 0x7C00) == 0x7C00) and np.all((ours[nan] & 0x03FF) != 0)


@check("horizontal_sum")
def _horizontal_sum(entry, lib):
    rng = np.random.default_rng(3)
    for _ in range(2000):
        v = rng.standard_normal(16).astype(np.float32) * np.float32(rng.uniform(0.01, 100))
        ref = v.astype(np.float64).sum()
        bound = 2 * 16 * np.finfo(np.float32).eps * np.abs(v).astype(np.float64).sum()
        s512 = lib("hsum512_of", v, restype=ctypes.c_float)
        assert abs(s512 - ref) <= bound
        assert np.float32(s512) == np.float32(lib("reduce_add_of", v, restype=ctypes.c_float))
        s256 = lib("hsum256_of", v, restype=ctypes.c_float)
        assert abs(s256 - v[:8].astype(np.float64).sum()) <= bound
    ints = np.arange(16, dtype=np.float32)
    assert lib("hsum512_of", ints, restype=ctypes.c_float) == 120.0


@check("horizontal_max")
def _horizontal_max(entry, lib):
    rng = np.random.default_rng(4)
    for n in list(range(1, 101)) + [4096]:
        for x in (rng.standard_normal(n).astype(np.float32), -np.abs(rng.standard_normal(n)).astype(np.float32) - 1):
            assert lib("row_max_of", x, n, restype=ctypes.c_float) == x.max()


@check("masked_tail")
def _masked_tail(entry, lib):
    rng = np.random.default_rng(5)
    a, b = 1.5, -0.25
    for n in range(0, 65):
        x = rng.standard_normal(n + 32).astype(np.float32)
        y = np.full(n + 32, 12345.0, np.float32)
        lib("axpb_c", x, y, n, a, b)
        expected = (np.float64(a) * x[:n].astype(np.float64) + b).astype(np.float32)  # single rounding like FMA
        assert np.array_equal(y[:n], expected)
        assert np.all(y[n:] == 12345.0), f"n={n}: wrote past the end"
    # a row that ends exactly at an inaccessible page: masked loads/stores must not fault
    _no_fault_at_page_end(lib, "axpb_c", a, b)


def _ulp_sweep(entry, lib, fn: str, ref: Callable[[np.ndarray], np.ndarray], lo: float, hi: float) -> float:
    dense = np.linspace(lo, hi, 4_000_000, dtype=np.float64).astype(np.float32)
    near0 = np.linspace(-1e-3, 1e-3, 200_000, dtype=np.float64).astype(np.float32)
    x = np.concatenate([dense, near0, np.float32([1.0, -1.0, 0.5, 0.625, -0.625, 0.999999, 1.000001])])
    x = x[: x.size - x.size % 16]
    y = np.empty_like(x)
    lib(fn, x, y, x.size)
    r = ref(x.astype(np.float64))
    normal = np.abs(r) >= np.finfo(np.float32).tiny
    err = ulp_error(y[normal], r[normal])
    worst = float(err.max())
    assert worst <= entry.extra["max_ulp_error"], (
        f"{entry.id}: measured max error {worst:.2f} ulp at x={x[normal][err.argmax()]!r} exceeds the "
        f"stated max_ulp_error {entry.extra['max_ulp_error']}"
    )
    # special values
    sp = np.float32([np.nan, np.inf, -np.inf, 0.0, -0.0] + [0.0] * 11)
    ys = np.empty_like(sp)
    lib(fn, sp, ys, 16)
    assert np.isnan(ys[0])
    return worst


@check("ulp_exp")
def _ulp_exp(entry, lib):
    worst = _ulp_sweep(entry, lib, "vexp", np.exp, -87.3, 88.7)
    print(f"vectorized-exp max ulp {worst:.3f}")
    sp = np.float32([np.inf, -np.inf, 0.0, 89.0, -104.0, -200.0] + [0.0] * 10)
    ys = np.empty_like(sp)
    lib("vexp", sp, ys, 16)
    assert ys[0] == np.inf and ys[1] == 0.0 and ys[2] == 1.0 and ys[3] == np.inf and ys[4] == 0.0 and ys[5] == 0.0


@check("ulp_tanh")
def _ulp_tanh(entry, lib):
    worst = _ulp_sweep(entry, lib, "vtanh", np.tanh, -10.0, 10.0)
    print(f"vectorized-tanh max ulp {worst:.3f}")
    sp = np.float32([np.inf, -np.inf, 20.0, -20.0, -0.0] + [0.0] * 11)
    ys = np.empty_like(sp)
    lib("vtanh", sp, ys, 16)
    assert list(ys[:4]) == [1.0, -1.0, 1.0, -1.0] and np.signbit(ys[4])


@check("ulp_erf")
def _ulp_erf(entry, lib):
    verf = np.vectorize(math.erf)
    worst = _ulp_sweep(entry, lib, "verf", lambda v: verf(v), -6.0, 6.0)
    print(f"vectorized-erf max ulp {worst:.3f}")


@check("ulp_sigmoid")
def _ulp_sigmoid(entry, lib):
    import torch

    worst = _ulp_sweep(entry, lib, "vsigmoid", lambda v: 1.0 / (1.0 + np.exp(-v)), -87.0, 30.0)
    print(f"vectorized-sigmoid max ulp {worst:.3f}")
    x = torch.randn(1 << 16, generator=torch.Generator().manual_seed(1)).mul(8).numpy()
    y = np.empty_like(x)
    lib("vsilu", x, y, x.size)
    np.testing.assert_allclose(y, torch.nn.functional.silu(torch.from_numpy(x)).numpy(), rtol=1e-5, atol=1e-6)


@check("reduction_order")
def _reduction_order(entry, lib):
    import torch

    rng = np.random.default_rng(6)
    differ, err_lanes, err_seq = 0, [], []
    for _ in range(200):
        x = rng.standard_normal(4096).astype(np.float32)
        ref = float((x.astype(np.float64) ** 2).sum())
        lanes = lib("sumsq_lanes_c", x, x.size, restype=ctypes.c_float)
        seq = lib("sumsq_sequential_c", x, x.size, restype=ctypes.c_float)
        differ += np.float32(lanes) != np.float32(seq)
        err_lanes.append(abs(lanes - ref) / ref)
        err_seq.append(abs(seq - ref) / ref)
        # both are well inside the fp32 tolerance of the benchmark (rtol 1e-5)
        assert abs(lanes - ref) / ref < 1e-5 and abs(seq - ref) / ref < 1e-5
    assert differ > 100, "the two orders should disagree in the last bits on most rows"
    assert np.mean(err_lanes) <= np.mean(err_seq)
    big = rng.standard_normal(1 << 24).astype(np.float32)
    ref = float((big.astype(np.float64) ** 2).sum())
    rel_lanes = abs(lib("sumsq_lanes_c", big, big.size, restype=ctypes.c_float) - ref) / ref
    rel_seq = abs(lib("sumsq_sequential_c", big, big.size, restype=ctypes.c_float) - ref) / ref
    rel_blocked = abs(lib("sumsq_blocked_c", big, big.size, restype=ctypes.c_float) - ref) / ref
    rel_torch = abs(float(torch.from_numpy(big).pow(2).sum()) - ref) / ref
    print(f"reduction-order 4096: mean rel err lanes {np.mean(err_lanes):.2e} seq {np.mean(err_seq):.2e}; "
          f"16M: lanes {rel_lanes:.2e} seq {rel_seq:.2e} blocked {rel_blocked:.2e} torch {rel_torch:.2e}")
    # over 16M elements: left-to-right is far outside fp32 rtol 1e-5, a flat lane-parallel sum
    # drifts towards it, the blocked sum stays near ATen's cascade sum
    assert rel_seq > 1e-3 and rel_lanes < rel_seq and rel_blocked < 1e-6


@check("multiple_accumulators")
def _multiple_accumulators(entry, lib):
    rng = np.random.default_rng(7)
    a, b = rng.standard_normal((2, 4096)).astype(np.float32)
    ref = float(a.astype(np.float64) @ b.astype(np.float64))
    for fn in ("dot1_c", "dot8_c"):
        assert abs(lib(fn, a, b, 4096, restype=ctypes.c_float) - ref) < 1e-3


@check("unroll_prefetch")
def _unroll_prefetch(entry, lib):
    rng = np.random.default_rng(8)
    n = 64 * 1000
    a, b, c = rng.standard_normal((3, n)).astype(np.float32)
    expected = (a.astype(np.float64) * b + c).astype(np.float32)
    for pd in (0, 256, 4096):
        out = np.empty(n, np.float32)
        lib("fma_stream_c", a, b, c, out, n, pd)
        assert np.array_equal(out, expected)


@check("software_prefetch")
def _software_prefetch(entry, lib):
    rng = np.random.default_rng(9)
    table = rng.standard_normal((1000, 32)).astype(np.float32)
    idx = rng.integers(0, 1000, 5000).astype(np.int64)
    for d in (0, 8):
        out = np.empty((5000, 32), np.float32)
        lib("gather_rows_c", table, idx, out, 5000, 32, d)
        assert np.array_equal(out, table[idx])


@check("nta_prefetch")
def _nta_prefetch(entry, lib):
    rng = np.random.default_rng(11)
    for n, k in ((7, 16), (33, 4096), (5, 8192 + 48)):
        x = rng.standard_normal((2, k)).astype(np.float32)
        w = rng.standard_normal((n, k)).astype(np.float32)
        expected = x.astype(np.float64) @ w.T.astype(np.float64)
        outs = []
        for nta in (0, 4096):
            y = np.empty((2, n), np.float32)
            lib("gemv2_c", y, x, w, n, k, nta)
            outs.append(y)
        assert np.array_equal(outs[0], outs[1])  # the hint changes no bit
        bound = 1e-6 * k * (np.abs(x).astype(np.float64) @ np.abs(w).T.astype(np.float64)) + 1e-30
        assert np.all(np.abs(outs[0] - expected) <= bound)


def fp32_rms_norm_case(rng: np.random.Generator, rows: int, cols: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Standard-normal fp32 x (rows x cols) and weight, and torch's rms_norm of them (eps 1e-6)."""
    import torch

    x = rng.standard_normal((rows, cols)).astype(np.float32)
    w = rng.standard_normal(cols).astype(np.float32)
    ref = torch.nn.functional.rms_norm(torch.from_numpy(x), (cols,), torch.from_numpy(w), 1e-6).numpy()
    return x, w, ref


def aligned_empty(n: int, align: int = 64, offset_floats: int = 0) -> np.ndarray:
    raw = np.empty(n + align, np.float32)
    start = (-raw.ctypes.data % align) // 4
    return raw[start + offset_floats : start + offset_floats + n]


@check("non_temporal")
def _non_temporal(entry, lib):
    rng = np.random.default_rng(10)
    for n, off in ((1000, 0), (1003, 3), (7, 1), (0, 0)):
        x = rng.standard_normal(n).astype(np.float32)
        y = aligned_empty(n, offset_floats=off)
        lib("scale_stream_c", x, y, n, 2.5)
        assert np.array_equal(y, x * np.float32(2.5))
        y2 = np.empty(n, np.float32)
        lib("scale_regular_c", x, y2, n, 2.5)
        assert np.array_equal(y2, y)


@check("first_touch")
def _first_touch(entry, lib):
    warm = ctypes.c_double()
    fresh = lib("first_touch_cost_c", 64 << 20, ctypes.byref(warm), restype=ctypes.c_double)
    assert fresh > 0 and warm.value > 0
    # fresh pages must cost more than mapped ones (the page-fault cost); generous factor for a shared VM
    assert fresh > 1.2 * warm.value, (fresh, warm.value)
    buf = np.ones(1 << 20, np.float32)
    lib("parallel_first_touch_c", buf, buf.size)
    assert np.all(buf[::1024] == 0.0) and buf[1] == 1.0


@check("single_pass")
def _single_pass(entry, lib):
    rng = np.random.default_rng(11)
    x, w, ref = fp32_rms_norm_case(rng, 64, 4096)
    y1, y2, inv = np.empty_like(x), np.empty_like(x), np.empty(64, np.float32)
    lib("rms_rowwise_c", x, w, y1, 64, 4096, 1e-6)
    lib("rms_two_sweeps_c", x, w, y2, inv, 64, 4096, 1e-6)
    np.testing.assert_allclose(y1, ref, rtol=1e-5, atol=1e-6)
    assert np.array_equal(y1, y2)


@check("row_pipelining")
def _row_pipelining(entry, lib):
    rng = np.random.default_rng(21)
    eps = 1e-6
    for rows, cols, runs_list in ((1, 16, (1, 4)), (7, 48, (1, 2, 3, 7, 10)), (64, 4096, (1, 5, 64))):
        x = (rng.standard_normal((rows, cols)) * rng.uniform(0.1, 10, (rows, 1))).astype(np.float32)
        w = rng.standard_normal(cols).astype(np.float32)
        x64, w64 = x.astype(np.float64), w.astype(np.float64)
        ref = x64 / np.sqrt((x64**2).mean(-1, keepdims=True) + eps) * w64
        plain = np.full_like(x, np.nan)
        lib("rms_plain_c", x, w, plain, rows, cols, eps)
        np.testing.assert_allclose(plain, ref, rtol=1e-5, atol=1e-6)
        for runs in runs_list:
            piped = np.full_like(x, np.nan)
            lib("rms_pipelined_c", x, w, piped, rows, cols, eps, runs)
            np.testing.assert_allclose(piped, ref, rtol=1e-5, atol=1e-6)
            # the carried sum adds the same terms in the same order as the standalone pass
            assert np.array_equal(piped.view(np.uint32), plain.view(np.uint32)), f"{rows}x{cols}, {runs} runs"


@check("output_prefetch")
def _output_prefetch(entry, lib):
    rng = np.random.default_rng(22)
    for rows, cols in ((1, 32), (5, 96), (64, 4096)):
        x, w, ref = fp32_rms_norm_case(rng, rows, cols)
        outs = []
        for ahead in (0, 64, 2048):
            y = np.empty_like(x)
            lib("rms_prefetch_out_c", x, w, y, rows, cols, 1e-6, ahead)
            np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-6)
            outs.append(y)
        # a prefetch must not change a single bit of the result
        assert all(np.array_equal(outs[0], o) for o in outs[1:])


@check("cache_blocking")
def _cache_blocking(entry, lib):
    rng = np.random.default_rng(12)
    for rows, cols in ((130, 70), (256, 512)):
        a = rng.standard_normal((rows, cols)).astype(np.float32)
        for fn in ("transpose_naive_c", "transpose_blocked_c"):
            b = np.empty((cols, rows), np.float32)
            lib(fn, a, b, rows, cols)
            assert np.array_equal(b, a.T)


@check("omp_row_parallel")
def _omp_row_parallel(entry, lib):
    rng = np.random.default_rng(13)
    for rows, cols in ((37, 4096), (5, 1000), (64, 13)):
        x, w, ref = fp32_rms_norm_case(rng, rows, cols)
        y = np.empty_like(x)
        lib("rms_parallel_c", x, w, y, rows, cols, 1e-6)
        np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-6)


@check("omp_threshold")
def _omp_threshold(entry, lib):
    rng = np.random.default_rng(14)
    for rows, cols, threads in ((1, 4096, 0), (300, 4096, 0), (7, 33, 2), (7, 33, 1)):
        x = rng.standard_normal((rows, cols)).astype(np.float32)
        y = np.empty_like(x)
        lib("scale_rows_c", x, y, rows, cols, 3.0, threads)
        assert np.array_equal(y, x * np.float32(3.0))
    ns = lib("time_scale_rows", x, y, 7, 33, 1, 3, restype=ctypes.c_double)
    assert ns > 0


@check("shared_openmp")
def _shared_openmp(entry, lib):
    import torch

    path = lib("omp_runtime_path_c", restype=ctypes.c_char_p).decode()
    maps = {line.split()[-1] for line in Path("/proc/self/maps").read_text().splitlines()
            if "libgomp" in line and "/" in line}
    assert len(maps) == 1, f"more than one OpenMP runtime mapped: {maps}"
    assert Path(path).resolve() == Path(next(iter(maps))).resolve()
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert lib("kernel_omp_threads_c", restype=ctypes.c_int) == 1
        torch.set_num_threads(2)
        assert lib("kernel_omp_threads_c", restype=ctypes.c_int) == 2
    finally:
        torch.set_num_threads(before)


def as_bf16_bits(x: np.ndarray) -> np.ndarray:
    return bf16_bits_torch(np.ascontiguousarray(x, dtype=np.float32))


def bf16_bits_to_f32(b: np.ndarray) -> np.ndarray:
    return (b.astype(np.uint32) << 16).view(np.float32)


@check("bf16_dot")
def _bf16_dot(entry, lib):
    rng = np.random.default_rng(15)
    for n in (32, 96, 4096, 8192):
        a, b = as_bf16_bits(rng.standard_normal(n)), as_bf16_bits(rng.standard_normal(n))
        fa, fb = bf16_bits_to_f32(a).astype(np.float64), bf16_bits_to_f32(b).astype(np.float64)
        ref = float(fa @ fb)
        got = lib("dot_bf16_c", a, b, n, restype=ctypes.c_float)
        assert abs(got - ref) <= 4 * n * np.finfo(np.float32).eps * float(np.abs(fa) @ np.abs(fb)) / 16 + 1e-6
    # the hardware conversion flushes denormals: equal to torch on every normal/zero/inf input
    x = random_float_bits(1_000_000, seed=16)
    ours = np.empty(x.size, np.uint16)
    lib("bf16_from_f32_hw", x, ours, x.size)
    theirs = bf16_bits_torch(x)
    denormal = (np.abs(x) < np.finfo(np.float32).tiny) & (x != 0)
    finite = np.isfinite(x) | np.isinf(x)
    differ = (ours != theirs) & ~np.isnan(x)
    assert not np.any(differ & ~denormal), "hardware conversion differs from torch on a non-denormal input"
    assert np.any(differ & denormal), "expected the hardware conversion to flush some denormals"
    assert np.all((ours[denormal] & 0x7FFF) == 0)
    assert finite.any()


@check("bf16_widen_fma_avx2")
def _bf16_widen_fma_avx2(entry, lib):
    rng = np.random.default_rng(41)
    for k in [*range(0, 41), 4096, 4099]:
        ldw = k + 3
        w = as_bf16_bits(rng.standard_normal(4 * ldw))
        x = rng.standard_normal(max(k, 1)).astype(np.float32)
        y = np.full(4, 777.0, np.float32)
        lib("gemv4_bf16w_c", w, ldw, x, k, y)
        wf = bf16_bits_to_f32(w).astype(np.float64).reshape(4, ldw)[:, :k]
        ref = wf @ x[:k].astype(np.float64)
        bound = 4 * max(k, 1) * np.finfo(np.float32).eps * (np.abs(wf) @ np.abs(x[:k].astype(np.float64))) + 1e-30
        assert np.all(np.abs(y.astype(np.float64) - ref) <= bound), (k, y, ref)


def _rms_ref(x64: np.ndarray, w64: np.ndarray, eps: float) -> np.ndarray:
    return x64 / np.sqrt((x64 * x64).mean(-1, keepdims=True) + eps) * w64


@check("bf16_accumulate")
def _bf16_accumulate(entry, lib):
    rng = np.random.default_rng(17)
    rows, cols = 256, 4096
    x = as_bf16_bits(rng.standard_normal((rows, cols)).astype(np.float32)).reshape(rows, cols)
    w = as_bf16_bits(rng.standard_normal(cols).astype(np.float32))
    y = np.empty_like(x)
    lib("rms_norm_bf16_c", x, w, y, rows, cols, 1e-6)
    got = bf16_bits_to_f32(y)
    ref64 = _rms_ref(bf16_bits_to_f32(x).astype(np.float64), bf16_bits_to_f32(w).astype(np.float64), 1e-6)
    # within one bf16 rounding of float64: |err| <= 2^-8 relative (+ tiny absolute slack)
    assert np.all(np.abs(got - ref64) <= np.abs(ref64) * 2.0**-8 + 1e-30)
    t = torch.nn.functional.rms_norm(torch.from_numpy(x.view(np.int16)).view(torch.bfloat16), (cols,),
                                     torch.from_numpy(w.view(np.int16)).view(torch.bfloat16), 1e-6)
    theirs = t.view(torch.int16).numpy().view(np.uint16)
    mismatch = float((theirs != y).mean())
    print(f"bf16-accumulate-fp32: fraction differing from torch {mismatch:.2e}")
    assert mismatch < 1e-2


@check("fp16_accumulate")
def _fp16_accumulate(entry, lib):
    rng = np.random.default_rng(18)
    rows, cols = 256, 4096
    xf = (rng.standard_normal((rows, cols)) * 8).astype(np.float16)
    wf = rng.standard_normal(cols).astype(np.float16)
    with np.errstate(over="ignore"):
        assert np.isinf((xf * xf).sum(-1, dtype=np.float16)).any(), "the test data must overflow an fp16 accumulator"
    y = np.empty((rows, cols), np.uint16)
    lib("rms_norm_fp16_c", xf.view(np.uint16), wf.view(np.uint16), y, rows, cols, 1e-6)
    got = y.view(np.float16).astype(np.float64)
    ref64 = _rms_ref(xf.astype(np.float64), wf.astype(np.float64), 1e-6)
    assert np.all(np.isfinite(got))
    assert np.all(np.abs(got - ref64) <= np.abs(ref64) * 2.0**-11 + 2.0**-24)
    t = torch.nn.functional.rms_norm(torch.from_numpy(xf), (cols,), torch.from_numpy(wf), 1e-6).numpy()
    mismatch = float((t.view(np.uint16) != y).mean())
    print(f"fp16-accumulate-fp32: fraction differing from torch {mismatch:.2e}")
    assert mismatch < 1e-2


def vnni_bf16(b: np.ndarray) -> np.ndarray:
    k, n = b.shape
    if k % 2:
        b = np.concatenate([b, np.zeros((1, n), b.dtype)])
    return np.ascontiguousarray(b.reshape(-1, 2, n).transpose(0, 2, 1))


@check("amx_permission")
def _amx_permission(entry, lib):
    assert lib("request_amx_permission_c", restype=ctypes.c_int) == 1
    assert lib("xcomp_perm_c", restype=ctypes.c_uint64) & (1 << 18)


@check("amx_tile")
def _amx_tile(entry, lib):
    rng = np.random.default_rng(19)
    for k in (32, 64, 1024):
        a = as_bf16_bits(rng.standard_normal((16, k)).astype(np.float32)).reshape(16, k)
        b = as_bf16_bits(rng.standard_normal((k, 16)).astype(np.float32)).reshape(k, 16)
        c = np.empty((16, 16), np.float32)
        assert lib("amx_gemm_16x16_c", a, k, vnni_bf16(b), c, k, restype=ctypes.c_int) == 1
        fa, fb = bf16_bits_to_f32(a).astype(np.float64), bf16_bits_to_f32(b).astype(np.float64)
        scale = np.abs(fa) @ np.abs(fb)
        assert np.all(np.abs(c - fa @ fb) <= 1e-6 * scale + 1e-6)


@check("vnni_packing")
def _vnni_packing(entry, lib):
    rng = np.random.default_rng(20)
    for k, n in ((64, 48), (33, 16), (7, 5)):
        b = rng.integers(0, 65535, (k, n)).astype(np.uint16)
        bp = np.zeros(((k + 1) // 2, n, 2), np.uint16)
        lib("pack_vnni_bf16_c", b, n, bp, k, n)
        assert np.array_equal(bp, vnni_bf16(b))
        b8 = rng.integers(-128, 127, (k, n)).astype(np.int8)
        kp = (k + 3) // 4
        padded = np.concatenate([b8, np.zeros((kp * 4 - k, n), np.int8)])
        bp8 = np.zeros((kp, n, 4), np.int8)
        lib("pack_vnni_int8_c", b8, n, bp8, k, n)
        assert np.array_equal(bp8, padded.reshape(kp, 4, n).transpose(0, 2, 1))


@check("cpublas_brgemm")
def _cpublas_brgemm(entry, lib):
    rng = np.random.default_rng(21)
    for m, n, k in ((70, 96, 64), (32, 64, 128), (5, 16, 32)):
        a = as_bf16_bits(rng.standard_normal((m, k)).astype(np.float32)).reshape(m, k)
        b = as_bf16_bits(rng.standard_normal((k, n)).astype(np.float32)).reshape(k, n)
        c = np.full((m, n), np.nan, np.float32)
        ok = lib("gemm_bf16_brgemm_c", a, vnni_bf16(b), c, m, n, k, restype=ctypes.c_int)
        if not ok:
            pytest.skip("at::native::cpublas::could_pack(kBFloat16) is false in this torch build/CPU")
        fa, fb = bf16_bits_to_f32(a).astype(np.float64), bf16_bits_to_f32(b).astype(np.float64)
        assert np.all(np.abs(c - fa @ fb) <= 1e-6 * (np.abs(fa) @ np.abs(fb)) + 1e-6), (m, n, k)


@check("int8_gemm")
def _int8_gemm(entry, lib):
    rng = np.random.default_rng(22)
    for m, n, k in ((1, 64, 4096), (3, 17, 48)):
        x = rng.standard_normal((m, k)).astype(np.float32)
        w = rng.integers(-128, 128, (n, k)).astype(np.int8)
        s = rng.uniform(0.001, 0.02, n).astype(np.float32)
        y = np.empty((m, n), np.float32)
        lib("gemm_int8_weight_c", x, w, s, y, m, n, k)
        wd = w.astype(np.float64) * s[:, None]
        ref = x.astype(np.float64) @ wd.T
        bound = 1e-6 * (np.abs(x).astype(np.float64) @ np.abs(wd).T) + 1e-7
        assert np.all(np.abs(y - ref) <= bound)


@check("int8_gemm_exact")
def _int8_gemm_exact(entry, lib):
    """Within int8_gemm's bound, and equal to the float64 result rounded to fp32 (tails in N and K)."""
    _int8_gemm(entry, lib)
    rng = np.random.default_rng(24)
    for m, n, k in ((1, 64, 4096), (3, 17, 53), (2, 5, 3)):
        x = rng.standard_normal((m, k)).astype(np.float32)
        w = rng.integers(-128, 128, (n, k)).astype(np.int8)
        s = rng.uniform(0.001, 0.02, n).astype(np.float32)
        y = np.empty((m, n), np.float32)
        lib("gemm_int8_weight_c", x, w, s, y, m, n, k)
        ref = (x.astype(np.float64) @ w.astype(np.float64).T) * s.astype(np.float64)
        assert np.array_equal(y, ref.astype(np.float32))

def pack_int4(q: np.ndarray) -> np.ndarray:
    """q: N x K values 0..15 -> N x K/2 bytes in the group-of-32 layout of int4-dequant-gemm."""
    n, k = q.shape
    g = q.reshape(n, k // 32, 2, 16)
    return (g[:, :, 0, :] | (g[:, :, 1, :] << 4)).astype(np.uint8).reshape(n, k // 2)


@check("int4_gemm")
def _int4_gemm(entry, lib):
    rng = np.random.default_rng(23)
    for m, n, k in ((1, 64, 4096), (2, 5, 64)):
        x = rng.standard_normal((m, k)).astype(np.float32)
        q = rng.integers(0, 16, (n, k)).astype(np.uint8)
        s = rng.uniform(0.01, 0.1, (n, k // 32)).astype(np.float32)
        z = rng.integers(0, 16, (n, k // 32)).astype(np.float32)
        y = np.empty((m, n), np.float32)
        lib("gemm_int4_weight_c", x, pack_int4(q), s, z, y, m, n, k)
        wd = (q.astype(np.float64).reshape(n, k // 32, 32) - z[..., None]) * s[..., None]
        wd = wd.reshape(n, k)
        ref = x.astype(np.float64) @ wd.T
        bound = 1e-6 * (np.abs(x).astype(np.float64) @ np.abs(wd).T) + 1e-7
        assert np.all(np.abs(y - ref) <= bound)


@check("cpuid_detection")
def _cpuid_detection(entry, lib):
    flags = cpu_flags()
    bits = lib("cpu_feature_bits", restype=ctypes.c_int)
    expected = (
        (1 if {"avx2", "fma", "f16c"} <= flags else 0)
        | (2 if {"avx512f", "avx512dq", "avx512bw", "avx512vl"} <= flags else 0)
        | (4 if {"avx512f", "avx512dq", "avx512bw", "avx512vl", "avx512_bf16"} <= flags else 0)
        | (8 if {"amx_tile", "amx_bf16"} <= flags else 0)
    )
    assert bits == expected, (bits, expected)


@check("isa_knob")
def _isa_knob(entry, lib):
    import os

    msg = ctypes.create_string_buffer(512)
    saved = os.environ.pop("KERNEL_CPU_ISA", None)
    try:
        assert lib("select_tier_c", ctypes.c_int(2), msg, ctypes.c_int(512), restype=ctypes.c_int) == 2
        for value, tier in (("generic", 0), ("avx2", 1), ("avx512", 2)):
            os.environ["KERNEL_CPU_ISA"] = value
            assert lib("select_tier_c", ctypes.c_int(2), msg, ctypes.c_int(512), restype=ctypes.c_int) == tier
        os.environ["KERNEL_CPU_ISA"] = "avx512"
        assert lib("select_tier_c", ctypes.c_int(1), msg, ctypes.c_int(512), restype=ctypes.c_int) == -1
        assert b"does not support" in msg.value and b"avx2" in msg.value
        os.environ["KERNEL_CPU_ISA"] = "sse9"
        assert lib("select_tier_c", ctypes.c_int(2), msg, ctypes.c_int(512), restype=ctypes.c_int) == -1
        assert b"not one of generic, avx2, avx512" in msg.value
    finally:
        os.environ.pop("KERNEL_CPU_ISA", None)
        if saved is not None:
            os.environ["KERNEL_CPU_ISA"] = saved


@check("tier_tus")
def _tier_tus(entry, lib):
    x = np.arange(1000, dtype=np.float32)
    outs = []
    for tier in (0, 1, 2):
        y = np.empty_like(x)
        lib("scale_dispatch_c", ctypes.c_int(tier), x, y, 1000, 0.5)
        outs.append(y)
    assert all(np.array_equal(o, x * np.float32(0.5)) for o in outs)


@check("level_algorithm")
def _level_algorithm(entry, lib):
    rng = np.random.default_rng(24)
    m, n, k = 7, 9, 64
    a = as_bf16_bits(rng.standard_normal((m, k)).astype(np.float32)).reshape(m, k)
    bt = as_bf16_bits(rng.standard_normal((n, k)).astype(np.float32)).reshape(n, k)
    c = np.empty((m, n), np.float32)
    lib("gemm_bf16_dot_c", a, bt, c, m, n, k)
    fa, fb = bf16_bits_to_f32(a).astype(np.float64), bf16_bits_to_f32(bt).astype(np.float64)
    assert np.all(np.abs(c - fa @ fb.T) <= 1e-6 * (np.abs(fa) @ np.abs(fb).T) + 1e-6)


@check("level_vectorize")
def _level_vectorize(entry, lib):
    rng = np.random.default_rng(25)
    for rows, cols in ((8, 4096), (3, 1000), (2, 7)):
        x, w, ref = fp32_rms_norm_case(rng, rows, cols)
        for fn in ("rms_scalar_c", "rms_avx512_c"):
            y = np.empty_like(x)
            lib(fn, x, w, y, rows, cols, 1e-6)
            np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-6)


@check("level_fusion")
def _level_fusion(entry, lib):
    rng = np.random.default_rng(26)
    rows, d = 8, 256
    x = (rng.standard_normal((rows, 2 * d)) * 4).astype(np.float32)
    ref = (torch.nn.functional.silu(torch.from_numpy(x[:, :d])) * torch.from_numpy(x[:, d:])).numpy()
    y1, y2, tmp = np.empty((rows, d), np.float32), np.empty((rows, d), np.float32), np.empty((rows, d), np.float32)
    lib("silu_mul_fused_c", x, y1, rows, d)
    lib("silu_mul_unfused_c", x, tmp, y2, rows, d)
    np.testing.assert_allclose(y1, ref, rtol=1e-5, atol=1e-6)
    assert np.array_equal(y1, y2)


@check("level_threading")
def _level_threading(entry, lib):
    rng = np.random.default_rng(27)
    x = rng.standard_normal((64, 4096)).astype(np.float32)
    w = rng.standard_normal(4096).astype(np.float32)
    for threads in (1, 2):
        y = np.empty_like(x)
        lib("mul_rows_c", x, w, y, 64, 4096, threads)
        assert np.array_equal(y, x * w)


@check("level_memory")
def _level_memory(entry, lib):
    rng = np.random.default_rng(28)
    x, r = rng.standard_normal((2, 4096)).astype(np.float32)
    r0 = r.copy()
    out = np.empty(4096, np.float32)
    lib("add_residual_c", x, r, out, 4096)
    assert np.array_equal(out, x + r0) and np.array_equal(r, out)


@check("bf16_correct_rounding")
def _bf16_correct_rounding(entry, lib):
    from kernel_harness.snippets.measure import bf16_rms_norm_case

    rows, cols = 1024, 4096
    xb, wb, ref_bits = bf16_rms_norm_case(rows, cols)
    y = np.empty_like(xb)
    lib("rms_norm_bf16_exact_c", xb, wb, y, rows, cols, ctypes.c_double(1e-6))
    assert np.array_equal(y, ref_bits), f"{int((y != ref_bits).sum())} elements differ from the float64 reference"
    # the plain fp32 version (bf16-accumulate-fp32) misses some of them: that is why this entry exists
    plain = Lib(build_shared(BY_ID["bf16-accumulate-fp32"].code, BY_ID["bf16-accumulate-fp32"].test_harness,
                             BY_ID["bf16-accumulate-fp32"].flags, label="bf16-accumulate-fp32"))
    y2 = np.empty_like(xb)
    plain("rms_norm_bf16_c", xb, wb, y2, rows, cols, 1e-6)
    wrong = int((y2 != ref_bits).sum())
    print(f"bf16-correct-rounding: fp32-only path differs on {wrong} of {y2.size} elements; exact path on 0")
    assert wrong > 0


def _no_fault_at_page_end(lib, fn: str, a: float, b: float) -> None:
    """Run fn on a row that ends exactly where a PROT_NONE page begins."""
    page = mmap.PAGESIZE
    region = mmap.mmap(-1, 2 * page, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    base = ctypes.addressof(ctypes.c_char.from_buffer(region))
    libc = ctypes.CDLL(None)
    assert libc.mprotect(ctypes.c_void_p(base + page), ctypes.c_size_t(page), 0) == 0
    try:
        n = 1000
        start = base + page - 4 * n
        ctypes.memset(start, 0, 4 * n)
        lib(fn, ctypes.c_void_p(start), ctypes.c_void_p(start), n, a, b)
        assert all(v == np.float32(b) for v in (ctypes.c_float * n).from_address(start))
    finally:
        libc.mprotect(ctypes.c_void_p(base + page), ctypes.c_size_t(page), 3)
    region.close()


@check("masked_tail_avx2")
def _masked_tail_avx2(entry, lib):
    rng = np.random.default_rng(30)
    a, b = 1.5, -0.25
    for n in range(0, 41):
        x = rng.standard_normal(n + 16).astype(np.float32)
        y = np.full(n + 16, 777.0, np.float32)
        lib("axpb_avx2_c", x, y, n, a, b)
        assert np.array_equal(y[:n], (np.float64(a) * x[:n].astype(np.float64) + b).astype(np.float32))
        assert np.all(y[n:] == 777.0)
    _no_fault_at_page_end(lib, "axpb_avx2_c", a, b)


@check("ulp_exp_avx2")
def _ulp_exp_avx2(entry, lib):
    def sweep(fn, ref, lo, hi):
        x = np.concatenate([np.linspace(lo, hi, 4_000_000, dtype=np.float64).astype(np.float32),
                            np.linspace(-1e-3, 1e-3, 200_000, dtype=np.float64).astype(np.float32)])
        x = x[: x.size - x.size % 8]
        y = np.empty_like(x)
        lib(fn, x, y, x.size)
        r = ref(x.astype(np.float64))
        normal = np.abs(r) >= np.finfo(np.float32).tiny
        return float(ulp_error(y[normal], r[normal]).max())

    e = sweep("vexp_avx2", np.exp, -87.3, 88.7)
    s = sweep("vsigmoid_avx2", lambda v: 1.0 / (1.0 + np.exp(-v)), -87.0, 30.0)
    print(f"vectorized-exp-avx2 max ulp exp {e:.3f} sigmoid {s:.3f}")
    assert e <= entry.extra["max_ulp_error"] and s <= entry.extra["max_ulp_error"] + 1.5
    sp = np.float32([np.nan, np.inf, -np.inf, 0.0, 89.0, -104.0, -95.0, 88.5])
    ys = np.empty_like(sp)
    lib("vexp_avx2", sp, ys, 8)
    assert np.isnan(ys[0]) and ys[1] == np.inf and ys[2] == 0.0 and ys[3] == 1.0 and ys[4] == np.inf and ys[5] == 0.0
    assert ulp_error(ys[6:7], np.exp(np.float64([-95.0])))[0] <= 1.0  # denormal result, one rounding
    assert ulp_error(ys[7:8], np.exp(np.float64([88.5])))[0] <= 1.0


@check("online_softmax_merge")
def _online_softmax_merge(entry, lib):
    import torch

    rng = np.random.default_rng(0)
    for d in (1, 7, 64, 131):
        for s in (1, 5, 100, 2000):
            q = (rng.standard_normal(d) * 2).astype(np.float32)
            k = (rng.standard_normal((s, d)) * 2).astype(np.float32)
            v = (rng.standard_normal((s, d)) * 2).astype(np.float32)
            scale = d ** -0.5
            w = np.exp((k.astype(np.float64) @ q.astype(np.float64)) * scale - ((k.astype(np.float64) @ q) * scale).max())
            ref = (w / w.sum()) @ v.astype(np.float64)
            single = np.empty(d)
            lib("attend_split_c", q, k, v, d, s, 1, ctypes.c_double(scale), single)
            bound = float(np.abs(v).max())
            assert np.abs(single - ref).max() <= 1e-13 * bound, (d, s)
            for chunks in (2, 3, 7, 64):  # 64 > s for small s: empty ranges
                merged = np.empty(d)
                lib("attend_split_c", q, k, v, d, s, chunks, ctypes.c_double(scale), merged)
                assert np.abs(merged - single).max() <= 1e-14 * bound, (d, s, chunks)
                assert np.abs(merged - ref).max() <= 1e-13 * bound, (d, s, chunks)
                as_bf16 = lambda a: torch.from_numpy(a).to(torch.bfloat16).view(torch.int16)  # noqa: E731
                assert torch.equal(as_bf16(merged), as_bf16(single)), (d, s, chunks)


@check("out_api")
def _out_api(entry, lib):
    rng = np.random.default_rng(31)
    rows, cols = 6, 64
    x, w, ref = fp32_rms_norm_case(rng, rows, cols)
    msg = ctypes.create_string_buffer(1024)
    for mode in (0, 1):
        out = np.zeros((rows, cols), np.float32)
        assert lib("out_api_c", x, w, out, rows, cols, ctypes.c_int(mode), msg, ctypes.c_int(1024), restype=ctypes.c_int) == 1
        np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6)
    out = np.zeros((rows, cols), np.float32)
    assert lib("out_api_c", x, w, out, rows, cols, ctypes.c_int(2), msg, ctypes.c_int(1024), restype=ctypes.c_int) == -1
    assert b"out must be a contiguous tensor with the shape and dtype of x" in msg.value
    assert not out.any(), "a rejected out tensor must not be written"


# --------------------------------------------------------------------------- tests


def test_schema_is_valid():
    assert references.validate_schema() == []


def test_schema_validator_rejects_bad_entries(tmp_path):
    for name in references.ENTRY_FILES:
        (tmp_path / name).write_text((REFERENCES_DIR / name).read_text())
    for name in references.MARKDOWN_FILES:
        (tmp_path / name).write_text("x")
    assert references.validate_schema(tmp_path) == []
    (tmp_path / "memory_patterns.yaml").write_text(
        "entries:\n- id: Bad_Id\n  why: too short\n  flags: [O2]\n  pitfalls: []\n"
        "  expected_effect: {summary: s, measurement: {op: x}}\n"
    )
    problems = " ".join(references.validate_schema(tmp_path))
    for expected in ("missing field 'code'", "missing field 'when_to_use'", "lower-case", "flags must",
                     "pitfalls must", "measurement.machine", "why must"):
        assert expected in problems


def test_promised_ids_exist_in_their_files():
    for file_name, ids in PROMISED_IDS.items():
        for entry_id in ids:
            assert entry_id in BY_ID, f"{entry_id} missing"
            assert BY_ID[entry_id].file == file_name, f"{entry_id} is in {BY_ID[entry_id].file}, expected {file_name}"
    assert references.reference_ids() >= {i for ids in PROMISED_IDS.values() for i in ids}


# The machines numbers were measured on (their /proc/cpuinfo model name plus CPUID family/model);
# README.md describes each. Re-measuring on another machine means naming it here and there.
MEASURED_ON = ("Intel(R) Xeon(R) Processor (family 6 model 207", "(Ice Lake server, family 6 model 106",
               "AMD EPYC (family 26 model 2")


def test_every_measurement_is_filled_in_and_names_the_machine():
    readme = (REFERENCES_DIR / "README.md").read_text()
    assert "Intel(R) Xeon(R) Processor" in readme and "model 207" in readme and "model 106" in readme
    for entry in ENTRIES:
        text = repr(entry.expected_effect) + repr(entry.extra.get("speedup_range"))
        assert "MEASURED_" not in text, f"{entry.id}: placeholder left in expected_effect"
        if entry.expected_effect["measurement"].get("exact") is True:
            continue  # exact IEEE arithmetic (a count of differing bits): the same on every CPU with the ISA
        machine = entry.expected_effect["measurement"]["machine"]
        assert any(m in machine for m in MEASURED_ON), f"{entry.id}: machine must name one of {MEASURED_ON!r}"
    if _cpu_model() != "Intel(R) Xeon(R) Processor":
        print("note: running on a different CPU model than the one the numbers were measured on")


def test_every_harness_has_a_registered_check():
    for entry in RUNNABLE:
        assert entry.check in CHECKS, f"{entry.id}: check {entry.check!r} is not implemented in this file"
    ulp_entries = [e for e in ENTRIES if "max_ulp_error" in e.extra]
    assert {e.id for e in ulp_entries} >= {"vectorized-exp", "vectorized-tanh", "vectorized-erf", "vectorized-sigmoid"}


@pytest.mark.slow
@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: e.id)
def test_snippet_compiles_with_its_flags(entry):
    compile_object(entry.code, entry.flags, torch_headers=entry.needs_torch_headers, label=entry.id)


@pytest.mark.slow
@pytest.mark.parametrize("entry", RUNNABLE, ids=lambda e: e.id)
def test_snippet_runs_correctly_on_this_cpu(entry):
    lib = load_lib(entry)
    CHECKS[entry.check](entry, lib)


def test_cross_references_point_at_existing_entries():
    sources = [p for d in ("kernel_harness", "scripts") for p in (PROJECT_ROOT / d).rglob("*.py")]
    sources += list(REFERENCES_DIR.glob("*.md")) + list(REFERENCES_DIR.glob("*.yaml"))
    sources += [p for p in (PROJECT_ROOT / "templates").rglob("*") if p.is_file()] if (PROJECT_ROOT / "templates").is_dir() else []
    docs = [p for p in [PROJECT_ROOT / "SKILL.md", PROJECT_ROOT / "README.md", *(PROJECT_ROOT / "docs").glob("*.md")] if p.is_file()]
    sources += docs
    # every references/<file> named in the project's documents exists
    for doc in docs + list(REFERENCES_DIR.glob("*.md")):
        for name in re.findall(r"references/([A-Za-z0-9_.-]+\.(?:yaml|md))", doc.read_text()):
            assert (REFERENCES_DIR / name).is_file(), f"{doc.name} names references/{name}, which does not exist"
    found = references.find_cross_references(sources)
    known = references.reference_ids()
    dangling = {i: files for i, files in found.items() if i not in known}
    assert not dangling, f"references to unknown ids: {dangling}"
    # the markdown documents actually use the convention
    md_refs = references.find_cross_references(list(REFERENCES_DIR.glob("*.md")))
    assert len(md_refs) >= 20
    # the analyser and profiler name their references in lists; the scan must see them
    code_refs = references.find_cross_references([p for p in sources if p.suffix == ".py"])
    if (PROJECT_ROOT / "kernel_harness" / "analysis" / "strategy.py").is_file():
        assert len(code_refs) >= 10


def test_readme_indexes_every_entry():
    indexed = set(references.find_cross_references([REFERENCES_DIR / "README.md"]))
    assert references.reference_ids() <= indexed, sorted(references.reference_ids() - indexed)


def test_cross_reference_scanner_finds_dangling_ids(tmp_path):
    src = tmp_path / "mod.py"
    src.write_text(
        'from kernel_harness.references import ref\nHINT = ref("no-such-entry")\nOK = ref("masked-tail")\n'
        'refs = ["level-fusion"]\nrefs += ["typo-in-list"]\nrefs.append("appended-typo")\n'
        'd = {"references": ["dict-typo"], "other": ["not-a-ref"]}\nunrelated = ["not-a-ref-either"]\n'
    )
    doc = tmp_path / "doc.md"
    doc.write_text("see [ref:also-missing] and [ref:horizontal-sum]")
    found = references.find_cross_references([src, doc])
    assert set(found) == {"no-such-entry", "masked-tail", "also-missing", "horizontal-sum", "level-fusion",
                          "typo-in-list", "appended-typo", "dict-typo"}
    assert set(found) - references.reference_ids() == {"no-such-entry", "also-missing", "typo-in-list",
                                                       "appended-typo", "dict-typo"}


def test_ref_helper():
    assert references.ref("masked-tail") == "references/simd_optimization_patterns.yaml#masked-tail"
    from kernel_harness.errors import UsageError

    with pytest.raises(UsageError, match="Unknown reference id"):
        references.ref("does-not-exist")


def _cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def test_optimization_levels_are_ordered_by_measured_gain():
    levels = [e for e in ENTRIES if e.file == "optimization_levels.yaml"]
    ranks = [e.extra.get("rank") for e in levels]
    assert ranks == list(range(1, len(levels) + 1)), "entries must appear in rank order 1..N"
    means = [math.sqrt(e.extra["speedup_range"][0] * e.extra["speedup_range"][1]) for e in levels]
    assert means == sorted(means, reverse=True), f"rank order must follow the geometric mean of speedup_range: {means}"
    for e in levels:
        assert "Intel(R) Xeon(R) Processor" in e.expected_effect["measurement"]["machine"]
        for see in e.extra.get("see_also", []):
            assert see in BY_ID, f"{e.id}: see_also {see} does not exist"


def test_analyser_reference_ids_exist():
    try:
        from kernel_harness.analysis.strategy import KNOWN_REFERENCE_IDS
    except ImportError:
        pytest.skip("kernel_harness.analysis.strategy is not available")
    assert set(KNOWN_REFERENCE_IDS) <= references.reference_ids()


# --------------------------------------------------------------------------- huggingface-kernels-integration.md

HF_DOC = REFERENCES_DIR / "huggingface-kernels-integration.md"


def test_kernels_api_signatures_match_the_document():
    import kernels
    from packaging.version import Version

    text = HF_DOC.read_text()
    intro = text.split("\n\n")[1]
    assert kernels.__version__ in intro, f"the document's opening must name the installed kernels {kernels.__version__} as tested"
    documented = {
        kernels.get_kernel: ["repo_id", "revision", "version", "backend", "user_agent", "trust_remote_code", "check_arch"],
        kernels.get_local_kernel: ["repo_path", "backend", "trust_remote_code", "user_agent"],
        kernels.kernelize: ["model", "mode", "device", "use_fallback"],
        kernels.LayerRepository.__init__: ["self", "repo_id", "layer_name", "revision", "version", "trust_remote_code", "user_agent"],
        kernels.LocalLayerRepository.__init__: ["self", "repo_path", "layer_name"],
        kernels.use_kernel_mapping: ["mapping", "inherit_mapping"],
        kernels.has_kernel: ["repo_id", "revision", "version", "backend", "trust_remote_code", "check_arch"],
    }
    if Version(kernels.__version__) >= Version("0.19"):
        # 0.19 gave every loader the CUDA/ROCm architecture check (a no-op for CPU builds)
        for fn in (kernels.get_local_kernel, kernels.LayerRepository.__init__, kernels.LocalLayerRepository.__init__):
            documented[fn] = [*documented[fn], "check_arch"]
    for fn, names in documented.items():
        actual = list(inspect.signature(fn).parameters)
        assert sorted(actual) == sorted(names), f"{fn.__qualname__}: installed {actual}, documented {names}"
        for name in names:
            if name != "self":
                assert name in text
    assert {m.name for m in kernels.Mode} >= {"INFERENCE", "TRAINING", "TORCH_COMPILE", "FALLBACK"}
    assert "LOCAL_KERNELS" in text and "v<N>" in text or "`vN`" in text


def _catalogue_dir(request) -> Path:
    try:
        return Path(request.getfixturevalue("catalogue_kernel_dir"))
    except pytest.FixtureLookupError:
        pytest.skip("the catalogue_kernel_dir fixture (tests/fixtures_kernels.py) is not available")


def check_kernels_api_on(kdir: Path, tmp_path: Path, monkeypatch) -> None:
    """What huggingface-kernels-integration.md promises, on a built kernel directory."""
    import json

    import kernels
    import torch.nn as nn
    import torch.nn.functional as F

    variants = sorted((kdir / "build").glob("torch*-cxx11-cpu-*-linux"))
    assert variants, f"no build variant under {kdir / 'build'}"
    variant = variants[0]
    meta = json.loads((variant / "metadata.json").read_text())
    assert {"name", "id", "version", "license", "python-depends", "backend"} <= set(meta)
    assert (variant / "_ops.py").is_file() and list(variant.glob("*.so"))

    x = torch.randn(5, 4096 + 13)
    w = torch.randn(4096 + 13)
    ref = F.rms_norm(x, (x.shape[-1],), w, 1e-6)

    mod = kernels.get_local_kernel(kdir)
    torch.testing.assert_close(mod.rms_norm(x, w, 1e-6), ref, rtol=1e-5, atol=1e-6)

    # LOCAL_KERNELS: a Hub id served from the local directory, no Hub access
    repo_id = "refs-test/catalogue"
    monkeypatch.setenv("LOCAL_KERNELS", f"{repo_id}={kdir}")
    mod2 = kernels.get_kernel(repo_id, version=1)
    torch.testing.assert_close(mod2.rms_norm(x, w, 1e-6), ref, rtol=1e-5, atol=1e-6)
    assert kernels.has_kernel(repo_id, version=1)

    # kernelize with the generated `layers` module, from a local layer repository and from
    # a Hub id served by LOCAL_KERNELS
    @kernels.use_kernel_forward_from_hub("RMSNorm")
    class RMSNorm(nn.Module):
        def __init__(self, hidden: int, eps: float = 1e-6):
            super().__init__()
            self.weight = nn.Parameter(w.clone())
            self.variance_epsilon = eps

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return F.rms_norm(x, (x.shape[-1],), self.weight, self.variance_epsilon)

    @kernels.use_kernel_forward_from_hub("SiluAndMul")
    class SiluAndMul(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            d = x.shape[-1] // 2
            return F.silu(x[..., :d]) * x[..., d:]

    gate = torch.randn(4, 2 * x.shape[-1])
    for repo_of in (lambda layer: kernels.LayerRepository(repo_id, layer_name=layer, revision="v1"),
                    lambda layer: kernels.LocalLayerRepository(kdir, layer_name=layer)):
        model = nn.Sequential(RMSNorm(x.shape[-1]), SiluAndMul())
        mapping = {name: {"cpu": repo_of(name)} for name in ("RMSNorm", "SiluAndMul")}
        with kernels.use_kernel_mapping(mapping, inherit_mapping=False):
            model = kernels.kernelize(model, mode=kernels.Mode.INFERENCE, device="cpu")
        for layer, original in ((model[0], RMSNorm), (model[1], SiluAndMul)):
            assert layer.forward.__func__ is not original.forward, "kernelize did not replace forward"
            assert layer.forward.__func__.__module__.endswith(".layers")
        with torch.no_grad():
            torch.testing.assert_close(model[0](x), ref, rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(model[1](gate), SiluAndMul.forward(None, gate), rtol=1e-5, atol=1e-6)

    # LayerNorm: nn.LayerNorm's own attributes; configurations the op lacks fall back to torch
    for ln in (nn.LayerNorm(x.shape[-1]), nn.LayerNorm(x.shape[-1], elementwise_affine=False)):
        with torch.no_grad():
            torch.testing.assert_close(mod.layers.LayerNorm.forward(ln, x), ln(x), rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_kernels_api_on_a_locally_built_kernel(request, tmp_path, monkeypatch):
    check_kernels_api_on(_catalogue_dir(request), tmp_path, monkeypatch)


def test_measure_script_keys_cover_every_benchmark():
    from kernel_harness.snippets import measure

    source = Path(measure.__file__).read_text()
    assert tuple(re.findall(r'want\("([a-z0-9_]+)"\)', source)) == measure.KEYS
    help_text = subprocess.run([sys.executable, str(PROJECT_ROOT / "scripts" / "measure_references.py"), "--help"],
                               capture_output=True, text=True, check=True).stdout
    for key in measure.KEYS:
        assert key in help_text
