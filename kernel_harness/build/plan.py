"""The compile plan: which source is compiled with which flags, and the content id.

Flags per unit = common flags + the unit's section ``include`` and
``cxx-flags``.  Only ``[torch] src`` units (the binding) see the generated
include directory's ``registration.h`` and ``TORCH_EXTENSION_NAME``; kernel
units get nothing that changes from build to build, so an edit recompiles
exactly the unit that changed (ninja + depfiles decide that).
"""

from __future__ import annotations

import hashlib
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from ..buildtoml import BuildToml
from ..errors import UsageError
from .codegen import Names
from .toolchain import TorchInfo

COMPILED_SUFFIXES = (".cpp", ".cc", ".cxx", ".c")
HEADER_SUFFIXES = (".h", ".hpp", ".hh", ".hxx", ".inc", ".cuh")
#: -falign-loops=64: every loop starts on a 64-byte line. Without it, where a hot loop
#: lands depends on all the code before it, so an edit elsewhere in a unit moved an
#: unchanged loop's time by up to 9 %, reproducibly (Zen 4 EPYC, 2026-12-05: linear's
#: AVX2 dot loop at bf16 M = 2 read 1.09x in a build whose only change was another M's
#: path, its loop now 48 bytes into a line; with the flag in both builds 1.00x), and a
#: trial would credit or blame its change for it. Side by side against the same sources
#: without it: every catalogue op's headline case in both tiers 0.92-1.03x, the GEMM and
#: attention ops 0.98-1.01x except AVX2 linear bf16 M = 1 0.82x and fp32 M = 4 0.91x.
COMMON_FLAGS = ("-O3", "-std=c++20", "-fPIC", "-fno-gnu-unique", "-falign-loops=64", "-DCPU_KERNEL")

#: Where the builder keeps everything that is not published.
OBJ_DIR = Path("build") / ".objs"


@dataclass(frozen=True)
class CompileUnit:
    source: Path  # relative to the kernel directory
    section: str  # "torch" or "kernel.<key>"
    flags: tuple[str, ...]
    generated: bool = False

    @property
    def obj(self) -> Path:
        """Object path relative to OBJ_DIR; the section keeps same-named sources apart."""
        safe = self.section.replace("/", "_")
        if self.source.is_absolute():  # generated sources live in OBJ_DIR/gen
            return Path("obj") / safe / (self.source.name + ".o")
        return Path("obj") / safe / self.source.with_suffix(self.source.suffix + ".o")


@dataclass
class BuildPlan:
    root: Path
    toml: BuildToml
    torch: TorchInfo
    names: Names
    units: list[CompileUnit] = field(default_factory=list)
    link_flags: tuple[str, ...] = ()
    python_files: list[Path] = field(default_factory=list)  # torch-ext/<name>/*

    @property
    def obj_dir(self) -> Path:
        return self.root / OBJ_DIR

    @property
    def gen_include(self) -> Path:
        return self.obj_dir / "gen" / "include"

    @property
    def extension_source(self) -> Path:
        return self.obj_dir / "gen" / "_extension.c"

    @property
    def linked_so(self) -> Path:
        # A fixed name: the id is not part of any ninja target, so a new id only
        # rebuilds the stub and relinks.  The publish step renames it.
        return self.obj_dir / "kernel.so"

    @property
    def variant(self) -> str:
        return self.torch.variant

    def describe(self) -> str:
        return "\n".join(f"{u.source}: {shlex.join(u.flags)}" for u in self.units)


def listed_sources(toml: BuildToml) -> list[tuple[str, str]]:
    """``(section, path)`` for every ``src`` entry, torch first."""
    pairs: list[tuple[str, str]] = []
    if toml.torch is not None:
        pairs += [("torch", s) for s in toml.torch.src]
    for kernel in toml.cpu_kernels:
        pairs += [(kernel.table, s) for s in kernel.src]
    return pairs


def python_package_files(root: Path, python_name: str, pyext: tuple[str, ...]) -> list[Path]:
    package = root / "torch-ext" / python_name
    if not package.is_dir():
        return []
    wanted = {f".{ext}" for ext in pyext}
    return sorted(
        p for p in package.rglob("*")
        if p.is_file() and p.suffix in wanted and "__pycache__" not in p.parts
    )


def content_id(root: Path, toml: BuildToml, python_files: list[Path]) -> str:
    """A hash of everything that goes into the build, so two different builds get two ids.

    Covers build.toml, every listed source, every file in the include
    directories and the Python package.  The hash decides only the op
    namespace / module name, never what ninja recompiles.
    """
    files: set[Path] = {toml.path.resolve()}
    for _, src in listed_sources(toml):
        files.add((root / src).resolve())
    include_dirs = [*((toml.torch.include if toml.torch else ())), *(i for k in toml.cpu_kernels for i in k.include)]
    for inc in include_dirs:
        directory = root / inc
        if directory.is_dir():
            files.update(p.resolve() for p in directory.rglob("*") if p.is_file() and p.suffix in HEADER_SUFFIXES + COMPILED_SUFFIXES)
    files.update(p.resolve() for p in python_files)
    digest = hashlib.sha256()
    for path in sorted(files):
        rel = path.relative_to(root.resolve()) if path.is_relative_to(root.resolve()) else path
        digest.update(str(rel).encode() + b"\0")
        try:
            digest.update(path.read_bytes())
        except OSError:
            digest.update(b"<missing>")
        digest.update(b"\0")
    return digest.hexdigest()[:10]


def make_plan(root: Path, toml: BuildToml, torch: TorchInfo) -> BuildPlan:
    root = root.resolve()
    if "cpu" not in toml.general.backends:
        raise UsageError(
            f"{toml.path}: [general] backends = {list(toml.general.backends)} does not include \"cpu\"; "
            "this builder only builds CPU kernels. Add \"cpu\" to backends."
        )
    if not toml.cpu_kernels:
        raise UsageError(
            f"{toml.path} has no [kernel.*] section with backend = \"cpu\"; add one per tier "
            "(see scripts/new_kernel.py) and rerun."
        )
    if toml.torch is None:
        raise UsageError(
            f"{toml.path} has no [torch] section; a CPU kernel needs one with "
            'src = ["torch-ext/torch_binding.cpp", "torch-ext/torch_binding.h"].'
        )
    missing = [src for _, src in listed_sources(toml) if not (root / src).is_file()]
    if missing:
        raise UsageError(
            f"{toml.path} lists source file(s) that do not exist: {', '.join(missing)}. "
            "Fix the src lists or create the files."
        )
    general = toml.general
    python_files = python_package_files(root, general.python_name, toml.torch.pyext if toml.torch else ("py", "pyi"))
    if not any(p.name == "__init__.py" for p in python_files):
        raise UsageError(
            f"{root / 'torch-ext' / general.python_name / '__init__.py'} does not exist. The Python "
            f"package of kernel {general.name!r} must live in torch-ext/{general.python_name}/."
        )
    names = Names(
        python_name=general.python_name,
        metadata_name=general.metadata_name,
        build_id=content_id(root, toml, python_files),
    )
    plan = BuildPlan(root=root, toml=toml, torch=torch, names=names, python_files=python_files)

    common = [
        *COMMON_FLAGS,
        f"-D_GLIBCXX_USE_CXX11_ABI={int(torch.cxx11_abi)}",
        *(f"-isystem{d}" for d in torch.include_dirs),
        f"-isystem{torch.python_include}",
    ]
    if toml.torch is not None:
        binding = [
            *common,
            f"-I{plan.gen_include}",
            f"-I{root / 'torch-ext'}",
            *(f"-I{root / inc}" for inc in toml.torch.include),
            # every CPU kernel section's include dirs, so the binding can include tier headers
            *(f"-I{root / inc}" for k in toml.cpu_kernels for inc in k.include),
            f"-DTORCH_EXTENSION_NAME={names.stem}",
            *toml.torch.cxx_flags,
        ]
        for src in toml.torch.src:
            if src.endswith(COMPILED_SUFFIXES):
                plan.units.append(CompileUnit(Path(src), "torch", tuple(_dedupe(binding))))
    for kernel in toml.cpu_kernels:
        flags = [*common, *(f"-I{root / inc}" for inc in kernel.include), *kernel.cxx_flags]
        for src in kernel.src:
            if src.endswith(COMPILED_SUFFIXES):
                plan.units.append(CompileUnit(Path(src), kernel.table, tuple(_dedupe(flags))))
    # compiled as C (g++ -x c): see codegen.extension_c
    stub_flags = ["-x", "c", "-std=c11", "-O2", "-fPIC", f"-isystem{torch.python_include}", "-DPy_LIMITED_API=0x03090000"]
    plan.units.append(CompileUnit(plan.extension_source, "generated", tuple(stub_flags), generated=True))

    omp_runtime = [str(torch.libgomp)] if torch.libgomp else ["-fopenmp"]
    plan.link_flags = (
        "-shared",
        # NO rpath: _ops.py imports torch first, so libc10/libtorch/libtorch_cpu and
        # torch's libgomp are already loaded and the dynamic loader reuses them by
        # soname; an rpath into this venv would leak into the published wheel.
        f"-L{torch.lib_dir}",
        "-lc10",
        "-ltorch",
        "-ltorch_cpu",
        # torch's own OpenMP runtime (soname libgomp.so.1), never the compiler's:
        # one runtime per process, so torch.set_num_threads governs the kernel too.
        *omp_runtime,
    )
    return plan


def _dedupe(flags: list[str]) -> list[str]:
    seen: set[str] = set()
    out: list[str] = []
    for flag in flags:
        if flag not in seen:
            seen.add(flag)
            out.append(flag)
    return out
