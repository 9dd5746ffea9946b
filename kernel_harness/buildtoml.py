"""``build.toml``: kernel-builder's schema, parsed with ``tomllib`` into dataclasses.

The builder (``scripts/build_kernel.py``) and the validator
(``scripts/validate_cpu_kernel.py``) share this module so they can never
disagree about what a valid file is.

The schema follows kernel-builder's current format, *edition 5* (the Rust
structs ``kernels-data/src/config/v5.rs`` in huggingface/kernels, which use
``deny_unknown_fields`` everywhere): an unknown key anywhere is an error there,
so it is an error here too, with the list of keys that are known.

``[general] name`` is checked by the ecosystem's own rule, ``kernels_data.KernelName``
(lowercase letters, digits and dashes; the Python package replaces ``-`` with
``_``), not by a copy of its regular expression: a name ``kernels`` would refuse
in ``metadata.json`` is refused here with kernels-data's own message.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kernels_data

from .errors import UsageError

EDITION = 5

#: ``[general] backends`` values (kernel-builder ``Backend``).
BACKENDS = ("cann", "cpu", "cuda", "metal", "neuron", "rocm", "tpu", "xpu")
#: ``[kernel.*] backend`` values (kernel-builder ``Kernel`` variants).
KERNEL_BACKENDS = ("cpu", "cuda", "metal", "rocm", "xpu")
#: ``depends`` values kernel-builder knows (``Dependency`` enum).
DEPENDENCIES = (
    "cutlass_2_10",
    "cutlass_3_5",
    "cutlass_3_6",
    "cutlass_3_8",
    "cutlass_3_9",
    "cutlass_4_0",
    "sycl_tla",
    "metal-cpp",
    "torch",
)

_STR = "a string"
_INT = "an integer"
_STR_LIST = "a list of strings"
_TABLE = "a table"
_KERNEL_DEPS = "a list of tables"

# key -> expected type, per table.  Kept as data so the error messages can list
# the known keys and the validator can report exactly which key is wrong.
TOP_LEVEL_KEYS = {"general": _TABLE, "torch": _TABLE, "torch-noarch": _TABLE, "tvm-ffi": _TABLE, "kernel": _TABLE}
GENERAL_KEYS = {
    "name": _STR,
    "version": _INT,
    "edition": _INT,
    "license": _STR,
    "upstream": _STR,
    "source": _STR,
    "minver": _STR,
    "backends": _STR_LIST,
    "cuda": _TABLE,
    "hub": _TABLE,
    "kernel-depends": _KERNEL_DEPS,
    "neuron": _TABLE,
    "python-depends": _STR_LIST,
    "tpu": _TABLE,
    "xpu": _TABLE,
}
GENERAL_REQUIRED = ("name", "version", "edition", "license", "backends")
GENERAL_SUBTABLE_KEYS = {
    "cuda": {"minver": _STR, "maxver": _STR, "kernel-depends": _KERNEL_DEPS, "python-depends": _STR_LIST},
    "hub": {"repo-id": _STR, "branch": _STR},
    "neuron": {"kernel-depends": _KERNEL_DEPS, "python-depends": _STR_LIST},
    "tpu": {"python-depends": _STR_LIST},
    "xpu": {"kernel-depends": _KERNEL_DEPS, "python-depends": _STR_LIST},
}
TORCH_KEYS = {
    "include": _STR_LIST,
    "minver": _STR,
    "maxver": _STR,
    "pyext": _STR_LIST,
    "src": _STR_LIST,
    "stable-abi": "a string or a table",
    "cxx-flags": _STR_LIST,
}
_KERNEL_COMMON = {"backend": _STR, "cxx-flags": _STR_LIST, "depends": _STR_LIST, "include": _STR_LIST, "src": _STR_LIST}
KERNEL_KEYS: dict[str, dict[str, str]] = {
    "cpu": dict(_KERNEL_COMMON),
    "cuda": {**_KERNEL_COMMON, "cuda-capabilities": _STR_LIST, "cuda-flags": _STR_LIST, "cuda-minver": _STR},
    "metal": dict(_KERNEL_COMMON),
    "rocm": {**_KERNEL_COMMON, "rocm-archs": _STR_LIST, "hip-flags": _STR_LIST},
    "xpu": {**_KERNEL_COMMON, "sycl-flags": _STR_LIST},
}
KERNEL_REQUIRED = ("backend", "depends", "src")

def kernel_name_error(name: str) -> str | None:
    """kernels-data's refusal of ``name`` as a kernel name, or None when the ecosystem accepts it."""
    try:
        kernels_data.KernelName(name)
    except ValueError as exc:
        return str(exc)
    return None


def python_package_name(name: str) -> str:
    """The importable package a kernel name stands for: ``my-kernel`` -> ``my_kernel``."""
    return name.replace("-", "_")


def kernel_builder_name(name: str) -> str:
    """The dashed spelling kernel-builder and ``metadata.json`` use: ``my_kernel`` -> ``my-kernel``."""
    return name.replace("_", "-")


@dataclass(frozen=True)
class SchemaProblem:
    """One thing wrong with ``build.toml``; ``where`` is a dotted key path."""

    where: str
    message: str
    line: int | None = None
    #: syntax | unknown-key | missing-key | type | value | name | missing-file
    kind: str = "value"

    def __str__(self) -> str:
        at = f" (line {self.line})" if self.line else ""
        return f"{self.where}{at}: {self.message}"


class BuildTomlError(UsageError):
    """``build.toml`` is missing, unparsable or does not follow the schema."""

    def __init__(self, path: Path, problems: list[SchemaProblem]):
        self.path = Path(path)
        self.problems = problems
        listed = "; ".join(str(p) for p in problems)
        super().__init__(
            f"{path} does not follow kernel-builder's build.toml schema (edition {EDITION}): {listed}. "
            "Fix the named keys; scripts/validate_cpu_kernel.py lists every problem."
        )


@dataclass(frozen=True)
class General:
    name: str
    version: int
    edition: int
    license: str
    backends: tuple[str, ...]
    python_depends: tuple[str, ...] = ()
    upstream: str | None = None
    hub_repo_id: str | None = None

    @property
    def python_name(self) -> str:
        """The importable package name (``torch-ext/<python_name>/``)."""
        return python_package_name(self.name)

    @property
    def metadata_name(self) -> str:
        """The name as ``metadata.json`` spells it (checked by kernels_data.KernelName at parse time)."""
        return self.name


@dataclass(frozen=True)
class TorchSection:
    src: tuple[str, ...]
    include: tuple[str, ...] = ()
    pyext: tuple[str, ...] = ("py", "pyi")
    cxx_flags: tuple[str, ...] = ()
    minver: str | None = None
    maxver: str | None = None


@dataclass(frozen=True)
class KernelSection:
    """One ``[kernel.<key>]`` table."""

    key: str
    backend: str
    depends: tuple[str, ...]
    src: tuple[str, ...]
    include: tuple[str, ...] = ()
    cxx_flags: tuple[str, ...] = ()
    line: int | None = None

    @property
    def table(self) -> str:
        return f"kernel.{self.key}"


@dataclass(frozen=True)
class BuildToml:
    path: Path
    general: General
    torch: TorchSection | None
    kernels: tuple[KernelSection, ...]
    text: str = field(repr=False, default="")

    @property
    def root(self) -> Path:
        return self.path.parent

    @property
    def cpu_kernels(self) -> tuple[KernelSection, ...]:
        return tuple(k for k in self.kernels if k.backend == "cpu")

    def line_of(self, table: str, key: str | None = None) -> int | None:
        return locate(self.text, table, key)


# --------------------------------------------------------------------------- parsing


def locate(text: str, table: str, key: str | None = None) -> int | None:
    """Best-effort 1-based line of ``[table]`` (or of ``key`` inside it).

    ``tomllib`` keeps no positions; a line number still helps a person find the
    problem, so this scans the text for the header and then the key.
    """
    lines = text.splitlines()
    header = re.compile(r"^\s*\[\s*" + r"\s*\.\s*".join(_quoted(p) for p in table.split(".")) + r"\s*\]\s*(#.*)?$")
    start = None
    if table:
        for number, line in enumerate(lines, 1):
            if header.match(line):
                start = number
                break
    if key is None:
        return start
    key_re = re.compile(r"^\s*" + _quoted(key) + r"\s*=")
    begin = start or 0
    for number in range(begin + 1, len(lines) + 1):
        line = lines[number - 1]
        if start is not None and number > start and re.match(r"^\s*\[", line):
            break
        if key_re.match(line):
            return number
    return start


def _quoted(part: str) -> str:
    escaped = re.escape(part)
    return f"(?:{escaped}|\"{escaped}\"|'{escaped}')"


class _Checker:
    """Collects every schema problem instead of stopping at the first one."""

    def __init__(self, text: str):
        self.text = text
        self.problems: list[SchemaProblem] = []

    def add(self, table: str, key: str | None, message: str, kind: str = "value") -> None:
        where = f"{table}.{key}" if key and table else (key or table or "build.toml")
        self.problems.append(SchemaProblem(where, message, locate(self.text, table, key), kind))

    def unknown_and_types(self, table: str, data: dict[str, Any], known: dict[str, str]) -> None:
        for key, value in data.items():
            if key not in known:
                self.add(
                    table,
                    key,
                    f"unknown key {key!r} (kernel-builder refuses unknown keys); "
                    f"the keys known in [{table or 'top level'}] are: {', '.join(sorted(known))}",
                    "unknown-key",
                )
                continue
            expected = known[key]
            if not _has_type(value, expected):
                self.add(table, key, f"must be {expected}, found {_describe(value)}", "type")

    def required(self, table: str, data: dict[str, Any], keys: tuple[str, ...]) -> None:
        for key in keys:
            if key not in data:
                self.add(table, None, f"missing required key {key!r} in [{table}]", "missing-key")


def _has_type(value: Any, expected: str) -> bool:
    if expected == _STR:
        return isinstance(value, str)
    if expected == _INT:
        return isinstance(value, int) and not isinstance(value, bool)
    if expected == _STR_LIST:
        return isinstance(value, list) and all(isinstance(v, str) for v in value)
    if expected == _TABLE:
        return isinstance(value, dict)
    if expected == _KERNEL_DEPS:
        return isinstance(value, list) and all(isinstance(v, dict) for v in value)
    return isinstance(value, (str, dict))  # "a string or a table"


def _describe(value: Any) -> str:
    kind = {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "a list", dict: "a table"}
    for cls, text in kind.items():
        if type(value) is cls:
            if cls is list and value and not all(isinstance(v, str) for v in value):
                return "a list containing non-strings " + repr(value)
            return f"{text} {value!r}" if cls is not dict else text
    return repr(value)


def check_text(text: str, path: Path) -> tuple[BuildToml | None, list[SchemaProblem]]:
    """Parse ``text``; return the typed result (``None`` when invalid) and every problem."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        line = getattr(exc, "lineno", None)
        match = re.search(r"line (\d+)", str(exc))
        if line is None and match:
            line = int(match.group(1))
        return None, [SchemaProblem("build.toml", f"not valid TOML: {exc}", line, "syntax")]
    check = _Checker(text)
    check.unknown_and_types("", data, TOP_LEVEL_KEYS)
    general = data.get("general")
    if not isinstance(general, dict):
        if "general" not in data:
            check.add("", "general", "missing required table [general]", "missing-key")
        general = {}
    else:
        _check_general(check, general)
    torch = data.get("torch")
    if isinstance(torch, dict):
        check.unknown_and_types("torch", torch, TORCH_KEYS)
    if not any(key in data for key in ("torch", "torch-noarch", "tvm-ffi")):
        # kernel-builder requires one framework table; a CPU kernel needs [torch]
        check.add(
            "",
            "torch",
            'missing required table [torch] (src = ["torch-ext/torch_binding.cpp", "torch-ext/torch_binding.h"])',
            "missing-key",
        )
    kernels = data.get("kernel", {})
    if isinstance(kernels, dict):
        for key, section in kernels.items():
            _check_kernel(check, key, section)
    if check.problems:
        return None, check.problems
    return _build(path, text, data), []


def _check_general(check: _Checker, general: dict[str, Any]) -> None:
    check.unknown_and_types("general", general, GENERAL_KEYS)
    check.required("general", general, GENERAL_REQUIRED)
    for sub, known in GENERAL_SUBTABLE_KEYS.items():
        if isinstance(general.get(sub), dict):
            check.unknown_and_types(f"general.{sub}", general[sub], known)
    name = general.get("name")
    refusal = kernel_name_error(name) if isinstance(name, str) else None
    if refusal is not None:
        suggestion = kernel_builder_name(name).lower()
        hint = (
            f" Write name = {suggestion!r} (the Python package stays {python_package_name(suggestion)!r})."
            if kernel_name_error(suggestion) is None
            else ""
        )
        check.add("general", "name", f"kernels-data refuses {name!r}: {refusal}.{hint}", "name")
    edition = general.get("edition")
    if isinstance(edition, int) and not isinstance(edition, bool) and edition != EDITION:
        check.add("general", "edition", f"must be {EDITION} (kernel-builder's current schema), found {edition}")
    version = general.get("version")
    if isinstance(version, int) and not isinstance(version, bool) and version < 0:
        check.add("general", "version", f"must be a non-negative integer, found {version}")
    backends = general.get("backends")
    if isinstance(backends, list):
        for backend in backends:
            if isinstance(backend, str) and backend not in BACKENDS:
                check.add("general", "backends", f"unknown backend {backend!r}; known: {', '.join(BACKENDS)}")


def _check_kernel(check: _Checker, key: str, section: Any) -> None:
    table = f"kernel.{key}"
    if not isinstance(section, dict):
        check.add("kernel", key, f"[{table}] must be a table, found {_describe(section)}", "type")
        return
    backend = section.get("backend")
    if "backend" not in section:
        check.add(
            table, None, f"missing required key 'backend' in [{table}] (one of {', '.join(KERNEL_BACKENDS)})", "missing-key"
        )
        known = _KERNEL_COMMON
    elif not isinstance(backend, str) or backend not in KERNEL_KEYS:
        check.add(table, "backend", f"unknown backend {backend!r}; known: {', '.join(KERNEL_BACKENDS)}")
        known = _KERNEL_COMMON
    else:
        known = KERNEL_KEYS[backend]
    check.unknown_and_types(table, section, known)
    check.required(table, section, tuple(k for k in KERNEL_REQUIRED if k != "backend"))
    depends = section.get("depends")
    if isinstance(depends, list):
        for dep in depends:
            if isinstance(dep, str) and dep not in DEPENDENCIES:
                check.add(table, "depends", f"unknown dependency {dep!r}; known: {', '.join(DEPENDENCIES)}")


def _build(path: Path, text: str, data: dict[str, Any]) -> BuildToml:
    g = data["general"]
    general = General(
        name=g["name"],
        version=g["version"],
        edition=g["edition"],
        license=g["license"],
        backends=tuple(g["backends"]),
        python_depends=tuple(g.get("python-depends", ())),
        upstream=g.get("upstream"),
        hub_repo_id=(g.get("hub") or {}).get("repo-id"),
    )
    torch = None
    if isinstance(data.get("torch"), dict):
        t = data["torch"]
        torch = TorchSection(
            src=tuple(t.get("src", ())),
            include=tuple(t.get("include", ())),
            pyext=tuple(t.get("pyext", ("py", "pyi"))),
            cxx_flags=tuple(t.get("cxx-flags", ())),
            minver=t.get("minver"),
            maxver=t.get("maxver"),
        )
    kernels = tuple(
        KernelSection(
            key=key,
            backend=s["backend"],
            depends=tuple(s["depends"]),
            src=tuple(s["src"]),
            include=tuple(s.get("include", ())),
            cxx_flags=tuple(s.get("cxx-flags", ())),
            line=locate(text, f"kernel.{key}"),
        )
        for key, s in data.get("kernel", {}).items()
    )
    return BuildToml(path=Path(path), general=general, torch=torch, kernels=kernels, text=text)


def check_build_toml(path: Path) -> tuple[BuildToml | None, list[SchemaProblem]]:
    """Read and check ``path``; a missing or unreadable file is one problem, not an exception."""
    path = Path(path)
    if not path.is_file():
        return None, [SchemaProblem("build.toml", f"{path} does not exist", None, "missing-file")]
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        return None, [SchemaProblem("build.toml", f"cannot read {path}: {exc}", None, "syntax")]
    return check_text(text, path)


def load_build_toml(path: Path) -> BuildToml:
    """Parse ``path`` or raise :class:`BuildTomlError` listing every problem."""
    path = Path(path)
    if not path.is_file():
        raise UsageError(
            f"{path} does not exist. Run the build from the kernel directory (the one holding "
            "build.toml) or pass --dir; scripts/new_kernel.py creates a complete kernel project."
        )
    result, problems = check_build_toml(path)
    if result is None:
        raise BuildTomlError(path, problems)
    return result
