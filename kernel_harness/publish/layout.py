"""What a publishable kernel directory contains, read without importing it.

``scripts/publish.py`` accepts either a kernel directory (``build.toml`` plus a
``build/<variant>/`` from ``scripts/build_kernel.py``) or a finalized
``output/`` directory (the same sources plus ``summary.json`` and
``baseline.py`` from ``trial_manager.py finalize``).  Everything here is read
from files (``tomllib``, ``json``, ``ast``) so that a broken kernel can never
take the publisher down with it: importing the kernel only ever happens in a
fresh child process (see :mod:`kernel_harness.publish.verify`).
"""

from __future__ import annotations

import ast
import json
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..buildtoml import kernel_builder_name, kernel_name_error, python_package_name
from ..errors import UsageError

#: Files and directories never copied into a Hub repository: byte code would be
#: ignored by ``kernels`` anyway, and build scratch space is not an artifact.
IGNORED_NAMES = frozenset({"__pycache__", ".pytest_cache", ".git", ".ninja_deps", ".ninja_log"})
IGNORED_SUFFIXES = (".pyc", ".pyo", ".o", ".d", ".tmp")

#: A build variant directory name as ``kernels.variants.parse_variant`` accepts
#: it for a Torch arch build, e.g. ``torch213-cxx11-cpu-x86_64-linux``.
VARIANT_RE = re.compile(r"^torch\d\d+(-cxx(11|98))?-[a-z0-9]+-[a-z0-9_]+-[a-z]+$")

#: Functions every generated package exposes that are not kernel operations.
HELPER_FUNCTIONS = frozenset({"available_tiers", "dispatch_tier"})

SUMMARY_FILE = "summary.json"
BASELINE_COPY = "baseline.py"


@dataclass(frozen=True)
class Signature:
    """A public function of the kernel's Python package, as written in its source."""

    name: str
    signature: str  # e.g. "rms_norm(x, weight, eps, out=None)"
    doc: str  # first paragraph of the docstring, or ""
    params: tuple[str, ...] = ()  # positional parameter names, in order


@dataclass(frozen=True)
class Tier:
    """One ``[kernel.*]`` section of build.toml, interpreted as a dispatch tier."""

    section: str
    tier: str  # "generic", "avx2", "avx512" or "amx"
    isa_flags: tuple[str, ...]  # the -m flags it is compiled with


@dataclass
class KernelSource:
    """A kernel directory or finalized output directory, ready to be staged."""

    root: Path
    name: str  # Python package name, e.g. "harness_catalogue"
    version: int
    license: str
    build_toml: dict[str, Any]
    variants: list[Path]  # build/<variant>/ directories with a metadata.json
    source_paths: list[Path]  # build.toml, torch-ext/, <name>_cpu/ (relative to root)
    tiers: list[Tier]
    functions: list[Signature]
    package_doc: str
    summary: dict[str, Any] | None = None  # output_dir/summary.json when present
    baseline: Path | None = None
    license_file: Path | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def hub_name(self) -> str:
        """The kernel name as kernels' metadata spells it (dashes, not underscores)."""
        return kernel_builder_name(self.name)


def _read_build_toml(root: Path) -> dict[str, Any]:
    path = root / "build.toml"
    if not path.is_file():
        raise UsageError(
            f"{root} has no build.toml, so it is neither a kernel directory nor a finalized "
            "output directory. Pass the directory that holds build.toml (the kernel you built, "
            "or the output/ written by `trial_manager.py finalize`)."
        )
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise UsageError(f"{path} is not valid TOML: {exc}. Fix it (scripts/validate_cpu_kernel.py names the line).") from exc


def find_variants(root: Path) -> list[Path]:
    """The build variant directories under ``root/build`` that carry kernels metadata."""
    build = root / "build"
    if not build.is_dir():
        return []
    return sorted(
        entry
        for entry in build.iterdir()
        if entry.is_dir() and VARIANT_RE.match(entry.name) and (entry / "metadata.json").is_file()
    )


def _tiers(build_toml: dict[str, Any]) -> list[Tier]:
    tiers: list[Tier] = []
    kernels = build_toml.get("kernel", {})
    if not isinstance(kernels, dict):
        return tiers
    for section, body in kernels.items():
        if not isinstance(body, dict):
            continue
        flags = tuple(
            flag[2:] for flag in body.get("cxx-flags", []) if isinstance(flag, str) and flag.startswith("-m")
        )
        if any(flag.startswith("amx") for flag in flags):
            tier = "amx"
        elif any(flag.startswith("avx512") for flag in flags):
            tier = "avx512"
        elif "avx2" in flags:
            tier = "avx2"
        else:
            tier = "generic"
        tiers.append(Tier(section=section, tier=tier, isa_flags=flags))
    order = {"generic": 0, "avx2": 1, "avx512": 2, "amx": 3}
    return sorted(tiers, key=lambda t: (order[t.tier], t.section))


def _format_arg(arg: ast.arg, default: ast.expr | None) -> str:
    return arg.arg if default is None else f"{arg.arg}={ast.unparse(default)}"


def _signature_of(node: ast.FunctionDef) -> str:
    args = node.args
    positional = args.posonlyargs + args.args
    defaults: list[ast.expr | None] = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
    parts = [_format_arg(a, d) for a, d in zip(positional, defaults)]
    if args.posonlyargs:
        parts.insert(len(args.posonlyargs), "/")
    if args.vararg:
        parts.append(f"*{args.vararg.arg}")
    elif args.kwonlyargs:
        parts.append("*")
    parts += [_format_arg(a, d) for a, d in zip(args.kwonlyargs, args.kw_defaults)]
    if args.kwarg:
        parts.append(f"**{args.kwarg.arg}")
    returns = f" -> {ast.unparse(node.returns)}" if node.returns is not None else ""
    return f"{node.name}({', '.join(parts)}){returns}"


def _first_paragraph(doc: str | None) -> str:
    if not doc:
        return ""
    return " ".join(doc.strip().split("\n\n", 1)[0].split())


def read_python_api(init_file: Path) -> tuple[list[Signature], str]:
    """The public functions of a package ``__init__.py`` (parsed, never imported)."""
    try:
        tree = ast.parse(init_file.read_text(encoding="utf-8"), filename=str(init_file))
    except (OSError, SyntaxError, UnicodeDecodeError) as exc:
        raise UsageError(f"Could not parse {init_file}: {exc}. Fix the Python package before publishing.") from exc
    exported: set[str] | None = None
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            try:
                exported = {str(v) for v in ast.literal_eval(node.value)}
            except ValueError:
                exported = None
    functions = [
        Signature(
            name=node.name,
            signature=_signature_of(node),
            doc=_first_paragraph(ast.get_docstring(node)),
            params=tuple(a.arg for a in node.args.posonlyargs + node.args.args),
        )
        for node in tree.body
        if isinstance(node, ast.FunctionDef)
        and not node.name.startswith("_")
        and (exported is None or node.name in exported)
    ]
    return functions, _first_paragraph(ast.get_docstring(tree))


def kernel_functions(source: KernelSource) -> list[Signature]:
    """The kernel operations (the helpers ``available_tiers``/``dispatch_tier`` excluded)."""
    return [f for f in source.functions if f.name not in HELPER_FUNCTIONS]


def _package_init(root: Path, name: str, variants: list[Path]) -> Path | None:
    candidates = [root / "torch-ext" / name / "__init__.py"]
    candidates += [variant / "__init__.py" for variant in variants]
    candidates += [variant / name / "__init__.py" for variant in variants]
    return next((c for c in candidates if c.is_file()), None)


def _read_summary(root: Path) -> dict[str, Any] | None:
    path = root / SUMMARY_FILE
    if not path.is_file():
        return None
    return _read_json_object(path, "Re-run `trial_manager.py finalize`.")


def _find_baseline(root: Path, summary: dict[str, Any] | None, explicit: Path | None) -> Path | None:
    if explicit is not None:
        if not explicit.is_file():
            raise UsageError(f"--baseline {explicit} does not exist. Pass the baseline.py the kernel was checked against.")
        return explicit.resolve()
    if (root / BASELINE_COPY).is_file():
        return (root / BASELINE_COPY).resolve()
    recorded = (summary or {}).get("baseline_file")
    if isinstance(recorded, str) and Path(recorded).is_file():
        return Path(recorded).resolve()
    return None


def _find_license(root: Path) -> Path | None:
    for name in ("LICENSE", "LICENSE.txt", "LICENSE.md", "COPYING"):
        if (root / name).is_file():
            return root / name
    return None


def read_kernel_source(root: Path, *, baseline: Path | None = None) -> KernelSource:
    """Read and check everything the stage needs from ``root`` (no import, no build)."""
    root = Path(root).resolve()
    if not root.is_dir():
        raise UsageError(f"{root} is not a directory. Pass a kernel directory or a finalized output/ directory.")
    build_toml = _read_build_toml(root)
    general = build_toml.get("general", {})
    raw_name = general.get("name") if isinstance(general, dict) else None
    refusal = kernel_name_error(raw_name) if isinstance(raw_name, str) else "it is missing or not a string"
    if refusal is not None:
        raise UsageError(
            f"{root / 'build.toml'}: [general] name {raw_name!r} is not a kernel name the ecosystem accepts "
            f"(kernels-data: {refusal}). Write it with dashes, e.g. my-kernel (the Python package stays "
            "my_kernel), and rebuild."
        )
    name = python_package_name(raw_name)
    variants = find_variants(root)
    notes: list[str] = []
    raw_version = general.get("version")
    if raw_version is None:
        raw_version = _metadata_version(variants)
        if raw_version is None:
            raw_version = 1
            notes.append("build.toml has no [general] version and no build metadata records one; using version 1.")
    if isinstance(raw_version, bool) or not isinstance(raw_version, int) or raw_version < 0:
        raise UsageError(f"{root / 'build.toml'}: [general] version must be a non-negative integer, found {raw_version!r}.")
    license_id = general.get("license", "Apache-2.0")
    if not isinstance(license_id, str) or not license_id:
        raise UsageError(f"{root / 'build.toml'}: [general] license must be an SPDX identifier such as Apache-2.0.")

    source_paths = [Path("build.toml")]
    for rel in (Path("torch-ext"), Path(f"{name}_cpu")):
        if (root / rel).exists():
            source_paths.append(rel)
        else:
            notes.append(f"{rel}/ is missing from {root}; the published sources will not include it.")
    init_file = _package_init(root, name, variants)
    if init_file is None:
        raise UsageError(
            f"No Python package for {name!r} was found (looked for torch-ext/{name}/__init__.py and the "
            "build variants). The kernel directory is incomplete; regenerate it from the templates."
        )
    functions, package_doc = read_python_api(init_file)
    summary = _read_summary(root)
    return KernelSource(
        root=root,
        name=name,
        version=raw_version,
        license=license_id,
        build_toml=build_toml,
        variants=variants,
        source_paths=source_paths,
        tiers=_tiers(build_toml),
        functions=functions,
        package_doc=package_doc,
        summary=summary,
        baseline=_find_baseline(root, summary, baseline),
        license_file=_find_license(root),
        notes=notes,
    )


def _metadata_version(variants: list[Path]) -> int | None:
    for variant in variants:
        data = read_metadata(variant)
        if isinstance(data.get("version"), int):
            return int(data["version"])
    return None


def read_metadata(variant: Path) -> dict[str, Any]:
    return _read_json_object(variant / "metadata.json", "Rebuild the kernel with scripts/build_kernel.py.")


def _read_json_object(path: Path, remedy: str) -> dict[str, Any]:
    """The JSON object in ``path``; anything else is a usage error that says ``remedy``."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UsageError(f"{path} is not valid JSON: {exc}. {remedy}") from exc
    if not isinstance(data, dict):
        raise UsageError(f"{path} must hold a JSON object. {remedy}")
    return data


def expected_build_id(root: Path) -> str | None:
    """The content id scripts/build_kernel.py would give a build of these sources.

    The builder names its module ``_<name>_cpu_<content id>`` (metadata.json's
    ``id``), a hash of build.toml, every source and the Python package.  Matching
    it is the reliable test that build/ was made from exactly these sources;
    file times are not (finalize copies sources with their old times).  ``None``
    when the builder's API is unavailable, so callers fall back to file times.
    """
    try:
        from ..build.plan import content_id, python_package_files
        from ..buildtoml import load_build_toml

        toml = load_build_toml(root / "build.toml")
        pyext = toml.torch.pyext if toml.torch else ("py", "pyi")
        return content_id(root, toml, python_package_files(root, toml.general.python_name, pyext))
    except Exception:  # noqa: BLE001 - any failure means "cannot tell"; the build step reports real errors
        return None


def build_matches_sources(source: KernelSource, variant: Path) -> bool | None:
    """True/False when the build's content id can be compared with the sources', else None."""
    expected = expected_build_id(source.root)
    built_id = read_metadata(variant).get("id")
    if expected is None or not isinstance(built_id, str):
        return None
    return built_id.endswith(f"_{expected}")


def newest_source_mtime(source: KernelSource) -> float:
    """The newest modification time among the published sources (to detect a stale build)."""
    newest = 0.0
    for rel in source.source_paths:
        path = source.root / rel
        files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
        for file in files:
            if not is_ignored(file.relative_to(source.root)):
                newest = max(newest, file.stat().st_mtime)
    return newest


def newest_build_mtime(variant: Path) -> float:
    """When the variant was last (re)built; an incremental no-op build may leave older files."""
    times = [p.stat().st_mtime for p in variant.rglob("*") if p.is_file() and not is_ignored(p.relative_to(variant))]
    return max(times) if times else 0.0


def is_ignored(relative: Path) -> bool:
    return any(part in IGNORED_NAMES for part in relative.parts) or relative.name.endswith(IGNORED_SUFFIXES)
