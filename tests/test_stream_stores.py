"""Non-temporal output stores chosen by size: bypass_caches_for (cpu_features.hpp) in fp32
rms_norm and layer_norm, and add_rms_norm's updated residual (every dtype) and fp32 output.

A streamed store writes the same bits as an ordinary one, so the outputs cannot tell which path
ran. The tests mutate the streamed pair stores (they add 1 to what they write) to see where they
run: under KERNEL_CPU_FORCE=streamstores on every aligned row, under KERNEL_CPU_MASK=streamstores
nowhere, and by default only once the call's inputs and outputs fill 3/4 of the last-level cache,
whose size the unit reads from sysfs like the machine probe. Unmutated, the forced path must give
the same bits as the ordinary one, tails and unaligned rows included.
"""

from __future__ import annotations

import ctypes
import math
from pathlib import Path

import pytest
import torch

from fixtures_kernels import compile_tier_unit, dtype_code, fresh_copy
from kernel_harness.machine import ASSUMED_LLC_BYTES, last_level_cache_bytes
from kernel_harness.scaffold import ScaffoldOptions, plan_project

PACKAGE = "stream_pkg"
NS = f"{PACKAGE}_cpu"
OPS = ("rms_norm", "layer_norm", "add_rms_norm")
# Tensors of the call's shape each op reads and writes: what the units give bypass_caches_for.
TENSORS_TOUCHED_BY_UNITS = {"rms_norm": 2, "layer_norm": 2, "add_rms_norm": 4}
# The streamed stores, made to write their values plus one: the fp32 (and fp16) pair of two
# vectors, each unit's bf16 pair of one vector of words, and its single bf16 vector (rms_norm's
# row tails and its one-vector streamed path).
PLUS_ONE = "vadd(a, vset1(1.0f)), vadd(b, vset1(1.0f))"
MUTATIONS = {
    tier: {"  store_stream(p, a);\n  store_stream(p + W, b);":
           "  store_stream(p, vadd(a, vset1(1.0f)));\n  store_stream(p + W, vadd(b, vset1(1.0f)));",
           f"_{width}_stream_si{bits}(aligned, bf16_pair_rounded(a, b));":
           f"_{width}_stream_si{bits}(aligned, bf16_pair_rounded({PLUS_ONE}));",
           f"{single}(a, to_bf16(v));": f"{single}(a, to_bf16(vadd(v, vset1(1.0f))));"}
    for tier, width, bits, single in (("avx2", "mm256", 256, "_mm_stream_si128"),
                                      ("avx512", "mm512", 512, "_mm256_stream_si256"))
}


def _wrapper(tier: str) -> str:
    body, dt = f"{NS}::{tier}", f"static_cast<{NS}::DType>(dt)"
    signature = "int dt, void* o, void* o2, const void* x, const void* r, const void* w, const void* b, float eps, " \
                "int64_t rows, int64_t cols"
    return (
        '#include "cpu_features.hpp"\n'
        f'extern "C" void rms_norm({signature}) {{ {body}::rms_norm({dt}, o, x, w, eps, rows, cols); }}\n'
        f'extern "C" void layer_norm({signature}) {{ {body}::layer_norm({dt}, o, x, w, b, eps, rows, cols); }}\n'
        f'extern "C" void add_rms_norm({signature}) {{ {body}::add_rms_norm({dt}, o, o2, x, r, w, eps, rows, cols); }}\n'
        f'extern "C" int64_t llc_bytes() {{ return {NS}::last_level_cache_bytes(); }}\n'
        f'extern "C" int bypass(int64_t bytes) {{ return {NS}::bypass_caches_for(bytes); }}\n'
    )


def _unit(directory: Path, tier: str, edits: dict[str, str] | None = None):
    plan = plan_project(ScaffoldOptions(ops=OPS, name=PACKAGE, directory=directory, force=True))
    lib = compile_tier_unit(plan, PACKAGE, tier, _wrapper(tier), directory, edits=edits)
    return _typed(lib)


def _typed(lib):
    for op in OPS:
        getattr(lib, op).argtypes = [ctypes.c_int, *[ctypes.c_void_p] * 6, ctypes.c_float, ctypes.c_int64,
                                     ctypes.c_int64]
    lib.llc_bytes.restype = ctypes.c_int64
    lib.bypass.argtypes = [ctypes.c_int64]
    return lib


def _fresh(lib, tag: str):
    """lib loaded anew, so that its once-per-process reads of the environment happen again."""
    return _typed(fresh_copy(lib, tag))


def _run(lib, op: str, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The op's outputs (add_rms_norm: the normalised rows and the updated residual, with b as the
    residual's input)."""
    out, out2 = torch.empty_like(x), torch.empty_like(x)
    residual = b.expand_as(x).contiguous()
    getattr(lib, op)(dtype_code(x.dtype), out.data_ptr(), out2.data_ptr(), x.data_ptr(), residual.data_ptr(),
                     w.data_ptr(), b.data_ptr(), 1e-5, x.shape[0], x.shape[1])
    return (out, out2) if op == "add_rms_norm" else (out,)


@pytest.fixture(scope="module")
def units(tmp_path_factory):
    """tier -> (plain unit, mutant unit), compiled once per module on first use."""
    built = {}

    def get(tier: str):
        if tier not in built:
            root = tmp_path_factory.mktemp(f"stream-{tier}")
            built[tier] = (_unit(root / "plain", tier), _unit(root / "mutant", tier, MUTATIONS[tier]))
        return built[tier]

    return get


@pytest.mark.parametrize("tier", ["avx2", "avx512"])
def test_last_level_cache_and_the_bypass_bound(units, tier):
    """The unit reads the same last-level cache size as the probe, and streams from 3/4 of it."""
    plain, _ = units(tier)
    llc, sysfs = plain.llc_bytes(), last_level_cache_bytes() or ASSUMED_LLC_BYTES
    assert llc == sysfs, f"unit read {llc} bytes, sysfs says {sysfs}"
    bound = math.ceil(3 * llc / 4)
    assert plain.bypass(bound) == 1 and plain.bypass(bound - 1) == 0


@pytest.mark.parametrize("tier", ["avx2", "avx512"])
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["fp32", "bf16", "fp16"])
def test_forced_streaming_gives_the_same_bits(units, tier, op, dtype, monkeypatch):
    """Outputs streamed (forced) and not (masked): identical, with rows of a length that is no
    multiple of the block (tails) and rows that start unaligned. 16-bit: add_rms_norm streams its
    updated residual (a bf16 pair as one vector of words, an fp16 pair as two half vectors); the
    other outputs stay as they were."""
    plain, _ = units(tier)
    monkeypatch.setenv("KERNEL_CPU_FORCE", "streamstores")
    forced = _fresh(plain, f"forced-{tier}-{op}-{dtype}")
    monkeypatch.delenv("KERNEL_CPU_FORCE")
    monkeypatch.setenv("KERNEL_CPU_MASK", "streamstores")
    masked = _fresh(plain, f"masked-{tier}-{op}-{dtype}")
    g = torch.Generator().manual_seed(5)
    for rows, cols in ((3, 4096), (7, 300), (5, 37), (64, 1024)):
        x, w, b = (torch.randn(*shape, generator=g).to(dtype) for shape in ((rows, cols), (cols,), (cols,)))
        for got, ref in zip(_run(forced, op, x, w, b), _run(masked, op, x, w, b), strict=True):
            assert torch.equal(got, ref), f"{rows}x{cols}"


def _streamed_rows(lib, plain, op: str, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> list[list[int]]:
    """For each output of the op, the rows the mutant (lib) got wrong: where its streamed stores ran."""
    return [[r for r in range(x.shape[0]) if not torch.equal(got[r], ref[r])]
            for got, ref in zip(_run(lib, op, x, w, b), _run(plain, op, x, w, b), strict=True)]


@pytest.mark.parametrize("tier", ["avx2", "avx512"])
@pytest.mark.parametrize("op", OPS)
def test_stores_stream_where_forced_and_by_size(units, tier, op, monkeypatch):
    """The mutant's fp32 outputs show where the streamed stores ran: every aligned row when
    forced, none when masked or below the bound, every row at the bound (3/4 of the last-level
    cache, counting every tensor the call reads and writes)."""
    plain, mutant = units(tier)
    cols = 4096
    g = torch.Generator().manual_seed(6)
    w, b = torch.randn(cols, generator=g), torch.randn(cols, generator=g)

    def streamed_rows(lib, rows: int) -> list[list[int]]:
        return _streamed_rows(lib, plain, op, torch.randn(rows, cols, generator=g), w, b)

    def every(rows: int) -> list[list[int]]:
        return [list(range(rows))] * (2 if op == "add_rms_norm" else 1)

    none = every(0)
    row_bytes = TENSORS_TOUCHED_BY_UNITS[op] * cols * 4  # read and written
    at_bound = math.ceil(3 * plain.llc_bytes() / 4 / row_bytes)
    if at_bound * row_bytes > 2 << 30:
        pytest.skip(f"a {plain.llc_bytes() >> 20} MiB last-level cache: the call at the bound needs over 2 GiB")
    small = min(8, at_bound - 1)  # below the bound whatever the cache
    assert small >= 1, f"a {plain.llc_bytes()} byte last-level cache: no call of {cols} columns is below the bound"
    assert streamed_rows(_fresh(mutant, f"default-small-{tier}-{op}"), small) == none, "streamed a small call"
    monkeypatch.setenv("KERNEL_CPU_FORCE", "streamstores")
    assert streamed_rows(_fresh(mutant, f"forced-{tier}-{op}"), small) == every(small), "KERNEL_CPU_FORCE=streamstores"
    monkeypatch.delenv("KERNEL_CPU_FORCE")
    by_size = _fresh(mutant, f"by-size-{tier}-{op}")
    assert streamed_rows(by_size, at_bound - 1) == none, f"streamed below the bound ({at_bound - 1} rows)"
    assert streamed_rows(by_size, at_bound) == every(at_bound), f"did not stream at {at_bound} rows"
    monkeypatch.setenv("KERNEL_CPU_MASK", "streamstores")  # read at the unit's first call
    assert streamed_rows(_fresh(mutant, f"masked-{tier}-{op}"), at_bound) == none, "KERNEL_CPU_MASK=streamstores"


@pytest.mark.parametrize("tier", ["avx2", "avx512"])
def test_bf16_streams_only_the_unscreened_residual(units, tier, monkeypatch):
    """bf16 under the force: add_rms_norm's updated residual streams (every row of the mutant
    wrong), its screened output and rms_norm's do not, nor does layer_norm's (fp32 only)."""
    plain, mutant = units(tier)
    monkeypatch.setenv("KERNEL_CPU_FORCE", "streamstores")
    forced = _fresh(mutant, f"forced-bf16-{tier}")
    g = torch.Generator().manual_seed(7)
    x, w, b = (torch.randn(*shape, generator=g).bfloat16() for shape in ((8, 1024), (1024,), (1024,)))
    assert _streamed_rows(forced, plain, "add_rms_norm", x, w, b) == [[], list(range(8))]
    assert _streamed_rows(forced, plain, "rms_norm", x, w, b) == [[]]
    assert _streamed_rows(forced, plain, "layer_norm", x, w, b) == [[]]


# ---- the sweep that re-measures the bound (examples/stream_store_sweep.py) ----

SWEEP = Path(__file__).resolve().parent.parent / "examples" / "stream_store_sweep.py"


def test_sweep_sizes_and_rule_match_the_units():
    """rows_for puts a call at a fraction of the cache; rule_streams is bypass_caches_for's bound."""
    from kernel_harness.bench.stream_stores import rows_for, rule_streams

    from kernel_harness.bench.stream_stores import TENSORS_TOUCHED

    assert TENSORS_TOUCHED == {op: TENSORS_TOUCHED_BY_UNITS[op] for op in OPS}
    llc = 32 << 20
    assert rows_for(1.0, 4096, llc) == 1024 and rows_for(0.75, 4096, llc) == 768 and rows_for(1e-9, 4096, llc) == 1
    assert rows_for(1.0, 4096, llc, tensors=4) == 512
    bound = math.ceil(3 * llc / 4)
    assert rule_streams(bound, llc) and not rule_streams(bound - 1, llc)


def test_sweep_verdicts_need_the_whole_interval_past_one():
    from kernel_harness.bench.stream_stores import SweepPoint

    def point(low, high, rule, mode="same input"):
        return SweepPoint("rms_norm", 8, 4096, mode, 1, 0.5, 1.0, 1.0, (low + high) / 2, low, high, 8, rule)

    assert point(0.7, 0.95, False).verdict == "streams faster" and point(0.7, 0.95, False).rule_disagrees
    assert point(1.05, 1.2, True).verdict == "streams slower" and point(1.05, 1.2, True).rule_disagrees
    assert point(0.9, 1.1, True).verdict == "no measurable difference" and not point(0.9, 1.1, False).rule_disagrees
    assert not point(0.7, 0.95, True).rule_disagrees and point(0.7, 0.95, True).as_json()["verdict"] == "streams faster"
    # rotated inputs: a win below the bound is a gain the rule leaves, not a contradiction; a loss above it is one
    rotated = point(0.7, 0.95, False, "rotated")
    assert rotated.gain_left and not rotated.rule_disagrees and rotated.as_json()["gain_left"]
    assert point(1.05, 1.2, True, "rotated").rule_disagrees and not point(0.7, 0.95, False).gain_left


def test_sweep_times_both_ops_in_both_modes(catalogue_kernel_dir, tmp_path):
    """The script on the session's catalogue package: a point per op and input mode, each with an
    interval and the rule's answer, and the conditions in the JSON."""
    import json
    import subprocess
    import sys

    llc = last_level_cache_bytes() or ASSUMED_LLC_BYTES
    if llc > 256 << 20:
        pytest.skip(f"a {llc >> 20} MiB last-level cache: the rotated inputs (three caches deep) would take "
                    f"{3 * llc >> 20} MiB in each of the sweep's two workers")
    out = tmp_path / "sweep.json"
    run = subprocess.run([sys.executable, str(SWEEP), "--kernel-dir", str(catalogue_kernel_dir), "--fractions", "0.02",
                          "--rounds", "3", "--calls", "2", "--json", str(out)],
                         capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    report = json.loads(out.read_text())
    assert report["llc_bytes"] == (last_level_cache_bytes() or ASSUMED_LLC_BYTES) and report["rule_fraction"] == 0.75
    points = report["points"]
    assert sorted((p["op"], p["mode"]) for p in points) == sorted(
        (op, mode) for op in OPS for mode in ("same input", "rotated"))  # the sweep covers the same ops
    for p in points:
        assert p["rule_streams"] is False and p["ci_low"] <= p["ratio"] <= p["ci_high"] and p["rounds"] == 3
        assert p["verdict"] in ("streams faster", "streams slower", "no measurable difference")


@pytest.mark.parametrize("args, needle", [(["--ops", "softmax"], "--ops softmax"),
                                          (["--fractions", "a,b"], "--fractions a,b"),
                                          (["--fractions", "0.5,nan"], "--fractions 0.5,nan"),
                                          (["--rounds", "2"], "rounds at least 3"),
                                          (["--kernel-dir", "/nonexistent/k"], "has no build/ directory")])
def test_sweep_rejects_bad_usage_in_one_line(args, needle, tmp_path):
    import subprocess
    import sys

    run = subprocess.run([sys.executable, str(SWEEP), *args], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert run.returncode == 2 and needle in run.stderr and "Traceback" not in run.stderr, run.stderr


def test_sweep_workers_differ_only_in_the_streaming_knob():
    """Each worker lists streamstores in its own knob only, whatever the user left set, and keeps
    every other token (a masked instruction set stays masked on both sides)."""
    from kernel_harness.bench.stream_stores import setting_env

    base = {"KERNEL_CPU_FORCE": "streamstores", "KERNEL_CPU_MASK": "avx512bf16,StreamStores", "OTHER": "1"}
    assert setting_env(base, "KERNEL_CPU_FORCE") == {"KERNEL_CPU_FORCE": "streamstores",
                                                     "KERNEL_CPU_MASK": "avx512bf16", "OTHER": "1"}
    assert setting_env(base, "KERNEL_CPU_MASK") == {"KERNEL_CPU_MASK": "avx512bf16,streamstores", "OTHER": "1"}
    assert base["KERNEL_CPU_FORCE"] == "streamstores"  # not modified in place
