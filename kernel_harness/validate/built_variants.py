"""Checks of an existing build: each ``build/<variant>/`` as ``kernels`` would read it.

The validator is run on sources, but a kernel directory that already has a
build carries what ``publish.py`` will upload.  Its ``metadata.json`` is parsed
and its files validated against the recorded digest with kernels-data, the
code ``kernels`` itself uses (:mod:`kernel_harness.build.variant_digest`), so a
``.so`` replaced, a file added or one removed after the build is caught here
with the file's name, before publishing refuses it.
"""

from __future__ import annotations

from pathlib import Path

from ..build.variant_digest import check_variant
from .findings import Report

REBUILD = "Rebuild with scripts/build_kernel.py (the configured build_command), which rewrites the variant and its digest."


def built_variants(root: Path) -> list[Path]:
    """``build/<variant>/`` directories holding a metadata.json (staging/old dirs start with a dot)."""
    build = root / "build"
    if not build.is_dir():
        return []
    return sorted(p.parent for p in build.glob("*/metadata.json") if not p.parent.name.startswith("."))


def check_built_variants(report: Report, root: Path) -> None:
    for variant in built_variants(root):
        rel = variant.relative_to(root).as_posix()
        check = check_variant(variant)
        if check.metadata_error is not None:
            report.error(
                "invalid-metadata",
                f"{rel}/metadata.json",
                None,
                f"kernels-data cannot read {rel}/metadata.json, so `kernels` cannot load this variant: "
                f"{check.metadata_error}. {REBUILD}",
            )
            continue
        if not check.has_digest:
            report.warning(
                "no-digest",
                f"{rel}/metadata.json",
                None,
                f"{rel}/metadata.json has no digest: it was built before scripts/build_kernel.py recorded one, "
                "so neither `kernels.verify` nor publish.py can check its files against it. "
                f"{REBUILD}",
            )
            continue
        for violation in check.violations:
            where = f"{rel}/{violation.path}" if violation.path else f"{rel}/metadata.json"
            report.error(
                "digest-mismatch",
                where,
                None,
                f"{violation.kind}: {violation.message} (kernels-data, {check.algorithm} digest in "
                f"{rel}/metadata.json). The variant changed after it was built. {REBUILD}",
            )
