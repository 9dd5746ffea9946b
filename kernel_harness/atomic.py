"""Crash-safe file writes and an exclusive inter-process lock.

A state file is only ever replaced by ``rename`` of a fully written and
fsynced temporary file in the same directory, so a reader (or a process that
restarts after being killed) sees either the old or the new content, never a
torn one.  The lock is ``fcntl.flock`` on a separate lock file: the kernel
releases it when its holder dies, so a SIGKILL never leaves a stale lock.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def _fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def current_umask() -> int:
    """The process's umask, read without changing it where Linux allows."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)  # the portable way: set and restore (briefly process-wide)
    os.umask(mask)
    return mask


def default_file_mode() -> int:
    """The mode ``open(path, "w")`` would give a new file: 0666 minus the umask."""
    return 0o666 & ~current_umask()


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` atomically (temporary file, fsync, rename).

    ``mkstemp`` creates its file 0600 whatever the umask; the file is given the
    mode a plain ``open()`` would (0644 under umask 022), because generated
    sources, trial copies and finalized output are meant to be read by others.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, default_file_mode())
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp_name, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp_name)
        raise
    _fsync_directory(path.parent)


def copy_file(source: Path, target: Path) -> None:
    """Copy contents and times (not the mode): the copy gets the umask's mode, so a
    0600 source (written by an older harness) does not make a 0600 copy."""
    target = Path(target)
    shutil.copyfile(source, target)
    os.chmod(target, default_file_mode())
    stat = os.stat(source)
    os.utime(target, ns=(stat.st_atime_ns, stat.st_mtime_ns))


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: Path, payload: Any) -> None:
    """Write ``payload`` as pretty, key-sorted JSON so diffs of state stay readable."""
    atomic_write_text(path, json.dumps(payload, indent=2, sort_keys=True, allow_nan=False) + "\n")


@contextlib.contextmanager
def exclusive_lock(lock_path: Path) -> Iterator[None]:
    """Hold an exclusive advisory lock on ``lock_path`` for the ``with`` block."""
    lock_path = Path(lock_path)
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
