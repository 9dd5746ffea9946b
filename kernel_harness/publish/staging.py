"""Lay out a Hub kernel repository in a local directory (the "stage").

The stage is exactly what gets uploaded, so it is also exactly what is
verified: ``build/<variant>/`` for every variant built here, ``build.toml``
and the sources, ``LICENSE``, ``benchmarks/benchmark.py`` and ``README.md``.
It is rebuilt from scratch on every run; a marker file (never uploaded)
proves a directory is a stage, so ``--stage`` can never wipe a directory the
user made for something else.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from ..atomic import atomic_write_text
from ..errors import UsageError
from .layout import KernelSource, is_ignored, read_metadata

STAGE_MARKER = ".kernel-harness-stage"
SYSTEM_LICENSES = Path("/usr/share/common-licenses")


def prepare_stage_dir(stage: Path) -> Path:
    """Empty (or create) ``stage``; refuse a non-empty directory that is not a stage."""
    stage = Path(stage).resolve()
    if stage.exists():
        if not stage.is_dir():
            raise UsageError(f"--stage {stage} exists and is not a directory. Pass a new or previous stage directory.")
        if any(stage.iterdir()) and not (stage / STAGE_MARKER).is_file():
            raise UsageError(
                f"--stage {stage} is a non-empty directory that publish.py did not create, and staging "
                "empties the directory first. Pass a new directory (or remove this one yourself)."
            )
        shutil.rmtree(stage)
    stage.mkdir(parents=True)
    (stage / STAGE_MARKER).write_text("staged by kernel-harness scripts/publish.py; safe to delete\n", encoding="utf-8")
    return stage


def _copy(src: Path, dst: Path, base: Path) -> None:
    if src.is_file():
        if not is_ignored(src.relative_to(base)):
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst)
        return
    for path in sorted(src.rglob("*")):
        rel = path.relative_to(src)
        if path.is_file() and not is_ignored(path.relative_to(base)):
            (dst / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, dst / rel)


def check_variant_metadata(source: KernelSource, version: int) -> None:
    """The build must describe the kernel being published under the version being published."""
    for variant in source.variants:
        meta = read_metadata(variant)
        name = meta.get("name")
        if name not in (source.hub_name, source.name):
            raise UsageError(
                f"{variant / 'metadata.json'} names the kernel {name!r}, but build.toml names it {source.hub_name!r} "
                f"(package {source.name!r}). "
                "The build is from another kernel; rebuild this directory with scripts/build_kernel.py."
            )
        built_version = meta.get("version")
        if built_version is not None and built_version != version:
            raise UsageError(
                f"{variant / 'metadata.json'} was built as version {built_version}, but version {version} is being "
                f"published (branch v{version}). `kernels` reads the version from metadata.json, so set "
                f"[general] version = {version} in build.toml and rebuild, or publish with --version {built_version}."
            )


def license_text(source: KernelSource) -> tuple[str, str]:
    """The LICENSE text and where it came from (the kernel's own file first)."""
    if source.license_file is not None:
        return source.license_file.read_text(encoding="utf-8", errors="replace"), str(source.license_file)
    # build.toml spells SPDX ids in any case ("apache-2.0"); the system copies use SPDX's.
    wanted = source.license.lower()
    if SYSTEM_LICENSES.is_dir():
        for system in sorted(SYSTEM_LICENSES.iterdir()):
            if system.name.lower() == wanted and system.is_file():
                return system.read_text(encoding="utf-8", errors="replace"), str(system)
    stub = (
        f"SPDX-License-Identifier: {source.license}\n\n"
        f"This kernel is licensed under {source.license}. The full license text is published at\n"
        f"https://spdx.org/licenses/{source.license}.html\n"
    )
    return stub, "SPDX reference (no license file found; add LICENSE to the kernel directory to ship the full text)"


def stage_kernel(source: KernelSource, stage: Path, version: int) -> list[str]:
    """Copy the build variants, sources and license into ``stage``; returns notes for the report."""
    notes: list[str] = []
    if not source.variants:
        raise UsageError(
            f"{source.root} has no build variant (build/torch*-cpu-*/metadata.json). Build it first with "
            "scripts/build_kernel.py --release, or let publish.py build it (omit --no-build)."
        )
    check_variant_metadata(source, version)
    for variant in source.variants:
        _copy(variant, stage / "build" / variant.name, source.root)
    for rel in source.source_paths:
        _copy(source.root / rel, stage / rel, source.root)
    text, origin = license_text(source)
    write_stage_file(stage, "LICENSE", text)
    notes.append(f"LICENSE from {origin}")
    return notes


def write_stage_file(stage: Path, relative: str, text: str) -> Path:
    """Write a generated file into the stage, world-readable like the copied ones."""
    path = stage / relative
    atomic_write_text(path, text)
    path.chmod(0o644)  # mkstemp creates 0600; a stage is meant to be shared and uploaded
    return path


def list_stage_files(stage: Path) -> list[str]:
    """Every file that would be uploaded, as sorted POSIX paths relative to the stage."""
    return sorted(
        path.relative_to(stage).as_posix()
        for path in stage.rglob("*")
        if path.is_file() and path.name != STAGE_MARKER and not is_ignored(path.relative_to(stage))
    )
