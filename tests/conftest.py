"""Shared test helpers: running the scripts as a user would, and shared fixtures."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

PROJECT_ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = PROJECT_ROOT / "scripts"

try:  # the catalogue kernel, generated and built once per session (see fixtures_kernels.py)
    from fixtures_kernels import *  # noqa: F401,F403
except ImportError:  # pragma: no cover - only while the fixture module does not exist
    pass


@pytest.fixture(autouse=True)
def _no_tier_forced_by_an_earlier_test(monkeypatch):
    """Every test starts with the dispatcher's own choice: a KERNEL_CPU_ISA / KERNEL_CPU_MASK
    left in os.environ by an earlier test (some write it directly inside a monkeypatched
    one) would reach the scripts this test runs and force or refuse a tier there (a
    publish check failed so in the full suite, never alone)."""
    monkeypatch.delenv("KERNEL_CPU_ISA", raising=False)
    monkeypatch.delenv("KERNEL_CPU_MASK", raising=False)
    monkeypatch.delenv("KERNEL_CPU_FORCE", raising=False)


def run_script(name: str, *args: str, cwd: Path, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run ``python scripts/<name>.py`` from ``cwd`` exactly as the procedure does."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, str(SCRIPTS / f"{name}.py"), *map(str, args)],
        cwd=cwd,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture
def script():
    return run_script


@pytest.fixture
def bench_kernels(monkeypatch):
    """The test kernels of tests/data/bench_kernels importable in this process (run_bench
    runs the CLI here) and in the benchmark's worker processes (PYTHONPATH)."""
    kernels = PROJECT_ROOT / "tests" / "data" / "bench_kernels"
    monkeypatch.setenv("PYTHONPATH", str(kernels))
    monkeypatch.syspath_prepend(str(kernels))
