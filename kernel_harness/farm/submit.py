"""The driver side of ``benchmark_cpu.py --cluster``: check, ship, submit, wait, write.

Everything that can be checked before a slot is taken is checked at once
(exit 2): Ray installed, a cluster at the address, a node with the asked
class, a node whose torch loads the package's build variant.  On the node,
before anything runs, the harness version and code, torch version and
variant are compared with the driver's (:mod:`.identity`): a difference is
exit 2 naming both sides.  A job then waits
in Ray's queue for the slot (unbounded: that is the point of one slot per
node); once it started on a node, a node failure or ``--job-timeout`` is
exit 3 naming the node, and nothing is written.
"""

from __future__ import annotations

import argparse
import io
import os
import re
import tarfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..cli import console, err_console, write_json_report
from ..errors import UsageError
from . import HEAD_COMMAND
from .classes import CLASS_PREFIX, CLASSES, ISA_PREFIX, SELECT, SLOT, VARIANT_PREFIX, NodeInfo
from .identity import Identity, local_identity, mismatch_message
from .merge import class_json_path, merged_report, overall_exit, remote_object
from .node import cluster_nodes, connect
from .remote import RemoteJob, benchmark_on_node, now

#: Options of benchmark_cpu.py the driver handles itself (never forwarded to the node).
DRIVER_ONLY = {"help", "baseline", "kernel_package", "json", "cluster", "cpu_class", "all_cpu_classes",
               "job_timeout", "against"}
#: Extra seconds the driver waits past --job-timeout before it cancels (the node kills first).
DRIVER_GRACE_S = 60.0
#: How often a queued job checks that some alive node can still run it.
QUEUE_POLL_S = 5.0
VARIANT_DIR = re.compile(r"^torch\d+-")
SKIP_PARTS = {".objs", "dist", ".git", "__pycache__", ".pytest_cache"}


def add_cluster_options(parser: argparse.ArgumentParser) -> None:
    """The ``--cluster`` flags of scripts/benchmark_cpu.py (see README "Benchmarking on a cluster")."""
    group = parser.add_argument_group("cluster (needs the optional extra: pip install -e '.[cluster]')")
    group.add_argument("--cluster", metavar="ADDRESS", default=None,
                       help="run the same benchmark on a Ray farm node holding the node's only bench slot: "
                            "HOST:PORT printed by `python -m kernel_harness.farm node --head`, or 'auto' "
                            "for the node started on this machine")
    group.add_argument("--cpu-class", choices=[*CLASSES, "any"], default="any",
                       help="with --cluster: run on a node of this CPU class (default any)")
    group.add_argument("--all-cpu-classes", action="store_true",
                       help="with --cluster: run once per distinct CPU class of the cluster, writing "
                            "<json stem>.<class>.json for each (needs --json)")
    group.add_argument("--job-timeout", type=float, default=3600.0, metavar="S",
                       help="with --cluster: exit 3 when a started job runs longer than S seconds (default 3600)")


@dataclass(frozen=True)
class Target:
    """One job to submit: the class label it answers for and the resources it asks Ray for."""

    label: str
    resources: dict[str, float]
    variant: str


def forwarded_args(args: argparse.Namespace, parser: argparse.ArgumentParser) -> list[str]:
    """The benchmark flags the node must get, rebuilt from the parsed values (not raw argv)."""
    out: list[str] = []
    for action in parser._actions:  # noqa: SLF001 - argparse has no public walk over its options
        if action.dest in DRIVER_ONLY or not action.option_strings:
            continue
        value = getattr(args, action.dest, action.default)
        if value == action.default or value is None:
            continue
        flag = action.option_strings[-1] if action.option_strings[-1].startswith("--") else action.option_strings[0]
        if isinstance(action, argparse._StoreTrueAction | argparse._StoreFalseAction):  # noqa: SLF001
            out.append(flag)
        elif isinstance(action, argparse._AppendAction):  # noqa: SLF001
            for item in value:
                out += [flag, str(item)]
        elif isinstance(action, argparse._StoreAction):  # noqa: SLF001
            out += [flag, *map(str, value)] if isinstance(value, list | tuple) else [flag, str(value)]
        else:
            raise UsageError(f"{flag} cannot be forwarded to a cluster node; run without --cluster.")
    return out


def package_variants(directory: Path) -> list[str]:
    build = directory / "build"
    return sorted(p.name for p in build.iterdir() if p.is_dir() and VARIANT_DIR.match(p.name)) if build.is_dir() else []


def check_package(spec: str, flag: str = "--kernel-package") -> tuple[Path, list[str]]:
    directory = Path(spec)
    if not (directory / "build.toml").is_file():
        raise UsageError(f"--cluster ships kernel directories, and {flag} {spec} is not one (no build.toml). Pass "
                         "the directory you built with scripts/build_kernel.py; an installed package name cannot "
                         "be shipped.")
    variants = package_variants(directory)
    if not variants:
        raise UsageError(f"{directory}/build/ holds no build variant (torch*-*-cpu-*). Build it first with "
                         "scripts/build_kernel.py in that directory, then rerun.")
    return directory.resolve(), variants


def pack(directory: Path, variant: str) -> bytes:
    """The kernel directory as tar.gz: sources, build.toml and the one variant the node loads."""
    def keep(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        parts = Path(info.name).parts
        if SKIP_PARTS.intersection(parts) or info.name.endswith((".o", ".pyc")):
            return None
        if len(parts) >= 2 and parts[0] == "build" and parts[1] != variant:
            return None
        return info

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for child in sorted(directory.iterdir()):
            tar.add(child, arcname=child.name, filter=keep)
    return buffer.getvalue()


#: Sibling .py files of the baseline are shipped up to this total (a baseline may import one).
SIBLINGS_MAX_BYTES = 10 * 1024 * 1024


def baseline_files(baseline: Path) -> dict[str, bytes]:
    """The baseline and the .py files in its directory (``baseline_large.py`` loads ``baseline.py``)."""
    files = {baseline.name: baseline.read_bytes()}
    total = len(files[baseline.name])
    for sibling in sorted(baseline.parent.glob("*.py")):
        if sibling.name in files or not sibling.is_file():
            continue
        size = sibling.stat().st_size
        if total + size > SIBLINGS_MAX_BYTES:
            break
        files[sibling.name], total = sibling.read_bytes(), total + size
    return files


def choose_targets(nodes: list[NodeInfo], variants: list[str], cpu_class: str, all_classes: bool) -> list[Target]:
    """Which jobs to submit; exit 2 at once when no node fits."""
    bench = [n for n in nodes if n.is_bench_node]
    if not bench:
        raise UsageError("The cluster has no farm node (no node offers a bench_slot). Start one on each machine "
                         f"with `python -m kernel_harness.farm node --address HOST:PORT` (or `{HEAD_COMMAND}`).")
    loadable = [n for n in bench if n.variant in variants]
    if not loadable:
        node_variants = sorted({n.variant or "unknown" for n in bench})
        raise UsageError(f"The package is built for {', '.join(variants)}, but the cluster's nodes load "
                         f"{', '.join(node_variants)} (torch version / C++ ABI differ). Build the package with "
                         "the nodes' torch, or run nodes with the package's torch.")
    if all_classes:
        tops = {n.top: n.variant for n in loadable}
        order = ("generic", *CLASSES)
        return [Target(top, {SLOT: 1, CLASS_PREFIX + top: SELECT, VARIANT_PREFIX + v: SELECT}, v)
                for top, v in sorted(tops.items(), key=lambda kv: order.index(kv[0]) if kv[0] in order else -1)]
    fitting = loadable if cpu_class == "any" else [n for n in loadable if cpu_class in n.classes]
    if not fitting:
        have = sorted({c for n in loadable for c in n.classes}, key=CLASSES.index)
        raise UsageError(f"No node of the cluster has the CPU class {cpu_class}: its nodes have "
                         f"{', '.join(have) or 'no AVX2 or higher (generic only)'}. Pass one of those (or "
                         f"--cpu-class any), or add a node of class {cpu_class}.")
    variant = Counter(n.variant for n in fitting).most_common(1)[0][0]
    resources = {SLOT: 1, VARIANT_PREFIX + variant: SELECT}
    if cpu_class != "any":
        resources[ISA_PREFIX + cpu_class] = SELECT
    return [Target(cpu_class, resources, variant)]


class JobLost(Exception):
    """The job started (or not) and then its node or worker was lost, or it ran out of time."""


def _next_item(ray, gen, timeout: float | None, what: str) -> dict[str, Any]:
    ready, _ = ray.wait([gen], timeout=timeout)
    if not ready:
        raise TimeoutError(what)
    try:
        return ray.get(next(gen))
    except StopIteration:
        raise JobLost(f"the job ended without {what}") from None
    except ray.exceptions.RayError as exc:
        raise JobLost(f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}") from None


def _feasible(ray, resources: dict[str, float]) -> bool:
    """Whether an alive node still offers every resource the job asks for."""
    return any(node.get("Alive") and all(key in (node.get("Resources") or {}) for key in resources)
               for node in ray.nodes())


def _wait_for_start(ray, gen, target: Target) -> dict[str, Any]:
    """Wait in Ray's queue for the slot, however long the queue; but when no alive node can run the
    job any more (its only node died), Ray would keep it pending for ever: that is a lost job."""
    misses = 0
    while True:
        try:
            return _next_item(ray, gen, QUEUE_POLL_S, "starting")
        except TimeoutError:
            misses = 0 if _feasible(ray, target.resources) else misses + 1
            if misses >= 2:
                raise JobLost("no alive node offers the resources it needs any more "
                              f"({', '.join(sorted(target.resources))})") from None


def follow(ray, target: Target, job: RemoteJob, job_timeout: float) -> dict[str, Any]:
    """Submit one job and wait for it: queue unbounded, run bounded by ``job_timeout``."""
    task = ray.remote(benchmark_on_node).options(
        num_cpus=0, resources=target.resources, max_retries=0, num_returns="streaming")
    submitted_at, t0 = now(), time.monotonic()
    gen = task.remote(job)
    try:
        started = _wait_for_start(ray, gen, target)
    except JobLost as exc:
        try:
            ray.cancel(gen, force=True)
        except Exception:  # noqa: BLE001 - never started, nothing to stop
            pass
        return {"status": "lost", "node": "(not started on any node)", "detail": str(exc), "label": target.label}
    try:
        outcome = _next_item(ray, gen, job_timeout + DRIVER_GRACE_S, "a result")
    except (JobLost, TimeoutError) as exc:
        try:
            ray.cancel(gen, force=True)
        except Exception:  # noqa: BLE001 - the job is lost either way
            pass
        status = "timeout" if isinstance(exc, TimeoutError) else "lost"
        return {**started, "status": status, "detail": str(exc), "label": target.label}
    outcome["submitted_at"], outcome["driver_wall_s"] = submitted_at, time.monotonic() - t0
    outcome["label"] = target.label
    return outcome


def _node_name(outcome: dict[str, Any]) -> str:
    if not outcome.get("node_id"):
        return str(outcome.get("node"))
    return f"{outcome.get('node')} ({outcome.get('node_ip')}, Ray node {str(outcome.get('node_id'))[:12]})"


def finish(outcome: dict[str, Any], nodes: dict[str, NodeInfo], requested: str, json_path: Path | None,
           job_timeout: float, local_paths: dict[str, str]) -> int:
    """Print and write one job's result; returns its exit code (nothing written on a lost job)."""
    label = outcome["label"]
    if outcome["status"] in ("lost", "timeout"):
        why = (f"ran longer than --job-timeout {job_timeout:g} s and was killed" if outcome["status"] == "timeout"
               else f"was lost ({outcome.get('detail')})")
        err_console.print(f"[bold red]kernel failure:[/bold red] the {label} job on node {_node_name(outcome)} "
                          f"{why}. Nothing was recorded; check the node (`python -m kernel_harness.farm status`) "
                          "and rerun.", soft_wrap=True)
        return 3
    if outcome["status"] == "mismatch":
        message = mismatch_message(Identity(**outcome["driver_identity"]), Identity(**outcome["node_identity"]),
                                   _node_name(outcome))
        err_console.print(f"[bold red]error:[/bold red] {message}", soft_wrap=True)
        return 2
    if outcome.get("stdout"):
        console.print(f"[bold]--- remote run ({label}) on node {_node_name(outcome)} ---[/bold]")
        console.out(outcome["stdout"].rstrip())
    if outcome.get("stderr"):
        err_console.out(outcome["stderr"].rstrip())
    report = outcome.get("report")
    code = int(outcome.get("returncode") or 0)
    if report is None:
        return code if code else 3
    node = nodes.get(str(outcome.get("node_id")))
    remote = remote_object(outcome, requested_class=requested, node_class=node.top if node else label,
                           submitted_at=outcome["submitted_at"], driver_wall_s=outcome["driver_wall_s"])
    write_json_report(json_path, merged_report(report, remote, local_paths))
    return code


def run_remote(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """``benchmark_cpu.py ... --cluster ADDRESS``: the same benchmark on a farm node."""
    if args.all_cpu_classes and args.cpu_class != "any":
        raise UsageError("--all-cpu-classes runs on every class; drop --cpu-class (or drop --all-cpu-classes).")
    if args.all_cpu_classes and args.json is None:
        raise UsageError("--all-cpu-classes writes one JSON per class: pass --json FILE "
                         "(written as FILE's stem + .<class>.json, e.g. out.avx2.json).")
    if not args.job_timeout > 0:
        raise UsageError(f"--job-timeout must be a positive number of seconds, not {args.job_timeout}.")
    baseline = Path(args.baseline)
    if not baseline.is_file():
        raise UsageError(f"Baseline file {baseline} does not exist. Pass the path of your baseline.py.")
    directory, variants = check_package(args.kernel_package)
    against = check_package(args.against, "--against") if getattr(args, "against", None) else None
    if against is not None:  # both builds must load on the node: only their common variants qualify
        variants = [v for v in variants if v in against[1]]
        if not variants:
            raise UsageError(f"--kernel-package {directory} and --against {against[0]} share no build variant "
                             f"({', '.join(package_variants(directory))} vs {', '.join(against[1])}); build both "
                             "with the same torch.")
    bench_args = tuple(forwarded_args(args, parser))
    ray = connect(args.cluster)
    try:
        nodes = cluster_nodes(ray)
        targets = choose_targets(nodes, variants, args.cpu_class, args.all_cpu_classes)
        by_id = {n.node_id: n for n in nodes}
        shipped = baseline_files(baseline)
        jobs = [RemoteJob(pack(directory, t.variant), directory.name, baseline.name, shipped,
                          bench_args, args.job_timeout, t.label,
                          against_tar=pack(against[0], t.variant) if against else None,
                          against_name=against[0].name if against else "against",
                          driver_omp=os.environ.get("OMP_NUM_THREADS") or None,
                          expected=local_identity(t.variant).as_json()) for t in targets]
        console.print(f"[dim]farm: submitting {len(jobs)} job(s) ({', '.join(t.label for t in targets)}); "
                      "each waits for a free bench slot[/dim]")
        if jobs and jobs[0].driver_omp:
            console.print(f"[dim]farm: OMP_NUM_THREADS={jobs[0].driver_omp} of this shell applies on the node, "
                          "as it would locally[/dim]")
        with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
            outcomes = list(pool.map(lambda tj: follow(ray, tj[0], tj[1], args.job_timeout), zip(targets, jobs)))
        codes = []
        for outcome in outcomes:
            path = class_json_path(args.json, outcome["label"]) if args.all_cpu_classes else args.json
            codes.append(finish(outcome, by_id, args.cpu_class, path, args.job_timeout,
                                {"baseline_file": str(baseline.resolve()), "kernel_package": str(directory),
                                 **({"against": args.against} if against else {})}))
    finally:
        ray.shutdown()
    return overall_exit(codes)
