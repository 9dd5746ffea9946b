"""Facts about the compiler and torch that every compile and link line needs.

Importing torch costs about two seconds here, which is a fifth of the budget
for an incremental build + install, so the facts are computed once in a child
interpreter and cached in ``~/.cache/kernel_harness/`` keyed by the
interpreter, torch's location and the mtime of ``torch/version.py`` (a torch
upgrade invalidates the cache).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from ..errors import UsageError

_PROBE = r"""
import json, os, sys, sysconfig, torch
from torch.utils.cpp_extension import include_paths
major, minor = torch.__version__.split("+")[0].split(".")[:2]
print(json.dumps({
    "torch_version": torch.__version__,
    "major": int(major),
    "minor": int(minor),
    "cxx11_abi": bool(torch._C._GLIBCXX_USE_CXX11_ABI),
    "include_dirs": list(include_paths()),
    "lib_dir": os.path.join(os.path.dirname(torch.__file__), "lib"),
    "python_include": sysconfig.get_paths()["include"],
    "python_tag": "cp%d%d" % sys.version_info[:2],
}))
"""


@dataclass(frozen=True)
class TorchInfo:
    torch_version: str
    major: int
    minor: int
    cxx11_abi: bool
    include_dirs: tuple[str, ...]
    lib_dir: str
    python_include: str
    python_tag: str

    @property
    def arch(self) -> str:
        return platform.machine()

    @property
    def variant(self) -> str:
        """kernel-builder's build variant name, e.g. ``torch213-cxx11-cpu-x86_64-linux``."""
        abi = "cxx11" if self.cxx11_abi else "cxx98"
        return f"torch{self.major}{self.minor}-{abi}-cpu-{self.arch}-linux"

    @property
    def libgomp(self) -> Path | None:
        """torch's own OpenMP runtime, linked instead of the compiler's (see ninja.py)."""
        path = Path(self.lib_dir) / "libgomp.so.1"
        return path if path.is_file() else None


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "kernel_harness"


def torch_info() -> TorchInfo:
    spec = importlib.util.find_spec("torch")
    if spec is None or spec.origin is None:
        raise UsageError(
            f"torch is not installed for {sys.executable}. Install it with "
            "`pip install torch==2.13.0` (the CPU wheel) and rerun the build."
        )
    version_file = Path(spec.origin).parent / "version.py"
    try:
        stamp = f"{sys.executable}|{spec.origin}|{version_file.stat().st_mtime_ns}"
    except OSError:
        stamp = f"{sys.executable}|{spec.origin}"
    key = hashlib.sha256(stamp.encode()).hexdigest()[:16]
    cache = _cache_dir() / f"torchinfo-{key}.json"
    try:
        data = json.loads(cache.read_text(encoding="utf-8"))
        return _from_dict(data)
    except (OSError, ValueError, KeyError, TypeError):
        pass
    proc = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True)
    if proc.returncode != 0:
        raise UsageError(
            f"Could not query torch's build settings with {sys.executable}: "
            f"{proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else 'no output'}. "
            "Check that `python -c 'import torch'` works in this environment."
        )
    data = json.loads(proc.stdout.strip().splitlines()[-1])
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data), encoding="utf-8")
        os.replace(tmp, cache)
    except OSError:
        pass  # a read-only home only costs the probe next time
    return _from_dict(data)


def _from_dict(data: dict) -> TorchInfo:
    data = dict(data)
    data["include_dirs"] = tuple(data["include_dirs"])
    return TorchInfo(**data)


def find_compiler() -> str:
    cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if not cxx:
        raise UsageError(
            "No C++ compiler found (looked at $CXX, g++ and c++). Install g++ 12 or newer "
            "(apt-get install g++) or set CXX."
        )
    return cxx


def find_ninja() -> str:
    """Prefer the ``ninja`` PyPI package next to this interpreter, then PATH."""
    local = Path(sys.executable).parent / "ninja"
    if local.is_file() and os.access(local, os.X_OK):
        return str(local)
    try:
        import ninja  # type: ignore[import-not-found]

        candidate = Path(ninja.BIN_DIR) / "ninja"
        if candidate.is_file():
            return str(candidate)
    except (ImportError, AttributeError):
        pass
    found = shutil.which("ninja")
    if not found:
        raise UsageError("ninja is not installed: `pip install ninja` (or apt-get install ninja-build).")
    return found


def find_ccache() -> str | None:
    """ccache when installed, unless ``KERNEL_HARNESS_NO_CCACHE=1`` (benchmarks of cold builds)."""
    if os.environ.get("KERNEL_HARNESS_NO_CCACHE") == "1":
        return None
    return shutil.which("ccache")


def as_dict(info: TorchInfo) -> dict:
    return asdict(info)
