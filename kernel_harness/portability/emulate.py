"""Running the package's checks inside ``qemu-x86_64 -cpu <model>`` and judging them.

One emulated process per CPU model (see :mod:`.child`). The parent decides:

* the run crashed: QEMU died of a signal (SIGILL is an instruction the
  emulated CPU lacks: an AVX512 or AVX2 instruction in the dispatcher, a static
  initialiser or a tier the dispatcher should not have chosen), the child hit
  its timeout, or the kernel could not be loaded -> exit 3;
* the emulation is not the CPU asked for (torch's capability differs) -> the
  run proves nothing -> exit 2;
* ``available_tiers()`` is not exactly the declared tiers this model has, a
  dispatch chose a tier outside them, or an output failed the correctness
  rules -> exit 1.

QEMU is optional (Debian's ``qemu-user``, installed by
``tools/install_system_packages.sh`` when root): without it
:func:`qemu_binary` is None and the caller says how to install it.
"""

from __future__ import annotations

import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..paths import PROJECT_ROOT
from .models import CpuModel

QEMU_ENV_VAR = "KERNEL_HARNESS_QEMU"
QEMU_PACKAGE_HINT = ("install Debian's qemu-user (as root: apt-get install -y qemu-user; "
                     "tools/install_system_packages.sh does it)")
#: Under emulation ``import torch`` takes ~30-40 s and each call is 10-100x
#: slower than native; ten minutes covers the catalogue's correctness sets on
#: a busy 2-core machine with room to spare.
DEFAULT_TIMEOUT_S = 900.0
_TCG_WARNING = re.compile(r"^qemu-x86_64: warning: TCG doesn't support requested feature.*$\n?",
                          re.MULTILINE)
#: Environment the kernel must not inherit: the run must see the emulated CPU
#: as it is, not a mask or a forced tier left over from the caller.
_SCRUBBED_ENV = ("KERNEL_CPU_ISA", "KERNEL_CPU_MASK", "KERNEL_HARNESS_CPU_FLAGS")


def qemu_binary() -> str | None:
    """The ``qemu-x86_64`` to use (``$KERNEL_HARNESS_QEMU`` overrides), or None."""
    override = os.environ.get(QEMU_ENV_VAR)
    if override:
        return override if Path(override).is_file() else None
    return shutil.which("qemu-x86_64")


def qemu_version(binary: str) -> str:
    try:
        out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    match = re.search(r"version\s+(\S+)", out.stdout)
    return match.group(1) if match else "unknown"


@dataclass
class Outcome:
    """How one emulated process ended."""

    returncode: int | None  # None: killed at the timeout
    stdout: str
    stderr: str
    seconds: float

    @property
    def signal(self) -> str | None:
        """The signal that killed the guest (QEMU re-raises it on itself), or None."""
        if self.returncode is not None and self.returncode < 0:
            try:
                return signal.Signals(-self.returncode).name
            except ValueError:
                return f"signal {-self.returncode}"
        match = re.search(r"uncaught target signal (\d+)", self.stderr)
        if match:
            try:
                return signal.Signals(int(match.group(1))).name
            except ValueError:
                return f"signal {match.group(1)}"
        return None


def _no_core_dumps() -> None:
    # QEMU writes qemu_<prog>_<date>_<pid>.core into the working directory when a
    # guest dies of a signal; a crash report must not leave 100 MB behind
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    os.setsid()  # so a timeout can kill the whole group


def run_emulated(model: CpuModel, argv: list[str], *, timeout: float, env: dict[str, str] | None = None,
                 cwd: Path | None = None, qemu: str | None = None) -> Outcome:
    """Run ``argv`` (an x86-64 program and its arguments) under ``qemu-x86_64 -cpu <model>``."""
    binary = qemu or qemu_binary()
    if binary is None:
        raise FileNotFoundError(f"qemu-x86_64 is not installed; {QEMU_PACKAGE_HINT}")
    start = time.monotonic()
    proc = subprocess.Popen([binary, "-cpu", model.qemu_name, *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=cwd,
                            preexec_fn=_no_core_dumps)
    try:
        out, err = proc.communicate(timeout=timeout)
        code: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        code = None
    return Outcome(code, out, _TCG_WARNING.sub("", err), time.monotonic() - start)


# --------------------------------------------------------------------------- one model


@dataclass
class EmulatedRun:
    """Everything one emulated CPU showed about the package."""

    model: CpuModel
    expected_tiers: list[str] | None  # None: the package's declared tiers are unknown
    outcome: Outcome | None = None
    result: dict[str, Any] = field(default_factory=dict)
    progress: str = ""
    crash: str | None = None  # exit 3
    emulation_problem: str | None = None  # exit 2
    problems: list[str] = field(default_factory=list)  # exit 1

    @property
    def ok(self) -> bool:
        return not (self.crash or self.emulation_problem or self.problems)

    @property
    def exit_code(self) -> int:
        if self.crash:
            return 3
        if self.emulation_problem:
            return 2
        return 1 if self.problems else 0

    @property
    def available_tiers(self) -> list[str] | None:
        return self.result.get("available_tiers")

    @property
    def checks(self) -> list[dict[str, Any]]:
        return list(self.result.get("checks", []))

    @property
    def dispatch(self) -> list[dict[str, Any]]:
        return list(self.result.get("dispatch", []))

    def to_dict(self) -> dict[str, Any]:
        checks = self.checks
        return {
            "cpu": self.model.key,
            "qemu_model": self.model.qemu_name,
            "label": self.model.label,
            "description": self.model.description,
            "expected_tiers": self.expected_tiers,
            "available_tiers": self.available_tiers,
            "torch_capability": self.result.get("torch_capability"),
            "expected_torch_capability": self.model.torch_capability,
            "dispatch": self.dispatch,
            "checks": checks,
            "checks_passed": sum(1 for c in checks if c.get("correct")),
            "ok": self.ok,
            "exit_code": self.exit_code,
            "crash": self.crash,
            "emulation_problem": self.emulation_problem,
            "problems": self.problems,
            "seconds": round(self.outcome.seconds, 1) if self.outcome else None,
            "progress_tail": self.progress.strip().splitlines()[-12:],
        }


@dataclass(frozen=True)
class Request:
    kernel_spec: str
    op_path: str
    baseline_path: Path
    seed: int
    seeds: int = 1
    atol: float | None = None
    rtol: float | None = None
    timeout: float = DEFAULT_TIMEOUT_S


def _child_env(model: CpuModel) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _SCRUBBED_ENV}
    if model.openblas_core:  # see CpuModel.openblas_core
        env["OPENBLAS_CORETYPE"] = model.openblas_core
    # the child must import *this* kernel_harness (the venv may hold another checkout)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PROJECT_ROOT), env.get("PYTHONPATH")) if p)
    env["OMP_NUM_THREADS"] = "1"  # threads only multiply the emulation's cost
    env["PYTHONUNBUFFERED"] = "1"
    return env


def emulate(model: CpuModel, request: Request, expected_tiers: list[str] | None,
            *, qemu: str | None = None) -> EmulatedRun:
    """Run the checks for ``request`` on one emulated CPU and judge them."""
    run = EmulatedRun(model=model, expected_tiers=expected_tiers)
    with tempfile.TemporaryDirectory(prefix=f"kh-qemu-{model.key}-") as tmp:
        work = Path(tmp)
        spec = request.kernel_spec
        if Path(spec).exists():  # a directory: absolute, since the child runs elsewhere
            spec = str(Path(spec).resolve())
        payload = {"kernel_spec": spec, "op_path": request.op_path,
                   "baseline_path": str(Path(request.baseline_path).resolve()),
                   "seed": request.seed, "seeds": request.seeds, "atol": request.atol,
                   "rtol": request.rtol, "result_path": str(work / "result.json"),
                   "progress_path": str(work / "progress.log")}
        (work / "request.json").write_text(json.dumps(payload), encoding="utf-8")
        argv = [sys.executable, "-m", "kernel_harness.portability.child", str(work / "request.json")]
        run.outcome = run_emulated(model, argv, timeout=request.timeout, env=_child_env(model),
                                   cwd=work, qemu=qemu)
        run.progress = _read(work / "progress.log")
        if (work / "result.json").is_file():
            run.result = json.loads((work / "result.json").read_text(encoding="utf-8"))
    judge(run)
    return run


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def _last_step(progress: str) -> str:
    lines = [ln for ln in progress.splitlines() if ln.startswith("[")]
    return lines[-1].split("] ", 1)[-1] if lines else "starting Python"


def judge(run: EmulatedRun) -> None:
    """Fill ``crash``, ``emulation_problem`` and ``problems`` from the outcome and result."""
    out, model = run.outcome, run.model
    assert out is not None
    cpu = f"the emulated {model.qemu_name} CPU ({model.description})"
    if out.returncode is None:
        run.crash = (f"the run on {cpu} did not finish within its timeout; it hung while "
                     f"{_last_step(run.progress)}")
        return
    sig = out.signal
    if sig is not None:
        what = "an illegal instruction (SIGILL)" if sig == "SIGILL" else sig
        run.crash = (f"{what} on {cpu} while {_last_step(run.progress)}: the package executes an "
                     "instruction this CPU does not have")
        if sig == "SIGILL":
            run.crash += (" (an AVX512/AVX2 instruction in the dispatcher, a static initialiser, "
                          "the generic unit or a tier chosen without checking the CPU)")
        return
    error = run.result.get("error")
    if error:
        text = f"{error['message']} (while {error.get('step', 'starting')} on {cpu})"
        if error.get("exit_code") == 3:
            run.crash = text
        else:
            run.emulation_problem = text
        return
    if out.returncode != 0 or not run.result:
        tail = (out.stderr.strip() or run.progress.strip())[-1500:]
        run.crash = f"the emulated process on {cpu} exited with {out.returncode}: {tail}"
        return
    capability = run.result.get("torch_capability")
    if capability != model.torch_capability:
        run.emulation_problem = (
            f"torch sees CPU capability {capability} under qemu -cpu {model.qemu_name}, expected "
            f"{model.torch_capability}: the emulator is not emulating that CPU, so this run "
            "proves nothing about it. Check the qemu-x86_64 binary (KERNEL_HARNESS_QEMU).")
        return
    _judge_tiers(run, cpu)
    _judge_calls(run)


def _judge_tiers(run: EmulatedRun, cpu: str) -> None:
    available = run.available_tiers
    if available is None:
        run.problems.append("the package exposes no available_tiers(), so which tiers run on "
                            f"{cpu} cannot be checked")
        return
    if run.expected_tiers is not None and available != run.expected_tiers:
        run.problems.append(
            f"available_tiers() is {available} on {cpu}, expected {run.expected_tiers} (the "
            "declared tiers this CPU can run): the CPU feature detection is wrong")
    beyond = [t for t in available if t not in run.model.tiers]
    if beyond and run.expected_tiers is None:
        run.problems.append(f"available_tiers() offers {beyond} on {cpu}, which lacks them")
    for entry in run.dispatch:
        if entry["tier"] not in available or entry["tier"] not in run.model.tiers:
            run.problems.append(f"dispatch_tier chose {entry['tier']} for {entry['input_set']} on "
                                f"{cpu}, which can run only {available}")


def _judge_calls(run: EmulatedRun) -> None:
    for check in run.checks:
        if check.get("correct"):
            continue
        where = f"tier {check['tier']}, {check['input_set']}"
        if check.get("error"):
            run.problems.append(f"{where}: the op raised {check['error']}")
            continue
        for failure in check.get("failures", []):
            run.problems.append(f"{where}: {failure.get('path')}: {failure.get('message')} "
                                f"({failure.get('diagnosis')})")


def emulate_all(models: list[CpuModel], request: Request, declared: list[str] | None,
                *, qemu: str | None = None, parallel: int = 2) -> list[EmulatedRun]:
    """One emulated run per model, ``parallel`` at a time (each is one busy core)."""

    def one(model: CpuModel) -> EmulatedRun:
        expected = None if declared is None else [t for t in model.tiers if t in declared]
        return emulate(model, request, expected, qemu=qemu)

    with ThreadPoolExecutor(max_workers=max(1, min(parallel, len(models)))) as pool:
        return list(pool.map(one, models))
