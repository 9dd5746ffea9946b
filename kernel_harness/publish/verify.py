"""Prove the stage is loadable and correct, each check in a fresh process.

Three checks, in order, and nothing is uploaded unless all of them pass:

1. ``kernels.get_local_kernel(stage)`` in a new interpreter (exit 3 if it
   fails or crashes: the build is unloadable).
2. ``scripts/benchmark_cpu.py <baseline> --kernel-package <stage> --op ...``,
   the project's only correctness and timing source (exit 1 if incorrect).
3. ``benchmarks/benchmark.py`` through the functions ``kernels benchmark``
   runs for a local checkout, so its ``verify_*`` methods are known to pass
   before anyone downloads it (exit 1 if a verification fails).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import CheckFailed, KernelCrashed, UsageError
from ..paths import PROJECT_ROOT, SCRIPTS_DIR
from .wire import RESULT_PREFIX

BENCHMARK_SCRIPT = SCRIPTS_DIR / "benchmark_cpu.py"
LOAD_TIMEOUT_S = 300
CHECK_TIMEOUT_S = 1800
KERNELS_BENCH_TIMEOUT_S = 900


@dataclass
class Verification:
    """What the checks found; ``lines`` is the human summary the card and report show."""

    load: dict[str, Any] | None = None
    correctness: str = "not run"  # "pass", "fail", "skipped", "not run"
    benchmark: dict[str, Any] | None = None  # benchmark_cpu.py's JSON report
    kernels_benchmark: str = "not run"
    kernels_workloads: dict[str, Any] = field(default_factory=dict)
    lines: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "load": self.load,
            "correctness": self.correctness,
            "benchmark": self.benchmark,
            "kernels_benchmark": self.kernels_benchmark,
            "kernels_workloads": self.kernels_workloads,
            "lines": self.lines,
        }


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PROJECT_ROOT), env.get("PYTHONPATH", "")) if p)
    # The checks must never reach for the network: a local kernel has no Hub dependencies.
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    return env


def _describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with status {code}"


def _tail(text: str, lines: int = 25) -> str:
    kept = [line for line in text.strip().splitlines() if not line.startswith(RESULT_PREFIX)]
    return "\n".join(kept[-lines:])


def run_child(args: list[str], *, timeout: float, what: str) -> dict[str, Any]:
    """Run ``python -m kernel_harness.publish.child ARGS`` in a fresh process; return its JSON."""
    command = [sys.executable, "-m", "kernel_harness.publish.child", *args]
    with tempfile.TemporaryDirectory(prefix="kh-publish-") as cwd:
        try:
            proc = subprocess.run(
                command, cwd=cwd, env=_child_env(), capture_output=True, text=True, timeout=timeout, check=False
            )
        except subprocess.TimeoutExpired as exc:
            raise KernelCrashed(
                f"{what} did not finish within {timeout:.0f} s in a fresh process and was stopped; the kernel "
                "probably hangs while loading or running. Nothing was uploaded."
            ) from exc
    payload: dict[str, Any] | None = None
    for line in proc.stdout.splitlines():
        if line.startswith(RESULT_PREFIX):
            payload = json.loads(line[len(RESULT_PREFIX):])
    if payload is None:
        raise KernelCrashed(
            f"{what} {_describe_exit(proc.returncode)} in a fresh process before reporting a result "
            f"(a crash in the kernel's native code). Nothing was uploaded. Output:\n{_tail(proc.stderr + proc.stdout)}"
        )
    if not payload.get("ok"):
        payload["output"] = _tail(proc.stderr + proc.stdout)
    return payload


def check_loads(stage: Path) -> dict[str, Any]:
    """Check 1: the stage imports with ``kernels.get_local_kernel`` in a fresh process."""
    result = run_child(["load", str(stage)], timeout=LOAD_TIMEOUT_S, what="Loading the staged kernel")
    if not result.get("ok"):
        raise KernelCrashed(
            f"The staged repository {stage} does not load with kernels.get_local_kernel in a fresh process: "
            f"{result.get('error')}. Nothing was uploaded. Rebuild the kernel (scripts/build_kernel.py) and check "
            f"that build/<variant>/ holds metadata.json, __init__.py, _ops.py and the .so.\n{result.get('output', '')}"
        )
    return result


def describe_baseline(baseline: Path) -> dict[str, Any]:
    """The baseline's workloads and dtypes, read in a fresh process."""
    result = run_child(["workloads", str(baseline)], timeout=LOAD_TIMEOUT_S, what="Reading the baseline")
    if not result.get("ok"):
        raise UsageError(
            f"The baseline {baseline} could not be used: {result.get('error')}. It must define get_inputs() "
            f"and get_reference_output() or a Model class.\n{result.get('output', '')}"
        )
    if not result.get("has_reference"):
        raise UsageError(f"The baseline {baseline} defines neither get_reference_output() nor a Model class.")
    return result


def check_correctness(
    stage: Path, baseline: Path, op_path: str, verification: Verification, extra_args: list[str] | None = None
) -> None:
    """Check 2: scripts/benchmark_cpu.py on the staged copy (skipped, and said so, if it is absent)."""
    if not BENCHMARK_SCRIPT.is_file():
        verification.correctness = "skipped"
        verification.lines.append(
            f"Correctness check SKIPPED: {BENCHMARK_SCRIPT} does not exist in this checkout, so "
            "scripts/benchmark_cpu.py could not be run."
        )
        return
    with tempfile.TemporaryDirectory(prefix="kh-publish-check-") as tmp:
        report = Path(tmp) / "check.json"
        command = [
            sys.executable, str(BENCHMARK_SCRIPT), str(baseline),
            "--kernel-package", str(stage), "--op", op_path, "--json", str(report), *(extra_args or []),
        ]  # fmt: skip
        try:
            proc = subprocess.run(
                command, cwd=tmp, env=_child_env(), capture_output=True, text=True,
                timeout=CHECK_TIMEOUT_S, check=False,
            )  # fmt: skip
        except subprocess.TimeoutExpired as exc:
            raise KernelCrashed(
                f"scripts/benchmark_cpu.py on the staged kernel did not finish within {CHECK_TIMEOUT_S} s; "
                "nothing was uploaded."
            ) from exc
        data: dict[str, Any] | None = None
        if report.is_file():
            try:
                data = json.loads(report.read_text(encoding="utf-8"))
            except ValueError:
                data = None
    output = _tail(proc.stdout + proc.stderr)
    shown = " ".join(command[1:])
    if proc.returncode == 0 and data is not None and data.get("correct") is True:
        verification.correctness = "pass"
        verification.benchmark = data
        rule = data.get("acceptance_rule")
        widened = " with widened tolerances" if data.get("widened") else ""
        verification.lines.append(
            f"Correctness: PASS (`scripts/benchmark_cpu.py {baseline.name} --op {op_path}` on the staged copy"
            f"{widened}; acceptance rule: {rule or 'tolerance'}; {len(data.get('input_sets', []))} input sets)."
        )
        return
    verification.correctness = "fail"
    verification.benchmark = data
    if proc.returncode == 1 or (proc.returncode == 0 and data is not None and data.get("correct") is False):
        raise CheckFailed(
            f"The staged kernel is incorrect: `{shown}` reports a mismatch with the baseline. Nothing was uploaded. "
            f"Fix the kernel and rebuild; the mismatch:\n{output}"
        )
    if proc.returncode == 2:
        raise UsageError(f"scripts/benchmark_cpu.py rejected its input (`{shown}`). Nothing was uploaded.\n{output}")
    raise KernelCrashed(
        f"`{shown}` {_describe_exit(proc.returncode)} on the staged kernel. Nothing was uploaded.\n{output}"
    )


def check_kernels_benchmark(stage: Path, verification: Verification, *, iterations: int = 3, warmup: int = 1) -> None:
    """Check 3: benchmarks/benchmark.py through kernels' own local benchmark runner."""
    result = run_child(
        ["kernels-benchmark", str(stage), "--iterations", str(iterations), "--warmup", str(warmup)],
        timeout=KERNELS_BENCH_TIMEOUT_S,
        what="Running benchmarks/benchmark.py with kernels' benchmark runner",
    )
    if not result.get("ok"):
        verification.kernels_benchmark = "fail"
        raise CheckFailed(
            f"benchmarks/benchmark.py fails under kernels' benchmark runner (the code path of "
            f"`kernels benchmark {stage}`): {result.get('error')}. Nothing was uploaded.\n{result.get('output', '')}"
        )
    workloads = result.get("workloads", {})
    failed = [name for name, info in workloads.items() if info.get("verified") is not True]
    verification.kernels_workloads = workloads
    if failed:
        verification.kernels_benchmark = "fail"
        raise CheckFailed(f"benchmarks/benchmark.py: verify_* did not pass for {', '.join(failed)}. Nothing was uploaded.")
    verification.kernels_benchmark = "pass"
    verification.lines.append(
        f"`benchmarks/benchmark.py`: all {len(workloads)} `verify_*` checks pass under the runner of "
        "`kernels benchmark` (torch.allclose with atol=1e-2; elements within 1 % relative count as matching)."
    )
