"""Reading and changing a trial tree on disk without ever losing a trial.

Rules that make it safe:

* every read-modify-write of ``state.json`` happens under an exclusive
  ``flock`` on ``trials/.<name>.lock``, so concurrent saves serialise and all
  land;
* a trial's sources are copied into ``.staging/`` and renamed into place
  *before* the state that mentions them is written atomically (temporary file,
  fsync, rename) — a process killed at any point leaves the previous state
  valid;
* a trial directory that exists without a state entry is the remnant of a
  killed save; it is moved to ``.interrupted/`` (kept, not deleted) before its
  id is reused.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path

from ..atomic import atomic_write_json, copy_file, exclusive_lock
from ..errors import UsageError
from .buildid import content_id_of, hashed_files, last_build_id
from .model import BaselineRecord, StateError, TreeState, Trial, TrialResult, state_from_json
from .names import validate_tree_name
from .sources import file_sha256, list_kernel_sources, sources_sha256

STATE_FILE = "state.json"
BASELINE_COPY = "baseline.py"


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


@dataclass(frozen=True)
class SaveOutcome:
    trial: Trial
    warnings: tuple[str, ...]
    interrupted_moved: tuple[str, ...]


class TrialStore:
    """One trial tree, ``<trials_root>/<name>/``."""

    def __init__(self, name: str, trials_root: Path | None = None):
        self.name = validate_tree_name(name)
        self.root = Path(trials_root) if trials_root is not None else Path.cwd() / "trials"
        self.directory = self.root / self.name
        self.state_path = self.directory / STATE_FILE
        self.lock_path = self.root / f".{self.name}.lock"

    # ------------------------------------------------------------ reading

    def exists(self) -> bool:
        return self.state_path.is_file()

    def load(self) -> TreeState:
        if not self.state_path.is_file():
            hint = (
                f"The directory {self.directory} exists but has no {STATE_FILE}; it was not made by "
                "trial_manager.py init (or its state was removed)."
                if self.directory.exists()
                else f"Run: python scripts/trial_manager.py init {self.name} <baseline_file>"
            )
            raise UsageError(f"No trial tree named {self.name!r} under {self.root}. {hint}")
        try:
            text = self.state_path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise StateError(f"Could not read the trial state {self.state_path}: {exc}.") from exc
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise StateError(
                f"The trial state {self.state_path} is not valid JSON (line {exc.lineno}, column "
                f"{exc.colno}: {exc.msg}). Nothing was changed. Fix the file by hand or restore it; "
                "the trial directories next to it still hold every saved source."
            ) from exc
        state = state_from_json(self.state_path, data)
        if state.name != self.name:
            raise StateError(
                f"The trial state {self.state_path} names the tree {state.name!r}, not {self.name!r}. "
                "It was copied or renamed by hand; fix its \"name\" field."
            )
        return state

    def baseline_warning(self, state: TreeState) -> str | None:
        """A warning when the baseline file changed since init (speedups stop comparing)."""
        path = Path(state.baseline.path)
        if not path.is_file():
            return (
                f"The baseline {path} recorded at init no longer exists; a copy is kept at "
                f"{self.directory / state.baseline.copy}."
            )
        if file_sha256(path) != state.baseline.sha256:
            return (
                f"The baseline {path} changed since init (sha256 differs), so new speedups do not "
                "compare with the recorded ones. Restore it from "
                f"{self.directory / state.baseline.copy}, or start a new tree with init --force."
            )
        return None

    # ------------------------------------------------------------ writing

    @contextmanager
    def _locked(self) -> Iterator[None]:
        self.root.mkdir(parents=True, exist_ok=True)
        with exclusive_lock(self.lock_path):
            yield

    def _write(self, state: TreeState) -> None:
        atomic_write_json(self.state_path, state.to_json())

    def init(self, baseline_file: Path, *, force: bool = False) -> tuple[TreeState, Path | None]:
        """Create the tree; with ``force`` an existing tree is archived, never deleted."""
        baseline_file = Path(baseline_file)
        if not baseline_file.is_file():
            raise UsageError(
                f"The baseline file {baseline_file} does not exist. Pass the path of a baseline.py "
                "that defines get_inputs() and get_reference_output() or a Model class."
            )
        with self._locked():
            archived: Path | None = None
            if self.directory.exists():
                if not force:
                    count = self._trial_count_for_message()
                    raise UsageError(
                        f"A trial tree named {self.name!r} already exists at {self.directory}{count}. "
                        "Use another name, or pass --force to archive it and start again "
                        "(the old tree is moved to trials/.archive/, not deleted)."
                    )
                archived = self._archive_existing()
            self.directory.mkdir(parents=True)
            shutil.copyfile(baseline_file, self.directory / BASELINE_COPY)
            state = TreeState(
                name=self.name,
                created_at=now_iso(),
                baseline=BaselineRecord(
                    path=str(baseline_file.resolve()),
                    sha256=file_sha256(baseline_file),
                    copy=BASELINE_COPY,
                    recorded_at=now_iso(),
                ),
            )
            self._write(state)
            return state, archived

    def _trial_count_for_message(self) -> str:
        try:
            return f" with {len(self.load().trials)} trial(s)"
        except UsageError:
            return ""

    def _archive_existing(self) -> Path:
        archive_root = self.root / ".archive"
        archive_root.mkdir(parents=True, exist_ok=True)
        stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S")
        target = archive_root / f"{self.name}-{stamp}-{uuid.uuid4().hex[:6]}"
        os.replace(self.directory, target)
        return target

    def save(self, kernel_dir: Path, *, strategy: str, parent: str | None) -> SaveOutcome:
        if not strategy.strip():
            raise UsageError("--strategy must describe what this trial changed (it is empty).")
        kernel_dir = Path(kernel_dir)
        files = list_kernel_sources(kernel_dir)
        if not files:
            raise UsageError(f"{kernel_dir} contains no kernel sources to save.")
        # whatever the builder's content id hashes is saved too (a listed source with
        # another suffix, say), so a build of the saved copy gets the same op namespace
        files = sorted(set(files) | set(hashed_files(kernel_dir) or ()))
        content_hash = sources_sha256(kernel_dir, files)
        directory_id = content_id_of(kernel_dir)
        with self._locked():
            state = self.load()
            warnings: list[str] = _build_warnings(kernel_dir, directory_id)
            parent = self._resolve_parent(state, parent, warnings)
            trial_id = f"t{len(state.trials)}"
            moved = self._clear_interrupted(trial_id)
            self._copy_sources(kernel_dir, files, trial_id)
            build_id = content_id_of(self.trial_sources_dir(trial_id))
            if directory_id is not None and build_id != directory_id:
                warnings.append(
                    f"The saved copy's content id ({build_id}) differs from {kernel_dir}'s ({directory_id}): "
                    "the copy lacks a file the build hashes (a symlink?). Benchmark JSONs of this "
                    "kernel's builds will not match the trial; replace the symlink by the file and save again."
                )
            twin = next((t.id for t in state.trials if t.sources_sha256 == content_hash), None)
            if twin is not None:
                warnings.append(
                    f"The sources are identical to trial {twin}: this trial changes nothing; "
                    "measure a real change instead."
                )
            trial = Trial(
                id=trial_id,
                parent=parent,
                strategy=strategy.strip(),
                created_at=now_iso(),
                sources_sha256=content_hash,
                files=tuple(f.as_posix() for f in files),
                build_id=build_id,
            )
            self._write(replace(state, trials=state.trials + (trial,)))
            return SaveOutcome(trial=trial, warnings=tuple(warnings), interrupted_moved=moved)

    def _resolve_parent(self, state: TreeState, parent: str | None, warnings: list[str]) -> str | None:
        if parent is None:
            if state.trials:
                latest = state.trials[-1].id
                warnings.append(f"No --parent given: the parent is the latest trial, {latest}.")
                return latest
            return None
        if state.trial(parent) is None:
            known = ", ".join(t.id for t in state.trials) or "none yet"
            first = " The first trial has no parent: omit --parent." if not state.trials else ""
            raise UsageError(f"--parent {parent!r} is not a trial of {self.name!r} (trials: {known}).{first}")
        return parent

    def _clear_interrupted(self, trial_id: str) -> tuple[str, ...]:
        """Keep remnants of killed saves aside so their id can be reused."""
        moved: list[str] = []
        staging = self.directory / ".staging"
        leftovers = list(staging.iterdir()) if staging.is_dir() else []
        target_dir = self.directory / trial_id
        if target_dir.exists():
            leftovers.append(target_dir)
        for leftover in leftovers:
            keep = self.directory / ".interrupted" / f"{leftover.name}-{int(time.time() * 1000)}"
            keep.parent.mkdir(parents=True, exist_ok=True)
            os.replace(leftover, keep)
            moved.append(str(keep))
        return tuple(moved)

    def _copy_sources(self, kernel_dir: Path, files: list[Path], trial_id: str) -> None:
        staging = self.directory / ".staging" / f"{trial_id}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        for relative in files:
            target = staging / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            copy_file(kernel_dir / relative, target)
        _fsync_tree(staging)
        os.replace(staging, self.directory / trial_id)

    def require_trial(self, state: TreeState, trial_id: str) -> Trial:
        """The trial ``trial_id`` of ``state``, or a UsageError listing the trials there are."""
        trial = state.trial(trial_id)
        if trial is None:
            known = ", ".join(t.id for t in state.trials) or "none yet"
            raise UsageError(f"{trial_id!r} is not a trial of {self.name!r} (trials: {known}).")
        return trial

    def update_trial(self, trial_id: str, change: Callable[[Trial], Trial]) -> Trial:
        """Apply ``change`` to one trial under the lock and persist the new state."""
        with self._locked():
            state = self.load()
            trial = self.require_trial(state, trial_id)
            updated = change(trial)
            trials = tuple(updated if t.id == trial_id else t for t in state.trials)
            self._write(replace(state, trials=trials))
            return updated

    def record_result(self, trial_id: str, result: TrialResult, *, force: bool) -> Trial:
        def change(trial: Trial) -> Trial:
            if trial.result is not None and not force:
                raise UsageError(
                    f"Trial {trial_id} already has a result (recorded {trial.result.recorded_at}). "
                    "Pass --force to replace it; the old result is kept in the trial's history."
                )
            history = trial.superseded_results + ((trial.result,) if trial.result is not None else ())
            return replace(trial, result=result, superseded_results=history)

        return self.update_trial(trial_id, change)

    def update_state(self, change: Callable[[TreeState], TreeState]) -> TreeState:
        """Apply ``change`` to the whole state under the lock and persist it."""
        with self._locked():
            updated = change(self.load())
            self._write(updated)
            return updated

    def trial_sources_dir(self, trial_id: str) -> Path:
        return self.directory / trial_id

    def trial_build_id(self, trial: Trial) -> str | None:
        """The content id of a trial's saved copy (recorded at save, computed for older trials)."""
        return trial.build_id or content_id_of(self.trial_sources_dir(trial.id))


def _build_warnings(kernel_dir: Path, directory_id: str | None) -> list[str]:
    """A warning when the sources being saved are not what the last build in build/ compiled."""
    last = last_build_id(kernel_dir)
    if directory_id is None or last is None or last[0] == directory_id:
        return []
    return [
        f"The sources in {kernel_dir} (content id {directory_id}) differ from its last build "
        f"({last[0]}, {last[1].parent}): they changed after the build that was benchmarked. Rebuild, "
        "reinstall and benchmark again before recording this trial's result (result --from-json "
        "refuses a benchmark JSON of another build)."
    ]


def _fsync_tree(root: Path) -> None:
    """Flush copied files so a rename never publishes a directory of empty files."""
    for path in sorted(root.rglob("*"), reverse=True):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    fd = os.open(root, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
