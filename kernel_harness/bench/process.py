"""The parent's handle on a worker process: start, ask, and contain failures.

A worker runs in its own session (process group), so killing it also ends
any thread pool or helper process the kernel started.  Every request has a
deadline (``--timeout``); when it passes, or when the child dies, the worker
is killed and :class:`KernelCrashed` (exit 3) names the timeout or the signal,
with the tail of the child's output.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any

from ..errors import CheckFailed, ExitCode, KernelCrashed, UsageError
from ..paths import PROJECT_ROOT
from . import protocol


#: glibc's malloc adapts its mmap and trim thresholds to each process's history,
#: so two processes can settle in different regimes: one reusing freed pages,
#: the other returning them and page-faulting every large output (a 30 %
#: "speedup" of an identical kernel; eager ops with many large temporaries,
#: like bf16 rms_norm, vary 3x). Fixed thresholds give every timing process the
#: same steady state: freed memory is reused, as in a model's inner loop.
#:
#: The thresholds alone are not enough. PyTorch allocates with
#: posix_memalign(64), for which glibc carves a block a little larger than asked
#: and frees the small remainder behind it into the thread cache (tcache), whose
#: chunks never coalesce. That remainder pins the freed block away from the top
#: of the heap, the next block of the same size is carved from fresh pages, and
#: an 8 MB output page-faults all 2048 of its pages on every call (measured:
#: 12,295 faults in 8 calls of a bf16 rms_norm, ~30 % of its time; 6 with the
#: tcache off). Whether it happens depends on how full the tcache is, i.e. on
#: the process's history, so it also moved from op to op and run to run.
#: Without the tcache the remainder coalesces and the same pages are reused.
STEADY_MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(32 << 20), "MALLOC_TRIM_THRESHOLD_": str(1 << 36)}
#: Appended to GLIBC_TUNABLES (see above); a value the user set for it wins.
STEADY_MALLOC_TUNABLE = ("glibc.malloc.tcache_count", "0")


def _with_tunable(tunables: str, name: str, value: str) -> str:
    """GLIBC_TUNABLES ``tunables`` (``a=1:b=2``) plus ``name=value`` unless it sets ``name``."""
    entries = [entry for entry in tunables.split(":") if entry]
    if any(entry.split("=", 1)[0] == name for entry in entries):
        return tunables
    return ":".join([*entries, f"{name}={value}"])


def with_steady_malloc(env: dict[str, str]) -> dict[str, str]:
    """``env`` plus STEADY_MALLOC_ENV and the tcache tunable (values already set there win)."""
    steady = {**STEADY_MALLOC_ENV, **env}
    steady["GLIBC_TUNABLES"] = _with_tunable(env.get("GLIBC_TUNABLES", ""), *STEADY_MALLOC_TUNABLE)
    return steady


#: OMP_WAIT_POLICY given to every timing worker unless the environment sets one.
OMP_WAIT_POLICY = "PASSIVE"


def worker_env(threads: int, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of every timing worker (kernel, baseline, --against, a refreshed baseline).

    One definition, so a baseline time cached by ``trial_manager.py baseline-us
    --refresh`` is measured under the settings the benchmark later compares it with:
    the allocator steady state (STEADY_MALLOC_ENV), the same thread count for torch
    and for a kernel's own OpenMP, and idle OpenMP threads that sleep instead of
    spinning, so the worker waiting for its next round takes no CPU time from the
    one being timed (with two busy loops on a 2-vCPU machine, spinning idle threads
    made an identical kernel read 0.55x-10.9x; passive, 0.96-1.03x). A wait policy
    the user set wins.
    """
    env = with_steady_malloc(dict(os.environ if base is None else base))
    env["OMP_NUM_THREADS"] = str(threads)
    env.setdefault("OMP_WAIT_POLICY", OMP_WAIT_POLICY)
    return env


def is_steady_malloc(env: dict[str, str]) -> bool:
    """Whether ``env`` already has everything :func:`with_steady_malloc` would add."""
    return with_steady_malloc(env) == env


def signal_name(returncode: int | None) -> str:
    if returncode is None:
        return "still running"
    if returncode < 0:
        try:
            return signal.Signals(-returncode).name
        except ValueError:
            return f"signal {-returncode}"
    return f"exit status {returncode}"


class WorkerProcess:
    """One child running :mod:`kernel_harness.bench.worker`."""

    def __init__(self, role: str, *, timeout: float, env: dict[str, str] | None = None) -> None:
        self.role = role
        self.timeout = timeout
        self._log = tempfile.TemporaryFile(prefix=f"bench-{role}-")
        parent_read, child_write = os.pipe()
        child_read, parent_write = os.pipe()
        child_env = dict(os.environ if env is None else env)
        # the child must import kernel_harness from this checkout, whatever its cwd
        child_env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(PROJECT_ROOT), child_env.get("PYTHONPATH", "")) if p)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "kernel_harness.bench.worker", str(child_read), str(child_write)],
            pass_fds=(child_read, child_write), stdin=subprocess.DEVNULL, stdout=self._log,
            stderr=subprocess.STDOUT, env=child_env, start_new_session=True,
        )
        os.close(child_read)
        os.close(child_write)
        self._read, self._write = parent_read, parent_write
        self.closed = False

    # ------------------------------------------------------------------ failures

    def output_tail(self, lines: int = 15) -> str:
        try:
            self._log.seek(0)
            text = self._log.read().decode("utf-8", errors="replace")
        except (OSError, ValueError):
            return ""
        return "\n".join(text.rstrip().splitlines()[-lines:])

    def kill(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                self.proc.kill()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL does not fail
            pass
        self._close_fds()

    def _close_fds(self) -> None:
        if not self.closed:
            self.closed = True
            for fd in (self._read, self._write):
                try:
                    os.close(fd)
                except OSError:
                    pass


    def _crash(self, what: str, *, timed_out: bool) -> KernelCrashed:
        if timed_out:
            self.kill()
            cause = f"did not finish within --timeout {self.timeout:g} s (hung or far too slow); it was killed"
            kind = "timeout"
        else:
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.kill()
            kind = signal_name(self.proc.returncode)
            cause = f"died with {kind}"
        tail = self.output_tail()
        err = KernelCrashed(
            f"The {self.role} process {cause} during {what}. Nothing was recorded. "
            + (f"Its last output:\n{tail}\n" if tail else "")
            + ("Fix the kernel (run it under gdb or with a debug build to find the fault) and rerun."
               if self.role == "kernel" else "The baseline itself failed; fix the baseline file.")
        )
        err.crash = {"role": self.role, "kind": kind, "during": what}  # type: ignore[attr-defined]
        self.kill()
        return err

    # ------------------------------------------------------------------ requests

    def request(self, kind: str, what: str, **fields: Any) -> dict[str, Any]:
        """Send one request and wait for its reply, at most ``timeout`` seconds."""
        deadline = time.monotonic() + self.timeout
        try:
            protocol.send(self._write, {"kind": kind, **fields}, deadline)
            reply = protocol.receive(self._read, deadline)
        except protocol.ChannelTimeout:
            raise self._crash(what, timed_out=True) from None
        except protocol.ChannelClosed:
            raise self._crash(what, timed_out=False) from None
        if not reply.get("ok"):
            raise self._error(reply, what)
        return reply

    def _error(self, reply: dict[str, Any], what: str) -> Exception:
        code = reply.get("exit_code")
        message = reply["message"]
        if code == int(ExitCode.BAD_INPUT):
            return UsageError(message)
        if code == int(ExitCode.CHECK_FAILED):
            return CheckFailed(message)
        if code == int(ExitCode.KERNEL_CRASHED):
            err = KernelCrashed(f"The --against build could not be loaded: {message}"
                                if self.role == "against" else message)
            err.crash = {"role": self.role, "kind": "could-not-load", "during": what}  # type: ignore[attr-defined]
            return err
        tb = reply.get("traceback", "")
        err = KernelCrashed(
            f"The {self.role} raised an exception during {what}: {message}. "
            + (f"\n{tb}" if tb else "")
            + ("A kernel must run every input set of the baseline; fix it and rerun."
               if self.role == "kernel" else "Fix the baseline file.")
        )
        err.crash = {"role": self.role, "kind": "exception", "during": what}  # type: ignore[attr-defined]
        return err

    def close(self) -> None:
        if self.closed:
            return
        try:
            protocol.send(self._write, {"kind": "exit"}, time.monotonic() + 2)
            self.proc.wait(timeout=5)
        except (protocol.ChannelTimeout, protocol.ChannelClosed, subprocess.TimeoutExpired, OSError):
            pass
        self.kill()
        try:
            self._log.close()
        except OSError:
            pass

    def __enter__(self) -> WorkerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
