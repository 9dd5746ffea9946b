"""decode_attention (issue 21, op 3): generated, validated, built once, checked in every tier.

The op is built in the package the GEMM/attention tests share (``harness_gemm`` of
fixtures_kernels.py: linear, linear_int8 and decode_attention, one build per content, cached
across sessions: a cold build takes minutes on a busy 2-core machine). The dispatcher's tiers
are forced with ``KERNEL_CPU_ISA``; a tier the package cannot run here is skipped with its reason.

The dispatcher offers the avx512 tier on every CPU with AVX512 F/BW/VL/DQ (the unit's
AVX512-BF16 instructions sit behind a run-time test). Each SIMD unit is also compiled on its own
with the package's flags and called through ctypes (test_simd_bodies_...), so the bodies run
with OpenMP's own thread count, outside torch.

Every output is compared with the float64 reference rounded once to the dtype: bf16 must be
bit-equal (the kernel computes in double, see templates/ops/decode_attention.op), fp32 within
the procedure's atol=1e-6, rtol=1e-5.
"""

from __future__ import annotations

import ctypes
import importlib.util
import json
import shutil
from pathlib import Path

import pytest
import torch

from fixtures_kernels import GEMM_PACKAGE, assert_prefetch_hint_moved, compile_tier_unit, dtype_code
from kernel_harness.scaffold import ScaffoldOptions, plan_project

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "decode_attention"
PACKAGE = GEMM_PACKAGE
NS = f"{PACKAGE}_cpu"
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
#: (B, H, H_kv, S, D): tails in D (1, 7, 33, 80: not multiples of 8 or 16) and S (1, 17, 100,
#: not multiples of the key block), grouped-query groups of 2, 4 and 8, batch 1.
SHAPES = ((1, 1, 1, 1, 1), (2, 4, 4, 17, 7), (2, 8, 2, 100, 33), (3, 8, 1, 257, 80), (1, 32, 8, 300, 128))
#: What each SIMD body needs from the CPU (the flags of its instructions, not the dispatcher's tier).
def _options(directory: Path) -> ScaffoldOptions:
    return ScaffoldOptions(ops=("decode_attention",), name=PACKAGE, directory=directory, force=True)


@pytest.fixture(scope="session")
def attn_kernel_dir(gemm_kernel_dir: Path) -> Path:
    """The shared GEMM/attention package (fixtures_kernels.py), which holds decode_attention."""
    return gemm_kernel_dir


@pytest.fixture(scope="module")
def kernel(attn_kernel_dir: Path):
    import kernels

    return kernels.get_local_kernel(attn_kernel_dir)


@pytest.fixture
def tier_env(monkeypatch, kernel):
    """Force a dispatcher tier for one test; skip, with the package's reason, where it cannot run."""
    monkeypatch.delenv("KERNEL_CPU_MASK", raising=False)

    def force(tier: str) -> None:
        if tier not in kernel.available_tiers():
            monkeypatch.setenv("KERNEL_CPU_ISA", tier)
            x = torch.zeros(1, 1, 1)
            with pytest.raises(RuntimeError) as err:
                kernel.decode_attention(x, x.view(1, 1, 1, 1), x.view(1, 1, 1, 1), 1.0)
            pytest.skip(f"the {tier} tier cannot run here: {str(err.value).splitlines()[0]}")
        monkeypatch.setenv("KERNEL_CPU_ISA", tier)

    return force


def _baseline():
    spec = importlib.util.spec_from_file_location("decode_attention_baseline", EXAMPLE / "baseline.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


BASE = _baseline()


def reference(q, k, v, scale):
    return BASE.get_reference_output(q, k, v, scale)


def case(shape, dtype, seed=0):
    torch.manual_seed(seed)
    return BASE._case(*shape, dtype)


def assert_matches(out: torch.Tensor, ref: torch.Tensor, where: str) -> None:
    assert out.dtype == ref.dtype and out.shape == ref.shape, where
    if out.dtype == torch.float32:
        torch.testing.assert_close(out, ref, atol=1e-6, rtol=1e-5, msg=lambda m: f"{where}: {m}")
    else:
        bad = (out != ref).sum().item()
        assert bad == 0, f"{where}: {bad} of {out.numel()} outputs differ from the float64 reference's rounding"


# ---------------------------------------------------------------- generated, validated (no build)

def test_new_kernel_generates_it_complete_and_it_validates(script, tmp_path):
    run = script("new_kernel", "--op", "decode_attention", "--name", "attn_k", "--dir", tmp_path / "k",
                 "--json", tmp_path / "g.json", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    sources = list((tmp_path / "k").rglob("*.cpp")) + list((tmp_path / "k").rglob("*.py"))
    assert sources and not any("KERNEL_TODO(\"decode_attention\"" in p.read_text() for p in sources)
    for tier in ("avx2", "avx512"):
        assert "static void decode_attention_run" in (tmp_path / f"k/attn_k_cpu/attn_k_{tier}.cpp").read_text()
    check = script("validate_cpu_kernel", tmp_path / "k", "--json", tmp_path / "v.json", cwd=tmp_path)
    report = json.loads((tmp_path / "v.json").read_text())
    assert check.returncode == 0 and report["ok"] is True, check.stdout + check.stderr
    assert report["errors"] == [] and report["warnings"] == []


# ---------------------------------------------------------------- the built package, every tier

@pytest.mark.slow
@pytest.mark.parametrize("dtype_name", list(DTYPES))
@pytest.mark.parametrize("tier", ["generic", "avx2", "avx512"])
def test_every_tier_matches_the_float64_reference(kernel, tier_env, tier, dtype_name):
    tier_env(tier)
    for i, shape in enumerate(SHAPES):
        q, k, v, scale = case(shape, DTYPES[dtype_name], seed=i)
        assert kernel.dispatch_tier("decode_attention", q, k, v) == tier
        assert_matches(kernel.decode_attention(q, k, v, scale), reference(q, k, v, scale),
                       f"{tier} {dtype_name} B,H,H_kv,S,D={shape}")


@pytest.mark.slow
def test_split_keys_merge_equals_the_unsplit_result(kernel, monkeypatch):
    """B = H = 1 with a long sequence: with 2+ threads the keys are split into chunks whose partial
    (max, sum, acc) are merged; one thread computes it unsplit. Both are the reference's rounding."""
    monkeypatch.delenv("KERNEL_CPU_ISA", raising=False)
    monkeypatch.delenv("KERNEL_CPU_MASK", raising=False)
    tiers = [t for t in kernel.available_tiers() if t != "generic"]
    if not tiers:
        pytest.skip("no SIMD tier can run here")
    threads = torch.get_num_threads()
    try:
        for tier in tiers:
            monkeypatch.setenv("KERNEL_CPU_ISA", tier)
            for shape in ((1, 1, 1, 3001, 64), (1, 4, 1, 1500, 80)):  # MHA and a GQA group of 4
                q, k, v, scale = case(shape, torch.bfloat16)
                ref = reference(q, k, v, scale)
                outs = []
                for n in (1, 3):  # 3: more threads than (batch, kv head) pairs even on a 2-core machine
                    torch.set_num_threads(n)
                    outs.append(kernel.decode_attention(q, k, v, scale))
                    assert_matches(outs[-1], ref, f"{tier} {shape} {n} thread(s)")
                assert torch.equal(outs[0], outs[1])
    finally:
        torch.set_num_threads(threads)


@pytest.mark.slow
def test_strided_cache_views_out_and_empty_sequence(kernel, monkeypatch):
    monkeypatch.delenv("KERNEL_CPU_MASK", raising=False)
    torch.manual_seed(3)
    big_k = torch.randn(2, 2, 64, 48).bfloat16()  # a preallocated cache, 40 of 64 positions used
    big_v = torch.randn(2, 2, 64, 48).bfloat16()
    k, v = big_k[:, :, :40], big_v[:, :, :40]
    assert not k.is_contiguous()
    q = torch.randn(2, 6, 48).bfloat16()
    ref = reference(q, k, v, 0.2)
    for tier in kernel.available_tiers():
        monkeypatch.setenv("KERNEL_CPU_ISA", tier)
        assert_matches(kernel.decode_attention(q, k, v, 0.2), ref, f"{tier} strided view")
        out = torch.full_like(q, float("nan"))
        assert kernel.decode_attention(q, k, v, 0.2, out=out) is out
        assert_matches(out, ref, f"{tier} out=")
        empty = torch.empty(2, 2, 0, 48).bfloat16()
        torch.testing.assert_close(kernel.decode_attention(q, empty, empty, 0.2),
                                   BASE.run_baseline(q, empty, empty, 0.2), atol=0, rtol=0)


@pytest.mark.slow
def test_bad_inputs_name_the_parameter_and_the_fix(kernel):
    q = torch.randn(1, 6, 16)
    k = torch.randn(1, 4, 10, 16)
    with pytest.raises(RuntimeError, match="multiple of the caches' 4 kv heads"):
        kernel.decode_attention(q, k, k, 0.25)
    with pytest.raises(RuntimeError, match="k_cache's last dimension is not contiguous"):
        kernel.decode_attention(torch.randn(1, 2, 16), torch.randn(1, 2, 16, 10).transpose(-1, -2),
                                torch.randn(1, 2, 10, 16), 0.25)
    with pytest.raises(RuntimeError, match="v_cache has dtype"):
        kernel.decode_attention(torch.randn(1, 2, 16), torch.randn(1, 2, 10, 16), torch.randn(1, 2, 10, 16).bfloat16(),
                                0.25)
    with pytest.raises(RuntimeError, match=r"q must be \[batch, heads, head_dim\]"):
        kernel.decode_attention(torch.randn(1, 2, 1, 16), torch.randn(1, 2, 10, 16), torch.randn(1, 2, 10, 16), 0.25)


@pytest.mark.slow
def test_benchmark_cli_passes_the_strict_check(attn_kernel_dir, script, tmp_path):
    """benchmark_cpu.py with the default (half-ulp bf16) tolerances, in every tier this package runs."""
    run = script("benchmark_cpu", EXAMPLE / "baseline.py", "--kernel-package", attn_kernel_dir,
                 "--op", f"{PACKAGE}.decode_attention", "--tier", "all", "--rounds", "2", "--calls", "1",
                 "--json", tmp_path / "b.json", cwd=tmp_path, timeout=1200)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    result = json.loads((tmp_path / "b.json").read_text())
    assert result["correct"] is True


# ---------------------------------------------------------------- each SIMD body on its own

def _compile_body(tmp_path: Path, tier: str, knobs: dict[str, str] | None = None):
    """The generated unit of ``tier`` with its build.toml flags plus a C wrapper, loaded with ctypes;
    ``knobs`` set to other values first (one #define each)."""
    plan = plan_project(_options(tmp_path))
    wrapper = ('extern "C" void run(int dt, void* o, const void* q, const void* k, const void* v, int64_t B, '
               "int64_t H, int64_t Hkv, int64_t S, int64_t D, const int64_t* ks, const int64_t* vs, double scale) {\n"
               f"  {NS}::{tier}::decode_attention(static_cast<{NS}::DType>(dt), o, q, k, v, B, H, Hkv, S, D, ks, vs, "
               "scale);\n}")
    return compile_tier_unit(plan, PACKAGE, tier, wrapper, tmp_path, knobs)


def _call_body(lib, q, k, v, scale):
    out = torch.empty_like(q)
    B, H, D = q.shape
    ks = (ctypes.c_int64 * 3)(*k.stride()[:3])
    vs = (ctypes.c_int64 * 3)(*v.stride()[:3])
    ptr = lambda t: ctypes.c_void_p(t.data_ptr())  # noqa: E731
    dt = dtype_code(q.dtype)
    lib.run(dt, ptr(out), ptr(q), ptr(k), ptr(v), *[ctypes.c_int64(n) for n in (B, H, k.shape[1], k.shape[2], D)],
            ks, vs, ctypes.c_double(scale))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("tier", ["avx2", "avx512"])
def test_simd_bodies_match_the_float64_reference_bit_for_bit(tmp_path, tier):
    """Each SIMD body on every shape and the example's correctness sets (including the split-keys
    path: ctypes runs the body with OpenMP's default of one thread per core), fp32, bf16 and fp16.
    The AVX512 unit runs wherever AVX512 F/BW/VL/DQ does (on a CPU without AVX512-BF16 its
    integer bf16 paths)."""
    lib = _compile_body(tmp_path, tier)
    dtypes = (*DTYPES.values(), torch.float16)  # the package accepts fp16 too (new_kernel.py's default --dtypes)
    sets = [case(shape, dtype, seed=i) for i, shape in enumerate(SHAPES) for dtype in dtypes]
    sets += BASE.get_correctness_inputs()
    for q, k, v, scale in sets:
        assert_matches(_call_body(lib, q, k, v, scale), reference(q, k, v, scale),
                       f"{tier} body {q.dtype} k {tuple(k.shape)}")


def _ordered_bits(t: torch.Tensor) -> torch.Tensor:
    """16-bit floats as integers in value order: neighbouring values differ by 1."""
    b = t.view(torch.int16).int()
    return torch.where(b < 0, -(b & 0x7FFF), b)


@pytest.mark.slow
@pytest.mark.parametrize("tier", ["avx2", "avx512"])
def test_fp32_sums_knob_stays_within_an_ulp_and_changes_the_sums(tmp_path, tier):
    """DECODE_ATTN_EXACT 0 (fp32 scores, weights and sums): bf16/fp16 outputs at most one ulp from
    the correctly rounded float64 result and rarely off at all, fp32 outputs within 1e-5 of the
    values' scale; fp32 outputs differ from the double path's (the knob does what it says)."""
    for name in ("fast", "exact"):
        (tmp_path / name).mkdir()
    fast = _compile_body(tmp_path / "fast", tier, {"DECODE_ATTN_EXACT": "0"})
    exact = _compile_body(tmp_path / "exact", tier)
    changed = 0
    for i, shape in enumerate((*SHAPES, (1, 32, 32, 2048, 128))):
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            q, k, v, scale = case(shape, dtype, seed=i)
            got, ref = _call_body(fast, q, k, v, scale), reference(q, k, v, scale)
            where = f"{tier} fp32 sums {dtype} {shape}"
            if dtype == torch.float32:
                exact64 = BASE.get_reference_output(q.double(), k.double(), v.double(), scale)
                assert (got.double() - exact64).abs().max() <= 1e-5 * v.abs().max(), where
                changed += int((got != _call_body(exact, q, k, v, scale)).sum())
            else:
                ulps = (_ordered_bits(got) - _ordered_bits(ref)).abs()
                assert ulps.max() <= 1 and (ulps > 0).float().mean() < 0.01, where
    assert changed > 0, f"{tier}: DECODE_ATTN_EXACT 0 gave the double path's fp32 outputs: the knob did nothing"


@pytest.mark.slow
def test_prefetch_level_knob_picks_the_hint_and_changes_no_bit(tmp_path):
    """DECODE_ATTN_PREFETCH_LEVEL 2 (the default) prefetches the K and V rows into the L2
    (prefetcht1, no prefetcht0 in the op), 1 into the L1 (prefetcht0): the hint is in the unit's
    machine code, and the outputs are the same bits either way."""
    for name in ("l1", "l2"):
        (tmp_path / name).mkdir()
    l1 = _compile_body(tmp_path / "l1", "avx2", {"DECODE_ATTN_PREFETCH_LEVEL": "1"})
    l2 = _compile_body(tmp_path / "l2", "avx2")
    assert_prefetch_hint_moved(l1, l2, "avx2", "DECODE_ATTN_PREFETCH_LEVEL")
    for i, shape in enumerate(((1, 4, 4, 300, 128), (2, 8, 2, 257, 80))):
        for dtype in (torch.bfloat16, torch.float32):
            q, k, v, scale = case(shape, dtype, seed=i)
            assert torch.equal(_call_body(l1, q, k, v, scale), _call_body(l2, q, k, v, scale)), (shape, dtype)


#: The unit's prefetch, replaced by a call that records the row asked for (edited_unit).
_PREFETCH_CALL = "    prefetch_lines<0, kLocality>(rows + ahead * stride, dim * static_cast<int64_t>(sizeof(T)));"
_RECORDER = """
static const void* g_rows[4096];
static int g_count = 0;
extern "C" void da_record_prefetch(const void* row) { if (g_count < 4096) g_rows[g_count++] = row; }
extern "C" int recorded() { return g_count; }
extern "C" const void* recorded_row(int i) { return g_rows[i]; }
extern "C" void forget() { g_count = 0; }
"""


@pytest.mark.parametrize("heads,exact", [(1, "1"), (2, "1"), (1, "0")], ids=["one-head", "group-of-2", "fp32-sums"])
def test_each_stream_is_prefetched_by_the_loop_that_reads_it(tmp_path, heads, exact):
    """Each block of keys reads its K rows (scores), then its V rows (sums). When the scores loop
    prefetched both streams, the V rows of a block's second half were asked for only while its
    scores ran, too late for the sums: bf16 B = 8 (268 MB of cache) took 1.33x (AVX512 unit) and
    1.66x (AVX2 unit) the time it takes now on a Zen 4, 1.53x its KV-streaming floor against 1.05x.
    Recorded in the order the body asks: for every block, the K rows 16 keys ahead of the keys
    it scores, then the V rows 16 keys ahead of the keys it sums (one query head, a group of two,
    and the fp32-sums path)."""
    plan = plan_project(_options(tmp_path))
    wrapper = ('extern "C" void run(int dt, void* o, const void* q, const void* k, const void* v, int64_t B, '
               "int64_t H, int64_t Hkv, int64_t S, int64_t D, const int64_t* ks, const int64_t* vs, double scale) {\n"
               f"  {NS}::avx2::decode_attention(static_cast<{NS}::DType>(dt), o, q, k, v, B, H, Hkv, S, D, ks, vs, "
               "scale);\n}" + _RECORDER)
    edits = {_PREFETCH_CALL: "    (void)kLocality;\n    da_record_prefetch(rows + ahead * stride);",
             "template <typename T>\nstatic inline void da_prefetch_row(":
             'extern "C" void da_record_prefetch(const void* row);\ntemplate <typename T>\n'
             "static inline void da_prefetch_row("}
    lib = compile_tier_unit(plan, PACKAGE, "avx2", wrapper, tmp_path,
                            {"DECODE_ATTN_EXACT": exact, "DECODE_ATTN_PREFETCH_KEYS": "16",
                             "DECODE_ATTN_BLOCK": "32"}, edits)
    lib.recorded_row.restype = ctypes.c_void_p
    seq, dim = 100, 64  # 25 KB of cache: one thread (DECODE_ATTN_PARALLEL_MIN_BYTES), blocks of 32, 32, 32, 4
    q, k, v, scale = case((1, heads, 1, seq, dim), torch.bfloat16)
    lib.forget()
    _call_body(lib, q, k, v, scale)
    row_bytes = dim * k.element_size()
    got = []
    for i in range(lib.recorded()):
        address = lib.recorded_row(i)
        for stream, t in (("K", k), ("V", v)):
            offset = address - t.data_ptr()
            if 0 <= offset < t.numel() * t.element_size():
                got.append((stream, offset // row_bytes))
    expected = []
    for j0 in range(0, seq, 32):
        ahead = [key + 16 for key in range(j0, min(j0 + 32, seq)) if key + 16 < seq]
        expected += [("K", key) for key in ahead] + [("V", key) for key in ahead]
    assert got == expected, f"prefetch order (stream, key) differs: first difference at " \
        f"{next((i for i, (a, b) in enumerate(zip(got, expected)) if a != b), min(len(got), len(expected)))}"


def test_analyze_op_gives_decode_advice(script, tmp_path):
    """analyze_op.py on the example baseline: the attention kind with the decode steps and references."""
    run = script("analyze_op", "--op", "decode_attention", "--file", EXAMPLE / "baseline.py",
                 "--json", tmp_path / "a.json", cwd=tmp_path, timeout=600)
    assert run.returncode == 0, run.stderr
    report = json.loads((tmp_path / "a.json").read_text())
    assert report["kind"] == "attention" and "KV cache" in report["strategy"]["gemm"]["why"]
    steps = " ".join(report["strategy"]["steps"])
    assert "new_kernel.py --op decode_attention" in steps and "grouped-query" in steps
    assert {"online-softmax-merge", "bf16-correct-rounding"} <= set(report["references"])
    assert "(batch, kv head)" in report["strategy"]["threading"]["axis"]


@pytest.mark.skipif(shutil.which("objdump") is None, reason="objdump (binutils) is not installed")
def test_avx512_bodies_call_no_memcpy(attn_kernel_dir: Path):
    """The avx512 unit widens a row's D tail by masked loads (load_wide_tail). As a copy into a
    zeroed buffer it was a memcpy call, around which GCC spilled and reloaded every live zmm
    register: with D = 24 a call took 4.2 us against the AVX2 unit's 3.5 (README, issue 21). The
    unit is compiled on every x86 machine, so this holds where AVX512 cannot run too."""
    from kernel_harness.build.machine_code import calls_by_function

    libraries = sorted(attn_kernel_dir.glob("build/torch*/**/*.so"))
    assert libraries, f"no built library under {attn_kernel_dir}/build"
    calls = calls_by_function(libraries[0], f"{NS}::avx512::decode_attention")
    assert calls, "no avx512 decode_attention function in the library"
    assert not [name for name, callees in calls.items() if "memcpy@plt" in callees], calls
