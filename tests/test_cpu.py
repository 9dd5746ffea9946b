"""kernel_harness.cpu: ISA flags and tiers, never assuming the CPU the tests run on."""

from __future__ import annotations

import pytest

from kernel_harness import cpu


def test_parse_flags_reads_the_first_flags_line() -> None:
    text = "processor\t: 0\nflags\t\t: fpu sse avx2 fma f16c avx512f\nprocessor\t: 1\nflags\t\t: fpu\n"
    assert cpu._parse_flags(text) == frozenset({"fpu", "sse", "avx2", "fma", "f16c", "avx512f"})


def test_parse_flags_without_flags_line_is_empty() -> None:
    assert cpu._parse_flags("processor: 0\n") == frozenset()


def test_env_override_simulates_an_avx2_only_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(cpu.FLAGS_ENV_VAR, "sse avx2 fma f16c")
    assert cpu.has_isa("generic")
    assert cpu.has_isa("avx2")
    assert not cpu.has_isa("avx512")
    assert not cpu.has_isa("amx")
    assert cpu.supported_tiers() == ["generic", "avx2"]
    assert "avx512f" in cpu.missing_flags("avx512")
    assert "avx512" in cpu.skip_reason("avx512")


def test_avx512_needs_every_listed_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    full = {"avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq"}
    monkeypatch.setenv(cpu.FLAGS_ENV_VAR, ",".join(full))
    assert cpu.supported_tiers() == ["generic", "avx2", "avx512"]  # Skylake-SP, Ice Lake: no AVX512-BF16 needed
    for flag in ("avx512bw", "avx512vl", "avx512dq"):
        monkeypatch.setenv(cpu.FLAGS_ENV_VAR, ",".join(full - {flag}))
        assert cpu.supported_tiers() == ["generic", "avx2"], flag


def test_generic_only_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(cpu.FLAGS_ENV_VAR, "")
    assert cpu.supported_tiers() == ["generic"]


def test_unknown_tier_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="unknown ISA tier 'avx1024'"):
        cpu.has_isa("avx1024")


def test_real_cpu_flags_are_consistent(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(cpu.FLAGS_ENV_VAR, raising=False)
    tiers = cpu.supported_tiers()
    assert tiers[0] == "generic"
    # tiers are ordered and downward closed: avx512 implies avx2 on every real CPU we target
    if "avx512" in tiers:
        assert "avx2" in tiers
    assert all(cpu.has_isa(t) for t in tiers)
