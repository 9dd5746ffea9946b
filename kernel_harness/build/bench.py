"""Measure the build: cold build, and rebuild + install after a one-line AVX512 edit.

The issue's target: after a one-line edit of the AVX512 unit, build + install
of the rms_norm kernel in <= 10 s on the 2-core box (a naive single compile
took ~50 s cold).  The edit is a real code change (a new constant each round),
not a comment, because ccache would serve a comment-only edit from its cache
and flatter the number.
"""

from __future__ import annotations

import os
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..buildtoml import load_build_toml
from ..errors import UsageError
from ..paths import SCRIPTS_DIR
from ..validate.isa import flags_level


@dataclass
class BenchResult:
    kernel_dir: str
    avx512_unit: str
    cold_seconds: float
    cold_ccache: bool
    rounds: list[dict[str, float]] = field(default_factory=list)
    install_mode: str = "target"
    compiled_per_round: list[list[str]] = field(default_factory=list)
    cold_cpu_seconds: float = 0.0
    cold_load: float = 0.0

    @property
    def incremental_total_median(self) -> float:
        return statistics.median(r["total"] for r in self.rounds)

    def as_dict(self) -> dict[str, Any]:
        return {
            "kernel_dir": self.kernel_dir,
            "avx512_unit": self.avx512_unit,
            "cold_build_seconds": round(self.cold_seconds, 2),
            "cold_build_ccache": self.cold_ccache,
            "cold_build_cpu_seconds": round(self.cold_cpu_seconds, 2),
            "cold_build_load_average": round(self.cold_load, 2),
            "cpu_count": os.cpu_count(),
            "install_mode": self.install_mode,
            "rounds": [{k: round(v, 2) for k, v in r.items()} for r in self.rounds],
            "incremental_build_install_median_seconds": round(self.incremental_total_median, 2),
            "compiled_per_round": self.compiled_per_round,
            "target_seconds": 10.0,
            "within_target": self.incremental_total_median <= 10.0,
        }


def generate_kernel(op: str, target: Path) -> Path:
    """A fresh kernel from the project's templates (scripts/new_kernel.py)."""
    name = f"bench_{op}"
    proc = subprocess.run(
        [sys.executable, str(SCRIPTS_DIR / "new_kernel.py"), "--op", op, "--name", name, "--dir", str(target)],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise UsageError(f"scripts/new_kernel.py could not generate the {op} kernel: {proc.stderr.strip()[-400:]}")
    return target


def avx512_unit(root: Path) -> str:
    toml = load_build_toml(root / "build.toml")
    for kernel in toml.cpu_kernels:
        if flags_level(kernel.cxx_flags) == 2:
            for src in kernel.src:
                if src.endswith((".cpp", ".cc", ".cxx")):
                    return src
    raise UsageError(f"{root / 'build.toml'} has no AVX512 section with a .cpp source to edit.")


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _build(root: Path, *, ccache: bool) -> tuple[float, list[str]]:
    env = dict(os.environ)
    if not ccache:
        # Recompile everything but keep the ccache launcher in the command lines:
        # dropping it would change every command and make ninja rebuild all units
        # in the first incremental round.
        env["CCACHE_RECACHE"] = "1"
    report = root / "build" / "bench-report.json"
    started = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, str(SCRIPTS_DIR / "build_kernel.py"), "--release", "--json", str(report)],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
    )
    seconds = time.perf_counter() - started
    if proc.returncode != 0:
        raise UsageError(f"The build of {root} failed during the benchmark:\n{proc.stderr[-2000:]}")
    import json

    return seconds, json.loads(report.read_text())["compiled"]


def _install(root: Path, mode: str, target: Path) -> float:
    wheels = sorted((root / "dist").glob("*.whl"))
    if mode == "env":
        from ..config import load_config

        command = load_config().install_command
        started = time.perf_counter()
        proc = subprocess.run(command, shell=True, cwd=root, capture_output=True, text=True)
    else:
        command = shlex.join(
            [sys.executable, "-m", "pip", "install", *map(str, wheels), "--force-reinstall", "--no-deps",
             "--target", str(target), "--upgrade", "-q", "--disable-pip-version-check"]
        )
        started = time.perf_counter()
        proc = subprocess.run(command, shell=True, cwd=root, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if proc.returncode != 0:
        raise UsageError(f"Installing the wheel failed during the benchmark ({command}): {proc.stderr[-1000:]}")
    return seconds


def run_bench(
    *,
    op: str = "rms_norm",
    kernel_dir: Path | None = None,
    rounds: int = 3,
    cold_ccache: bool = False,
    install_mode: str = "target",
    keep: bool = False,
) -> BenchResult:
    work = Path(tempfile.mkdtemp(prefix="kh-bench-"))
    try:
        root = work / "kernel"
        if kernel_dir is not None:
            shutil.copytree(kernel_dir, root, ignore=shutil.ignore_patterns("build", "dist", "__pycache__"))
        else:
            generate_kernel(op, root)
        unit = avx512_unit(root)
        cpu_before = _children_cpu()
        cold, _ = _build(root, ccache=cold_ccache)
        cold_cpu = _children_cpu() - cpu_before
        result = BenchResult(
            kernel_dir=str(kernel_dir or f"generated {op}"),
            avx512_unit=unit,
            cold_seconds=cold,
            cold_ccache=cold_ccache,
            install_mode=install_mode,
            cold_cpu_seconds=cold_cpu,
            cold_load=os.getloadavg()[0],
        )
        target = work / "site"
        _install(root, install_mode, target)  # first install, so later rounds are reinstalls
        stamp = time.time_ns()
        for index in range(rounds):
            path = root / unit
            with path.open("a", encoding="utf-8") as handle:
                # a real code change, unique per round: ccache cannot serve it
                handle.write(f"static volatile int kh_bench_edit_{stamp}_{index} = {index};\n")
            cpu_before = _children_cpu()
            build_s, compiled = _build(root, ccache=True)
            install_s = _install(root, install_mode, target)
            cpu = _children_cpu() - cpu_before
            result.rounds.append(
                {"build": build_s, "install": install_s, "total": build_s + install_s, "cpu": cpu, "load": os.getloadavg()[0]}
            )
            result.compiled_per_round.append(compiled)
        return result
    finally:
        if not keep:
            shutil.rmtree(work, ignore_errors=True)
