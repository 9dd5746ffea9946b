"""Deciding what to publish: options, the kernel's build, version, branch, function, stage.

Everything here happens before the stage is touched, so a wrong flag or a
build that does not match its sources is reported before anything is copied.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..buildtoml import python_package_name
from ..config import load_config
from ..errors import CheckFailed, UsageError
from .card import best_trial_details
from .layout import (
    KernelSource,
    build_matches_sources,
    find_variants,
    kernel_functions,
    newest_build_mtime,
    newest_source_mtime,
    read_kernel_source,
    read_metadata,
)
from .upload import manual_commands

REPO_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")
BRANCH_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


@dataclass
class PublishOptions:
    source_dir: Path
    repo_id: str
    version: int | None = None
    branch: str | None = None
    create_pr: bool = False
    dry_run: bool = False
    stage: Path | None = None
    baseline: Path | None = None
    op: str | None = None
    description: str | None = None
    private: bool = False
    allow_build: bool = True
    check_args: list[str] = field(default_factory=list)  # passed on to scripts/benchmark_cpu.py
    endpoint: str | None = None  # tests point huggingface_hub at a loopback server
    token: str | None = None
    tier_evidence: list[Path] = field(default_factory=list)  # issue 24, tier_guard.py
    drop_unverified_tiers: bool = False  # issue 24, tier_guard.py


Log = Callable[[str], None]


def _check_identifiers(options: PublishOptions) -> None:
    if not REPO_ID_RE.match(options.repo_id):
        raise UsageError(
            f"--repo-id {options.repo_id!r} is not of the form ORG/NAME (letters, digits, '-', '_', '.'), "
            "e.g. my-org/my-kernel."
        )
    if options.branch is not None and not BRANCH_RE.match(options.branch):
        raise UsageError(f"--branch {options.branch!r} is not a valid branch name; the convention is v<version>, e.g. v1.")
    if options.version is not None and options.version < 0:
        raise UsageError(f"--version must be a non-negative integer, found {options.version}.")


def resolve_function(source: KernelSource, op: str | None, baseline: Path | None) -> str:
    """The function the baseline describes: --op, summary.json's op, the baseline's folder, or the only one."""
    names = [f.name for f in kernel_functions(source)]
    if op:
        name = op.split(".")[-1]
        if "." in op and op.rsplit(".", 1)[0] != source.name:
            raise UsageError(f"--op {op!r} names package {op.rsplit('.', 1)[0]!r}, but this kernel's package is {source.name!r}.")
        if name not in names:
            raise UsageError(f"--op {op!r}: {source.name} has no function {name!r}; it has {', '.join(names) or 'none'}.")
        return name
    candidates: list[str] = []
    summary = source.summary or {}
    for key in ("op", "function"):
        if isinstance(summary.get(key), str):
            candidates.append(summary[key].split(".")[-1])
    for path in (baseline, Path(summary["baseline_file"]) if isinstance(summary.get("baseline_file"), str) else None):
        if path is not None:
            candidates.append(path.parent.name)
    for candidate in candidates:
        if candidate in names:
            return candidate
    if len(names) == 1:
        return names[0]
    raise UsageError(
        f"Cannot tell which function of {source.name} the baseline measures (it exports {', '.join(names) or 'none'}). "
        f"Pass --op {source.name}.<function>."
    )


def rebuild_reason(source: KernelSource) -> str | None:
    """Why build/ must be (re)built before publishing, or None when it is current."""
    variants = source.variants
    if not variants:
        return "it has no build/torch*-cpu-*/ variant yet"
    matches = [build_matches_sources(source, v) for v in variants]
    if any(m is False for m in matches):
        return "build/ was made from other sources (its content id differs from the sources')"
    if not all(m is True for m in matches) and newest_source_mtime(source) > min(newest_build_mtime(v) for v in variants):
        return "its sources are newer than build/"
    undigested = [v.name for v in variants if "digest" not in read_metadata(v)]
    if undigested:
        return (
            f"build/{', build/'.join(undigested)}/metadata.json has no content digest (built before "
            "scripts/build_kernel.py recorded one), which publishing checks the files against"
        )
    return None


def ensure_built(source: KernelSource, allow_build: bool, log: Log) -> tuple[KernelSource, list[str]]:
    """Build the kernel when it has no variant or its build was not made from these sources.

    The builder's content id in metadata.json decides; file times only when it
    cannot be computed (an output/ from finalize keeps the trial's old file times).
    """
    reason = rebuild_reason(source)
    if reason is None:
        return source, []
    command = load_config().build_command
    if not allow_build:
        raise UsageError(f"{source.root} must be (re)built because {reason}; run `{command}` there, or drop --no-build.")
    log(f"Building {source.root} because {reason}: {command}")
    proc = subprocess.run(command, shell=True, cwd=source.root, check=False)
    if proc.returncode != 0:
        raise CheckFailed(
            f"The build command `{command}` failed in {source.root} (status {proc.returncode}); nothing was staged. "
            "Read the compiler output above, fix the named source or cxx-flags, and rerun."
        )
    rebuilt = read_kernel_source(source.root, baseline=source.baseline)
    if not find_variants(source.root):
        raise CheckFailed(f"`{command}` succeeded but {source.root}/build has no variant with metadata.json.")
    return rebuilt, [f"built with `{command}` because {reason}"]


@dataclass
class Plan:
    """What the pipeline decided before touching the stage."""

    source: KernelSource
    version: int
    branch: str
    function: str
    stage: Path
    check_args: list[str]

    @property
    def baseline(self) -> Path:
        assert self.source.baseline is not None  # checked in plan_publish
        return self.source.baseline


def plan_publish(options: PublishOptions, report: dict[str, Any], log: Log) -> Plan:
    """Read the directory, build it if needed, and decide version, branch, function and stage."""
    _check_identifiers(options)
    source = read_kernel_source(options.source_dir, baseline=options.baseline)
    report.update(source_dir=str(source.root), name=source.name, notes=list(source.notes))
    repo_name = options.repo_id.split("/", 1)[-1]
    if python_package_name(repo_name) != source.name:
        # kernels' requirements: each variant holds a directory named like the repository
        # (dashes as underscores) for older kernels releases; the builder names it after the package.
        report["notes"].append(
            f"The repository name {repo_name!r} differs from the package name {source.name!r}; older kernels "
            f"releases look for build/<variant>/{repo_name.replace('-', '_')}/. Prefer --repo-id "
            f"{options.repo_id.split('/')[0]}/{source.name.replace('_', '-')}."
        )
    if source.baseline is None:
        raise UsageError(
            f"No baseline for {source.root}: there is no baseline.py in it, summary.json records none, and "
            "--baseline was not given. The baseline is needed to verify the kernel and to generate "
            "benchmarks/benchmark.py; pass --baseline path/to/baseline.py."
        )
    source, build_notes = ensure_built(source, options.allow_build, log)
    report["notes"] += build_notes
    version = options.version if options.version is not None else source.version
    branch = options.branch or f"v{version}"
    function = resolve_function(source, options.op, source.baseline)
    stage = (Path(options.stage) if options.stage else Path.cwd() / "publish" / f"{source.name}-v{version}").resolve()
    check_args = list(options.check_args)
    details = best_trial_details(source.summary)
    if details.get("acceptance_rule") == "as-accurate-as-baseline" and "--accept-if-as-accurate" not in check_args:
        # the finalized trial passed under this rule; re-check it under the same rule
        check_args.append("--accept-if-as-accurate")
        report["notes"].append(
            "the best trial passed benchmark_cpu.py with --accept-if-as-accurate, so the publish-time check uses it too"
        )
    report.update(
        repo_id=options.repo_id, version=version, branch=branch, function=f"{source.name}.{function}",
        baseline=str(source.baseline), stage_dir=str(stage),
        manual_commands=manual_commands(stage, options.repo_id, branch, options.create_pr),
    )  # fmt: skip
    return Plan(source=source, version=version, branch=branch, function=function, stage=stage, check_args=check_args)
