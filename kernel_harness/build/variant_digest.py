"""A build variant's content digest, written and checked by ``kernels-data``.

``kernels`` verifies a downloaded variant in two steps
(``kernels.verify.verify_variant``): a sigstore bundle,
``metadata.json.sigstore``, proves who wrote ``metadata.json``; then every
other file of the variant is re-hashed and compared with the ``digest`` that
``metadata.json`` records.  Both the hashing and the comparison are Rust code
that ships on its own as the PyPI package ``kernels-data``
(``Digest.hash_variant``, ``Digest.validate``, ``Metadata``).  This module
uses that package and nothing of its own, so the digest the builder writes is
by construction the one ``kernels`` checks, and it skips exactly what
``kernels`` skips (the top-level ``metadata.json`` and
``metadata.json.sigstore``, ``__pycache__/`` and ``*.pyc``).

The harness writes the digest; it never writes a signature bundle (that needs
an OIDC identity, see docs/publish.md).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kernels_data

from ..errors import CheckFailed

#: SHA-256, the algorithm kernel-builder's ``hash`` command uses.
ALGORITHM = kernels_data.DigestAlgorithm.SHA256
METADATA = "metadata.json"
BUNDLE = "metadata.json.sigstore"
KERNELS_DATA_VERSION: str = kernels_data.__version__


def algorithm_name(algorithm: kernels_data.DigestAlgorithm = ALGORITHM) -> str:
    """The spelling ``metadata.json`` uses (kernels-data's own ``str``: ``sha256``)."""
    return str(algorithm)


@dataclass(frozen=True)
class Violation:
    """One way the variant's files differ from its digest, in kernels-data's words."""

    kind: str  # missing-file | unknown-file | hash-mismatch | algorithm-mismatch | unreadable
    path: str | None  # relative to the variant directory; None for an algorithm mismatch
    message: str  # str(violation) from kernels-data

    def as_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "path": self.path, "message": self.message}


_KINDS = (
    (kernels_data.DigestViolation.MissingFile, "missing-file"),
    (kernels_data.DigestViolation.UnknownFile, "unknown-file"),
    (kernels_data.DigestViolation.HashMismatch, "hash-mismatch"),
    (kernels_data.DigestViolation.AlgorithmMismatch, "algorithm-mismatch"),
)


def _violation(raw: Any) -> Violation:
    kind = next((name for cls, name in _KINDS if isinstance(raw, cls)), "unknown")
    return Violation(kind=kind, path=getattr(raw, "path", None), message=str(raw))


@dataclass
class VariantCheck:
    """What kernels-data says about one variant directory."""

    variant: Path
    metadata_error: str | None = None  # kernels-data could not read metadata.json
    has_digest: bool = False
    algorithm: str | None = None
    files: int = 0  # files the digest covers
    violations: list[Violation] = field(default_factory=list)
    signed: bool = False  # a metadata.json.sigstore is present (never made by this harness)

    @property
    def ok(self) -> bool:
        return self.metadata_error is None and self.has_digest and not self.violations

    def as_dict(self) -> dict[str, Any]:
        return {
            "variant": self.variant.name,
            "ok": self.ok,
            "metadata_error": self.metadata_error,
            "has_digest": self.has_digest,
            "algorithm": self.algorithm,
            "files": self.files,
            "violations": [v.as_dict() for v in self.violations],
            "signed": self.signed,
        }


def read_metadata(variant: Path) -> kernels_data.Metadata:
    """``metadata.json`` parsed by kernels-data; ``ValueError`` with its message otherwise."""
    try:
        return kernels_data.Metadata.read_from_file(Path(variant) / METADATA)
    except OSError as exc:  # kernels-data raises OSError for a missing or unreadable file
        raise ValueError(str(exc)) from exc


def check_variant(variant: Path) -> VariantCheck:
    """Parse the variant's metadata.json and validate its files against the digest in it."""
    variant = Path(variant)
    check = VariantCheck(variant=variant, signed=(variant / BUNDLE).is_file())
    try:
        metadata = read_metadata(variant)
    except ValueError as exc:
        check.metadata_error = str(exc)
        return check
    expected = metadata.digest
    if expected is None:
        return check
    check.has_digest = True
    check.algorithm = algorithm_name(expected.algorithm)
    check.files = len(expected.files)
    try:
        actual = kernels_data.Digest.hash_variant(expected.algorithm, variant)
    except (OSError, RuntimeError) as exc:  # an unreadable file: nothing can be compared
        check.violations = [Violation(kind="unreadable", path=None, message=f"cannot hash the variant: {exc}")]
        return check
    try:
        expected.validate(actual)
    except kernels_data.DigestValidationError as exc:
        check.violations = [_violation(v) for v in exc.violations]
    return check


def digest_json(digest: kernels_data.Digest) -> dict[str, Any]:
    """The ``digest`` object of metadata.json: ``{"algorithm": "sha256", "files": {path: base64}}``."""
    return {"algorithm": algorithm_name(digest.algorithm), "files": dict(sorted(digest.files.items()))}


class DigestWriteFailed(CheckFailed):
    """The digest just written does not read back as valid (exit 1; the previous build is kept)."""


def write_digest(variant: Path) -> VariantCheck:
    """Hash ``variant`` with kernels-data, record the digest in its metadata.json, read it back.

    Must run after every other file of the variant is in place: a file written
    later would be an unknown file to ``kernels``.  The read-back goes through
    ``kernels_data.Metadata`` and ``Digest.validate``, the code ``kernels``
    verifies with, so a digest that would not verify is never published.
    """
    variant = Path(variant)
    path = variant / METADATA
    payload = json.loads(path.read_text(encoding="utf-8"))
    payload["digest"] = digest_json(kernels_data.Digest.hash_variant(ALGORITHM, variant))
    path.write_text(json.dumps(payload, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    check = check_variant(variant)
    if not check.ok:
        detail = check.metadata_error or "; ".join(v.message for v in check.violations) or "no digest read back"
        raise DigestWriteFailed(
            f"{path}: the digest the builder just wrote does not validate with kernels-data "
            f"{KERNELS_DATA_VERSION}: {detail}. Nothing was swapped in; the previous build is unchanged. "
            "Rebuild; if it happens again, report it with this message (it is a builder bug)."
        )
    return check
