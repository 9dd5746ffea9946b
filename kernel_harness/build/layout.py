"""Assemble the published variant directory in a staging dir and swap it in atomically.

``build/<variant>/`` is what ``kernels.get_local_kernel`` imports, so it must
never be half-written: a failed build leaves the previous one usable, and a
successful one replaces it in one step.  The variant is rebuilt from scratch
each time (a few small files plus the .so), which also removes the previous
build's ``_<name>_cpu_<old id>.abi3.so``.  Staging and old directories start
with a dot, which ``kernels`` ignores when it lists variants.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import shutil
from pathlib import Path

from . import codegen
from .plan import BuildPlan

_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


def assemble(plan: BuildPlan, staging: Path) -> None:
    """Write the variant's files into ``staging`` (which must not exist)."""
    staging.mkdir(parents=True)
    package = plan.root / "torch-ext" / plan.names.python_name
    for source in plan.python_files:
        target = staging / source.relative_to(package)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target)
    (staging / "_ops.py").write_text(codegen.ops_py(plan.names), encoding="utf-8")
    general = plan.toml.general
    (staging / "metadata.json").write_text(
        codegen.metadata_json(
            plan.names,
            version=general.version,
            license=general.license,
            python_depends=general.python_depends,
        ),
        encoding="utf-8",
    )
    shutil.copy2(plan.linked_so, staging / plan.names.so_name)


def _exchange(a: Path, b: Path) -> bool:
    """Atomically swap two paths with renameat2(RENAME_EXCHANGE); False when unsupported."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    rc = renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)
    return rc == 0


def publish(staging: Path, final: Path) -> None:
    """Make ``staging`` the new ``final``; the old content is deleted afterwards."""
    if not final.exists():
        os.rename(staging, final)
        return
    if _exchange(staging, final):
        shutil.rmtree(staging, ignore_errors=True)  # staging now holds the old build
        return
    old = final.with_name(f".old-{final.name}-{os.getpid()}")
    os.rename(final, old)
    os.rename(staging, final)
    shutil.rmtree(old, ignore_errors=True)


def staging_dir(build_dir: Path, variant: str) -> Path:
    path = build_dir / f".staging-{variant}-{os.getpid()}"
    if path.exists():
        shutil.rmtree(path)
    return path


def clean_stale(build_dir: Path) -> None:
    """Remove staging/old directories left by a build that was killed midway."""
    for entry in build_dir.glob(".staging-*"):
        with contextlib.suppress(OSError):
            shutil.rmtree(entry)
    for entry in build_dir.glob(".old-*"):
        with contextlib.suppress(OSError):
            shutil.rmtree(entry)
