"""Recognise an unfinished compute body (``KERNEL_TODO``) raised by a kernel.

A generated body that is still ``KERNEL_TODO("op", "tier")`` throws
``KERNEL_TODO at <file>:<line>: <op> <tier> compute body`` when called. The
benchmark's worker hands such an error here: it is not a crash but work left
to do, so the benchmark fails with exit 1 and one line per unfinished body of
the package (found in its sources, next to the built module), not only the
first one the call happened to reach.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

RAISED_RE = re.compile(r"KERNEL_TODO at (?P<file>[^:\s]+):(?P<line>\d+): (?P<op>\w+) (?P<tier>\w+) compute body")
MARKER_RE = re.compile(r'^\s*KERNEL_TODO\(\s*"(?P<op>\w+)"\s*,\s*"(?P<tier>\w+)"\s*\)')


def _clean(path: str) -> str:
    """A compiler's relative __FILE__ ("../../ns/x.cpp") as a path relative to the kernel directory."""
    parts = [p for p in Path(path).parts if p not in ("..", ".")]
    return str(Path(*parts)) if parts else path


def kernel_dir_of(module: Any) -> Path | None:
    """The kernel project directory (the one holding build.toml) a loaded package was built from."""
    file = getattr(module, "__file__", None)
    if not file:
        return None
    for parent in Path(file).resolve().parents:
        if (parent / "build.toml").is_file():
            return parent
    return None


def unfinished_bodies(kernel_dir: Path) -> list[str]:
    """Every ``KERNEL_TODO("op", "tier")`` of the sources, as the benchmark's lines."""
    lines = []
    for path in sorted(kernel_dir.rglob("*.cpp")):
        if "build" in path.relative_to(kernel_dir).parts[:1]:
            continue
        for number, text in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            m = MARKER_RE.match(text)
            if m:
                rel = path.relative_to(kernel_dir)
                lines.append(f"KERNEL_TODO at {rel}:{number}: {m['op']} {m['tier']} compute body")
    return lines


def todo_report(message: str, module: Any = None) -> str | None:
    """The benchmark's failure text for a KERNEL_TODO error, or None for any other error."""
    m = RAISED_RE.search(message)
    if m is None:
        return None
    raised = f"KERNEL_TODO at {_clean(m['file'])}:{m['line']}: {m['op']} {m['tier']} compute body"
    kernel_dir = kernel_dir_of(module) if module is not None else None
    every = unfinished_bodies(kernel_dir) if kernel_dir is not None else []
    lines = [line for line in every if line.endswith(f": {m['op']} {line.split()[-3]} compute body")
             and line.split()[-4] == m["op"]]
    if raised not in lines:
        lines.insert(0, raised)
    where = f" in {kernel_dir}" if kernel_dir is not None else ""
    others = len(every) - len([line for line in every if line in lines])
    tail = f" ({others} more of other ops)" if others > 0 else ""
    return ("\n".join(lines) + f"\n{m['op']} has {len(lines)} unfinished compute bod{'y' if len(lines) == 1 else 'ies'}"
            f"{where}{tail}: write each body named above (remove its KERNEL_TODO line), rebuild and rerun.")
