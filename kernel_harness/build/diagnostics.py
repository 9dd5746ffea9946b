"""Turn a failed ninja run into one clear paragraph: file:line and the compiler's message first.

An agent that reads 200 lines of template backtrace tends to fix the wrong
thing; the first ``error:`` line of the first failing unit is almost always the
one to fix, so it goes first, and the raw output follows for context.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

_DIAG_RE = re.compile(r"^(?P<file>[^\s:][^:]*):(?P<line>\d+):(?:(?P<col>\d+):)?\s*(?:fatal )?error:\s*(?P<msg>.*)$")
_LINK_RE = re.compile(r"(undefined reference to .*|multiple definition of .*|cannot find -l\S+)")
_FAILED_RE = re.compile(r"^FAILED: (.*)$")


@dataclass(frozen=True)
class CompileError:
    file: str | None
    line: int | None
    message: str
    raw: str

    def headline(self) -> str:
        where = f"{self.file}:{self.line}" if self.file and self.line else (self.file or "the build")
        return f"{where}: {self.message}"


def _relative(path: str, root: Path, cwd: Path) -> str:
    """Name the file relative to the kernel directory (the compiler ran in ``cwd``)."""
    try:
        return str((cwd / path).resolve().relative_to(root.resolve()))
    except (ValueError, OSError):
        return path


def first_error(output: str, root: Path, cwd: Path | None = None) -> CompileError:
    """The first compiler/linker error in ninja's output; ``cwd`` is where ninja ran."""
    cwd = cwd or root
    failed_target = None
    for line in output.splitlines():
        failed = _FAILED_RE.match(line)
        if failed and failed_target is None:
            failed_target = failed.group(1)
        match = _DIAG_RE.match(line.strip())
        if match:
            return CompileError(
                file=_relative(match["file"], root, cwd),
                line=int(match["line"]),
                message=match["msg"].strip(),
                raw=output,
            )
    for line in output.splitlines():
        link = _LINK_RE.search(line)
        if link:
            return CompileError(file=None, line=None, message=f"link error: {link.group(1)}", raw=output)
    what = f"building {failed_target}" if failed_target else "the build"
    return CompileError(file=None, line=None, message=f"{what} failed (see the compiler output below)", raw=output)
