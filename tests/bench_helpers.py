"""Shared helpers of tests/test_benchmark*.py: run scripts/benchmark_cpu.py in-process
(its worker children still run for real) or as a subprocess, and read its JSON."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
KERNELS = ROOT / "tests" / "data" / "bench_kernels"
BASELINES = ROOT / "tests" / "data" / "baselines"
SCRIPT = ROOT / "scripts" / "benchmark_cpu.py"
RMS = str(BASELINES / "rms_norm_small.py")
#: few, short rounds: the tests check behaviour, not precision
FAST = ["--rounds", "3", "--calls", "3"]


def load_script():
    if str(SCRIPT.parent) not in sys.path:
        sys.path.insert(0, str(SCRIPT.parent))
    spec = importlib.util.spec_from_file_location("benchmark_cpu_under_test", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(module)
    return module


_SCRIPT = None


def run_bench(tmp_path: Path, *args: str) -> tuple[int, dict[str, Any] | None]:
    """Run the CLI in this process; returns (exit code, JSON report or None)."""
    global _SCRIPT
    if _SCRIPT is None:
        _SCRIPT = load_script()
    out = tmp_path / f"report-{len(list(tmp_path.glob('report-*')))}.json"
    try:
        _SCRIPT.run_main(_SCRIPT.main, [*args, "--json", str(out)])
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    data = json.loads(out.read_text()) if out.exists() else None
    return code, data


def run_bench_subprocess(tmp_path: Path, *args: str, cwd: Path | None = None,
                         prefix: list[str] | None = None,
                         timeout: float = 240) -> tuple[subprocess.CompletedProcess, dict | None]:
    out = tmp_path / "sub-report.json"
    env = dict(os.environ)
    env["PYTHONPATH"] = str(KERNELS)
    proc = subprocess.run([*(prefix or []), sys.executable, str(SCRIPT), *args, "--json", str(out)],
                          capture_output=True, text=True, cwd=cwd or tmp_path, env=env,
                          timeout=timeout)
    data = json.loads(out.read_text()) if out.exists() else None
    return proc, data


def checks(report: dict[str, Any]) -> set[str]:
    return {f["check"] for f in report["failures"]}
