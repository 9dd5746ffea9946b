"""Turning a node's outcome into the report the caller gets.

The report is the node's own ``benchmark_cpu.py --json`` output, unchanged,
plus a ``remote`` object (where and when it ran), so every consumer of the
local JSON (``trial_manager.py result --from-json`` included) reads a remote
one the same way.  The build id in ``kernel_build`` is the one the node
loaded: the shipped ``build/<variant>/`` is byte-identical, so a remote run of
a trial's build is matched with that trial like a local one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def remote_object(outcome: dict[str, Any], *, requested_class: str, node_class: str,
                  submitted_at: str, driver_wall_s: float) -> dict[str, Any]:
    """The ``remote`` key: node, class, the node's start/finish stamps and wall seconds."""
    return {
        "node": outcome.get("node"),
        "node_ip": outcome.get("node_ip"),
        "node_id": outcome.get("node_id"),
        "cpu_class": node_class,
        "requested_class": requested_class,
        "started_at": outcome.get("started_at"),
        "finished_at": outcome.get("finished_at"),
        "wall_s": outcome.get("wall_s"),
        # the node's OMP_NUM_THREADS and who set it (driver, node, or None: the node's default)
        "threads": outcome.get("threads"),
        # the harness version and code hash, torch and variant the node ran (checked equal to the driver's)
        "identity": outcome.get("identity"),
        # the scheduling priority the benchmark ran at (0, as a local run, unless the node's operator chose)
        "nice": outcome.get("nice"),
        # the driver's view: submit to result, queueing for the slot and shipping included
        "submitted_at": submitted_at,
        "driver_wall_s": round(driver_wall_s, 3),
    }


#: Keys naming files the node unpacked into a temporary directory (deleted after the run).
LOCAL_PATH_KEYS = ("baseline_file", "kernel_package")


def merged_report(report: dict[str, Any], remote: dict[str, Any], local_paths: dict[str, str]) -> dict[str, Any]:
    """The node's report with ``remote`` added.

    ``baseline_file`` and ``kernel_package`` name the caller's files (the
    shipped copies are byte-identical), because consumers read them here:
    ``trial_manager.py finalize`` hashes ``baseline_file``.  The node's own
    paths are kept in ``remote.node_paths``.
    """
    node_paths = {key: report[key] for key in LOCAL_PATH_KEYS if key in report}
    merged = {**report, **{k: v for k, v in local_paths.items() if k in LOCAL_PATH_KEYS and k in report}}
    vs = report.get("vs_against")
    if isinstance(vs, dict) and "against" in vs and "against" in local_paths:  # --against DIR, shipped too
        node_paths["against"] = vs["against"]
        merged["vs_against"] = {**vs, "against": local_paths["against"]}
    merged["remote"] = {**remote, "node_paths": node_paths}
    return merged


def class_json_path(path: Path, cpu_class: str) -> Path:
    """``--all-cpu-classes --json out.json`` writes ``out.<class>.json`` per class (``out.avx2.json``)."""
    path = Path(path)
    suffix = path.suffix or ".json"
    return path.with_name(f"{path.stem if path.suffix else path.name}.{cpu_class}{suffix}")


def overall_exit(codes: list[int]) -> int:
    """One exit code for several runs: the worst (3 crashed > 2 bad input > 1 check failed > 0)."""
    return max(codes, default=0)
