"""Validation of trial-tree names: one plain directory name under ``trials/``."""

from __future__ import annotations

import re

from ..errors import UsageError

MAX_NAME_LENGTH = 100
_ALLOWED = re.compile(r"[A-Za-z0-9_.\-]+")


def validate_tree_name(name: str) -> str:
    """Return ``name`` if it is a safe single directory name, else raise UsageError.

    Checked before anything touches the disk, so a refused name writes nothing.
    """
    rule = (
        "A trial-tree name is one directory name under trials/: letters, digits, '_', '-' "
        f"and '.', at most {MAX_NAME_LENGTH} characters, not '.' or '..'. "
        "It is a label such as my_rmsnorm, not a path."
    )
    if not name:
        raise UsageError(f"The trial-tree name is empty. {rule}")
    if len(name) > MAX_NAME_LENGTH:
        raise UsageError(f"The trial-tree name is {len(name)} characters long. {rule}")
    if name in {".", ".."}:
        raise UsageError(f"The trial-tree name {name!r} would escape trials/. {rule}")
    if not _ALLOWED.fullmatch(name):
        bad = sorted({ch for ch in name if not _ALLOWED.fullmatch(ch)})
        raise UsageError(f"The trial-tree name {name!r} contains {''.join(bad)!r}. {rule}")
    return name
