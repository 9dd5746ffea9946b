"""The knowledge base in ``references/``: loading, schema validation, id look-up.

An agent copies what it reads in ``references/*.yaml`` into its kernel, so the
entries are data with a fixed schema (documented in ``references/README.md``)
and every snippet is compiled and, where it is a function, run by
``tests/test_references.py``.  Other modules point at an entry by calling
:func:`ref` with a *literal* id (``ref("masked-tail")``); the cross-reference
test scans the sources for those calls and fails when an id does not exist, so
a renamed entry cannot leave dangling pointers behind.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .errors import UsageError
from .paths import REFERENCES_DIR

# The YAML pattern files and the Markdown documents the procedure names.
# correctness.yaml is owned by the benchmark code (it mirrors its tolerance
# rules) and has its own schema, so it is not an entry file.
ENTRY_FILES: tuple[str, ...] = (
    "runtime_dispatch.yaml",
    "simd_optimization_patterns.yaml",
    "memory_patterns.yaml",
    "threading_patterns.yaml",
    "dtype_optimizations.yaml",
    "brgemm_patterns.yaml",
    "quantized_gemm_patterns.yaml",
    "optimization_levels.yaml",
)
MARKDOWN_FILES: tuple[str, ...] = (
    "README.md",
    "workflow_details.md",
    "build_system.md",
    "implementation_reference.md",
    "optimization_strategies.md",
    "huggingface-kernels-integration.md",
)
CORRECTNESS_FILE = "correctness.yaml"

ID_PATTERN = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*$")
REQUIRED_FIELDS: tuple[str, ...] = ("id", "when_to_use", "why", "code", "flags", "expected_effect", "pitfalls")
MEASUREMENT_FIELDS: tuple[str, ...] = ("op", "shape", "dtype", "machine", "result")
OPTIONAL_FIELDS: tuple[str, ...] = (
    "title",
    "isa",  # /proc/cpuinfo flags needed to RUN the snippet (compiling needs only `flags`)
    "test_harness",  # extern "C" wrappers appended to `code` and called by the run test
    "check",  # name of the run check in tests/test_references.py
    "needs_torch_headers",  # compile with torch's include paths (and link libtorch)
    "max_ulp_error",  # math approximations: measured bound, asserted by the test
    "sources",  # public sources a fact came from
    "speedup_range",  # optimization_levels.yaml: [low, high] measured here
    "rank",  # optimization_levels.yaml: order by expected gain (1 = largest)
    "see_also",  # other entry ids
)


@dataclass(frozen=True)
class Entry:
    """One pattern: the fields of the schema plus the file it came from."""

    id: str
    file: str
    when_to_use: str
    why: str
    code: str
    flags: tuple[str, ...]
    expected_effect: dict[str, Any]
    pitfalls: tuple[str, ...]
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def isa(self) -> tuple[str, ...]:
        return tuple(self.extra.get("isa", ()))

    @property
    def test_harness(self) -> str | None:
        return self.extra.get("test_harness")

    @property
    def check(self) -> str | None:
        return self.extra.get("check")

    @property
    def needs_torch_headers(self) -> bool:
        return bool(self.extra.get("needs_torch_headers", False))


def ref(entry_id: str) -> str:
    """Point at a reference entry from code: ``ref("masked-tail")``.

    Returns the text an agent should read ("references/<file>#<id>").  Pass a
    literal string: the cross-reference test finds the calls by scanning the
    source, and an unknown id is an error here as well.
    """
    files = _id_to_file()
    if entry_id not in files:
        raise UsageError(
            f"Unknown reference id {entry_id!r}. Known ids are listed by "
            "kernel_harness.references.reference_ids(); fix the id or add the entry to references/."
        )
    return f"references/{files[entry_id]}#{entry_id}"


def reference_ids(directory: Path | None = None) -> set[str]:
    """Every entry id in the knowledge base (cached until a file changes)."""
    directory = Path(directory) if directory is not None else REFERENCES_DIR
    return set(_cached_ids(directory, _fingerprint(directory)))


def _fingerprint(directory: Path) -> tuple[tuple[str, int], ...]:
    stamps = []
    for name in ENTRY_FILES + MARKDOWN_FILES:
        try:
            stamps.append((name, (directory / name).stat().st_mtime_ns))
        except OSError:
            stamps.append((name, -1))
    return tuple(stamps)


@functools.lru_cache(maxsize=8)
def _cached_ids(directory: Path, fingerprint: tuple[tuple[str, int], ...]) -> frozenset[str]:
    return frozenset(entry.id for entry in load_entries(directory))


def load_entries(directory: Path | None = None) -> list[Entry]:
    """Parse and validate every entry file; raise UsageError on the first problem."""
    directory = Path(directory) if directory is not None else REFERENCES_DIR
    problems = validate_schema(directory)
    if problems:
        raise UsageError(
            f"The knowledge base in {directory} does not follow the schema of references/README.md: "
            + "; ".join(problems[:10])
            + ("" if len(problems) <= 10 else f"; and {len(problems) - 10} more")
        )
    entries: list[Entry] = []
    for name in ENTRY_FILES:
        for raw in _read_entries(directory / name):
            entries.append(_to_entry(name, raw))
    return entries


def validate_schema(directory: Path | None = None) -> list[str]:
    """Return every schema problem found (an empty list means valid).

    Problems are phrased as "<file> entry <id>: <what is wrong>" so a failing
    test names the exact place to fix.
    """
    directory = Path(directory) if directory is not None else REFERENCES_DIR
    problems: list[str] = []
    seen: dict[str, str] = {}
    for name in ENTRY_FILES:
        path = directory / name
        try:
            raws = _read_entries(path)
        except UsageError as error:
            problems.append(error.message)
            continue
        if not raws:
            problems.append(f"{name}: has no entries")
        for index, raw in enumerate(raws):
            label = f"{name} entry #{index}"
            if not isinstance(raw, dict):
                problems.append(f"{label}: must be a mapping, found {type(raw).__name__}")
                continue
            entry_id = raw.get("id")
            if isinstance(entry_id, str):
                label = f"{name} entry {entry_id}"
            problems.extend(f"{label}: {p}" for p in validate_entry(raw))
            if isinstance(entry_id, str):
                if entry_id in seen:
                    problems.append(f"{label}: id also used in {seen[entry_id]}")
                seen[entry_id] = name
    for name in MARKDOWN_FILES:
        if not (directory / name).is_file():
            problems.append(f"{name}: missing")
    return problems


def validate_entry(raw: dict[str, Any]) -> list[str]:
    """Schema problems of one entry mapping."""
    problems: list[str] = []
    for key in REQUIRED_FIELDS:
        if key not in raw:
            problems.append(f"missing field {key!r}")
    unknown = sorted(set(raw) - set(REQUIRED_FIELDS) - set(OPTIONAL_FIELDS))
    if unknown:
        problems.append(f"unknown field(s) {unknown}")
    entry_id = raw.get("id")
    if "id" in raw and (not isinstance(entry_id, str) or not ID_PATTERN.match(entry_id)):
        problems.append(f"id {entry_id!r} must be lower-case words joined by '-'")
    for key in ("when_to_use", "why", "code"):
        if key in raw and (not isinstance(raw[key], str) or len(raw[key].strip()) < 20):
            problems.append(f"{key} must be a string of at least 20 characters")
    if "flags" in raw:
        flags = raw["flags"]
        if not isinstance(flags, list) or not all(isinstance(f, str) and f.startswith("-") for f in flags):
            problems.append("flags must be a list of compiler options (each starting with '-')")
    if "pitfalls" in raw:
        pitfalls = raw["pitfalls"]
        if not isinstance(pitfalls, list) or not pitfalls or not all(isinstance(p, str) and p.strip() for p in pitfalls):
            problems.append("pitfalls must be a non-empty list of strings")
    effect = raw.get("expected_effect")
    if "expected_effect" in raw:
        if not isinstance(effect, dict) or not isinstance(effect.get("summary"), str):
            problems.append("expected_effect must be a mapping with a 'summary' string")
        else:
            measurement = effect.get("measurement")
            if not isinstance(measurement, dict):
                problems.append("expected_effect.measurement must be a mapping")
            else:
                for key in MEASUREMENT_FIELDS:
                    if not str(measurement.get(key, "")).strip():
                        problems.append(f"expected_effect.measurement.{key} is missing or empty")
    if raw.get("test_harness") is not None:
        if "extern \"C\"" not in str(raw["test_harness"]):
            problems.append("test_harness must define extern \"C\" functions")
        if not isinstance(raw.get("check"), str):
            problems.append("an entry with a test_harness must name its run check in 'check'")
    if "isa" in raw and (not isinstance(raw["isa"], list) or not all(isinstance(f, str) for f in raw["isa"])):
        problems.append("isa must be a list of /proc/cpuinfo flag names")
    if "max_ulp_error" in raw and (
        isinstance(raw["max_ulp_error"], bool) or not isinstance(raw["max_ulp_error"], (int, float))
    ):
        problems.append("max_ulp_error must be a number")
    if "speedup_range" in raw:
        rng = raw["speedup_range"]
        if not (isinstance(rng, list) and len(rng) == 2 and all(isinstance(v, (int, float)) for v in rng) and rng[0] <= rng[1]):
            problems.append("speedup_range must be [low, high] with low <= high")
    return problems


def _read_entries(path: Path) -> list[Any]:
    if not path.is_file():
        raise UsageError(f"{path.name}: missing (expected at {path})")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise UsageError(f"{path.name}: not valid YAML: {exc}") from exc
    if not isinstance(data, dict) or not isinstance(data.get("entries"), list):
        raise UsageError(f"{path.name}: must be a mapping with an 'entries' list")
    return data["entries"]


def _to_entry(file_name: str, raw: dict[str, Any]) -> Entry:
    extra = {k: v for k, v in raw.items() if k not in REQUIRED_FIELDS}
    return Entry(
        id=raw["id"],
        file=file_name,
        when_to_use=raw["when_to_use"],
        why=raw["why"],
        code=raw["code"],
        flags=tuple(raw["flags"]),
        expected_effect=raw["expected_effect"],
        pitfalls=tuple(raw["pitfalls"]),
        extra=extra,
    )


@functools.lru_cache(maxsize=1)
def _id_to_file() -> dict[str, str]:
    return {entry.id: entry.file for entry in load_entries()}


# Patterns the cross-reference test uses: ref(<quoted literal id>) in Python, [ref:<id>] in Markdown/YAML text.
PY_REF_PATTERN = re.compile(r"""\bref\(\s*["']([^"']+)["']\s*\)""")
TEXT_REF_PATTERN = re.compile(r"\[ref:([a-z0-9-]+)\]")
# Python names whose string elements are reference ids by convention (the analyser and the
# profiler build lists like `refs += ["masked-tail"]` or dicts with a "references" key).
REF_LIST_NAMES = frozenset({"refs", "references", "reference_ids", "KNOWN_REFERENCE_IDS"})


def find_cross_references(paths: list[Path]) -> dict[str, list[str]]:
    """Map each referenced id to the files that reference it.

    Python: ``ref(<quoted id>)`` calls, and string literals collected into a list named
    ``refs``/``references`` (assignment, ``+=``, ``.append``/``.extend``) or stored
    under a ``"references"`` dict key. Text: ``[ref:<id>]``.
    """
    found: dict[str, list[str]] = {}
    for path in paths:
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        hits = TEXT_REF_PATTERN.findall(text)
        if path.suffix == ".py":
            hits += PY_REF_PATTERN.findall(text)
            hits += _python_ref_literals(text)
        for entry_id in hits:
            found.setdefault(entry_id, []).append(str(path))
    return found


def _python_ref_literals(source: str) -> list[str]:
    import ast

    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []

    def strings(node: ast.AST | None) -> list[str]:
        if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
            return [e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
        if isinstance(node, ast.Call) and node.args:  # frozenset({...}), list([...])
            return strings(node.args[0])
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return [node.value]
        return []

    def named(target: ast.AST) -> bool:
        name = target.id if isinstance(target, ast.Name) else target.attr if isinstance(target, ast.Attribute) else ""
        return name in REF_LIST_NAMES or name.endswith("_refs")

    out: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(named(t) for t in node.targets):
            out += strings(node.value)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)) and named(node.target):
            out += strings(node.value)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr in ("append", "extend") and named(node.func.value) and node.args):
            out += strings(node.args[0])
        elif isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values):
                if isinstance(key, ast.Constant) and key.value == "references":
                    out += strings(value)
    return [s for s in out if ID_PATTERN.match(s)]
