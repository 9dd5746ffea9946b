"""The task that runs one benchmark on a node that holds the slot.

It unpacks the shipped kernel directory and baseline (with the .py files
beside it) into a temporary
directory, and runs this node's own ``scripts/benchmark_cpu.py --json`` in a
subprocess, so the node benchmarks exactly as a local run does (same code
path, same child-process isolation, same load check).  It is a Ray generator:
it first yields where and when it started (so the driver can name the node
even if the node dies later), then the outcome.

The benchmark subprocess dies with the worker (``PR_SET_PDEATHSIG``) and is
killed with its process group on ``--job-timeout``, so nothing outlives a job.
"""

from __future__ import annotations

import ctypes
import io
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator

from ..paths import SCRIPTS_DIR
from .identity import Identity, differences, local_identity

PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class RemoteJob:
    """Everything a node needs: the packed kernel directory, the baseline, the benchmark's flags."""

    package_tar: bytes
    package_name: str
    baseline_name: str
    #: {file name: bytes} of the baseline and the .py files beside it (a baseline may load a sibling)
    baseline_files: dict[str, bytes]
    bench_args: tuple[str, ...]
    job_timeout: float
    cpu_class: str
    #: --against DIR: that kernel directory packed like the package (same variant), or None
    against_tar: bytes | None = None
    against_name: str = "against"
    #: the driver's OMP_NUM_THREADS, applied on the node (see benchmark_env), or None
    driver_omp: str | None = None
    #: the driver's harness, torch and the package's variant (identity.Identity.as_json()); the node
    #: refuses to run when its own differ (None: not checked, for callers outside the driver)
    expected: dict[str, str] | None = None


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="microseconds")


def node_identity() -> dict[str, str]:
    """The node as reports name it: hostname, IP and Ray node id."""
    node_id, ip = "local", "127.0.0.1"  # outside a Ray worker (tests call run_job directly)
    try:
        import ray  # noqa: PLC0415

        # only inside a connected worker: get_runtime_context() in a plain process would make Ray
        # auto-connect to whatever cluster /tmp/ray names (and wait for it, if it is gone)
        if ray.is_initialized():
            node_id = ray.get_runtime_context().get_node_id()
            ip = ray.util.get_node_ip_address()
    except Exception:  # noqa: BLE001 - no Ray, or not connected: the local names above
        pass
    return {"node": socket.gethostname(), "node_ip": ip, "node_id": node_id}


def _die_with_parent() -> None:
    # the benchmark must not outlive a worker that was killed (node failure, cancel)
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        pass


def _extract(data: bytes, target: Path) -> Path:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        tar.extractall(target, filter="data")
    return target


def unpack(job: RemoteJob, workdir: Path) -> tuple[Path, Path]:
    package = _extract(job.package_tar, workdir / "package" / job.package_name)
    baseline_dir = workdir / "baseline"
    baseline_dir.mkdir()
    for name, data in job.baseline_files.items():
        (baseline_dir / Path(name).name).write_bytes(data)
    return package, baseline_dir / job.baseline_name


#: Set by ``farm node`` in the environment of ``ray start`` (so every worker inherits it): the
#: ``OMP_NUM_THREADS`` the operator started the node with, "" when unset.  Ray sets the variable
#: for a task only when it is unset (``set_omp_num_threads_if_unset``), so with this marker a
#: worker can tell the operator's value from Ray's cap.
NODE_OMP_ENV = "KERNEL_HARNESS_NODE_OMP_NUM_THREADS"
#: What Ray sets for a task that asks for fewer than one CPU (ours ask for none): ``max(floor(0), 1)``.
RAY_TASK_CAP = "1"


@dataclass(frozen=True)
class Threads:
    """Where the node's ``OMP_NUM_THREADS`` came from: ``driver``, ``node`` (its operator), or None."""

    value: str | None
    source: str | None

    def as_json(self) -> dict[str, str | None]:
        return {"omp_num_threads": self.value, "source": self.source}


def benchmark_env(environ: dict[str, str] | None = None,
                  driver_omp: str | None = None) -> tuple[dict[str, str], Threads]:
    """The environment of the benchmark on the node: every thread setting but Ray's task cap.

    Ray's workers run tasks with ``OMP_NUM_THREADS`` set (1 for a task that asks for no
    CPUs, as ours do so that the slot, not Ray's CPU count, serialises benchmarks) when the
    node's environment leaves it unset; the benchmark takes its default thread count from
    torch, so every remote run timed one thread where a local run times every core
    (measured: "1 thread(s)" in each remote JSON).  So, first match wins:

    1. the driver's own ``OMP_NUM_THREADS`` (``driver_omp``): the caller asked for it, as a
       local run with that environment would time it;
    2. the value the node's operator started ``farm node`` with (recorded in
       :data:`NODE_OMP_ENV`; Ray never overrides a set value);
    3. otherwise the variable is removed, so the node picks its threads as a local run there
       does.  A node started without ``farm node`` (no marker) keeps any value but Ray's cap.

    ``--threads N`` (forwarded) sets the timing workers' threads explicitly on top of this.
    """
    env = dict(os.environ if environ is None else environ)
    current = env.pop("OMP_NUM_THREADS", None)
    if driver_omp:
        env["OMP_NUM_THREADS"] = driver_omp
        return env, Threads(driver_omp, "driver")
    marker = env.get(NODE_OMP_ENV)
    operator = marker if marker is not None else (current if current != RAY_TASK_CAP else None)
    if operator:
        env["OMP_NUM_THREADS"] = operator
        return env, Threads(operator, "node")
    return env, Threads(None, None)


def run_job(job: RemoteJob) -> dict[str, Any]:
    """Run the benchmark here; the outcome with the node's stamps (never raises for a bad run)."""
    started, t0 = now(), time.monotonic()
    node = local_identity()
    if job.expected is not None:
        driver = Identity(**job.expected)
        if differences(driver, node):  # not the same benchmark: refuse before anything runs
            return {"status": "mismatch", "driver_identity": driver.as_json(), "node_identity": node.as_json(),
                    "started_at": started, "finished_at": now(), "wall_s": round(time.monotonic() - t0, 3),
                    **node_identity()}
    workdir = Path(tempfile.mkdtemp(prefix="kh-farm-"))
    try:
        package, baseline = unpack(job, workdir)
        report_path = workdir / "report.json"
        cmd = [sys.executable, str(SCRIPTS_DIR / "benchmark_cpu.py"), str(baseline),
               "--kernel-package", str(package), *job.bench_args, "--json", str(report_path)]
        if job.against_tar is not None:
            cmd += ["--against", str(_extract(job.against_tar, workdir / "against" / job.against_name))]
        env, threads = benchmark_env(driver_omp=job.driver_omp)
        proc = subprocess.Popen(cmd, cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, start_new_session=True, preexec_fn=_die_with_parent,
                                env=env)
        try:
            stdout, stderr = proc.communicate(timeout=job.job_timeout)
            status = "done"
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            stdout, stderr = proc.communicate()
            status = "timeout"
        report = json.loads(report_path.read_text(encoding="utf-8")) if report_path.is_file() else None
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return {"status": status, "returncode": proc.returncode, "stdout": stdout, "stderr": stderr,
            "report": report, "threads": threads.as_json(), "identity": node.as_json(), "nice": os.nice(0),
            "started_at": started, "finished_at": now(),
            "wall_s": round(time.monotonic() - t0, 3), **node_identity()}


def benchmark_on_node(job: RemoteJob) -> Iterator[dict[str, Any]]:
    """The Ray task body (a generator): first where it started, then the outcome."""
    yield {"status": "started", "started_at": now(), **node_identity()}
    yield run_job(job)
