"""The validator's view of which files a section compiles and with which flags."""

from __future__ import annotations

from pathlib import Path

from ..buildtoml import KernelSection

COMPILED_SUFFIXES = (".cpp", ".cc", ".cxx", ".c")


def section_flags(kernel: KernelSection) -> tuple[str, ...]:
    return tuple(kernel.cxx_flags)


def compiled_sources(root: Path, kernel: KernelSection) -> list[Path]:
    """The existing compiled sources of a section (missing ones are reported elsewhere)."""
    return [root / src for src in kernel.src if src.endswith(COMPILED_SUFFIXES) and (root / src).is_file()]
