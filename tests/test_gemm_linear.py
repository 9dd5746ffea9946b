"""The ``linear`` catalogue op (issue 21, op 1), generated and built for real.

The op is built in the package the GEMM/attention tests share (``harness_gemm``
of ``fixtures_kernels.py``: linear, linear_int8 and decode_attention, one build
per content, cached across sessions); it stays out of the big catalogue build,
whose AVX512 unit would otherwise change flags (the gemm kind adds AMX) for every op.

Tiers are forced with ``KERNEL_CPU_ISA``; a tier this CPU lacks is skipped
with the reason. Correctness is checked two ways:
* exact: inputs whose products and partial sums are exact in fp32 (small
  integers times powers of two), so every summation order gives the exact
  sum and the output must equal the float64 reference rounded once, bit for
  bit (catches any indexing, tail, bias, packing or rounding mistake);
* bounded: continuous random data against float64, within the rounding of
  the dtype plus a forward error bound of an fp32 sum of K products.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import kernels
import pytest
import torch
import torch.nn.functional as F

from fixtures_kernels import GEMM_PACKAGE, assert_prefetch_hint_moved, compile_tier_unit, dtype_code, fresh_copy
from kernel_harness.cpu import (cpu_flags, cpu_model, cpu_vendor, has_isa, row_segments_by_default,
                                row_streams_by_default, skip_reason)
from kernel_harness.machine import ASSUMED_LLC_BYTES, last_level_cache_bytes
from kernel_harness.paths import SCRIPTS_DIR
from kernel_harness.scaffold import ScaffoldOptions, plan_project, write_project

PACKAGE = GEMM_PACKAGE
TIERS = ("generic", "avx2", "avx512")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
# (M, N, K): tails in every dimension (not multiples of 6, 8, 12, 16 or 32),
# decode sizes, M just above the micro-kernel's MR, N narrower than one panel.
# On a CPU with AMX, bf16 from M = 5 takes the AMX path: M = 7 to 100 its fused
# path, (300, 70, 77) its K-blocked one with the rows split between threads.
# M = 4 to 6 on a packed fp32 weight take the AVX2 unit's two-pass wide tile, whose
# chunks of 128 k-steps end inside K = 300 and 129, and whose last panel is narrower at N = 45.
SHAPES = ((1, 1, 1), (1, 37, 7), (2, 33, 4096 + 13), (4, 64, 256), (5, 45, 300), (6, 40, 129), (7, 97, 129),
          (9, 31, 17), (13, 65, 100), (33, 130, 47), (100, 96, 300), (300, 70, 77))


def _options(directory: Path) -> ScaffoldOptions:
    return ScaffoldOptions(ops=("linear",), name=PACKAGE, directory=directory, force=True)


@pytest.fixture(scope="session")
def linear_kernel_dir(gemm_kernel_dir: Path) -> Path:
    """The shared GEMM/attention package (fixtures_kernels.py), which holds linear and prepack."""
    return gemm_kernel_dir


@pytest.fixture(scope="module")
def kernel(linear_kernel_dir: Path):
    import kernels

    return kernels.get_local_kernel(linear_kernel_dir)


def _exact(gen: torch.Generator, *shape: int, scale: float) -> torch.Tensor:
    return torch.randint(-8, 9, shape, generator=gen).to(torch.float32) * scale


def _case(m: int, n: int, k: int, dtype: torch.dtype, seed: int):
    gen = torch.Generator().manual_seed(seed)
    x = _exact(gen, m, k, scale=1 / 8).to(dtype)
    w = _exact(gen, n, k, scale=1 / 64).to(dtype)
    b = _exact(gen, n, scale=1 / 8).to(dtype)
    return x, w, b


def _reference(x, w, b):
    return F.linear(x.double(), w.double(), None if b is None else b.double()).to(x.dtype)


# ---------------------------------------------------------------- generation


def test_linear_is_generated_complete_and_validates(tmp_path: Path):
    plan = plan_project(_options(tmp_path / "k"))
    assert plan.unfinished_ops == []
    assert not [rel for rel, text in plan.files.items() if "KERNEL_TODO(\"linear\"" in text]
    write_project(plan, force=True)
    proc = subprocess.run([sys.executable, str(SCRIPTS_DIR / "validate_cpu_kernel.py"), str(tmp_path / "k")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr


# ---------------------------------------------------------------- correctness


@pytest.mark.parametrize("tier", TIERS)
@pytest.mark.parametrize("dtype_name", tuple(DTYPES))
def test_linear_is_exact_on_exact_inputs(kernel, force_tier, tier, dtype_name):
    """Every shape, plain and packed weight, with and without bias: bit-equal to float64 rounded once."""
    force_tier(tier)
    dtype = DTYPES[dtype_name]
    for i, (m, n, k) in enumerate(SHAPES):
        x, w, b = _case(m, n, k, dtype, seed=i)
        packed = kernel.prepack(w)
        for bias in (None, b):
            ref = _reference(x, w, bias)
            for weight, what in ((w, "plain"), (packed, "packed")):
                out = kernel.linear(x, weight, bias)
                where = f"{tier} {dtype_name} M={m} N={n} K={k} {what} bias={bias is not None}"
                assert out.dtype == dtype and out.shape == (m, n), where
                assert torch.equal(out, ref), f"{where}: max |diff| {(out.double() - ref.double()).abs().max()}"


@pytest.mark.parametrize("tier", TIERS)
@pytest.mark.parametrize("m", (1, 4, 16, 70))
def test_linear_random_data_is_within_the_fp32_sum_bound(kernel, force_tier, tier, m):
    """Continuous data: |y - y64| <= half an ulp of the dtype + K * 2^-23 * sum |x w| (an fp32 sum of K terms)."""
    force_tier(tier)
    n, k = 77, 1000
    gen = torch.Generator().manual_seed(m)
    for dtype in DTYPES.values():
        x = torch.randn(m, k, generator=gen).to(dtype)
        w = torch.randn(n, k, generator=gen).to(dtype)
        b = torch.randn(n, generator=gen).to(dtype)
        exact = F.linear(x.double(), w.double(), b.double())
        bound = k * 2.0**-23 * (F.linear(x.double().abs(), w.double().abs(), b.double().abs()))
        half_ulp = torch.finfo(dtype).eps / 2
        for weight in (w, kernel.prepack(w)):
            err = (kernel.linear(x, weight, b).double() - exact).abs()
            assert bool((err <= half_ulp * exact.abs() * (1 + 1e-3) + bound * (1 + half_ulp * 2)).all()), (
                f"{tier} {dtype} M={m}: worst error {err.max()}")


@pytest.mark.parametrize("tier", TIERS)
def test_leading_dims_out_and_fp16(kernel, force_tier, tier):
    """x [..., K] keeps its leading dims; out= is written in place; fp16 works like bf16."""
    force_tier(tier)
    x, w, b = _case(2 * 5, 40, 33, torch.float16, seed=7)
    x3 = x.view(2, 5, 33)
    ref = _reference(x, w, b).view(2, 5, 40)
    assert torch.equal(kernel.linear(x3, w, b), ref)
    out = torch.empty(2, 5, 40, dtype=torch.float16)
    assert kernel.linear(x3, kernel.prepack(w), b, out=out) is out
    assert torch.equal(out, ref)


@pytest.mark.parametrize("tier", TIERS)
def test_out_sharing_memory_with_an_input_gives_the_out_of_place_result(kernel, force_tier, tier):
    """linear, linear_int8 and decode_attention with out= over an input (x with N = K, q): the
    bridges run on copies of the inputs (aliased()), so the result is the out-of-place call's.
    Without that a GEMM's later column blocks would read rows of x it had already overwritten."""
    force_tier(tier)
    for dtype in (torch.float32, torch.bfloat16):
        x, w, b = _case(40, 96, 96, dtype, seed=3)
        for weight in (w, kernel.prepack(w)):
            target = x.clone()
            kernel.linear(target, weight, b, out=target)
            assert torch.equal(target, kernel.linear(x, weight, b)), f"linear {dtype}"
        q8 = torch.randint(-127, 128, (96, 96), dtype=torch.int8)
        scales = torch.rand(96) * 1e-2
        target = x.clone()
        kernel.linear_int8(target, q8, scales, b, out=target)
        assert torch.equal(target, kernel.linear_int8(x, q8, scales, b)), f"linear_int8 {dtype}"
        gen = torch.Generator().manual_seed(4)
        q = torch.randn(2, 4, 64, generator=gen).to(dtype)
        k_cache, v_cache = (torch.randn(2, 4, 300, 64, generator=gen).to(dtype) for _ in range(2))
        target = q.clone()
        kernel.decode_attention(target, k_cache, v_cache, 0.125, out=target)
        assert torch.equal(target, kernel.decode_attention(q, k_cache, v_cache, 0.125)), f"decode {dtype}"


@pytest.mark.parametrize("tier", ("avx2", "avx512"))
def test_plain_weight_takes_the_tiled_path_from_32_rows(kernel, force_tier, tier):
    """fp32 on continuous data: from M = 32 (LINEAR_TILE_MIN_ROWS) a plain weight's panels are
    copied into the packed layout and run the packed weight's tiles, so the two layouts give the
    same bits; at M = 31 the plain weight runs the dot path, whose lane partial sums add in another
    order, so some bits differ (that is how the test sees which path ran). All within the bound."""
    force_tier(tier)
    gen = torch.Generator().manual_seed(5)
    n, k = 70, 1000
    w = torch.randn(n, k, generator=gen)
    packed = kernel.prepack(w)
    for m, tiled in ((31, False), (32, True), (45, True)):
        x = torch.randn(m, k, generator=gen)
        plain, from_packed = kernel.linear(x, w), kernel.linear(x, packed)
        assert torch.equal(plain, from_packed) == tiled, f"{tier} M={m}: the plain weight ran the wrong path"
        exact = F.linear(x.double(), w.double())
        bound = k * 2.0**-23 * F.linear(x.double().abs(), w.double().abs())
        assert bool(((plain.double() - exact).abs() <= bound).all()), f"{tier} M={m}"


def test_empty_dimensions_follow_f_linear(kernel):
    """K = 0: the bias alone (or zeros); M = 0 or N = 0: an empty result."""
    w = torch.empty(5, 0)
    b = torch.arange(5.0)
    assert torch.equal(kernel.linear(torch.empty(3, 0), w, b), F.linear(torch.empty(3, 0), w, b))
    assert torch.equal(kernel.linear(torch.empty(3, 0), w), torch.zeros(3, 5))
    assert kernel.linear(torch.empty(0, 4), torch.ones(5, 4)).shape == (0, 5)
    assert kernel.linear(torch.ones(2, 4), torch.empty(0, 4)).shape == (2, 0)


# ---------------------------------------------------------------- prepack


def test_prepack_layout_is_the_documented_panels(kernel):
    """[1, N, K]; its memory: panels of 32 columns (the last narrower), each K rows of its columns."""
    w = torch.arange(70 * 9, dtype=torch.float32).view(70, 9)
    packed = kernel.prepack(w)
    assert packed.shape == (1, 70, 9) and packed.is_contiguous()
    expected = torch.cat([w[j:j + 32].t().reshape(-1) for j in range(0, 70, 32)])
    assert torch.equal(packed.reshape(-1), expected)
    assert packed.dtype == w.dtype


# ---------------------------------------------------------------- the packed decode paths' knobs


def _packed(w: torch.Tensor) -> torch.Tensor:
    """prepack's layout (test_prepack_layout_is_the_documented_panels), built in Python."""
    return torch.cat([w[j:j + 32].t().reshape(-1) for j in range(0, w.shape[0], 32)])


def _linear_unit(tmp_path: Path, tier: str, knobs: dict[str, str], edits: dict[str, str] | None = None):
    """The ``tier`` unit of a linear-only package with ``knobs`` set (and each text of ``edits``,
    found exactly once, replaced), compiled and loaded with ctypes (compile_tier_unit: skipped
    where this CPU cannot run the tier)."""
    plan = plan_project(_options(tmp_path))
    ns = f"{PACKAGE}_cpu"
    wrapper = "".join(
        f'extern "C" void {name}(int dt, void* o, const void* x, const void* w, const void* b, int64_t m, '
        f"int64_t n, int64_t k) {{\n  {ns}::{tier}::linear(static_cast<{ns}::DType>(dt), o, x, w, b, {packed}, m, n, k);\n}}\n"
        for name, packed in (("run", "true"), ("run_plain", "false")))
    return compile_tier_unit(plan, PACKAGE, tier, wrapper, tmp_path, knobs, edits)


@pytest.fixture(scope="module")
def default_unit(tmp_path_factory):
    """tier -> that tier's unit with the template's knobs, compiled once per module (on first use)."""
    units = {}

    def get(tier: str):
        if tier not in units:
            units[tier] = _linear_unit(tmp_path_factory.mktemp(f"{tier}-default"), tier, {})
        return units[tier]

    return get


def _run_packed(lib, x, w, b, packed: bool = True):
    """The unit's linear on x and w (packed into prepack's layout first, or plain with packed False)."""
    out = torch.empty(x.shape[0], w.shape[0], dtype=x.dtype)
    wp = _packed(w).contiguous() if packed else w
    ptr = lambda t: ctypes.c_void_p(None if t is None else t.data_ptr())  # noqa: E731
    dt = dtype_code(x.dtype)
    run = lib.run if packed else lib.run_plain
    run(dt, ptr(out), ptr(x), ptr(wp), ptr(b), *[ctypes.c_int64(v) for v in (x.shape[0], w.shape[0], x.shape[1])])
    return out


@pytest.mark.slow
@pytest.mark.parametrize("tier, knob, dtype", [("avx2", "LINEAR_PACKED_GEMV_ROWS", torch.bfloat16),
                                               ("avx512", "LINEAR_PACKED_DP_ROWS", torch.bfloat16),
                                               ("avx512", "LINEAR_PACKED_FP32_ROWS", torch.float32)])
def test_packed_decode_knob_off_restores_the_tiles(tmp_path: Path, default_unit, tier: str, knob: str,
                                                  dtype: torch.dtype):
    """A packed weight at decode sizes streams its panels (bf16: lin_packed_gemv in the AVX2 unit,
    lin_packed_gemv_dp in the AVX512 unit on a CPU with AVX512-BF16; fp32: lin_packed_gemv in the
    AVX512 unit); the knob at 0 sends it to the tiles (lin_tiled, or lin_tiled_groups from
    LINEAR_TILE_PACKED_MIN_ROWS rows). Both exact on exact inputs (full panels, a
    narrower last one, odd K, up to 8 rows), both within the fp32-sum bound on continuous data, and
    at M = 1 their bits differ there (other sums: the knob does what it says)."""
    if knob == "LINEAR_PACKED_DP_ROWS" and "avx512_bf16" not in cpu_flags():
        pytest.skip("this CPU lacks avx512_bf16: lin_packed_gemv_dp cannot run (lin_tiled runs either way)")
    on = default_unit(tier)
    off = _linear_unit(tmp_path / "off", tier, {knob: "0"})
    for i, (m, n, k) in enumerate(((1, 70, 129), (2, 64, 4096 + 13), (3, 33, 7), (8, 96, 300))):
        x, w, b = _case(m, n, k, dtype, seed=i)
        for lib, what in ((on, "on"), (off, "off")):
            got = _run_packed(lib, x, w, b)
            assert torch.equal(got, _reference(x, w, b)), f"{tier} {knob} {what} M={m} N={n} K={k}"
    gen = torch.Generator().manual_seed(3)
    # ~1 bf16 output in 1000 moves with the order of a K = 4096 sum, fp32 ones far more: 4096 of them
    x, w, b = (torch.randn(*shape, generator=gen).to(dtype) for shape in ((1, 4096), (4096, 4096), (4096,)))
    got_on, got_off = _run_packed(on, x, w, b), _run_packed(off, x, w, b)
    for got, what in ((got_on, "on"), (got_off, "off")):
        assert_within_fp32_sum_bound(x, w, b, got, f"{tier} {knob} {what}")
    assert not torch.equal(got_on, got_off), f"{tier}: {knob} 0 gave the same bits: the knob did nothing"


@pytest.mark.slow
def test_packed_dp_streams_split_k_up_to_four_rows_of_a_weight_the_cache_cannot_hold(tmp_path: Path,
                                                                                     default_unit):
    """LINEAR_PACKED_DP_STREAMS reads each panel's k as segments in lockstep in lin_packed_gemv_dp, up
    to 4 rows of x, on weights of LINEAR_PACKED_DP_STREAMS_MIN_KIB or more (0: the last-level cache's
    size). With every weight in segments (1 KiB) against the knob at 1 (k in order): both exact on
    exact inputs at every tail of the segments (k below one pair per segment, odd, not a multiple of
    their pairs), both within the fp32-sum bound on continuous data; there the bits differ at M = 1-4
    (the knob acts) and are the same at M = 5-8 (k in order). The template's own unit keeps k in
    order on a weight the cache holds."""
    if "avx512_bf16" not in cpu_flags():
        pytest.skip("this CPU lacks avx512_bf16: lin_packed_gemv_dp cannot run")
    streams = _linear_unit(tmp_path / "streams", "avx512", {"LINEAR_PACKED_DP_STREAMS_MIN_KIB": "1"})
    in_order = _linear_unit(tmp_path / "in-order", "avx512", {"LINEAR_PACKED_DP_STREAMS": "1"})
    for i, (m, n, k) in enumerate(((1, 40, 7), (2, 33, 16), (3, 64, 17), (4, 70, 130), (4, 32, 4096 + 13),
                                   (6, 40, 99))):
        x, w, b = _case(m, n, k, torch.bfloat16, seed=10 + i)
        for lib, what in ((streams, "streams"), (in_order, "in order")):
            assert torch.equal(_run_packed(lib, x, w, b), _reference(x, w, b)), f"{what} M={m} N={n} K={k}"
    gen = torch.Generator().manual_seed(5)
    w, b = (torch.randn(*shape, generator=gen).bfloat16() for shape in ((4096, 4096), (4096,)))
    # half the last-level cache (the C++ side's rule: kernel_harness.machine's), up to the whole w:
    # enough outputs that an order of k other than the in-order unit's would show in their bits
    llc = last_level_cache_bytes() or ASSUMED_LLC_BYTES
    rows = max(32, min(4096, llc // (2 * 4096 * 2)) // 32 * 32)
    cached_w, cached_b = w[:rows].contiguous(), b[:rows].contiguous()
    for m in range(1, 9):
        x = torch.randn(m, 4096, generator=gen).bfloat16()
        got, ref = _run_packed(streams, x, w, b), _run_packed(in_order, x, w, b)
        assert_within_fp32_sum_bound(x, w, b, got, f"streams M={m}")
        assert torch.equal(got, ref) == (m > 4), f"M={m}: the knob must act at exactly M = 1-4"
        cached = _run_packed(default_unit("avx512"), x, cached_w, cached_b)
        assert torch.equal(cached, _run_packed(in_order, x, cached_w, cached_b)), f"M={m}: a cached weight in order"


@pytest.mark.slow
def test_avx2_packed_weight_at_4_to_6_rows_takes_the_two_pass_paths(tmp_path: Path):
    """The AVX2 unit's two-pass paths for a packed weight really run where they should: lin_tile_wide
    (fp32, M = 4 to LINEAR_WIDE_MAX_ROWS: two halves of the rows) and lin_packed_gemv_wide16 (16-bit,
    M = 4 to LINEAR_PACKED_WIDE16_ROWS: two rows widening the chunk into a scratch, then the rest
    over it). Both sum each output in k order as the groups do, so the bits cannot tell; a unit
    whose later passes read the wrong rows of x must go wrong in exactly those rows, while M = 3
    (the 3 x 32 tile / lin_packed_gemv), fp32 M = 7 and bf16 M = 6 (lin_tiled_groups) stay exact.
    test_linear_is_exact_on_exact_inputs checks the intact paths' results, tails included."""
    # not knobs: mutations of the unit's source, so the test fails if a path is never taken
    mutant = _linear_unit(tmp_path, "avx2", {}, edits={
        "lin_wide_part<R1, NV, kFull>(c1, ar + R0, b, ldb, len, k0, k1, next);":
            "lin_wide_part<R1, NV, kFull>(c1, ar, b, ldb, len, k0, k1, next);",
        "lin_wide_part<R1, 4, true>(c1, ar + 2, static_cast<const float*>(scratch),":
            "lin_wide_part<R1, 4, true>(c1, ar, static_cast<const float*>(scratch),",
    })
    cases = ((4, torch.float32, 2), (6, torch.float32, 3), (4, torch.bfloat16, 2), (5, torch.bfloat16, 2),
             (3, torch.float32, None), (7, torch.float32, None), (3, torch.bfloat16, None), (6, torch.bfloat16, None))
    for m, dtype, right_rows in cases:
        x, w, b = _case(m, 64, 300, dtype, seed=m)
        got, ref = _run_packed(mutant, x, w, b), _reference(x, w, b)
        if right_rows is None:
            assert torch.equal(got, ref), f"M={m} {dtype}: took a two-pass path, which it should not"
        else:
            assert torch.equal(got[:right_rows], ref[:right_rows]), f"M={m} {dtype}: the first pass changed"
            assert not torch.equal(got[right_rows:], ref[right_rows:]), f"M={m} {dtype}: the two-pass path did not run"


@pytest.mark.slow
def test_avx512_bf16_dot_path_streams_up_to_the_dp_rows_one_weight_row_at_a_time(tmp_path: Path, monkeypatch):
    """On a CPU with AVX512-BF16 the avx512 unit's dot path takes bf16 with the plain weight one
    weight row at a time (lin_gemv_seq) up to LINEAR_GEMV_SEQ_ROWS_DP rows of x, and in blocks of
    LINEAR_GEMV_ROWS rows from there on, where row_stream_reads() holds (Zen 5 on, or
    KERNEL_CPU_FORCE=rowstream). Both sum in k order, so the bits cannot tell: a unit whose
    row-at-a-time VDPBF16PS loop reads x's first row for every row must go wrong from M = 2 to 4
    (x's first row stays right) and stay exact at M = 5; with the knob at 2 it stays exact at
    M = 3 and 4 too. Without the force the CPU decides, and KERNEL_CPU_MASK=rowstream keeps the
    blocks everywhere."""
    if not has_isa("avx512") or "avx512_bf16" not in cpu_flags():
        pytest.skip("this CPU lacks avx512_bf16: the avx512 unit's dot path takes no VDPBF16PS here")
    mutation = {"const __m512i xv = _mm512_loadu_si512(x + i * k + kk + u * 2 * W);":
                "const __m512i xv = _mm512_loadu_si512(x + kk + u * 2 * W);"}
    monkeypatch.setenv("KERNEL_CPU_FORCE", "rowstream")  # read at each unit's first call
    mutant = _linear_unit(tmp_path / "four", "avx512", {}, mutation)
    two = _linear_unit(tmp_path / "two", "avx512", {"LINEAR_GEMV_SEQ_ROWS_DP": "2"}, mutation)

    def rows_streamed(lib) -> list[int]:
        """The M in 1..5 whose rows of x (past the first) went wrong: where lin_gemv_seq ran."""
        ran = []
        for m in range(1, 6):
            x, w, b = _case(m, 70, 300, torch.bfloat16, seed=m)
            got, ref = _run_packed(lib, x, w, b, packed=False), _reference(x, w, b)
            assert torch.equal(got[:1], ref[:1]), f"M={m}: x's first row went wrong"
            if not torch.equal(got, ref):
                ran.append(m)
        return ran

    assert rows_streamed(mutant) == [2, 3, 4], "lin_gemv_seq under the rows knob 4"
    assert rows_streamed(two) == [2], "lin_gemv_seq under the rows knob 2"
    monkeypatch.delenv("KERNEL_CPU_FORCE")
    by_cpu = rows_streamed(fresh_copy(mutant, "default"))
    assert by_cpu == ([2, 3, 4] if row_streams_by_default() else []), f"{cpu_model()}: streamed at M = {by_cpu}"
    monkeypatch.setenv("KERNEL_CPU_MASK", "rowstream")
    assert rows_streamed(fresh_copy(mutant, "masked")) == [], "KERNEL_CPU_MASK=rowstream kept lin_gemv_seq"


@pytest.mark.slow
@pytest.mark.parametrize("tier", ["avx2", "avx512"])
def test_one_row_of_x_reads_a_large_weight_as_segments_where_the_cpu_prefers_it(tmp_path: Path, monkeypatch,
                                                                               tier: str):
    """Where row_segment_reads() holds (Zen 4, or KERNEL_CPU_FORCE=rowsegments), the dot path
    with up to LINEAR_GEMV_SEGMENT_ROWS rows of x (1) reads a weight of at least
    LINEAR_GEMV_SEGMENTS_MIN_KIB (here 1 KiB) as segments of rows in lockstep: every output
    the same k-order sum as the blocks', so exact on exact inputs, fp32 and bf16, with N tails
    in the segments and past them, one and two threads' shares. A unit whose segment loop drops
    the bias must go wrong at exactly M = 1 (M = 1-2 with the rows knob at 2), in the segments'
    rows only; without the force the CPU decides, and KERNEL_CPU_MASK=rowsegments keeps the
    blocks; a weight under the size bound keeps them too, and so does fp32 in the avx512 unit
    (its loop lost that way)."""
    knobs = {"LINEAR_GEMV_SEGMENTS_MIN_KIB": "1"}
    monkeypatch.setenv("KERNEL_CPU_FORCE", "rowsegments")  # read at each unit's first call
    exact = _linear_unit(tmp_path / "exact", tier, knobs)
    for dtype in (torch.float32, torch.bfloat16):
        for n, k in ((4 * 17, 260), (4 * 17 + 3, 300), (9, 77), (130, 4096 + 13)):
            for m in (1, 2):
                x, w, b = _case(m, n, k, dtype, seed=n + m)
                got = _run_packed(exact, x, w, b, packed=False)
                assert torch.equal(got, _reference(x, w, b)), f"{tier} {dtype} M={m} N={n} K={k}"
    edit = {"x, w + (r0 + i) * k, bias != nullptr ? bias + r0 + i : nullptr,":
            "x, w + (r0 + i) * k, static_cast<const T*>(nullptr),"}
    mutant = _linear_unit(tmp_path / "mutant", tier, knobs, edit)
    two = _linear_unit(tmp_path / "two", tier, {**knobs, "LINEAR_GEMV_SEGMENT_ROWS": "2"}, edit)
    n, k = 4 * 40 + 3, 300  # each of two threads' shares: segments of rows, then a narrower block

    def segmented(lib, rows: tuple[int, ...] = (1, 2, 3), dtype: torch.dtype = torch.bfloat16) -> list[int]:
        """The M whose outputs lost their bias (where the segments ran)."""
        ran = []
        for m in rows:
            x, w, b = _case(m, n, k, dtype, seed=m)
            if not torch.equal(_run_packed(lib, x, w, b, packed=False), _reference(x, w, b)):
                ran.append(m)
        return ran

    fp32 = segmented(mutant, dtype=torch.float32)
    assert fp32 == ([] if tier == "avx512" else [1]), "fp32: segments in the avx2 unit only"
    assert segmented(mutant) == [1], "segments under the rows knob 1"
    assert segmented(two) == [1, 2], "segments under the rows knob 2"
    x, w, b = _case(1, n, k, torch.bfloat16, seed=5)
    wrong = (_run_packed(mutant, x, w, b, packed=False) != _reference(x, w, b))[0]
    assert 0 < int(wrong.sum()) < n, "only the segments' rows, not the blocks past them"
    small = _linear_unit(tmp_path / "small", tier, {"LINEAR_GEMV_SEGMENTS_MIN_KIB": "1024"}, edit)
    assert segmented(small, (1,)) == [], "a weight under the size bound took segments"
    monkeypatch.delenv("KERNEL_CPU_FORCE")
    by_cpu = segmented(fresh_copy(mutant, "default"), (1,))
    assert by_cpu == ([1] if row_segments_by_default() else []), f"{cpu_model()}: segments at M = {by_cpu}"
    monkeypatch.setenv("KERNEL_CPU_MASK", "rowsegments")
    assert segmented(fresh_copy(mutant, "masked"), (1,)) == [], "KERNEL_CPU_MASK=rowsegments kept the segments"


@pytest.mark.slow
@pytest.mark.parametrize("tier, knob, rows, takes", [
    ("avx512", "LINEAR_GEMV_ROWS_FEW", 6, {torch.float32: (2, 3, 4, 7, 8), torch.bfloat16: (2, 3, 4, 7, 8)}),
    ("avx2", "LINEAR_GEMV_ROWS_FEW_AVX2", 2, {torch.float32: (), torch.bfloat16: (4,)})])
def test_dot_path_takes_its_other_blocks_at_exactly_their_rows(tmp_path: Path, monkeypatch, tier: str, knob: str,
                                                                rows: int, takes: dict[torch.dtype, tuple[int, ...]]):
    """Besides blocks of LINEAR_GEMV_ROWS (4) weight rows against passes of 6 (avx512) or 3
    (AVX2) rows of x, the dot path has blocks of ``rows`` against passes of 4: wider ones in the
    avx512 unit where they need no more passes (M = 2-4, 7-8), narrower ones in the AVX2 unit
    where they save a pass (M = 4, 16-bit weights only). Every output is the same k-order sum either way, so the bits
    cannot tell: a unit whose other blocks read every row from the block's first must go wrong
    at exactly those M, in exactly the other rows' outputs (full blocks and the narrower last one,
    fp32 and bf16, K with a tail), and stay exact at every other M up to 9. With the knob at 4
    the same edit changes nothing. KERNEL_CPU_MASK=rowstream keeps 16-bit weights off the
    one-row-at-a-time loop where the CPU would take it (Zen 5), and amx keeps bf16 from M = 5 on
    the dot path where the CPU has AMX (its AMX path runs there otherwise)."""
    monkeypatch.setenv("KERNEL_CPU_MASK", "rowstream,amx")  # read at the unit's first call
    edit = {"wr[r] = w + std::min<int64_t>(r, nb - 1) * seg * k;":
            "wr[r] = w + std::min<int64_t>(R == LINEAR_GEMV_ROWS ? r : 0, nb - 1) * seg * k;"}
    mutant = _linear_unit(tmp_path / "other", tier, {}, edit)
    four = _linear_unit(tmp_path / "four", tier, {knob: "4"}, edit)
    n = 6 * 11 + 5  # 71: a narrower last block of either width
    moved = torch.tensor([j % rows != 0 for j in range(n)])
    for dtype in (torch.float32, torch.bfloat16):
        for m in range(1, 10):
            x, w, b = _case(m, n, 4096 + 13, dtype, seed=m)
            ref = _reference(x, w, b)
            got = _run_packed(mutant, x, w, b, packed=False)
            assert torch.equal(_run_packed(four, x, w, b, packed=False), ref), f"{dtype} M={m}: knob 4 not exact"
            assert torch.equal(got[:, ~moved], ref[:, ~moved]), f"{dtype} M={m}: a block's first row went wrong"
            if m in takes[dtype]:
                assert not torch.equal(got[:, moved], ref[:, moved]), f"{dtype} M={m}: kept the blocks of four"
            else:
                assert torch.equal(got, ref), f"{dtype} M={m}: took blocks of {rows} rows"


@pytest.mark.slow
@pytest.mark.parametrize("tier, knobs", [("avx2", ("LINEAR_WIDE_PREFETCH", "LINEAR_PACKED_PREFETCH_BYTES",
                                                   "LINEAR_SEQ_NTA_BYTES")),
                                         ("avx512", ("LINEAR_PACKED_PREFETCH_BYTES", "LINEAR_SEQ_NTA_BYTES"))])
def test_linear_prefetch_knobs_at_0_take_their_prefetches_out(tmp_path: Path, default_unit, tier: str,
                                                                     knobs: tuple[str, ...]):
    """The software prefetches of the packed panels (LINEAR_WIDE_PREFETCH: lin_tile_wide's next
    chunk; LINEAR_PACKED_PREFETCH_BYTES: lin_packed_gemv(_dp)'s stream) and of lin_gemv_seq's
    plain weight (LINEAR_SEQ_NTA_BYTES) are in the unit's machine code, and the knobs at 0 take
    them out without changing a bit of the results."""
    from kernel_harness.build.machine_code import prefetch_counts

    off = _linear_unit(tmp_path, tier, dict.fromkeys(knobs, "0"))
    on = default_unit(tier)
    counts = {what: prefetch_counts(Path(lib._name)) for what, lib in (("on", on), ("off", off))}
    if None in counts.values():
        pytest.skip("objdump (binutils) cannot read the units here")
    assert counts["on"][tier] > counts["off"][tier], f"{tier}: {knobs} at 0 left the prefetch count at {counts}"
    # lin_gemv_seq's hint is the unit's only prefetchnta: present, and gone with LINEAR_SEQ_NTA_BYTES at 0
    nta = {what: prefetch_counts(Path(lib._name), "prefetchnta")[tier] for what, lib in (("on", on), ("off", off))}
    assert nta["on"] > 0 and nta["off"] == 0, f"{tier}: prefetchnta counts {nta}"
    for m, dtype in ((1, torch.bfloat16), (3, torch.bfloat16), (4, torch.float32), (8, torch.float32)):
        x, w, b = _case(m, 96, 300, dtype, seed=m)
        assert torch.equal(_run_packed(on, x, w, b), _run_packed(off, x, w, b)), f"{tier} M={m} {dtype}"
    for m in (2, 4):  # the plain weight, x's rows past LINEAR_SEQ_NTA_MIN_X_KIB (lin_gemv_seq where it runs)
        x, w, b = _case(m, 40, 4096 + 40, torch.bfloat16, seed=m)
        assert torch.equal(_run_packed(on, x, w, b, packed=False), _run_packed(off, x, w, b, packed=False)), m


@pytest.mark.slow
@pytest.mark.parametrize("tier", ["avx2", "avx512"])
def test_fp32_next_block_prefetch_knob_is_in_the_code_and_changes_no_bit(tmp_path: Path, default_unit, tier: str):
    """LINEAR_PREFETCH_BLOCKS_FP32: the dot path's prefetch of the next block of fp32 weight rows
    into the L2 (on since 2026-12-05: 0.80-0.95x the time on a Zen 4 at M = 1-8) is in the unit's
    machine code as prefetcht1, and at 0 it is gone without a bit of a plain fp32 result changing
    (M = 1 to 7, N and K with tails)."""
    from kernel_harness.build.machine_code import prefetch_counts

    off = _linear_unit(tmp_path, tier, {"LINEAR_PREFETCH_BLOCKS_FP32": "0"})
    on = default_unit(tier)
    counts = {what: prefetch_counts(Path(lib._name), "prefetcht1") for what, lib in (("on", on), ("off", off))}
    if None in counts.values():
        pytest.skip("objdump (binutils) cannot read the units here")
    assert counts["on"][tier] > counts["off"][tier], f"{tier}: prefetcht1 counts {counts}"
    for m in (1, 2, 4, 7):
        x, w, b = _case(m, 70, 1030, torch.float32, seed=m)
        got = _run_packed(on, x, w, b, packed=False)
        assert torch.equal(got, _run_packed(off, x, w, b, packed=False)), f"{tier} M={m}"
        assert_within_fp32_sum_bound(x, w, b, got, f"{tier} M={m}")


@pytest.mark.slow
def test_stream_prefetch_level_knob_picks_the_hint_and_changes_no_bit(tmp_path: Path, default_unit):
    """LINEAR_STREAM_PREFETCH_LEVEL 2 (the default) prefetches the packed panels and the wide
    paths' chunks into the L2 (prefetcht1), 1 into the L1 (prefetcht0): the hint moves in the
    unit's machine code, and no result changes (the decode forms, the wide two-pass paths and
    the tiles, both dtypes)."""
    l1 = _linear_unit(tmp_path, "avx2", {"LINEAR_STREAM_PREFETCH_LEVEL": "1"})
    l2 = default_unit("avx2")
    assert_prefetch_hint_moved(l1, l2, "avx2", "LINEAR_STREAM_PREFETCH_LEVEL")
    for m, dtype in ((1, torch.bfloat16), (4, torch.bfloat16), (5, torch.float32), (6, torch.float32),
                     (40, torch.bfloat16)):
        x, w, b = _case(m, 96, 300, dtype, seed=m)
        assert torch.equal(_run_packed(l1, x, w, b), _run_packed(l2, x, w, b)), f"M={m} {dtype}"


# ---------------------------------------------------------------- refusals


def test_bad_inputs_are_refused_with_clear_messages(kernel):
    x, w, b = _case(3, 8, 16, torch.float32, seed=1)
    with pytest.raises(RuntimeError, match="not contiguous.*contiguous\\(\\)"):
        kernel.linear(x.t().contiguous().t(), w, b)
    with pytest.raises(RuntimeError, match="not contiguous"):
        kernel.linear(x, w.t().contiguous().t(), b)
    with pytest.raises(RuntimeError, match="weight has K = 15"):
        kernel.linear(x, w[:, :15].contiguous(), b)
    with pytest.raises(RuntimeError, match="bias must have shape \\[8\\]"):
        kernel.linear(x, w, b[:5].contiguous())
    with pytest.raises(RuntimeError, match="weight must be the plain \\[N, K\\] weight or the \\[1, N, K\\]"):
        kernel.linear(x, w.view(2, 4, 16), b)
    with pytest.raises(RuntimeError, match="weight has dtype"):
        kernel.linear(x, w.to(torch.bfloat16), b)
    with pytest.raises(RuntimeError, match="out has shape"):
        kernel.linear(x, w, b, out=torch.empty(3, 9))


# ---------------------------------------------------------------- dispatch


def test_dispatch_picks_the_best_tier_at_every_listed_m(kernel, monkeypatch):
    """The dispatcher's rule for linear (see README): bf16 runs the best tier this CPU has at
    every M (on a CPU with AMX too: its AMX path ran ahead of oneDNN's from M = 128 to 1024);
    fp32 from M = 32 (and M x K >= 32768) on an Intel CPU runs the generic tier, MKL's GEMM
    (M = 128 on an Ice Lake: 19.7 ms against the avx512 tier's 27.2 and the avx2 tier's 44.1;
    on a Zen 5 EPYC MKL took 25.0 ms against avx512's 18.3, so elsewhere fp32 stays ours),
    unless KERNEL_CPU_ISA forces a tier."""
    monkeypatch.delenv("KERNEL_CPU_ISA", raising=False)
    monkeypatch.delenv("KERNEL_CPU_MASK", raising=False)
    best = kernel.available_tiers()[-1]
    for m in (1, 4, 15, 16, 31, 32, 128, 160, 1024):
        x, w = torch.empty(m, 4096, dtype=torch.bfloat16), torch.empty(4096, 4096, dtype=torch.bfloat16)
        assert kernel.dispatch_tier("linear", x, w) == best, m
        assert kernel.dispatch_tier("linear", x, kernel.prepack(w)) == best, m
        expected = "generic" if m >= 32 and _MKL_FAST else best
        assert kernel.dispatch_tier("linear", x.float(), w.float()) == expected, m
    # a forced tier wins over the library rule, for the query and for the call
    monkeypatch.setenv("KERNEL_CPU_ISA", best)
    x, w = torch.randn(128, 256), torch.randn(64, 256)
    assert kernel.dispatch_tier("linear", x, w) == best
    torch.testing.assert_close(kernel.linear(x, w), torch.nn.functional.linear(x, w), rtol=1e-4, atol=1e-4)


# The fp32 library rule holds where MKL runs its fast kernels: on Intel CPUs (cpu_features.hpp).
_MKL_FAST = cpu_vendor() == "GenuineIntel"


def test_fp32_from_32_rows_runs_the_library_call(kernel, monkeypatch):
    """On an Intel CPU the generic tier's result is F.linear's own (the same MKL call), bit for
    bit; a small GEMM stays on the SIMD tier (its call overhead: measured 148 against 263 us).
    On other CPUs (MKL slower there) the same call runs the best SIMD tier."""
    monkeypatch.delenv("KERNEL_CPU_ISA", raising=False)
    monkeypatch.delenv("KERNEL_CPU_MASK", raising=False)
    x, w, b = torch.randn(40, 1024), torch.randn(70, 1024), torch.randn(70)
    if not _MKL_FAST:
        assert kernel.dispatch_tier("linear", x, w) == kernel.available_tiers()[-1], cpu_vendor()
        return
    assert kernel.dispatch_tier("linear", x, w) == "generic"
    assert torch.equal(kernel.linear(x, w, b), torch.nn.functional.linear(x, w, b))
    small = "avx2" if kernel.available_tiers()[-1] == "avx512" else kernel.available_tiers()[-1]
    assert kernel.dispatch_tier("linear", torch.randn(33, 100), torch.randn(65, 100)) == small  # fp32 < 2^19


def test_a_small_fp32_gemm_runs_avx2_where_avx512_would(kernel, monkeypatch):
    """fp32 below 2^19 multiply-adds runs the avx2 unit instead of the avx512 one (measured
    faster there, see linear.op), decided by M x N x K, so a decode-sized call with a large
    weight stays on avx512, and bf16 stays on avx512 at any size; a forced tier still wins,
    and dispatch_tier gives the call's own answer (the bits say which unit ran)."""
    monkeypatch.delenv("KERNEL_CPU_ISA", raising=False)
    monkeypatch.delenv("KERNEL_CPU_MASK", raising=False)
    if kernel.available_tiers()[-1] != "avx512":
        pytest.skip(f"the rule picks between avx2 and avx512; this CPU's best tier is {kernel.available_tiers()[-1]}")
    gen = torch.Generator().manual_seed(3)
    x, w = torch.randn(8, 129, generator=gen), torch.randn(97, 129, generator=gen)
    assert kernel.dispatch_tier("linear", x, w) == "avx2"  # 100 K multiply-adds
    assert kernel.dispatch_tier("linear", torch.empty(1, 4096), torch.empty(4096, 4096)) == "avx512"  # 16.8 M
    assert kernel.dispatch_tier("linear", torch.empty(8, 256), torch.empty(256, 256)) == "avx512"  # 2^19
    assert kernel.dispatch_tier("linear", x, kernel.prepack(w)) == "avx2"  # packed or plain alike
    assert kernel.dispatch_tier("linear", x.bfloat16(), w.bfloat16()) == "avx512"
    unforced = kernel.linear(x, w)
    monkeypatch.setenv("KERNEL_CPU_ISA", "avx512")
    assert kernel.dispatch_tier("linear", x, w) == "avx512"
    wide = kernel.linear(x, w)
    monkeypatch.setenv("KERNEL_CPU_ISA", "avx2")
    narrow = kernel.linear(x, w)
    assert not torch.equal(wide, narrow), "the two units must sum in different orders for this check to mean anything"
    assert torch.equal(unforced, narrow)


def test_a_packed_fp32_weight_stays_on_the_simd_tier_above_the_library_rule(kernel, monkeypatch):
    """The fp32 library rule was measured with the plain weight; the generic tier would
    unpack a prepacked one in every call (M = 32: 36.9 ms against the avx512 tier's 7.2 on
    an Ice Lake), so a packed call runs the best SIMD tier at every M, and dispatch_tier
    says so. KERNEL_CPU_ISA still forces any tier."""
    monkeypatch.delenv("KERNEL_CPU_ISA", raising=False)
    monkeypatch.delenv("KERNEL_CPU_MASK", raising=False)
    best = kernel.available_tiers()[-1]
    if best == "generic":
        pytest.skip("this CPU runs no SIMD tier of the package")
    x, w = torch.randn(40, 1024), torch.randn(70, 1024)
    wp = kernel.prepack(w)
    assert kernel.dispatch_tier("linear", x, w) == ("generic" if _MKL_FAST else best)  # the rule, plain weight
    assert kernel.dispatch_tier("linear", x, wp) == best
    unforced = kernel.linear(x, wp)
    monkeypatch.setenv("KERNEL_CPU_ISA", "generic")
    assert kernel.dispatch_tier("linear", x, wp) == "generic"
    library = kernel.linear(x, wp)
    monkeypatch.setenv("KERNEL_CPU_ISA", best)
    simd = kernel.linear(x, wp)
    # the two tiers sum in different orders, so their bits tell which one ran
    assert not torch.equal(library, simd), "the generic and SIMD results must differ for this check to mean anything"
    assert torch.equal(unforced, simd)


def test_installed_package_loads_in_a_fresh_process(linear_kernel_dir: Path):
    """The built variant imports in a clean interpreter and computes (no state from this process)."""
    code = (
        "import sys, torch, kernels, pathlib\n"
        f"k = kernels.get_local_kernel(pathlib.Path({str(linear_kernel_dir)!r}))\n"
        "w = torch.ones(5, 3); x = torch.ones(2, 3)\n"
        "assert torch.equal(k.linear(x, k.prepack(w)), torch.full((2, 5), 3.0))\n"
    )
    env = {key: v for key, v in os.environ.items() if key not in ("KERNEL_CPU_ISA", "KERNEL_CPU_MASK")}
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert run.returncode == 0, run.stderr


def test_avx512_unit_fp32_and_fp16_paths_run_on_an_avx512f_cpu(linear_kernel_dir: Path, tmp_path: Path):
    """The AVX512 unit, compiled with its own flags into a torch-free C++ driver, on exact data.

    Outside torch, on exact data: tails, panels, M below MR, both weight
    layouts, wherever the CPU has AVX512 F/BW/VL/DQ (with or without AVX512-BF16).
    """

    needed = {"avx512f", "avx512bw", "avx512vl", "avx512dq"}
    if not needed <= cpu_flags():
        pytest.skip(f"this CPU lacks {', '.join(sorted(needed - cpu_flags()))}: the AVX512 unit cannot run")
    if shutil.which("g++") is None:
        pytest.skip("g++ is not on PATH")
    import tomllib

    build = tomllib.loads((linear_kernel_dir / "build.toml").read_text())
    flags = build["kernel"][f"{PACKAGE}_cpu_avx512"]["cxx-flags"]
    src = linear_kernel_dir / f"{PACKAGE}_cpu"
    driver = Path(__file__).parent / "data" / "linear" / "avx512_fp32_driver.cpp"
    exe = tmp_path / "driver"
    compiled = subprocess.run(["g++", "-O2", "-std=c++20", *flags, f"-I{src}", str(driver),
                               str(src / f"{PACKAGE}_avx512.cpp"), "-o", str(exe)],
                              capture_output=True, text=True, timeout=600)
    assert compiled.returncode == 0, compiled.stderr[-4000:]
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "fp32: 0 wrong elements" in run.stdout and "fp16: 0 wrong elements" in run.stdout


_PROBE = """
import pathlib, sys, torch, kernels
import torch.nn.functional as F
k = kernels.get_local_kernel(pathlib.Path(sys.argv[1]))
gen = torch.Generator().manual_seed(11)
out = {}
for m, n, k_ in SHAPES:
    x = torch.randn(m, k_, generator=gen).bfloat16()
    w = torch.randn(n, k_, generator=gen).bfloat16()
    b = torch.randn(n, generator=gen).bfloat16()
    # the same weight starting 2 bytes past a 64-byte line (AMX cannot read its rows as tiles in place)
    shifted = torch.empty(n * k_ + 1, dtype=torch.bfloat16)[1:].view(n, k_)
    shifted.copy_(w)
    out[(m, n, k_)] = (x, w, b, k.linear(x, w, b), k.linear(x, k.prepack(w), b), k.linear(x, shifted, b))
big = torch.empty(1024, 4096, dtype=torch.bfloat16), torch.empty(4096, 4096, dtype=torch.bfloat16)
torch.save({"out": out, "tier_1024": k.dispatch_tier("linear", *big)}, sys.argv[2])
"""
# M = 5 and 33: the fused path; 300 and 200 the K-blocked one (rows split between threads),
# 200 with three blocks of K (128 + 128 + 2 steps: sums parked between them) and a strip of 8 rows
_AMX_SHAPES = ((5, 33, 4096 + 70), (33, 130, 4096 + 13), (300, 70, 77), (200, 40, 8192 + 45))

# the dot path's M (below the AMX rows), K with and without a tail of pairs and of vectors; enough
# long sums that another summation order moves some bf16 roundings (~1 output in 1000 at K = 4096)
_DOT_SHAPES = ((1, 4096, 4096), (4, 2048, 4096 + 13), (2, 8192, 4096), (2, 65, 77), (3, 9, 31))


def run_probe(kernel_dir: Path, tmp_path: Path, shapes: tuple, masks: tuple[str, ...], probe: str = _PROBE) -> dict:
    """A probe script (by default _PROBE: bf16 linear on continuous data) in a fresh process per
    KERNEL_CPU_MASK (the unit reads the mask once): per mask, what the script saved for ``shapes``."""
    script = tmp_path / "probe.py"
    script.write_text(probe.replace("SHAPES", repr(shapes)))
    results = {}
    for mask in masks:
        env = {key: v for key, v in os.environ.items() if key not in ("KERNEL_CPU_ISA", "KERNEL_CPU_MASK")}
        env["KERNEL_CPU_MASK"] = mask
        dest = tmp_path / f"out_{mask or 'none'}.pt"
        run = subprocess.run([sys.executable, str(script), str(kernel_dir), str(dest)], env=env,
                             capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stderr[-3000:]
        results[mask] = torch.load(dest)
    return results


def assert_within_fp32_sum_bound(x, w, b, got, what: str) -> None:
    """got within half an ulp of its dtype plus the fp32-sum error bound (k * 2^-23 * |x| |w|) of float64."""
    exact = F.linear(x.double(), w.double(), b.double())
    bound = x.shape[-1] * 2.0**-23 * F.linear(x.double().abs(), w.double().abs(), b.double().abs())
    half_ulp = torch.finfo(got.dtype).eps / 2
    err = (got.double() - exact).abs()
    assert bool((err <= half_ulp * exact.abs() * (1 + 1e-3) + bound * (1 + 2 * half_ulp)).all()), (
        f"{what}: worst error {err.max()}")


def assert_tiled_path_ran(results: dict, path_mask: str, fma_mask: str, path: str) -> None:
    """A tiled bf16 path (run under KERNEL_CPU_MASK=path_mask) against the FMA paths (fma_mask):
    every output within the fp32-sum bound, the path's bits the same from the plain and the packed
    weight (both are converted to the same blocks), and other bits than the FMA paths', so it ran."""
    differs = False
    for shape, (x, w, b, plain, packed, _) in results[path_mask]["out"].items():
        fma_plain, fma_packed = results[fma_mask]["out"][shape][3:5]
        for got, what in ((plain, f"{path} plain"), (packed, f"{path} packed"), (fma_plain, "fma plain"),
                          (fma_packed, "fma packed")):
            assert_within_fp32_sum_bound(x, w, b, got, f"{what} {shape}")
        assert torch.equal(plain, packed), f"{shape}: the {path} path must not depend on the weight's layout"
        differs |= not torch.equal(plain, fma_plain)
    assert differs, f"{path} and FMA results were bit-equal everywhere: the {path} path did not run"


def test_bf16_dot_path_takes_vdpbf16ps_where_the_cpu_has_it(linear_kernel_dir: Path, tmp_path: Path):
    """bf16 decode sizes on the avx512 tier: with AVX512-BF16 the dot path (plain weight) and
    lin_packed_gemv_dp (packed weight) sum element pairs by VDPBF16PS, with
    KERNEL_CPU_MASK=avx512bf16 they widen and use FMAs. Both within the fp32-sum
    bound on continuous data, K tails included; their bits differ (another summation order), so
    the VDPBF16PS loop did run."""

    if not has_isa("avx512"):
        pytest.skip(skip_reason("avx512"))
    if "avx512_bf16" not in cpu_flags():
        pytest.skip("this CPU lacks avx512_bf16 (the FMA dot path runs there, tested by the exact-input tests)")
    results = run_probe(linear_kernel_dir, tmp_path, _DOT_SHAPES, ("", "avx512bf16"))
    differs = {"plain": False, "packed": False}
    for shape, (x, w, b, plain, packed, _) in results[""]["out"].items():
        fma_plain, fma_packed = results["avx512bf16"]["out"][shape][3:5]
        for got, what in ((plain, "vdpbf16ps plain"), (packed, "vdpbf16ps packed"), (fma_plain, "fma plain"),
                          (fma_packed, "fma packed")):
            assert_within_fp32_sum_bound(x, w, b, got, f"{what} {shape}")
        differs["plain"] |= not torch.equal(plain, fma_plain)
        differs["packed"] |= not torch.equal(packed, fma_packed)
    for layout, seen in differs.items():
        assert seen, f"VDPBF16PS and FMA results were bit-equal everywhere ({layout} weight): the pair loop did not run"


# the VDPBF16PS tiled path's M (from LINEAR_DP_MIN_ROWS = 16): strips
# and a tail of rows, strips split between threads (300 rows, three panels), K with a tail of a
# 32-wide step and an odd K, N narrower than a panel and with a partial last panel
_DP_SHAPES = ((40, 64, 4096 + 13), (33, 130, 4096 + 13), (300, 70, 77), (100, 96, 301))


def test_bf16_tiled_dp_path_runs_where_the_cpu_has_avx512bf16(linear_kernel_dir: Path, tmp_path: Path):
    """bf16 from M = 16 on the avx512 tier of a CPU with AVX512-BF16 and no AMX (or AMX masked
    off, so this also runs on an AMX CPU): the VDPBF16PS tiled path. With KERNEL_CPU_MASK also
    listing avx512bf16 the FMA paths run instead. Both within the fp32-sum bound on continuous
    data; the tiled path gives the same bits from the plain and the packed weight (both are
    converted to the same k-pair blocks), and other bits than the FMA paths, so it did run."""

    if not has_isa("avx512"):
        pytest.skip(skip_reason("avx512"))
    if "avx512_bf16" not in cpu_flags():
        pytest.skip("this CPU lacks avx512_bf16: the VDPBF16PS tiled path cannot run (the FMA paths run there, "
                    "tested by the exact-input tests)")
    results = run_probe(linear_kernel_dir, tmp_path, _DP_SHAPES, ("amx", "amx,avx512bf16"))
    assert results["amx"]["tier_1024"] == "avx512", "bf16 without AMX stays on the avx512 tier at M = 1024"
    assert_tiled_path_ran(results, "amx", "amx,avx512bf16", "VDPBF16PS tiled")


def test_amx_path_runs_where_the_cpu_has_amx_and_the_mask_turns_it_off(linear_kernel_dir: Path, tmp_path: Path):
    """bf16 on the avx512 tier, with AMX and with KERNEL_CPU_MASK=amx (the FMA paths), each in a
    fresh process (the unit reads the mask once): both within the fp32-sum bound of float64 on
    continuous data, plain and packed weight alike, and their bits differ (TDPBF16PS sums in
    another order, so the AMX path did run); bf16 stays on the avx512 tier at M = 1024 either way."""
    if not has_isa("amx"):
        pytest.skip(skip_reason("amx"))
    if not has_isa("avx512"):
        pytest.skip(skip_reason("avx512"))
    results = run_probe(linear_kernel_dir, tmp_path, _AMX_SHAPES, ("", "amx"))
    assert results[""]["tier_1024"] == "avx512" and results["amx"]["tier_1024"] == "avx512"
    assert_tiled_path_ran(results, "", "amx", "AMX")


# K a multiple of 32, so lin_amx's rows route reads the plain weight's rows as tiles in place: a last panel of
# 4 rows (copied) and a strip of 8 rows; three blocks of K (sums parked between them); strips split
# between threads
_IN_PLACE_SHAPES = ((40, 100, 4096), (20, 64, 8192 + 64), (300, 96, 256))


def test_amx_path_gives_the_same_bits_from_the_weight_in_place_copied_or_packed(linear_kernel_dir: Path,
                                                                                 tmp_path: Path):
    """On a CPU with AMX the plain bf16 weight's rows are TDPBF16PS's first operand as they are
    (lin_amx's rows route) where K is a multiple of 32 and the weight starts on a 64-byte line; a weight
    two bytes off a line goes through a copy, prepack's panels through lin_amx. All three sum the
    same pairs in the same order, so their bits must agree, within the fp32-sum bound, and differ
    from the FMA paths' (KERNEL_CPU_MASK=amx), so the AMX paths did run."""
    if not has_isa("amx"):
        pytest.skip(skip_reason("amx"))
    if not has_isa("avx512"):
        pytest.skip(skip_reason("avx512"))
    results = run_probe(linear_kernel_dir, tmp_path, _IN_PLACE_SHAPES, ("", "amx"))
    differs = False
    for shape, (x, w, b, in_place, packed, shifted) in results[""]["out"].items():
        assert_within_fp32_sum_bound(x, w, b, in_place, f"AMX in place {shape}")
        assert torch.equal(in_place, shifted), f"{shape}: the copied weight gave other bits than in place"
        assert torch.equal(in_place, packed), f"{shape}: prepack's panels gave other bits than the plain weight"
        differs |= not torch.equal(in_place, results["amx"]["out"][shape][3])
    assert differs, "AMX and FMA results were bit-equal everywhere: the AMX path did not run"


_DENORMAL_PROBE = """
import pathlib, sys, torch, kernels
k = kernels.get_local_kernel(pathlib.Path(sys.argv[1]))
out = {}
for m, n, k_ in SHAPES:
    # x subnormal (2^-130), w 2^100: each product 2^-30. TDPBF16PS reads subnormal
    # inputs as zero, so the AMX path gives 0 where the FMA paths give k_ * 2^-30
    x = torch.full((m, k_), 2.0**-130).bfloat16()
    w = torch.full((n, k_), 2.0**100).bfloat16()
    out[(m, n, k_)] = (k.linear(x, w), k.linear(x, k.prepack(w)))
torch.save(out, sys.argv[2])
"""


def test_amx_path_leaves_calls_below_its_minimum_work_to_the_fma_paths(linear_kernel_dir: Path, tmp_path: Path):
    """bf16 from M = 5 takes the AMX path only from LINEAR_AMX_MIN_WORK (65536) multiply-adds: the
    AMX unit sleeps when idle, and a tiny call paid its wake-up (9 x 31 x 17: 6.95 us after 1 ms
    without tiles against 4.64 on the FMA path). With subnormal x the two paths differ in every
    output (TDPBF16PS reads subnormals as zero), so the bits tell which one ran, plain and packed."""
    if not has_isa("amx"):
        pytest.skip(skip_reason("amx"))
    if not has_isa("avx512"):
        pytest.skip(skip_reason("avx512"))
    small, large = (9, 31, 17), (5, 33, 4096)  # 4743 and 675840 multiply-adds
    out = run_probe(linear_kernel_dir, tmp_path, (small, large), ("",), probe=_DENORMAL_PROBE)[""]
    for got in out[small]:
        assert torch.equal(got.float(), torch.full_like(got.float(), 17 * 2.0**-30)), "the AMX path ran below its work"
    for got in out[large]:
        assert not bool(got.float().any()), "above LINEAR_AMX_MIN_WORK the FMA paths ran, not the AMX path"


def test_the_side_by_side_sweep_runs_every_tier_with_the_weight_from_memory(linear_kernel_dir: Path,
                                                                              tmp_path: Path):
    """examples/linear/sweep.py: F.linear and every tier, plain and packed, one row per (dtype, M),
    with the caches scrubbed before each call unless --weight-in-cache; said in its JSON."""
    script = Path(__file__).resolve().parent.parent / "examples" / "linear" / "sweep.py"
    env = {key: v for key, v in os.environ.items() if key not in ("KERNEL_CPU_ISA", "KERNEL_CPU_MASK")}
    for extra, from_memory in (([], True), (["--weight-in-cache"], False)):
        out = tmp_path / f"sweep-{from_memory}.json"
        run = subprocess.run([sys.executable, str(script), str(linear_kernel_dir), "--m", "1,3", "--n", "40",
                              "--k", "33", "--dtypes", "bf16", "--reps", "1", "--json", str(out), *extra],
                             capture_output=True, text=True, timeout=300, env=env)
        assert run.returncode == 0, run.stderr
        report = json.loads(out.read_text())
        assert report["weight_from_memory"] is from_memory
        assert [(row["dtype"], row["m"]) for row in report["rows"]] == [("bf16", 1), ("bf16", 3)]
        tiers = report["rows"][0]["median_ms"]
        expected = {"F.linear", *(f"{t} {form}" for t in kernels.get_local_kernel(linear_kernel_dir).available_tiers()
                                  for form in ("plain", "packed"))}
        assert set(tiers) == expected and all(t > 0 for t in tiers.values())
