"""The catalogue op ``linear_int8``, generated, validated and built for real.

The op is built in the package the GEMM/attention tests share (``harness_gemm``
of ``fixtures_kernels.py``: linear, linear_int8 and decode_attention, one build
per content, cached across sessions).

Correctness is judged by the procedure's strict rules (``kernel_harness.correctness``,
no widening) against the float64 ground truth of ``examples/linear_int8/baseline.py``:
the kernel sums exactly (integer digits of x times the int8 weights), so its
bf16 results are the float64 result's own rounding, not merely within an ulp of it. Tiers are forced with
``KERNEL_CPU_ISA``; a tier this CPU lacks is skipped with the reason. The
package's avx512 tier needs AVX512 F/BW/VL/DQ only (its AVX512-BF16
instructions sit behind a run-time test); ``test_avx512_unit_runs_without_avx512_bf16``
also calls the unit directly, outside torch.
"""

from __future__ import annotations

import ctypes
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from fixtures_kernels import GEMM_PACKAGE, assert_prefetch_hint_moved, compile_tier_unit, dtype_code, fresh_copy
from kernel_harness.correctness import compare_outputs
from kernel_harness.cpu import cpu_flags, cpu_model, has_isa, row_segments_by_default, row_streams_by_default
from kernel_harness.paths import PROJECT_ROOT, SCRIPTS_DIR
from kernel_harness.scaffold import ScaffoldOptions, plan_project

pytestmark = pytest.mark.slow

PACKAGE = GEMM_PACKAGE
TIERS = ("generic", "avx2", "avx512")
EXAMPLE = PROJECT_ROOT / "examples" / "linear_int8"


def _options(directory: Path) -> ScaffoldOptions:
    return ScaffoldOptions(ops=("linear_int8",), name=PACKAGE, directory=directory, force=True)


@pytest.fixture(scope="session")
def int8_kernel_dir(gemm_kernel_dir: Path) -> Path:
    """The shared GEMM/attention package (fixtures_kernels.py), which holds linear_int8."""
    return gemm_kernel_dir


@pytest.fixture(scope="module")
def kernel(int8_kernel_dir: Path):
    import kernels

    return kernels.get_local_kernel(Path(int8_kernel_dir))


def _baseline():
    spec = importlib.util.spec_from_file_location("_linear_int8_example", EXAMPLE / "baseline.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _assert_strict(out: torch.Tensor, ref: torch.Tensor, where: str) -> None:
    verdict = compare_outputs(out, ref)
    assert verdict.ok, f"{where}: " + "; ".join(f.message for f in verdict.failures)


# ---------------------------------------------------------------- generation

def test_generated_complete_and_valid(int8_kernel_dir: Path):
    """No KERNEL_TODO anywhere, and the validator passes the generated project."""
    plan = plan_project(_options(Path("unused")))
    assert [s.name for s in plan.specs if not s.complete] == []
    for rel, text in plan.files.items():
        assert "KERNEL_TODO(\"linear_int8\"" not in text, rel
    proc = subprocess.run([sys.executable, str(SCRIPTS_DIR / "validate_cpu_kernel.py"), str(int8_kernel_dir)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_new_kernel_cli_generates_it_complete_in_every_tier(tmp_path: Path):
    """new_kernel.py --op linear_int8 (default tiers generic,avx2,avx512): complete, every
    tier unit holds the op's body and no KERNEL_TODO call, and the project validates."""
    d = tmp_path / "kernel"
    report = tmp_path / "new.json"
    proc = subprocess.run([sys.executable, str(SCRIPTS_DIR / "new_kernel.py"), "--op", "linear_int8", "--name", "qk",
                           "--dir", str(d), "--json", str(report)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads(report.read_text())
    assert data["unfinished_ops"] == [] and data["ops"][0]["complete"] is True and data["ops"][0]["kind"] == "gemm"
    for tier in ("avx2", "avx512"):
        unit = (d / "qk_cpu" / f"qk_{tier}.cpp").read_text()
        assert "void linear_int8(DType dt" in unit and "KERNEL_TODO(\"" not in unit, tier
    assert "at::matmul" in (d / "qk_cpu" / "qk_cpu.cpp").read_text()  # the generic ATen tier
    check = subprocess.run([sys.executable, str(SCRIPTS_DIR / "validate_cpu_kernel.py"), str(d)],
                           capture_output=True, text=True, timeout=300)
    assert check.returncode == 0, check.stdout + check.stderr


# ---------------------------------------------------------------- correctness

@pytest.mark.parametrize("tier", TIERS)
def test_every_tier_matches_the_float64_reference(kernel, force_tier, tier):
    """Every correctness case of the example (fp32/bf16/fp16, tails in M, N, K,
    3-d x, with and without bias) equals the float64 reference under the strict rule."""
    force_tier(tier)
    base = _baseline()
    torch.manual_seed(21)
    for inputs in base.get_correctness_inputs():
        x, q, s, b = inputs
        where = f"{tier} {x.dtype} x{tuple(x.shape)} N={q.shape[0]} bias={b is not None}"
        assert kernel.dispatch_tier("linear_int8", x, q) == tier
        out = kernel.linear_int8(x, q, s, b)
        _assert_strict(out, base.get_reference_output(*inputs), where)


@pytest.mark.parametrize("tier", TIERS)
def test_bf16_decode_is_the_rounded_float64_result_where_fp32_sums_are_not(kernel, force_tier, tier):
    """At M = 16, N = K = 4096 the fp32 reference (dequantise, F.linear) rounds some
    outputs to the other bf16 neighbour; the kernel equals the float64 result bit for bit."""
    force_tier(tier)
    base = _baseline()
    torch.manual_seed(5)
    x, q, s, b = base.make_inputs((16, 4096), 4096, True, torch.bfloat16)
    truth = base.get_reference_output(x, q, s, b)
    assert torch.equal(kernel.linear_int8(x, q, s, b), truth)
    assert not torch.equal(base.run_baseline(x, q, s, b), truth)  # why fp32 sums were not enough


@pytest.mark.parametrize("tier", TIERS)
def test_rows_the_digits_cannot_hold_are_summed_in_double(kernel, force_tier, tier):
    """The SIMD tiers write each row of x as 15-bit integer digits. Rows the digits
    cannot hold (inf, NaN, a span of 2^200, max |x| below 2^-100) take a scalar
    double path; rows beside them, including one that needs 4-6 digit levels and
    an all-zero row, stay exact: every row equals the float64 reference, NaN where
    it has NaN (inf times a zero weight)."""
    force_tier(tier)
    base = _baseline()
    torch.manual_seed(8)
    for dtype in (torch.float32, torch.bfloat16):
        x, q, s, b = base.make_inputs((8, 300), 37, True, dtype)
        x[1] = 0
        x[2, 5] = float("inf")
        q[::2, 5] = 0
        x[3, 7] = float("nan")
        x[4, 3], x[4, 9] = 1e30, 1e-30
        x[5] *= 1e-33
        x[6, ::7] *= 2.0 ** -40
        out = kernel.linear_int8(x, q, s, b)
        ref = base.get_reference_output(x, q, s, b)
        assert ref[2].isnan().any() and ref[3].isnan().all() and not ref[6].isnan().any()
        torch.testing.assert_close(out, ref, rtol=0, atol=0, equal_nan=True, msg=lambda m: f"{tier} {dtype}: {m}")


def test_fp32_agrees_with_dequantise_then_linear(kernel, force_tier):
    """The speed baseline's own semantics: within fp32's tolerance of F.linear on the dequantised weight."""
    for tier in [t for t in TIERS if has_isa(t)]:
        force_tier(tier)  # through monkeypatch: restored after the test
        torch.manual_seed(3)
        x = torch.randn(9, 300)
        q = torch.randint(-128, 128, (45, 300), dtype=torch.int8)
        s = torch.rand(45) * 0.01
        b = torch.randn(45)
        ref = F.linear(x, q.float() * s[:, None], b)
        torch.testing.assert_close(kernel.linear_int8(x, q, s, b), ref, atol=1e-6, rtol=1e-5)


def test_out_parameter_and_empty_sums(kernel, force_tier):
    for tier in [t for t in TIERS if has_isa(t)]:
        force_tier(tier)
        x = torch.randn(2, 3, 40, dtype=torch.bfloat16)
        q = torch.randint(-128, 128, (6, 40), dtype=torch.int8)
        s = torch.rand(6)
        out = torch.empty(2, 3, 6, dtype=torch.bfloat16)
        assert kernel.linear_int8(x, q, s, out=out).data_ptr() == out.data_ptr()
        assert torch.equal(out, kernel.linear_int8(x, q, s))
        # K = 0: the bias alone, as F.linear
        b = torch.randn(6, dtype=torch.bfloat16)
        empty = kernel.linear_int8(torch.empty(3, 0, dtype=torch.bfloat16), torch.empty(6, 0, dtype=torch.int8), s, b)
        assert torch.equal(empty, b.expand(3, 6))


def test_bad_inputs_name_the_parameter(kernel):
    x = torch.randn(4, 16)
    q = torch.randint(-128, 128, (8, 16), dtype=torch.int8)
    s = torch.rand(8)
    with pytest.raises(RuntimeError, match=r"qweight has dtype Float.*int8"):
        kernel.linear_int8(x, q.float(), s)
    with pytest.raises(RuntimeError, match=r"qweight must have shape \[N, K\] with K = 16"):
        kernel.linear_int8(x, q[:, :8].contiguous(), s)
    with pytest.raises(RuntimeError, match=r"scales must have shape \[8\]"):
        kernel.linear_int8(x, q, torch.rand(7))
    with pytest.raises(RuntimeError, match=r"bias has dtype BFloat16 but x has dtype Float"):
        kernel.linear_int8(x, q, s, torch.rand(8, dtype=torch.bfloat16))


def test_dispatcher_picks_the_best_tier_the_package_allows(kernel, monkeypatch):
    """Unforced, the op runs on the highest tier whose full feature set this CPU has
    (the avx512 tier's: AVX512 F/BW/VL/DQ) from 4096 multiply-adds (kLinearInt8Avx512MinWork);
    below that the avx2 unit, which was faster there side by side (same bits). A forced tier
    runs at any size, and the query checks the inputs as a call does."""
    monkeypatch.delenv("KERNEL_CPU_ISA", raising=False)
    monkeypatch.delenv("KERNEL_CPU_MASK", raising=False)
    best = [t for t in TIERS if has_isa(t)][-1]
    for m, n, k in ((1, 64, 64), (2, 3, 4096), (16, 64, 64)):  # 4096 multiply-adds and more
        x, q = torch.randn(m, k), torch.zeros(n, k, dtype=torch.int8)
        assert kernel.dispatch_tier("linear_int8", x, q) == best, (m, n, k)
    small = best if best != "avx512" else "avx2"
    for m, n, k in ((3, 7, 13), (1, 63, 64), (5, 3, 1)):
        x, q = torch.randn(m, k), torch.zeros(n, k, dtype=torch.int8)
        assert kernel.dispatch_tier("linear_int8", x, q) == small, (m, n, k)
        assert kernel.dispatch_tier("linear_int8", x.bfloat16(), q, torch.ones(n)) == small
    monkeypatch.setenv("KERNEL_CPU_ISA", best)
    assert kernel.dispatch_tier("linear_int8", torch.randn(3, 13), torch.zeros(7, 13, dtype=torch.int8)) == best
    with pytest.raises(RuntimeError, match=r"qweight must have shape \[N, K\] with K = 13"):
        kernel.dispatch_tier("linear_int8", torch.randn(3, 13), torch.zeros(7, 12, dtype=torch.int8))


# ---------------------------------------------------------------- the AVX512 body on AVX512 CPUs without BF16

_UNIT_MAIN = r"""
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>
#include "PKG_tiers.hpp"
using namespace PKG_cpu;
int main() {
  std::mt19937 g(1);
  std::normal_distribution<float> nd;
  std::uniform_int_distribution<int> qd(-128, 127);
  int bad = 0, cases = 0;
  for (int64_t M : {1, 3, 5, 16, 17, 70}) for (int64_t N : {1, 3, 4, 7, 37}) for (int64_t K : {1, 7, 8, 13, 515, 1100})
    for (int b = 0; b < 2; ++b) {
      std::vector<float> x(M * K), s(N), bias(N), out(M * N);
      std::vector<int8_t> q(N * K);
      for (auto& v : x) v = nd(g);
      for (auto& v : q) v = static_cast<int8_t>(qd(g));
      for (auto& v : s) v = std::fabs(nd(g)) * 0.01f;
      for (auto& v : bias) v = nd(g);
      avx512::linear_int8(DType::F32, out.data(), x.data(), q.data(), s.data(), b ? bias.data() : nullptr, M, N, K);
      std::vector<bf16_t> xb(M * K), bb(N), ob(M * N);
      for (int64_t i = 0; i < M * K; ++i) xb[i] = float_to_bf16(x[i]);
      for (int64_t j = 0; j < N; ++j) bb[j] = float_to_bf16(bias[j]);
      avx512::linear_int8(DType::BF16, ob.data(), xb.data(), q.data(), s.data(), b ? bb.data() : nullptr, M, N, K);
      for (int64_t i = 0; i < M; ++i) for (int64_t j = 0; j < N; ++j) {
        double acc = 0, accb = 0;
        for (int64_t k = 0; k < K; ++k) {
          acc += double(x[i * K + k]) * (double(q[j * K + k]) * s[j]);
          accb += double(bf16_to_float(xb[i * K + k])) * (double(q[j * K + k]) * s[j]);
        }
        if (b) { acc += bias[j]; accb += bf16_to_float(bb[j]); }
        ++cases;
        bad += out[i * N + j] != float(acc);
        bad += ob[i * N + j].bits != float_to_bf16(float(accb)).bits;
      }
    }
  std::printf("%d of %d outputs differ\n", bad, 2 * cases);
  return bad != 0;
}
"""


def test_avx512_unit_runs_without_avx512_bf16(int8_kernel_dir: Path, tmp_path: Path):
    """Run the AVX512 unit directly (fp32 and bf16, tails, bias) where the CPU has
    AVX512F/BW/VL/DQ, with or without AVX512-BF16 (Ice Lake): an unguarded BF16
    instruction would SIGILL there."""
    needed = {"avx512f", "avx512bw", "avx512vl", "avx512dq"}
    if not needed <= cpu_flags():
        pytest.skip(f"this CPU lacks {', '.join(sorted(needed - cpu_flags()))}")
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no C++ compiler (g++/c++) on PATH")
    src = int8_kernel_dir / f"{PACKAGE}_cpu"
    flags = ["-std=c++20", "-O1", "-fopenmp", f"-I{src}"]
    unit_flags = ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mavx512bf16", "-mf16c", "-mfma"]
    main = tmp_path / "main.cpp"
    main.write_text(_UNIT_MAIN.replace("PKG", PACKAGE))
    exe = tmp_path / "unit"
    build = subprocess.run([cxx, *flags, *unit_flags, str(src / f"{PACKAGE}_avx512.cpp"), str(main), "-o", str(exe)],
                           capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stderr[-4000:]
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, f"exit {run.returncode}: {run.stdout}{run.stderr}"
    assert run.stdout.startswith("0 of ")


def test_avx512_sums_without_vnni_are_exact_and_the_mask_selects_them(int8_kernel_dir: Path, tmp_path: Path,
                                                                      monkeypatch):
    """Where the CPU has AVX512-VNNI the avx512 unit sums with VPDPWSSD (kVnni); KERNEL_CPU_MASK=
    avx512vnni runs VPMADDWD + VPADDD, as Skylake-SP does. A unit whose VPDPWSSD helper is made
    wrong must go wrong unmasked (the branch is taken) and be exact masked (the other branch is
    exact and the mask reaches it), in the decode tiles and the int16 panels, with tails. The
    package's own build holds both instructions."""
    if not has_isa("avx512"):
        pytest.skip("this CPU cannot run the avx512 tier")
    if "avx512_vnni" not in cpu_flags():
        pytest.skip("this CPU lacks AVX512-VNNI, so the other tests already run the VPMADDWD + VPADDD sums")
    if shutil.which("objdump") is None:
        pytest.skip("objdump (binutils) is not installed")
    library = next((int8_kernel_dir / "build").rglob("*.so"))
    code = subprocess.run(["objdump", "-d", "--no-show-raw-insn", str(library)], capture_output=True, text=True,
                          check=True, timeout=300).stdout
    assert "vpdpwssd" in code and "vpmaddwd" in code
    asm = '  __asm__ volatile("vpdpwssd %2, %1, %0" : "+v"(acc) : "v"(a), "v"(b));\n'
    wrong = _int8_unit(tmp_path / "wrong", "avx512", {}, {asm: asm + "  acc = _mm512_add_epi32(acc, _mm512_set1_epi32(1));\n"})
    gen = torch.Generator().manual_seed(11)
    cases = []
    for m, dtype in ((1, torch.bfloat16), (3, torch.float32), (20, torch.bfloat16)):
        x = torch.randn(m, 2048 + 96, generator=gen).to(dtype)
        q = torch.randint(-127, 128, (9, 2048 + 96), dtype=torch.int8, generator=gen)
        s = 0.01 * torch.rand(9, generator=gen) + 0.001
        cases.append((f"M={m} {dtype}", x, q, s, (x.double() @ (q.double() * s.double()[:, None]).T).to(dtype)))
    monkeypatch.delenv("KERNEL_CPU_MASK", raising=False)
    unmasked = fresh_copy(wrong, "unmasked")
    for where, x, q, s, ref in cases:
        assert not torch.equal(_run_unit(unmasked, x, q, s), ref), f"{where}: the VPDPWSSD branch did not run"
    monkeypatch.setenv("KERNEL_CPU_MASK", "avx512vnni")
    masked = fresh_copy(wrong, "masked")
    for where, x, q, s, ref in cases:
        assert torch.equal(_run_unit(masked, x, q, s), ref), f"{where}: KERNEL_CPU_MASK=avx512vnni"


# ---------------------------------------------------------------- the decode form's order

def _int8_unit(tmp_path: Path, tier: str, knobs: dict[str, str], edits: dict[str, str]):
    """The ``tier`` unit of a linear_int8-only package, knobs set and edits made, loaded with ctypes."""
    ns = f"{PACKAGE}_cpu"
    wrapper = ('extern "C" void run(int dt, void* o, const void* x, const int8_t* q, const float* s, '
               "const void* b, int64_t m, int64_t n, int64_t k) {\n"
               f"  {ns}::{tier}::linear_int8(static_cast<{ns}::DType>(dt), o, x, q, s, b, m, n, k);\n}}")
    return compile_tier_unit(plan_project(_options(tmp_path)), PACKAGE, tier, wrapper, tmp_path, knobs, edits)


def _run_unit(lib, x: torch.Tensor, q: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    out = torch.empty(x.shape[0], q.shape[0], dtype=x.dtype)
    dt = dtype_code(x.dtype)
    ptrs = [ctypes.c_void_p(t.data_ptr()) for t in (out, x, q, s)]
    lib.run(dt, *ptrs, None, *[ctypes.c_int64(v) for v in (x.shape[0], q.shape[0], x.shape[1])])
    return out


@pytest.mark.slow
def test_prefetch_level_knob_picks_the_hint_and_changes_no_bit(tmp_path: Path):
    """LINEAR_INT8_PREFETCH_LEVEL 2 (the default) prefetches the weight rows into the L2
    (prefetcht1), 1 into the L1 (prefetcht0): the hint moves in the unit's machine code and the
    results stay the same bits (decode rows and a tile's worth, both activation dtypes)."""
    l1 = _int8_unit(tmp_path / "l1", "avx2", {"LINEAR_INT8_PREFETCH_LEVEL": "1"}, {})
    l2 = _int8_unit(tmp_path / "l2", "avx2", {}, {})
    assert_prefetch_hint_moved(l1, l2, "avx2", "LINEAR_INT8_PREFETCH_LEVEL")
    gen = torch.Generator().manual_seed(7)
    for m, dtype in ((1, torch.bfloat16), (3, torch.float32), (20, torch.bfloat16)):
        x = torch.randn(m, 2048 + 96, generator=gen).to(dtype)
        q = torch.randint(-127, 128, (40, 2048 + 96), dtype=torch.int8, generator=gen)
        s = 0.01 * torch.rand(40, generator=gen) + 0.001
        assert torch.equal(_run_unit(l1, x, q, s), _run_unit(l2, x, q, s)), f"M={m} {dtype}"


def test_avx512_decode_reads_the_weight_rows_in_turn_within_the_knobs(tmp_path: Path, monkeypatch):
    """In the AVX512 unit a decode block reads its weight rows one after the other (li_rows_in_turn)
    where row_stream_reads() holds (Zen 5 on, or KERNEL_CPU_FORCE=rowstream), when its digit rows
    number at most LINEAR_INT8_SEQ_DIGIT_ROWS (2) and take at most LINEAR_INT8_SEQ_DIGIT_KIB
    (16 KiB), and otherwise (or with the rows knob at 0, or KERNEL_CPU_MASK=rowstream) the 4 x 4
    tiles. Both sum exactly, so the bits cannot tell: a unit whose row-at-a-time form reads the
    digit rows in reverse order (the top level's sum weighted as the last's) must go wrong at
    M = 1 in bf16 (two levels: 2 digit rows, 8.6 KiB) and stay exact where the tiles run: fp32
    M = 1 (3 digit rows), bf16 M = 2 (4), bf16 M = 1 at K = 4192 (16.4 KiB of digits), and
    everywhere with the knob at 0."""
    mutation = {"const VI dv = viload(d + i * ldd + k + u * WI);":
                "const VI dv = viload(d + (VR - 1 - i) * ldd + k + u * WI);"}
    monkeypatch.setenv("KERNEL_CPU_FORCE", "rowstream")  # read at each unit's first call
    mutant = _int8_unit(tmp_path / "on", "avx512", {}, mutation)
    off = _int8_unit(tmp_path / "off", "avx512", {"LINEAR_INT8_SEQ_DIGIT_ROWS": "0"}, mutation)
    gen = torch.Generator().manual_seed(5)
    cases = [(1, torch.bfloat16, 2048 + 96, True), (1, torch.float32, 2048 + 96, False),
             (2, torch.bfloat16, 2048 + 96, False), (1, torch.bfloat16, 4096 + 96, False)]
    data = []
    for m, dtype, k, in_turn in cases:
        x = torch.randn(m, k, generator=gen).to(dtype)  # K: whole chunks of 2048, then a short one
        q = torch.randint(-127, 128, (9, k), dtype=torch.int8, generator=gen)
        s = 0.01 * torch.rand(9, generator=gen) + 0.001
        ref = (x.double() @ (q.double() * s.double()[:, None]).T).to(dtype)
        data.append((f"M={m} K={k} {dtype}", x, q, s, ref, in_turn))
    for where, x, q, s, ref, in_turn in data:
        assert torch.equal(_run_unit(off, x, q, s), ref), f"{where}: the knob at 0 still read rows in turn"
        got = _run_unit(mutant, x, q, s)
        if in_turn:
            assert not torch.equal(got, ref), f"{where}: the rows were not read in turn"
        else:
            assert torch.equal(got, ref), f"{where}: read rows in turn past the knobs' limits"
    where, x, q, s, ref, _ = data[0]  # the case that reads rows in turn when the CPU allows it
    monkeypatch.delenv("KERNEL_CPU_FORCE")
    by_cpu = not torch.equal(_run_unit(fresh_copy(mutant, "default"), x, q, s), ref)
    assert by_cpu == row_streams_by_default(), f"{cpu_model()}, {where}: rows in turn {by_cpu}"
    monkeypatch.setenv("KERNEL_CPU_MASK", "rowstream")
    assert torch.equal(_run_unit(fresh_copy(mutant, "masked"), x, q, s), ref), "KERNEL_CPU_MASK=rowstream"


@pytest.mark.slow
@pytest.mark.parametrize("tier", ["avx2", "avx512"])
def test_decode_reads_the_weight_as_segments_where_the_cpu_prefers_it(tmp_path: Path, monkeypatch, tier: str):
    """Where row_segment_reads() holds (Zen 4, or KERNEL_CPU_FORCE=rowsegments), decode blocks with
    up to LINEAR_INT8_SEGMENT_ROWS rows of x (1) read each thread's channels as four runs in
    lockstep: exact (the outputs the float64 reference rounds to), bf16 and fp32, with N tails in
    the runs and past them. A unit that zeroes the output of every first-run channel must go
    wrong at M = 1 in those channels only, stay exact at M = 2 and with the rows knob at 0;
    without the force the CPU decides, and KERNEL_CPU_MASK=rowsegments keeps the tiles."""
    monkeypatch.setenv("KERNEL_CPU_FORCE", "rowsegments")  # read at each unit's first call
    call = "r0 + i, kLiNR, seg, n, k, panel,\n                   acc);"
    mutation = {call: call + " out[m0 * n + r0 + i] = T{};"}
    mutant = _int8_unit(tmp_path / "on", tier, {}, mutation)
    off = _int8_unit(tmp_path / "off", tier, {"LINEAR_INT8_SEGMENT_ROWS": "0"}, mutation)
    gen = torch.Generator().manual_seed(9)

    def case(m: int, n: int, k: int, dtype: torch.dtype):
        x = torch.randn(m, k, generator=gen).to(dtype)
        q = torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=gen)
        s = 0.01 * torch.rand(n, generator=gen) + 0.001
        return x, q, s, (x.double() @ (q.double() * s.double()[:, None]).T).to(dtype)

    for n in (4 * 17, 4 * 17 + 3, 9, 130):
        for dtype in (torch.bfloat16, torch.float32):
            x, q, s, ref = case(1, n, 2048 + 96, dtype)
            assert torch.equal(_run_unit(off, x, q, s), ref), f"N={n} {dtype}: tiles"
            wrong = (_run_unit(mutant, x, q, s) != ref)[0]
            assert 0 < int(wrong.sum()) < n, f"N={n} {dtype}: {int(wrong.sum())} channels of the first runs wrong"
    x2, q2, s2, ref2 = case(2, 130, 2048 + 96, torch.bfloat16)
    assert torch.equal(_run_unit(mutant, x2, q2, s2), ref2), "M = 2 read segments"
    x, q, s, ref = case(1, 130, 2048 + 96, torch.bfloat16)
    monkeypatch.delenv("KERNEL_CPU_FORCE")
    by_cpu = not torch.equal(_run_unit(fresh_copy(mutant, "default"), x, q, s), ref)
    assert by_cpu == row_segments_by_default(), f"{cpu_model()}: segments {by_cpu}"
    monkeypatch.setenv("KERNEL_CPU_MASK", "rowsegments")
    assert torch.equal(_run_unit(fresh_copy(mutant, "masked"), x, q, s), ref), "KERNEL_CPU_MASK=rowsegments"


# ---------------------------------------------------------------- the procedure's strict check, through the CLI

_SMALL_BASELINE = """
import importlib.util
import torch
_spec = importlib.util.spec_from_file_location("_linear_int8_example", {example!r})
_base = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_base)
get_reference_output = _base.get_reference_output
run_baseline = _base.run_baseline

def get_inputs():
    return _base.make_inputs((5, 1030), 70, True, torch.bfloat16)

def get_correctness_inputs():
    return [_base.make_inputs(shape, n, bias, dtype) for dtype in (torch.float32, torch.bfloat16)
            for shape, n, bias in (((1, 515), 37, False), ((17, 260), 33, True))]
"""


def test_benchmark_strict_check_passes_in_every_tier(int8_kernel_dir: Path, tmp_path: Path):
    """benchmark_cpu.py --tier all with the default (strict) tolerances, on the example's
    semantics at small shapes (the full-size cases run in-process above): correct on
    every tier this machine runs."""
    baseline = tmp_path / "baseline_small.py"
    baseline.write_text(_SMALL_BASELINE.format(example=str(EXAMPLE / "baseline.py")))
    report = tmp_path / "bench.json"
    proc = subprocess.run(
        [sys.executable, str(SCRIPTS_DIR / "benchmark_cpu.py"), str(baseline),
         "--kernel-package", str(int8_kernel_dir), "--op", f"{PACKAGE}.linear_int8",
         "--tier", "all", "--rounds", "3", "--calls", "1", "--json", str(report)],
        capture_output=True, text=True, timeout=1800, cwd=PROJECT_ROOT,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    data = json.loads(report.read_text())
    assert data["correct"] is True


def test_analyser_advises_the_int8_patterns():
    """analyze_op's strategy for an int8 linear names both int8 references and the catalogue op."""
    from kernel_harness.analysis.strategy import simd_strategy
    from test_machine import fake_profile

    strategy = simd_strategy("gemm", "gemm", "bf16", fake_profile(flags=("avx2", "fma", "f16c")), gemm_m=1,
                             name="linear_int8")
    assert {"int8-dequant-gemm", "int8-dequant-gemm-avx2-exact"} <= set(strategy["references"])
    assert any("linear_int8" in step for step in strategy["steps"])


def test_tiny_sweep_times_both_units_and_names_the_dispatchers_pick(int8_kernel_dir: Path, tmp_path: Path):
    """examples/linear_int8/tiny_sweep.py re-measures kLinearInt8Avx512MinWork: both units side by
    side per shape, the ratio with its interval, a verdict only outside it, and the dispatcher's
    pick (avx2 below 4096 multiply-adds, avx512 from there). Without the avx512 tier it says it
    has nothing to compare (exit 2); a malformed shape is a usage error."""
    script = EXAMPLE / "tiny_sweep.py"
    out = tmp_path / "tiny.json"
    env = {key: v for key, v in os.environ.items() if key not in ("KERNEL_CPU_ISA", "KERNEL_CPU_MASK")}
    run = subprocess.run([sys.executable, str(script), str(int8_kernel_dir), "--shapes", "3x7x13,9x31x17",
                          "--dtypes", "fp32", "--rounds", "3", "--calls", "5", "--json", str(out)],
                         capture_output=True, text=True, timeout=300, env=env)
    if not has_isa("avx512"):
        assert run.returncode == 2 and "nothing to compare" in run.stdout, run.stdout + run.stderr
        return
    assert run.returncode == 0, run.stdout + run.stderr
    report = json.loads(out.read_text())
    assert report["cpu"] and report["threads"] >= 1 and report["pinned"] is False
    assert [(r["shape"], r["multiply_adds"]) for r in report["rows"]] == [("3x7x13", 273), ("9x31x17", 4743)]
    assert [r["dispatcher_pick"] for r in report["rows"]] == ["avx2", "avx512"]
    for row in report["rows"]:
        assert row["median_us"]["avx2"] > 0 and row["median_us"]["avx512"] > 0
        assert row["ci_low"] <= row["avx512_over_avx2"] <= row["ci_high"]
        value = row["avx512_over_avx2"]  # the interval reaches the 5 % floor on each side
        assert row["ci_low"] <= value / 1.05 + 1e-12 and row["ci_high"] >= value * 1.05 - 1e-12
        assert row["faster"] in (None, "avx2", "avx512")
        assert row["faster"] != "avx2" or row["ci_low"] > 1.0
        assert row["pick_verdict"] in ("ok", "violation", "undecided", "noise")
        if row["pick_verdict"] == "violation":  # only where the whole interval says the other unit is faster
            assert row["faster"] not in (None, row["dispatcher_pick"])
    bad = subprocess.run([sys.executable, str(script), str(int8_kernel_dir), "--shapes", "3x7"],
                         capture_output=True, text=True, timeout=120, env=env)
    assert bad.returncode == 2 and "--shapes: '3x7' is not MxNxK" in bad.stderr
