"""C++ source text with comments and string literals blanked, line numbers kept.

The source checks are regular expressions, not a parser; blanking comments and
strings first keeps ``// don't use _mm512_load_ps here`` or an error message
from being read as code.  Newlines are preserved so offsets map to lines.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass
from pathlib import Path

_TOKEN_RE = re.compile(
    r"//[^\n]*"  # line comment
    r"|/\*.*?\*/"  # block comment
    r"|R\"(?P<delim>[^(\s]*)\(.*?\)(?P=delim)\""  # raw string
    r"|\"(?:\\.|[^\"\\\n])*\""  # string literal
    r"|'(?:\\.|[^'\\\n])*'",  # char literal
    re.DOTALL,
)


def _blank(match: re.Match[str]) -> str:
    text = match.group(0)
    if text.startswith(("\"", "R\"")):
        return '""' + re.sub(r"[^\n]", " ", text[2:])
    return re.sub(r"[^\n]", " ", text)


@dataclass
class Source:
    path: Path
    rel: str  # path relative to the kernel directory, as reported
    raw: str
    code: str  # comments and strings blanked
    _starts: list[int]

    @classmethod
    def read(cls, path: Path, root: Path) -> "Source":
        raw = path.read_text(encoding="utf-8", errors="replace")
        code = _TOKEN_RE.sub(_blank, raw)
        starts = [0] + [m.end() for m in re.finditer(r"\n", raw)]
        try:
            rel = str(path.resolve().relative_to(root.resolve()))
        except ValueError:
            rel = str(path)
        return cls(path=path, rel=rel, raw=raw, code=code, _starts=starts)

    def line_of(self, offset: int) -> int:
        return bisect.bisect_right(self._starts, offset)

    def includes(self) -> list[tuple[str, int]]:
        """``(header, line)`` for each #include (read from the raw text: headers are strings)."""
        found = []
        for match in re.finditer(r"^[ \t]*#[ \t]*include[ \t]*([<\"])([^>\"]+)[>\"]", self.raw, re.MULTILINE):
            found.append((match.group(2), self.line_of(match.start())))
        return found
