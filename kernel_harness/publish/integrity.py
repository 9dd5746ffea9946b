"""Publish verifies before it uploads: each staged variant re-hashed against its digest.

``scripts/build_kernel.py`` records a kernels-data digest of every variant's
files in its ``metadata.json``.  After staging, each staged ``build/<variant>/``
is re-hashed with kernels-data (the code ``kernels.verify`` uses) and compared
with that digest; any missing file, unknown file or hash mismatch (for example
a ``.so`` replaced after the build) refuses the publish with exit 1, naming
every violation, before anything is loaded or uploaded.  The staged copy is
checked because it is exactly what gets uploaded.

Nothing here signs anything: a ``metadata.json.sigstore`` bundle needs a
sigstore OIDC identity (a GitHub Actions workflow), which an offline harness
does not have; see docs/publish.md.  A bundle already in a variant was not made
by this harness and is passed on unchecked (the report says so).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..build.variant_digest import KERNELS_DATA_VERSION, VariantCheck, algorithm_name, check_variant
from ..errors import CheckFailed


@dataclass
class Integrity:
    """The digest check of every staged variant."""

    variants: list[VariantCheck] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return bool(self.variants) and all(v.ok for v in self.variants)

    @property
    def signed(self) -> bool:
        return bool(self.variants) and all(v.signed for v in self.variants)

    @property
    def algorithm(self) -> str:
        found = {v.algorithm for v in self.variants if v.algorithm}
        return ", ".join(sorted(found)) if found else algorithm_name()

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "algorithm": self.algorithm,
            "kernels_data": KERNELS_DATA_VERSION,
            "signed": self.signed,
            "variants": [v.as_dict() for v in self.variants],
            "line": self.summary_line(),
        }

    def summary_line(self) -> str:
        """One line for the card's verification list."""
        files = sum(v.files for v in self.variants)
        return (
            f"Every file of the staged build variants ({files} files) matches the {self.algorithm} digest "
            f"recorded in its `metadata.json` at build time, re-hashed with kernels-data {KERNELS_DATA_VERSION} "
            "(`Digest.hash_variant` + `Digest.validate`, the code `kernels` verifies with)."
        )


def _problems(check: VariantCheck, stage: Path) -> list[str]:
    rel = check.variant.relative_to(stage).as_posix()
    if check.metadata_error is not None:
        return [f"{rel}/metadata.json: kernels-data cannot read it: {check.metadata_error}"]
    if not check.has_digest:
        return [f"{rel}/metadata.json has no digest (built before scripts/build_kernel.py recorded one)"]
    return [
        f"{rel}/{v.path}: {v.kind} ({v.message})" if v.path else f"{rel}: {v.kind} ({v.message})"
        for v in check.violations
    ]


def check_stage_integrity(stage: Path, variant_names: list[str]) -> Integrity:
    """Validate every staged ``build/<variant>/`` against the digest in its metadata.json."""
    return Integrity(variants=[check_variant(stage / "build" / name) for name in variant_names])


def refuse_unless_intact(integrity: Integrity, stage: Path, source_root: Path) -> None:
    """Raise CheckFailed (exit 1) naming every violation and the fix; return when all variants match."""
    problems = [p for check in integrity.variants for p in _problems(check, stage)]
    if problems:
        raise CheckFailed(
            "The staged build does not match the digest its builder recorded (the check `kernels.verify` "
            f"runs on a downloaded variant), so nothing is uploaded: {'; '.join(problems)}. A file was changed, added or removed after "
            f"the build. Rebuild in {source_root} with scripts/build_kernel.py (the configured build_command), "
            "then rerun publish.py."
        )
