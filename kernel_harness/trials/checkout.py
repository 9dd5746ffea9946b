"""Writing a trial's saved sources back into a kernel directory (branching back).

A regression branches back to the best trial; before this existed agents ran
``cp -r trials/<label>/t2/. kernel/``, which silently overwrote unsaved edits
and left files the older trial never had.  ``checkout`` makes the directory's
sources exactly the trial's, and refuses when that would lose work: a source
file whose content matches no saved trial (at the same path) is uncommitted.
``--force`` first copies every source of the directory to
``trials/<label>/.stash/<timestamp>/`` and then proceeds.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from ..atomic import copy_file
from ..errors import UsageError
from .model import TreeState, Trial
from .sources import file_sha256, list_kernel_sources, sources_sha256
from .store import TrialStore

STASH_DIR = ".stash"


@dataclass(frozen=True)
class CheckoutOutcome:
    trial: Trial
    directory: Path
    written: tuple[str, ...]
    removed: tuple[str, ...]
    stashed: Path | None


def _saved_hashes(store: TrialStore, state: TreeState) -> dict[str, set[str]]:
    """Every saved trial's files: relative path -> the contents (sha256) saved under it."""
    known: dict[str, set[str]] = {}
    for trial in state.trials:
        directory = store.trial_sources_dir(trial.id)
        for relative in trial.files:
            path = directory / relative
            if path.is_file():
                known.setdefault(relative, set()).add(file_sha256(path))
    return known


def _current_sources(target: Path, trial: Trial) -> list[str]:
    """Sources in ``target`` the checkout would replace or remove."""
    present: set[str] = set()
    if (target / "build.toml").is_file():
        present.update(p.as_posix() for p in list_kernel_sources(target))
    present.update(f for f in trial.files if (target / f).is_file())
    return sorted(present)


def _uncommitted(target: Path, current: list[str], known: dict[str, set[str]]) -> list[str]:
    return [f for f in current if file_sha256(target / f) not in known.get(f, set())]


def _stash(store: TrialStore, target: Path, current: list[str]) -> Path:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S.%fZ")
    stash = store.directory / STASH_DIR / f"{stamp}-{uuid.uuid4().hex[:6]}"
    for relative in current:
        destination = stash / relative
        destination.parent.mkdir(parents=True, exist_ok=True)
        copy_file(target / relative, destination)
    return stash


def checkout(store: TrialStore, trial_id: str, target: Path, *, force: bool) -> CheckoutOutcome:
    target = Path(target)
    if target.exists() and not target.is_dir():
        raise UsageError(f"{target} exists and is not a directory; pass the kernel directory to write into.")
    with store._locked():
        state = store.load()
        trial = store.require_trial(state, trial_id)
        source = store.trial_sources_dir(trial.id)
        missing = [f for f in trial.files if not (source / f).is_file()]
        if missing:
            raise UsageError(
                f"Trial {trial.id}'s saved copy in {source} lacks {', '.join(missing[:5])}; nothing was written. "
                "Restore the trial directory from a backup."
            )
        current = _current_sources(target, trial)
        uncommitted = _uncommitted(target, current, _saved_hashes(store, state))
        stashed = None
        if uncommitted and not force:
            shown = ", ".join(uncommitted[:8]) + (" ..." if len(uncommitted) > 8 else "")
            raise UsageError(
                f"{target} holds work no saved trial has ({len(uncommitted)} file(s): {shown}); "
                f"checking out {trial.id} would overwrite or remove it. Nothing was written. Save it first "
                f"(trial_manager.py save {store.name} {target} --strategy ...), or pass --force to keep a copy "
                f"under {store.directory / STASH_DIR}/<timestamp>/ and check out anyway."
            )
        if force and current:
            stashed = _stash(store, target, current)
        removed = [f for f in current if f not in trial.files]
        for relative in removed:
            os.unlink(target / relative)
        for relative in trial.files:
            destination = target / relative
            destination.parent.mkdir(parents=True, exist_ok=True)
            copy_file(source / relative, destination)
    check = sources_sha256(target, [Path(f) for f in trial.files])
    if check != trial.sources_sha256:  # pragma: no cover - only when the saved copy was edited by hand
        raise UsageError(
            f"{target} now holds trial {trial.id}'s saved copy, but its hash differs from the one recorded "
            f"at save ({trial.sources_sha256[:12]}): the copy in {source} was edited after the save."
        )
    return CheckoutOutcome(trial, target, tuple(trial.files), tuple(removed), stashed)
