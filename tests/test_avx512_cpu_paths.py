"""The avx512 unit's CPU-dependent paths: BF16 instructions as asm, table lookups without gathers.

The generated avx512 unit runs on every CPU with AVX512 F/BW/VL/DQ, so it is
built without ``-mavx512bf16`` and spells VCVTNEPS2BF16, VCVTNE2PS2BF16 and
VDPBF16PS as volatile asm (an intrinsic behind ``if (kBf16)`` was executed
speculatively by GCC 12: SIGILL on an Ice Lake), and AVX512-VNNI's VPDPWSSD
(``vnni_dot_insn``, behind ``kVnni``) likewise. Hand-written operand order is
easy to get backwards and this machine may not have AVX512-BF16 to run it, so
the helpers are compared instruction by instruction, operands included, with
what the intrinsics compile to: on any machine with g++ and objdump.

Table lookups (vlookup, vlookup_d_lo/hi) use gathers only where they are fast
(``kFastGather``: Sapphire Rapids on); elsewhere scalar loads. The dispatcher
runs one of the two on a given CPU, so the loads are compared with the gathers
directly, lane by lane, on any CPU that runs the avx512 unit.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from kernel_harness.cpu import has_isa
from kernel_harness.scaffold import ScaffoldOptions, plan_project

#: helper -> (C signature, the intrinsic expression it must equal)
HELPERS = {
    "bf16_cvt_insn": ("__m256i {name}(__m512 v)", "(__m256i)_mm512_cvtneps_pbh(v)", "v"),
    "bf16_cvt2_insn": ("__m512i {name}(__m512 lo, __m512 hi)", "(__m512i)_mm512_cvtne2ps_pbh(hi, lo)", "lo, hi"),
    "bf16_dot_insn": ("__m512 {name}(__m512 acc, __m512i a, __m512i b)",
                      "_mm512_dpbf16_ps(acc, (__m512bh)a, (__m512bh)b)", "acc, a, b"),
    "vnni_dot_insn": ("__m512i {name}(__m512i acc, __m512i a, __m512i b)", "_mm512_dpwssd_epi32(acc, a, b)",
                      "acc, a, b"),
}


def _helper_definitions(unit_text: str, names=tuple(HELPERS)) -> str:
    """The unit's own definitions of the named helpers, cut from the generated source."""
    found = []
    for name in names:
        match = re.search(rf"^inline [\w_]+ {name}\(.*?^}}\n", unit_text, re.MULTILINE | re.DOTALL)
        assert match, f"{name} is not defined in the generated avx512 unit"
        found.append(match.group(0))
    return "\n".join(found)


def _instructions(objdump: str, function: str) -> list[str]:
    body = re.search(rf"<{function}>:\n(.*?)(?:\n\n|\Z)", objdump, re.DOTALL)
    assert body, function
    lines = [line.split("\t", 1)[-1].strip() for line in body.group(1).splitlines() if "\t" in line]
    return [insn for insn in lines if not insn.startswith(("nop", "xchg   %ax,%ax", "data16", "cs nop"))]


def test_asm_helpers_compile_to_the_intrinsics_instructions(tmp_path: Path):
    if shutil.which("g++") is None or shutil.which("objdump") is None:
        pytest.skip("needs g++ and objdump (binutils) on PATH")
    plan = plan_project(ScaffoldOptions(ops=("rms_norm",), name="bf16_probe", directory=tmp_path / "k"))
    unit = plan.files["bf16_probe_cpu/bf16_probe_avx512.cpp"]
    assert "#define kBf16 (bf16_on())" in unit
    source = ["#include <immintrin.h>", "using V = __m512;", "using VI = __m512i;", _helper_definitions(unit)]
    for name, (signature, intrinsic, args) in HELPERS.items():
        source.append(f'extern "C" {signature.format(name="asm_" + name)} {{ return {name}({args}); }}')
        source.append(f'extern "C" {signature.format(name="intr_" + name)} {{ return {intrinsic}; }}')
    (tmp_path / "probe.cpp").write_text("\n".join(source) + "\n")
    subprocess.run(["g++", "-std=c++20", "-O2", "-c", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq",
                    "-mavx512bf16", "-mavx512vnni", "probe.cpp", "-o", "probe.o"], cwd=tmp_path, check=True, capture_output=True,
                   timeout=300)
    dump = subprocess.run(["objdump", "-d", "--no-show-raw-insn", "probe.o"], cwd=tmp_path, check=True,
                          capture_output=True, text=True).stdout
    for name in HELPERS:
        ours, theirs = _instructions(dump, "asm_" + name), _instructions(dump, "intr_" + name)
        assert ours == theirs, f"{name}: {ours} != {theirs}"
        assert any(re.match(r"v(cvtne2?ps2bf16|dpbf16ps|pdpwssd) ", insn) for insn in ours), ours


_LOOKUP_DRIVER = r"""
#include <immintrin.h>
#include <cstdint>
#include <cstdio>
#include <random>
using V = __m512; using VD = __m512d; using VI = __m512i;
constexpr int64_t W = 16;
HELPERS
int main() {
  static float tf[65536]; static double td[65536];
  std::mt19937 rng(7);
  for (int i = 0; i < 65536; ++i) { tf[i] = float(rng()) / 7.0f; td[i] = double(rng()) / 3.0; }
  long wrong = 0;
  for (int rep = 0; rep < 20000; ++rep) {
    alignas(64) uint32_t idx[16];
    for (auto& v : idx) v = rng() & 0xFFFF;
    const VI vi = _mm512_load_si512(idx);
    const __mmask16 f = _mm512_cmpneq_epi32_mask(_mm512_castps_si512(vlookup_loads(tf, vi)),
                                                _mm512_castps_si512(_mm512_i32gather_ps(vi, tf, 4)));
    const __m256i lo = _mm512_castsi512_si256(vi), hi = _mm512_extracti64x4_epi64(vi, 1);
    const __mmask8 dl = _mm512_cmpneq_epi64_mask(_mm512_castpd_si512(vlookup_d_loads(td, lo)),
                                                 _mm512_castpd_si512(_mm512_i32gather_pd(lo, td, 8)));
    const __mmask8 dh = _mm512_cmpneq_epi64_mask(_mm512_castpd_si512(vlookup_d_loads(td, hi)),
                                                 _mm512_castpd_si512(_mm512_i32gather_pd(hi, td, 8)));
    wrong += __builtin_popcount(f) + __builtin_popcount(dl) + __builtin_popcount(dh);
  }
  std::printf("%ld wrong lanes\n", wrong);
  return wrong != 0;
}
"""


def test_table_lookups_by_scalar_loads_equal_the_gathers(tmp_path: Path):
    """Every lane of the loads-based lookups (float and double halves) equals the gather's."""
    if not has_isa("avx512"):
        pytest.skip("this CPU cannot run the avx512 unit (AVX512 F/BW/VL/DQ)")
    if shutil.which("g++") is None:
        pytest.skip("needs g++ on PATH")
    plan = plan_project(ScaffoldOptions(ops=("silu_and_mul",), name="lookup_probe", directory=tmp_path / "k"))
    unit = plan.files["lookup_probe_cpu/lookup_probe_avx512.cpp"]
    assert "kFastGather ? _mm512_i32gather_ps" in unit
    helpers = _helper_definitions(unit, ("lookup8_loads", "lookup4_loads", "vlookup_loads", "vlookup_d_loads"))
    (tmp_path / "lookup.cpp").write_text(_LOOKUP_DRIVER.replace("HELPERS", helpers))
    subprocess.run(["g++", "-std=c++20", "-O2", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "lookup.cpp",
                    "-o", "lookup"], cwd=tmp_path, check=True, capture_output=True, timeout=300)
    run = subprocess.run([str(tmp_path / "lookup")], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and run.stdout.startswith("0 wrong lanes"), run.stdout + run.stderr
