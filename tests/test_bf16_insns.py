"""The avx512 unit's AVX512-BF16 instructions: volatile asm that must mean what the intrinsics mean.

The generated avx512 unit runs on every CPU with AVX512 F/BW/VL/DQ, so it is
built without ``-mavx512bf16`` and spells VCVTNEPS2BF16, VCVTNE2PS2BF16 and
VDPBF16PS as volatile asm (an intrinsic behind ``if (kBf16)`` was executed
speculatively by GCC 12: SIGILL on an Ice Lake). Hand-written operand order is
easy to get backwards and this machine may not have AVX512-BF16 to run it, so
the helpers are compared instruction by instruction, operands included, with
what the intrinsics compile to: on any machine with g++ and objdump.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from kernel_harness.scaffold import ScaffoldOptions, plan_project

#: helper -> (C signature, the intrinsic expression it must equal)
HELPERS = {
    "bf16_cvt_insn": ("__m256i {name}(__m512 v)", "(__m256i)_mm512_cvtneps_pbh(v)", "v"),
    "bf16_cvt2_insn": ("__m512i {name}(__m512 lo, __m512 hi)", "(__m512i)_mm512_cvtne2ps_pbh(hi, lo)", "lo, hi"),
    "bf16_dot_insn": ("__m512 {name}(__m512 acc, __m512i a, __m512i b)",
                      "_mm512_dpbf16_ps(acc, (__m512bh)a, (__m512bh)b)", "acc, a, b"),
}


def _helper_definitions(unit_text: str) -> str:
    """The unit's own definitions of the helpers, cut from the generated source."""
    found = []
    for name in HELPERS:
        match = re.search(rf"^inline [\w_]+ {name}\(.*?^}}\n", unit_text, re.MULTILINE | re.DOTALL)
        assert match, f"{name} is not defined in the generated avx512 unit"
        found.append(match.group(0))
    return "\n".join(found)


def _instructions(objdump: str, function: str) -> list[str]:
    body = re.search(rf"<{function}>:\n(.*?)(?:\n\n|\Z)", objdump, re.DOTALL)
    assert body, function
    lines = [line.split("\t", 1)[-1].strip() for line in body.group(1).splitlines() if "\t" in line]
    return [insn for insn in lines if not insn.startswith(("nop", "xchg   %ax,%ax", "data16", "cs nop"))]


def test_bf16_asm_helpers_compile_to_the_intrinsics_instructions(tmp_path: Path):
    if shutil.which("g++") is None or shutil.which("objdump") is None:
        pytest.skip("needs g++ and objdump (binutils) on PATH")
    plan = plan_project(ScaffoldOptions(ops=("rms_norm",), name="bf16_probe", directory=tmp_path / "k"))
    unit = plan.files["bf16_probe_cpu/bf16_probe_avx512.cpp"]
    assert "kBf16 = bf16_instructions()" in unit
    source = ["#include <immintrin.h>", "using V = __m512;", _helper_definitions(unit)]
    for name, (signature, intrinsic, args) in HELPERS.items():
        source.append(f'extern "C" {signature.format(name="asm_" + name)} {{ return {name}({args}); }}')
        source.append(f'extern "C" {signature.format(name="intr_" + name)} {{ return {intrinsic}; }}')
    (tmp_path / "probe.cpp").write_text("\n".join(source) + "\n")
    subprocess.run(["g++", "-std=c++20", "-O2", "-c", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq",
                    "-mavx512bf16", "probe.cpp", "-o", "probe.o"], cwd=tmp_path, check=True, capture_output=True,
                   timeout=300)
    dump = subprocess.run(["objdump", "-d", "--no-show-raw-insn", "probe.o"], cwd=tmp_path, check=True,
                          capture_output=True, text=True).stdout
    for name in HELPERS:
        ours, theirs = _instructions(dump, "asm_" + name), _instructions(dump, "intr_" + name)
        assert ours == theirs, f"{name}: {ours} != {theirs}"
        assert any(re.match(r"v(cvtne2?ps2bf16|dpbf16ps) ", insn) for insn in ours), ours
