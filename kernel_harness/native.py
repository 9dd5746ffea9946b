"""C++ probes compiled with plain ``g++`` into the machine cache directory, loaded with ctypes.

The machine profile's peak-throughput probe and the streaming reader behind the
bandwidth floors are small C++ files that must not need torch's headers (a torch
extension takes a minute to build here; these take a second or two). Each is
compiled once per (source, compiler) and found again by a hash of both.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

PROBE_DIRECTORY = Path(__file__).resolve().parent / "probe"


def build_probe_library(source: Path, directory: Path, flags: Sequence[str] = ()) -> Path:
    """The shared library of ``source`` in ``directory``, compiled now (with ``flags`` added) if no
    build of this source, flags and compiler is there yet. Raises FileNotFoundError (no compiler)
    or RuntimeError."""
    compiler = shutil.which(os.environ.get("CXX", "g++")) or shutil.which("g++")
    if compiler is None:
        raise FileNotFoundError("no C++ compiler (g++) on PATH")
    text = source.read_bytes()
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True).stdout
    tag = hashlib.sha256(text + version.encode() + " ".join(flags).encode()).hexdigest()[:12]
    library = directory / f"{source.stem}-{tag}.so"
    if library.exists():
        return library
    directory.mkdir(parents=True, exist_ok=True)
    tmp = library.with_suffix(f".{os.getpid()}.tmp.so")
    cmd = [compiler, "-O2", "-std=c++17", "-shared", "-fPIC", "-pthread", *flags, str(source), "-o", str(tmp)]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if result.returncode != 0:
        raise RuntimeError(f"compiling {source.name} failed: {result.stderr.strip()[-800:]}")
    os.replace(tmp, library)  # atomic: a concurrent builder finds a whole library or none
    return library
