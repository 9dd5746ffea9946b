"""Which build a set of sources makes: the content id the builder embeds in the op namespace.

``scripts/build_kernel.py`` names the extension ``_<name>_cpu_<id>``, ``<id>``
being :func:`kernel_harness.build.plan.content_id` over build.toml, every
listed source, every header/source in the include directories and the
Python package.  The same function over a trial's saved copy gives the id a
build of that trial has, so a benchmark JSON (its ``kernel_build.build_id``)
can be matched with the trial it is recorded on, and a kernel directory with
the build sitting in its ``build/``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

BUILD_ID = re.compile(r"_cpu_([0-9a-f]{10})$")


def content_id_of(directory: Path) -> str | None:
    """The builder's content id of ``directory``'s sources; None when its build.toml
    cannot be read (the build step reports that error in full)."""
    try:
        from ..build.plan import content_id, python_package_files
        from ..buildtoml import load_build_toml

        toml = load_build_toml(Path(directory) / "build.toml")
        pyext = toml.torch.pyext if toml.torch else ("py", "pyi")
        return content_id(Path(directory), toml, python_package_files(Path(directory), toml.general.python_name, pyext))
    except Exception:  # noqa: BLE001 - any failure means "cannot tell", never a crash of the trial manager
        return None


def id_of_module(name: str | None) -> str | None:
    """``_rms_norm_cpu_0123abcdef`` -> ``0123abcdef`` (None for anything else)."""
    if not isinstance(name, str):
        return None
    match = BUILD_ID.search(name)
    return match.group(1) if match else None


def last_build_id(kernel_dir: Path) -> tuple[str, Path] | None:
    """The content id of the newest build in ``kernel_dir/build/<variant>/`` and its metadata file."""
    build = Path(kernel_dir) / "build"
    newest: tuple[float, str, Path] | None = None
    for metadata in build.glob("*/metadata.json") if build.is_dir() else ():
        try:
            data = json.loads(metadata.read_text(encoding="utf-8"))
            stamp = metadata.stat().st_mtime
        except (OSError, ValueError):
            continue
        found = id_of_module(data.get("id")) if isinstance(data, dict) else None
        if found and (newest is None or stamp > newest[0]):
            newest = (stamp, found, metadata)
    return (newest[1], newest[2]) if newest else None


def hashed_files(directory: Path) -> list[Path] | None:
    """The files (relative, inside ``directory``) that :func:`content_id_of` hashes, so a
    trial's saved copy can hold all of them; None when build.toml cannot be read."""
    try:
        from ..build.plan import COMPILED_SUFFIXES, HEADER_SUFFIXES, listed_sources, python_package_files
        from ..buildtoml import load_build_toml

        root = Path(directory)
        toml = load_build_toml(root / "build.toml")
        files = {root / "build.toml", *(root / src for _, src in listed_sources(toml))}
        includes = [*(toml.torch.include if toml.torch else ()), *(i for k in toml.cpu_kernels for i in k.include)]
        for include in includes:
            if (root / include).is_dir():
                files.update(p for p in (root / include).rglob("*")
                             if p.is_file() and p.suffix in HEADER_SUFFIXES + COMPILED_SUFFIXES)
        pyext = toml.torch.pyext if toml.torch else ("py", "pyi")
        files.update(python_package_files(root, toml.general.python_name, pyext))
    except Exception:  # noqa: BLE001 - see content_id_of
        return None
    inside = []
    for path in files:
        if path.is_file() and not path.is_symlink() and path.resolve().is_relative_to(root.resolve()):
            inside.append(path.relative_to(root))
    return sorted(inside)
