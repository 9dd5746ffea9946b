"""A tiny template renderer: ``string.Template`` plus named sections.

Project templates (``templates/project/**.in``) are plain ``string.Template``
files with ``${placeholder}`` fields. Op templates (``templates/ops/*.op``)
hold every piece of one op in named sections, each starting with a line
``//@@ <section>`` (C++) or ``#@@ <section>`` (Python), so all of an op lives
in one file and the project templates stay op-agnostic.
"""

from __future__ import annotations

import re
import string
from collections.abc import Mapping
from pathlib import Path

from ..errors import UsageError

SECTION_RE = re.compile(r"^\s*(?://|#)@@\s+(\w+)\s*$")

#: Sections every op template must provide (empty is allowed, missing is not).
OP_SECTIONS: tuple[str, ...] = (
    "tier_decl",
    "simd",
    "generic_decl",
    "generic",
    "bridge_decl",
    "bridge",
    "binding",
    "python",
)

#: Sections an op template may provide: ``layer`` is a stateless nn.Module for
#: ``kernels.kernelize`` (only ``forward``), collected into ``<name>/layers.py``.
OPTIONAL_OP_SECTIONS: tuple[str, ...] = ("layer",)


def render(text: str, values: Mapping[str, str], *, source: str) -> str:
    """Substitute ``${key}`` fields; a field without a value is a template bug."""
    try:
        return string.Template(text).substitute(values)
    except KeyError as exc:
        raise UsageError(
            f"Template {source} uses ${{{exc.args[0]}}}, which the scaffold does not provide. "
            "Fix the template (write $$ for a literal dollar sign)."
        ) from exc
    except ValueError as exc:
        raise UsageError(f"Template {source} has a malformed placeholder: {exc}.") from exc


def render_file(path: Path, values: Mapping[str, str]) -> str:
    return render(path.read_text(encoding="utf-8"), values, source=str(path))


def parse_sections(text: str, *, source: str, required: tuple[str, ...] = OP_SECTIONS,
                   comment_preamble: bool = False) -> dict[str, str]:
    """Split a template into its named sections (text between markers).

    Op templates must hold every section of ``required`` and nothing before
    their first marker; ``comment_preamble`` lets a shared file open with
    ``//`` comment lines that say what it is (they belong to no section).
    """
    sections: dict[str, list[str]] = {}
    current: str | None = None
    for line in text.splitlines(keepends=True):
        match = SECTION_RE.match(line)
        if match:
            current = match.group(1)
            if current in sections:
                raise UsageError(f"Template {source} defines section {current!r} twice.")
            sections[current] = []
        elif current is not None:
            sections[current].append(line)
        elif line.strip() and not (comment_preamble and line.lstrip().startswith("//")):
            raise UsageError(f"Template {source}: text before the first '//@@ <section>' marker.")
    missing = [name for name in required if name not in sections]
    if missing:
        raise UsageError(f"Template {source} lacks section(s) {', '.join(missing)}.")
    return {name: "".join(lines).rstrip() + "\n" for name, lines in sections.items()}
