"""``scripts/check_portability.py``: the package on CPUs this machine is not.

Checks the inputs natively first (cheap, clear exit 2 messages), then runs one
emulated process per CPU model (:mod:`.emulate`) and turns the runs into a
report with tier evidence (:mod:`.evidence`). Exit code: 3 when any run
crashed (SIGILL names the CPU model and the step), 2 for bad input or an
emulation that is not the CPU asked for, 1 when a tier check or an output
failed, 0 when every model loaded the package, offered exactly the declared
tiers it can run, dispatched within them and produced correct outputs.
"""

from __future__ import annotations

import importlib.util
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import UsageError
from ..kernel_loader import kernel_name_from_build_toml
from .emulate import (DEFAULT_TIMEOUT_S, QEMU_PACKAGE_HINT, EmulatedRun, Request, emulate_all,
                      qemu_binary, qemu_version)
from .evidence import emulated_tier_evidence, host_cpu
from .models import models_for
from .resolve import KnownUnits, resolve_units
from .units import kernel_dir_of

SCHEMA_VERSION = 1


@dataclass
class PortabilityOptions:
    kernel_spec: str
    baseline_path: Path
    op_path: str
    cpu: str = "all"
    seed: int | None = None
    seeds: int = 1
    atol: float | None = None
    rtol: float | None = None
    timeout: float = DEFAULT_TIMEOUT_S
    parallel: int = 2


@dataclass
class PortabilityReport:
    options: PortabilityOptions
    seed: int
    qemu: str
    qemu_version: str
    known: KnownUnits
    runs: list[EmulatedRun] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        codes = [r.exit_code for r in self.runs]
        for code in (3, 2, 1):
            if code in codes:
                return code
        return 0

    @property
    def evidence(self) -> list[dict[str, Any]]:
        return emulated_tier_evidence(self.runs, self.known)

    def to_dict(self) -> dict[str, Any]:
        o = self.options
        return {
            "schema_version": SCHEMA_VERSION,
            "kernel_package": o.kernel_spec,
            "op": o.op_path,
            "baseline_file": str(o.baseline_path),
            "seed": self.seed,
            "seeds": o.seeds,
            "widened": {"atol": o.atol, "rtol": o.rtol} if (o.atol or o.rtol) else None,
            "ok": self.exit_code == 0,
            "exit_code": self.exit_code,
            "qemu": {"binary": self.qemu, "version": self.qemu_version},
            "host_cpu": host_cpu(),
            "declared_tiers": [u.to_dict() for u in self.known.units] if self.known.units is not None else None,
            "declared_tiers_note": self.known.reason,
            "unit_hashes": self.known.to_dict(),
            "runs": [r.to_dict() for r in self.runs],
            "tier_evidence": self.evidence,
        }


def preflight(o: PortabilityOptions) -> None:
    """Everything that can be checked without the emulator (each is exit 2 or 3)."""
    if not Path(o.baseline_path).is_file():
        raise UsageError(f"Baseline file {o.baseline_path} does not exist. Pass --baseline the "
                         "baseline.py the benchmark uses.")
    package, _, fn = o.op_path.partition(".")
    if not fn:
        raise UsageError(f"--op {o.op_path!r} must be <package>.<function>, e.g. my_kernel.rms_norm.")
    directory = kernel_dir_of(o.kernel_spec)
    if directory is not None:
        name = kernel_name_from_build_toml(directory)
        if package != name:
            raise UsageError(f"--op {o.op_path!r} names package {package!r} but {directory} is "
                             f"{name!r}; use --op {name}.{fn}.")
        if not any((directory / "build").glob("torch*")):
            raise UsageError(f"{directory} has no build/ variant yet; build it first "
                             "(scripts/build_kernel.py in that directory), then rerun.")
    elif Path(o.kernel_spec).exists():
        raise UsageError(f"{o.kernel_spec} has no build.toml, so it is not a kernel directory. "
                         "Pass the directory that holds build.toml, or an installed package name.")
    elif importlib.util.find_spec(o.kernel_spec.split(".")[0]) is None:
        raise UsageError(f"{o.kernel_spec!r} is neither a kernel directory nor an installed "
                         "package. Pass the kernel directory or install the package.")
    if o.seeds < 0 or o.timeout <= 0:
        raise UsageError("--seeds must be >= 0 and --timeout > 0.")


def check_portability(o: PortabilityOptions) -> PortabilityReport:
    """Run the emulated checks (see the module docstring)."""
    models = models_for(o.cpu)
    preflight(o)
    qemu = qemu_binary()
    if qemu is None:
        raise UsageError(f"qemu-x86_64 is not installed, so no CPU can be emulated; "
                         f"{QEMU_PACKAGE_HINT}, then rerun.")
    seed = o.seed if o.seed is not None else random.SystemRandom().randrange(1, 2**31 - 1)
    known = resolve_units(o.kernel_spec)
    report = PortabilityReport(options=o, seed=seed, qemu=qemu, qemu_version=qemu_version(qemu), known=known)
    declared = [u.tier for u in known.units] if known.units is not None else None
    request = Request(kernel_spec=o.kernel_spec, op_path=o.op_path, baseline_path=Path(o.baseline_path),
                      seed=seed, seeds=o.seeds, atol=o.atol, rtol=o.rtol, timeout=o.timeout)
    report.runs = emulate_all(models, request, declared, qemu=qemu, parallel=o.parallel)
    return report
