"""Compile (and link) the C++ snippets of ``references/`` with a content-keyed cache.

The knowledge base promises that every snippet compiles with its declared
flags and that function snippets run correctly on this CPU.  Checking that
means invoking g++ for ~40 snippets; results are cached under
``~/.cache/kernel_harness/snippets/<sha256>/`` keyed by the source text, the
flags and the compiler version, so a rerun costs nothing and a snippet that
needs torch's headers (~50 s to compile) is compiled once.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from ..atomic import atomic_write_text, exclusive_lock
from ..errors import CheckFailed, UsageError

BASE_FLAGS: tuple[str, ...] = ("-std=c++20", "-O2")
COMPILER = os.environ.get("CXX", "g++")


def cache_root() -> Path:
    override = os.environ.get("KERNEL_HARNESS_SNIPPET_CACHE")
    return Path(override) if override else Path.home() / ".cache" / "kernel_harness" / "snippets"


@dataclass(frozen=True)
class TorchBuildInfo:
    include_dirs: tuple[str, ...]
    library_dir: str
    abi_flag: str


@functools.lru_cache(maxsize=1)
def torch_build_info() -> TorchBuildInfo:
    """torch's include paths, lib dir and C++ ABI define (imports torch once)."""
    import torch
    from torch.utils import cpp_extension

    abi = int(bool(torch._C._GLIBCXX_USE_CXX11_ABI))
    lib_dir = str(Path(torch.__file__).parent / "lib")
    return TorchBuildInfo(tuple(cpp_extension.include_paths()), lib_dir, f"-D_GLIBCXX_USE_CXX11_ABI={abi}")


@functools.lru_cache(maxsize=1)
def compiler_version() -> str:
    if shutil.which(COMPILER) is None:
        raise UsageError(f"The C++ compiler {COMPILER!r} is not on PATH; install g++ (>= 12) or set CXX.")
    return subprocess.run([COMPILER, "--version"], capture_output=True, text=True, check=True).stdout.splitlines()[0]


def _command(source: Path, output: Path, flags: tuple[str, ...], *, shared: bool, torch_headers: bool) -> list[str]:
    cmd = [COMPILER, *BASE_FLAGS, *flags]
    if torch_headers:
        info = torch_build_info()
        cmd.append(info.abi_flag)
        for inc in info.include_dirs:
            cmd += ["-isystem", inc]
    if shared:
        cmd += ["-shared", "-fPIC", str(source), "-o", str(output)]
        if torch_headers:
            info = torch_build_info()
            cmd += [f"-L{info.library_dir}", f"-Wl,-rpath,{info.library_dir}", "-ltorch_cpu", "-lc10"]
    else:
        cmd += ["-c", str(source), "-o", str(output)]
    return cmd


def _build(source_text: str, flags: tuple[str, ...], *, shared: bool, torch_headers: bool, label: str) -> Path:
    key_material = "\n".join(
        [compiler_version(), " ".join(BASE_FLAGS), " ".join(flags), str(shared), str(torch_headers), source_text]
    )
    key = hashlib.sha256(key_material.encode()).hexdigest()[:24]
    directory = cache_root() / key
    output = directory / ("snippet.so" if shared else "snippet.o")
    if output.is_file():
        return output
    directory.mkdir(parents=True, exist_ok=True)
    with exclusive_lock(directory / ".lock"):
        if output.is_file():  # built by a concurrent process while we waited
            return output
        source = directory / "snippet.cpp"
        atomic_write_text(source, source_text)
        tmp = output.with_suffix(output.suffix + ".tmp")
        cmd = _command(source, tmp, flags, shared=shared, torch_headers=torch_headers)
        result = subprocess.run(cmd, capture_output=True, text=True)
        if result.returncode != 0:
            raise CheckFailed(
                f"Snippet {label} does not compile with flags {' '.join(flags) or '(none)'}. "
                f"Command: {' '.join(cmd)}. Compiler output: {result.stderr.strip()[:4000]}"
            )
        os.replace(tmp, output)
    return output


def compile_object(code: str, flags: tuple[str, ...] | list[str], *, torch_headers: bool = False, label: str = "") -> Path:
    """``g++ -std=c++20 -O2 <flags> -c``; returns the cached object file."""
    return _build(code, tuple(flags), shared=False, torch_headers=torch_headers, label=label)


def build_shared(
    code: str,
    harness: str,
    flags: tuple[str, ...] | list[str],
    *,
    torch_headers: bool = False,
    label: str = "",
) -> Path:
    """Compile ``code`` followed by its ``extern "C"`` harness into a cached shared library."""
    text = f"{code.rstrip()}\n\n// ---- test harness ----\n{harness}"
    return _build(text, tuple(flags), shared=True, torch_headers=torch_headers, label=label)
