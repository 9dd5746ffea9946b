"""Software prefetches survive compilation.

GCC 12 at -O2/-O3 deletes calls to a helper whose only effect is
``__builtin_prefetch`` in a loop: it finds the helper "looping const", assumes
the loop ends (C++'s -ffinite-loops) and drops the call as having no effect.
The units' prefetch helpers (``templates/project/cpu/tiers.hpp.in``) held no
instruction at all that way, whatever the knobs said, and every measurement of
a prefetch knob compared a build with itself. These tests look at the machine
code, not at timings.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from kernel_harness.build.machine_code import prefetch_counts
from kernel_harness.scaffold import ScaffoldOptions, plan_project

PROBE = "pf_probe"

# One extern "C" function per helper, each with the arguments an op's loop passes.
WRAPPERS = """
using namespace pf_probe_cpu;
extern "C" void probe_output(const char* p) { prefetch_output(p, 2048, 32); }
extern "C" void probe_input(const char* p) { prefetch_input(p, 1024, 64); }
extern "C" void probe_input_l2(const char* p, long ahead) { prefetch_input_l2(p, ahead, 64); }
extern "C" void probe_lines(const char* p, long bytes) { prefetch_lines<0>(p, bytes); }
extern "C" void probe_ahead_runtime(const char* p, long ahead) { prefetch_ahead<1>(p, ahead, 64); }
// An op's own helper around them (decode_attention's da_prefetch_row is one): it is
// deleted as "looping const" too unless the helpers carry a side effect.
static inline void op_helper(const char* k, const char* v, long key, long end, long row) {
  if (key + 8 < end) {
    prefetch_lines<0>(k + (key + 8) * row, row);
    prefetch_lines<0>(v + (key + 8) * row, row);
  }
}
extern "C" void probe_op_helper(const char* k, const char* v, long key, long end) { op_helper(k, v, key, end, 256); }
"""


def _function_bodies(assembly: str) -> dict[str, str]:
    """Each global function's assembly text, by name (GCC's ``name:`` ... ``.cfi_endproc``)."""
    bodies = {}
    for match in re.finditer(r"^(\w+):\n(.*?)\.cfi_endproc", assembly, flags=re.S | re.M):
        bodies[match.group(1)] = match.group(2)
    return bodies


@pytest.mark.parametrize("level", ["-O2", "-O3"])
def test_every_prefetch_helper_emits_a_prefetch_instruction(tmp_path: Path, level: str):
    plan = plan_project(ScaffoldOptions(ops=("rms_norm",), name=PROBE, directory=tmp_path / "k", force=True))
    (tmp_path / f"{PROBE}_tiers.hpp").write_text(plan.files[f"{PROBE}_cpu/{PROBE}_tiers.hpp"])
    (tmp_path / "probe.cpp").write_text(f'#include "{PROBE}_tiers.hpp"\n{WRAPPERS}')
    assembly = subprocess.run(["g++", "-std=c++20", level, "-mavx2", "-fopenmp", "-S", "-o", "-", "probe.cpp"],
                              cwd=tmp_path, check=True, capture_output=True, text=True, timeout=120).stdout
    bodies = _function_bodies(assembly)
    for name in ("probe_output", "probe_input", "probe_input_l2", "probe_lines", "probe_ahead_runtime",
                 "probe_op_helper"):
        assert name in bodies, f"{name} missing from the assembly"
        assert "prefetch" in bodies[name], f"{name} at {level} holds no prefetch instruction:\n{bodies[name]}"
    assert "prefetcht1" in bodies["probe_input_l2"], "prefetch_input_l2 must ask for L2, not L1 (prefetcht1)"


@pytest.mark.skipif(shutil.which("objdump") is None, reason="objdump (binutils) is not installed")
def test_the_built_catalogue_units_hold_prefetch_instructions(catalogue_kernel_dir: Path):
    # Both units are compiled whatever this CPU runs, and the catalogue's rms_norm,
    # softmax and layer_norm prefetch their outputs by default.
    libraries = sorted(catalogue_kernel_dir.glob("build/torch*/**/*.so"))
    assert libraries, f"no built library under {catalogue_kernel_dir}/build"
    counts = prefetch_counts(libraries[0])  # what build_kernel.py reports
    assert counts is not None and counts["avx2"] > 0 and counts["avx512"] > 0, counts


def test_the_count_is_cached_until_the_library_changes(tmp_path: Path, monkeypatch):
    """A no-op rebuild (the library copied with its timestamp) reuses the recorded count
    instead of running objdump again; a relinked library, or a broken cache, is counted anew."""
    from kernel_harness.build import machine_code

    calls = []
    monkeypatch.setattr(machine_code, "prefetch_counts",
                        lambda library: calls.append(library) or {"avx2": 1, "avx512": 2, "other": len(calls)})
    library, cache = tmp_path / "kernel.so", tmp_path / "prefetch_counts.json"
    library.write_bytes(b"\x7fELF one")
    first = machine_code.cached_prefetch_counts(library, cache)
    assert machine_code.cached_prefetch_counts(library, cache) == first and len(calls) == 1
    library.write_bytes(b"\x7fELF relinked, longer")
    assert machine_code.cached_prefetch_counts(library, cache)["other"] == 2 and len(calls) == 2
    cache.write_text("{not json")
    assert machine_code.cached_prefetch_counts(library, cache)["other"] == 3
    assert machine_code.cached_prefetch_counts(tmp_path / "missing.so", cache) is None
