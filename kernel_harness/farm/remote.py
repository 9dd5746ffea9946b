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


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="microseconds")


def node_identity() -> dict[str, str]:
    """The node as reports name it: hostname, IP and Ray node id."""
    try:
        import ray  # noqa: PLC0415

        node_id = ray.get_runtime_context().get_node_id()
        ip = ray.util.get_node_ip_address()
    except Exception:  # noqa: BLE001 - outside a worker (tests call run_job directly)
        node_id, ip = "local", "127.0.0.1"
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


def benchmark_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of the benchmark on the node, without the thread cap Ray gives tasks.

    Ray's workers run with ``OMP_NUM_THREADS`` set (1 for a task that asks for no
    CPUs, as ours do so that the slot, not Ray's CPU count, serialises benchmarks);
    the benchmark takes its default thread count from torch, so every remote run
    timed one thread where a local run times every core (measured: "1 thread(s)" in
    each remote JSON). Without the variable the node's benchmark picks its threads
    as a local run there does; ``--threads N`` (forwarded) chooses explicitly.
    """
    env = dict(os.environ if environ is None else environ)
    env.pop("OMP_NUM_THREADS", None)
    return env


def run_job(job: RemoteJob) -> dict[str, Any]:
    """Run the benchmark here; the outcome with the node's stamps (never raises for a bad run)."""
    started, t0 = now(), time.monotonic()
    workdir = Path(tempfile.mkdtemp(prefix="kh-farm-"))
    try:
        package, baseline = unpack(job, workdir)
        report_path = workdir / "report.json"
        cmd = [sys.executable, str(SCRIPTS_DIR / "benchmark_cpu.py"), str(baseline),
               "--kernel-package", str(package), *job.bench_args, "--json", str(report_path)]
        if job.against_tar is not None:
            cmd += ["--against", str(_extract(job.against_tar, workdir / "against" / job.against_name))]
        proc = subprocess.Popen(cmd, cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, start_new_session=True, preexec_fn=_die_with_parent,
                                env=benchmark_env())
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
            "report": report, "started_at": started, "finished_at": now(),
            "wall_s": round(time.monotonic() - t0, 3), **node_identity()}


def benchmark_on_node(job: RemoteJob) -> Iterator[dict[str, Any]]:
    """The Ray task body (a generator): first where it started, then the outcome."""
    yield {"status": "started", "started_at": now(), **node_identity()}
    yield run_job(job)
