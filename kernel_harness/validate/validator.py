"""``validate_kernel(dir)``: every static check of a CPU kernel directory, in one report.

The checks never stop at the first problem: an agent fixing errors one rerun
at a time wastes a build cycle per error.  Schema errors still stop the source
checks that need a valid build.toml (which sections compile which file).
"""

from __future__ import annotations

from pathlib import Path

from ..buildtoml import BuildToml, SchemaProblem, check_build_toml
from .built_variants import check_built_variants
from .cxx_text import Source
from .fp_contract import check_fp_contract
from .findings import Report
from .isa import is_simd_section
from .plan_view import compiled_sources, section_flags
from .source_checks import (
    check_aligned_access,
    check_avx512_tier_flags,
    check_insn_guards,
    check_isa,
    check_mixing,
    check_tail,
    check_threshold,
    check_todo_markers,
    check_torch_in_tier,
)

_SCHEMA_CODES = {
    "syntax": "toml-syntax",
    "unknown-key": "unknown-key",
    "missing-key": "missing-key",
    "type": "wrong-type",
    "value": "invalid-value",
    "name": "invalid-kernel-name",
    "missing-file": "missing-build-toml",
}
_SKIP_DIRS = {"build", "dist", ".git", "__pycache__", ".venv", "node_modules"}
CXX_SUFFIXES = (".cpp", ".cc", ".cxx", ".c", ".hpp", ".h", ".hh", ".hxx", ".inc")


def _walk_sources(root: Path, suffixes: tuple[str, ...]) -> list[Path]:
    found = []
    for path in sorted(root.rglob("*")):
        rel_parts = path.relative_to(root).parts
        if any(part in _SKIP_DIRS or part.startswith(".") for part in rel_parts[:-1]):
            continue
        if path.is_file() and path.suffix in suffixes:
            found.append(path)
    return found


def _schema_errors(report: Report, problems: list[SchemaProblem]) -> None:
    for problem in problems:
        code = _SCHEMA_CODES.get(problem.kind, "invalid-value")
        if code == "missing-build-toml":
            report.error(
                code,
                "build.toml",
                None,
                f"{problem.message}: every kernel needs a build.toml (kernel-builder's schema); "
                "scripts/new_kernel.py generates one.",
            )
        else:
            report.error(code, "build.toml", problem.line, f"{problem.where}: {problem.message}")


def validate_kernel(kernel_dir: Path) -> Report:
    root = Path(kernel_dir).resolve()
    report = Report(kernel_dir=str(root))
    toml, problems = check_build_toml(root / "build.toml")
    _schema_errors(report, problems)

    binding = root / "torch-ext" / "torch_binding.cpp"
    if not binding.is_file():
        report.error(
            "missing-binding",
            "torch-ext/torch_binding.cpp",
            None,
            "torch-ext/torch_binding.cpp does not exist: it registers the ops with TORCH_LIBRARY_EXPAND and "
            "REGISTER_EXTENSION from registration.h. Create it and list it in [torch] src.",
        )

    # The unfinished-body check needs no build.toml: run it on every C++ file.
    for path in _walk_sources(root, CXX_SUFFIXES):
        check_todo_markers(report, Source.read(path, root))

    if toml is not None:
        _check_structure(report, root, toml)
    check_built_variants(report, root)
    return report


def _check_structure(report: Report, root: Path, toml: BuildToml) -> None:
    general = toml.general
    if not toml.cpu_kernels:
        report.error(
            "no-cpu-kernel",
            "build.toml",
            None,
            "build.toml has no [kernel.*] section with backend = \"cpu\"; add one per tier "
            f"([kernel.{general.python_name}_cpu], [kernel.{general.python_name}_cpu_avx512], ...).",
        )
        return

    # Listed sources exist; every .cpp on disk is listed somewhere.
    listed: set[Path] = set()
    sections = ([("torch", toml.torch.src)] if toml.torch else []) + [(k.table, k.src) for k in toml.cpu_kernels]
    for table, sources in sections:
        for src in sources:
            path = (root / src).resolve()
            listed.add(path)
            if not path.is_file():
                report.error(
                    "missing-source",
                    "build.toml",
                    toml.line_of(table, "src"),
                    f"[{table}] src lists {src}, which does not exist. Create it or remove it from src.",
                )
    for path in _walk_sources(root, (".cpp", ".cc", ".cxx")):
        if path.resolve() not in listed:
            rel = str(path.relative_to(root))
            report.error(
                "unlisted-source",
                rel,
                None,
                f"{rel} is in no build.toml section, so it is never compiled. Add it to the src of its "
                "tier's [kernel.*] section (or delete it).",
            )

    wanted_include = f"{general.python_name}_cpu"
    for kernel in toml.cpu_kernels:
        flags = section_flags(kernel)
        if wanted_include not in kernel.include:
            report.error(
                "missing-include",
                "build.toml",
                kernel.line,
                f"[{kernel.table}] needs include = [\"{wanted_include}\"] so its units find "
                f"{wanted_include}/cpu_features.hpp and the shared headers (found include = {list(kernel.include)}).",
            )
        simd = is_simd_section(flags)
        if simd and "-fopenmp" not in flags:
            report.error(
                "simd-without-openmp",
                "build.toml",
                toml.line_of(kernel.table, "cxx-flags") or kernel.line,
                f"[{kernel.table}] is a SIMD section without -fopenmp: its `#pragma omp` loops silently run on "
                "one thread. Add \"-fopenmp\" to its cxx-flags (the build links torch's OpenMP runtime).",
            )
        units = [Source.read(p, root) for p in compiled_sources(root, kernel)]
        for unit in units:
            check_isa(report, unit, kernel.table, flags)
            check_insn_guards(report, unit)
            if simd:
                check_torch_in_tier(report, unit, kernel.table)
                check_aligned_access(report, unit)
                check_tail(report, unit)
        check_mixing(report, kernel.table, flags, units, kernel.line, "build.toml")
        check_avx512_tier_flags(report, kernel.table, flags, units,
                                toml.line_of(kernel.table, "cxx-flags") or kernel.line)

    if toml.torch is not None:  # the binding is compiled with [torch] cxx-flags only
        for src in toml.torch.src:
            path = root / src
            if src.endswith((".cpp", ".cc", ".cxx")) and path.is_file():
                check_isa(report, Source.read(path, root), "torch", tuple(toml.torch.cxx_flags))

    check_fp_contract(report, toml)  # issue 20: contraction must be a decision (fp_contract.py)

    dispatcher = root / f"{general.python_name}_cpu" / f"{general.python_name}_cpu.cpp"
    if dispatcher.is_file():
        check_threshold(report, Source.read(dispatcher, root))
