"""Which files of a kernel directory are its sources, and their content hash.

A trial keeps what an agent edits (C++ sources and headers, ``build.toml``,
``torch-ext/``) and never build products: copying ``build/`` or ``dist/``
would bloat the tree and make two identical kernels hash differently.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from ..errors import UsageError

SOURCE_SUFFIXES = frozenset({".c", ".cc", ".cpp", ".cxx", ".h", ".hh", ".hpp", ".hxx", ".inc", ".ipp"})
TOP_LEVEL_FILES = frozenset({"build.toml"})
SKIPPED_DIRS = frozenset({"build", "dist", "__pycache__", ".git", ".objs", ".cache", ".pytest_cache"})
SKIPPED_SUFFIXES = frozenset({".o", ".so", ".a", ".pyc", ".whl", ".d", ".gch", ".pch"})


def _is_skipped_dir(name: str) -> bool:
    return name in SKIPPED_DIRS or name.endswith(".egg-info") or name.startswith(".")


def _is_source(relative: Path) -> bool:
    if relative.suffix in SKIPPED_SUFFIXES:
        return False
    if len(relative.parts) == 1 and relative.name in TOP_LEVEL_FILES:
        return True
    if relative.parts[0] == "torch-ext":
        return True
    return relative.suffix in SOURCE_SUFFIXES


def list_kernel_sources(kernel_dir: Path) -> list[Path]:
    """Relative paths of the source files of ``kernel_dir``, sorted."""
    kernel_dir = Path(kernel_dir)
    if not kernel_dir.is_dir():
        raise UsageError(f"The kernel directory {kernel_dir} does not exist or is not a directory.")
    if not (kernel_dir / "build.toml").is_file():
        raise UsageError(
            f"{kernel_dir} has no build.toml, so it is not a kernel directory. "
            "Pass the directory that holds build.toml (e.g. the one new_kernel.py wrote)."
        )
    found: list[Path] = []
    pending = [kernel_dir]
    while pending:
        directory = pending.pop()
        for entry in sorted(directory.iterdir()):
            if entry.is_symlink():
                continue
            if entry.is_dir():
                if not _is_skipped_dir(entry.name):
                    pending.append(entry)
            elif entry.is_file():
                relative = entry.relative_to(kernel_dir)
                if _is_source(relative):
                    found.append(relative)
    return sorted(found)


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def sources_sha256(root: Path, files: list[Path]) -> str:
    """A hash of names and contents, independent of timestamps and of where ``root`` is."""
    digest = hashlib.sha256()
    for relative in sorted(files):
        digest.update(relative.as_posix().encode())
        digest.update(b"\0")
        digest.update(file_sha256(root / relative).encode())
        digest.update(b"\n")
    return digest.hexdigest()
