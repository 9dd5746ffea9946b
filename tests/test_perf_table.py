"""The catalogue benchmark's timing loop (kernel_harness.perf_table): side by side, every order in turn."""

from __future__ import annotations

import os
import subprocess
import sys
import types

import pytest
import torch

from conftest import run_script

from kernel_harness.perf_table import interleaved_samples, rounds_for


def test_rounds_time_every_function_and_rotate_through_every_order():
    calls: list[str] = []
    fns = {name: (lambda name=name: calls.append(name)) for name in ("torch", "ours", "floor")}
    samples = interleaved_samples(fns, rounds=6, calls=2)
    # every call timed on its own, grouped by round
    assert {name: [len(r) for r in m.rounds] for name, m in samples.items()} == {
        "torch": [2] * 6, "ours": [2] * 6, "floor": [2] * 6}
    assert all(t >= 0 for m in samples.values() for t in m.times_ns)
    rounds = [calls[i:i + 6:2] for i in range(0, len(calls), 6)]  # each function runs `calls` times in a row
    # six rounds: each of the six orders once, so every function runs in every
    # position twice and right after each other function equally often
    assert len({tuple(r) for r in rounds}) == 6
    for name in fns:
        assert sorted(r.index(name) for r in rounds) == [0, 0, 1, 1, 2, 2]
        after = [r[r.index(name) - 1] for r in rounds if r.index(name) > 0]
        assert sorted(after) == sorted(2 * [other for other in fns if other != name])


def test_rounds_follow_the_time_budget_within_bounds():
    assert rounds_for(0.1, budget_s=6.0) == 60
    assert rounds_for(1.0, budget_s=6.0) == 15  # a slow case still gets the least
    assert rounds_for(0.01, budget_s=6.0) == 75  # a fast one no more than the most
    assert rounds_for(0.0, budget_s=6.0) == 75


def test_speedup_is_the_ratio_of_medians_with_an_interval(monkeypatch):
    """measure() on a fake kernel: the row's speedup is torch's median over ours, the
    interval brackets it, and the floor fraction is ours over the copy."""
    import time as _time

    import kernel_harness.perf_table as pt

    def slow(*_a, **_k):
        _time.sleep(0.002)
        return torch.zeros(4)

    def fast(*_a, **_k):
        _time.sleep(0.0005)
        return torch.zeros(4)

    fake = types.SimpleNamespace(rms_norm=fast, dispatch_tier=lambda *_a: "fake")
    monkeypatch.setattr(pt, "_functions", lambda case, kernel: ([torch.zeros(4)], slow, kernel.rms_norm, 32))
    row = pt.measure(pt.Case("rms_norm", "fp32", 1, 4), fake, rounds=6, calls=3)
    assert row.rounds == 6 and row.tier == "fake"
    assert 2.0 < row.speedup < 5.0  # ~2 ms against ~0.5 ms, whatever the sleep overshoot
    assert row.speedup_ci_low <= row.speedup <= row.speedup_ci_high
    assert row.floor_fraction > 5.0  # a 0.5 ms sleep against copying four floats
    assert row.floor_ci_low <= row.floor_fraction <= row.floor_ci_high
    assert row.floor_bytes == 2 * 4 * 4 and row.floor_in_cache in (True, None)  # four floats, read and written


def test_floor_counts_every_output_and_knows_when_it_fits_the_cache(monkeypatch):
    """The floor's bytes are each output read and written once; against the last-level cache
    (sysfs, as the units read it) they are in cache up to its size, and unknown without it."""
    import kernel_harness.perf_table as pt
    from kernel_harness.machine import CacheLevel, last_level_cache_bytes

    pair = (torch.zeros(1024, 4096), torch.zeros(1024, 4096, dtype=torch.bfloat16))
    assert pt._floor_bytes(pair) == 2 * (1024 * 4096 * 4 + 1024 * 4096 * 2)
    monkeypatch.setattr(pt, "last_level_cache_bytes", lambda: 32 << 20)
    assert pt._fits_cache(32 << 20) is True and pt._fits_cache((32 << 20) + 1) is False
    monkeypatch.setattr(pt, "last_level_cache_bytes", lambda: None)
    assert pt._fits_cache(1) is None
    caches = (CacheLevel(1, "Data", 32 << 10, 1, 64), CacheLevel(1, "Instruction", 32 << 10, 1, 64),
              CacheLevel(2, "Unified", 1 << 20, 1, 64), CacheLevel(3, "Unified", 32 << 20, 2, 64))
    assert last_level_cache_bytes(caches) == 32 << 20
    assert last_level_cache_bytes(caches[:2]) == 32 << 10 and last_level_cache_bytes(caches[1:2]) is None


@pytest.mark.parametrize("flag", [("--rounds", "0"), ("--seconds-per-case", "-1")])
def test_bench_catalogue_rejects_bad_counts_before_building(tmp_path, flag):
    result = run_script("bench_catalogue", *flag, "--kernel-dir", tmp_path / "k", cwd=tmp_path)
    assert result.returncode == 2
    assert flag[0] in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "k").exists()  # nothing generated or built


def test_tier_plan_measures_what_the_package_runs_and_explains_the_rest(monkeypatch):
    """--tier all times every tier the package runs here; a tier it lacks is listed with the missing flags."""
    from kernel_harness.perf_table import tier_plan

    monkeypatch.setenv("KERNEL_HARNESS_CPU_FLAGS", "avx2 fma f16c avx512f avx512cd")
    plan = tier_plan("all", ["generic", "avx2"])
    assert plan.measured == ("generic", "avx2")
    assert plan.not_measured == {"avx512": "this CPU lacks avx512bw, avx512dq, avx512vl"}
    assert tier_plan("avx2", ["generic", "avx2"]).measured == ("avx2",)
    lacking = tier_plan("avx512", ["generic", "avx2"])
    assert lacking.measured == () and "avx512vl" in lacking.not_measured["avx512"]
    assert tier_plan("auto", ["generic"]).measured == ("auto",)
    # the CPU has the flags but the package was generated without the tier
    monkeypatch.setenv("KERNEL_HARNESS_CPU_FLAGS", "avx2 fma f16c")
    assert "package" in tier_plan("avx2", ["generic"]).not_measured["avx2"]
    with pytest.raises(ValueError, match="sse4"):
        tier_plan("sse4", ["generic"])


def test_forced_tier_sets_and_restores_the_dispatcher_knob(monkeypatch):
    import os

    from kernel_harness.perf_table import ISA_ENV, forced_tier

    monkeypatch.setenv(ISA_ENV, "generic")
    with forced_tier("avx2"):
        assert os.environ[ISA_ENV] == "avx2"
    with forced_tier("auto"):
        assert ISA_ENV not in os.environ
    assert os.environ[ISA_ENV] == "generic"


def test_every_catalogue_op_has_a_headline_case_in_both_dtypes():
    from kernel_harness.perf_table import DEFAULT_CASES, OPS, select_cases
    from kernel_harness.scaffold import CATALOGUE

    assert set(OPS) <= set(CATALOGUE)
    assert {(c.op, c.dtype) for c in DEFAULT_CASES} >= {(op, dt) for op in OPS for dt in ("fp32", "bf16")}
    assert {c.op for c in select_cases(["softmax", "layer_norm"])} == {"softmax", "layer_norm"}
    with pytest.raises(ValueError, match="nope"):
        select_cases(["nope"])


def test_bench_catalogue_rejects_an_unknown_op_before_building(tmp_path):
    result = run_script("bench_catalogue", "--ops", "rms_norm,nope", "--kernel-dir", tmp_path / "k", cwd=tmp_path)
    assert result.returncode == 2
    assert "--ops" in result.stderr and "nope" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "k").exists()


def test_eager_isa_cap_leaves_native_alone_and_caps_aten_and_onednn_at_avx2():
    from kernel_harness.perf_table import eager_isa_environment

    base = {"PATH": "/bin", "ATEN_CPU_CAPABILITY": "avx512"}
    assert eager_isa_environment(base, "native") == base
    capped = eager_isa_environment(base, "avx2")
    assert capped["ATEN_CPU_CAPABILITY"] == "avx2" and capped["ONEDNN_MAX_CPU_ISA"] == "AVX2"
    assert capped["PATH"] == "/bin" and base["ATEN_CPU_CAPABILITY"] == "avx512"  # a copy, not an edit
    with pytest.raises(ValueError, match="avx9"):
        eager_isa_environment(base, "avx9")


def test_the_capped_environment_runs_eager_on_avx2():
    """What --eager-isa avx2 relies on: torch started with that environment reports AVX2 kernels."""
    import os
    import subprocess
    import sys

    from kernel_harness.cpu import has_isa
    from kernel_harness.perf_table import eager_isa_environment

    if not has_isa("avx2"):
        pytest.skip("this CPU lacks AVX2")
    env = eager_isa_environment(dict(os.environ), "avx2")
    out = subprocess.run([sys.executable, "-c", "import torch; print(torch.backends.cpu.get_cpu_capability())"],
                         env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "AVX2"


def test_bench_catalogue_with_an_eager_cap_starts_once_and_still_checks_its_flags(tmp_path):
    # the script runs itself again with the cap set: it must not loop, and a bad
    # flag is still refused (exit 2) before anything is built
    result = run_script("bench_catalogue", "--eager-isa", "avx2", "--ops", "nope", "--kernel-dir", tmp_path / "k",
                        cwd=tmp_path)
    assert result.returncode == 2
    assert "--ops" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "k").exists()


def test_console_gives_logs_the_room_their_tables_need():
    """Captured output (an agent's log) once came out 80 columns wide, which cut the
    benchmark tables' intervals to "7.58-…": a console on a pipe is LOG_WIDTH wide,
    and COLUMNS still decides where it is set."""
    probe = "from kernel_harness.cli import console, LOG_WIDTH; print(console.width, LOG_WIDTH)"
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, check=True)
    width, log_width = map(int, out.stdout.split())
    assert width == log_width >= 120
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         env={**env, "COLUMNS": "100"}, check=True)
    assert int(out.stdout.split()[0]) == 100
