"""Build a CPU kernel directory without Nix: build.toml -> ninja -> variant dir -> wheel.

This is what the configured ``build_command`` runs.  See ``docs/build.md`` for
the layout and for how the real ``kernel-builder`` differs.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..atomic import exclusive_lock
from ..buildtoml import load_build_toml
from ..errors import CheckFailed, UsageError
from ..portability.units import BUILT_UNITS_FILE, built_units_json
from . import codegen, layout
from .diagnostics import CompileError, first_error
from .machine_code import cached_prefetch_counts
from .ninja import ninja_file, run_ninja, write_if_changed
from .plan import BuildPlan, make_plan
from .toolchain import find_ccache, find_compiler, find_ninja, torch_info
from .variant_digest import write_digest
from .wheel import write_wheel


class BuildFailed(CheckFailed):
    """The compiler or linker failed; ``error`` has the first diagnostic, ``raw`` all output."""

    def __init__(self, error: CompileError, *, variant_dir: Path, previous_kept: bool):
        kept = (
            f" The previous build in {variant_dir} is unchanged and still loads."
            if previous_kept
            else ""
        )
        super().__init__(
            f"{error.headline()} -- fix this in the named file (or the section's cxx-flags in "
            f"build.toml) and rebuild.{kept}"
        )
        self.error = error
        self.raw = error.raw


@dataclass
class BuildResult:
    root: Path
    variant_dir: Path
    wheel: Path | None
    ext_name: str
    build_id: str
    compiled: list[str] = field(default_factory=list)
    linked: bool = False
    seconds: float = 0.0
    ccache: bool = False
    #: prefetch instructions in the built library by tier (None: no objdump); see machine_code
    prefetches: dict[str, int] | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": True,
            "kernel_dir": str(self.root),
            "variant_dir": str(self.variant_dir),
            "wheel": str(self.wheel) if self.wheel else None,
            "ext_name": self.ext_name,
            "build_id": self.build_id,
            "compiled": list(self.compiled),
            "linked": self.linked,
            "seconds": round(self.seconds, 3),
            "ccache": self.ccache,
            "prefetch_instructions": self.prefetches,
        }


StepCallback = Callable[[int, int, str, str], None]


def prepare(root: Path) -> BuildPlan:
    """Read build.toml and torch's settings into a compile plan (no compiling)."""
    root = Path(root).resolve()
    if not root.is_dir():
        raise UsageError(f"The kernel directory {root} does not exist; pass --dir or cd into the kernel directory.")
    toml = load_build_toml(root / "build.toml")
    return make_plan(root, toml, torch_info())


def build_kernel(
    root: Path,
    *,
    jobs: int | None = None,
    wheel: bool = True,
    on_step: StepCallback | None = None,
) -> BuildResult:
    """Build ``root`` into ``build/<variant>/`` and ``dist/*.whl``.

    Raises :class:`BuildFailed` (exit 1) on a compiler/linker error, leaving the
    previous variant untouched, and ``UsageError`` (exit 2) on a bad build.toml.
    The variant's ``metadata.json`` carries a kernels-data ``digest`` of its
    files (see :mod:`.variant_digest`), validated before the swap; among them
    ``tier_units.json``, each tier's unit hash as compiled
    (:func:`kernel_harness.portability.units.built_units_json`), so tier
    evidence of the installed package names the units that ran.
    ``on_step(done, total, "CXX"|"LINK", what)`` reports ninja's progress.
    """
    started = time.perf_counter()
    plan = prepare(root)
    compiler = find_compiler()
    ninja = find_ninja()
    ccache = find_ccache()
    build_dir = plan.root / "build"
    plan.obj_dir.mkdir(parents=True, exist_ok=True)
    variant_dir = build_dir / plan.variant
    with exclusive_lock(plan.obj_dir / "build.lock"):
        layout.clean_stale(build_dir)
        # the units as ninja is about to compile them (read before compiling, not after)
        units_json = built_units_json(plan.root, plan.names.ext_name)
        write_if_changed(plan.gen_include / "registration.h", codegen.registration_h(plan.names))
        write_if_changed(plan.extension_source, codegen.extension_c(plan.names))
        write_if_changed(plan.obj_dir / "build.ninja", ninja_file(plan, compiler, ccache))
        result = run_ninja(ninja, plan.obj_dir, jobs=jobs, on_step=on_step, source_root=plan.root)
        if result.returncode != 0:
            raise BuildFailed(
                first_error(result.output, plan.root, plan.obj_dir),
                variant_dir=variant_dir,
                previous_kept=(variant_dir / "metadata.json").is_file(),
            )
        staging = layout.staging_dir(build_dir, plan.variant)
        try:
            layout.assemble(plan, staging)
            (staging / BUILT_UNITS_FILE).write_text(units_json, encoding="utf-8")
            # Last step before the swap: the digest covers every file now in staging,
            # and is read back through kernels-data before anything is replaced.
            write_digest(staging)
            layout.publish(staging, variant_dir)
        finally:
            if staging.exists():
                shutil.rmtree(staging, ignore_errors=True)
        wheel_path = write_wheel(plan, variant_dir, plan.root / "dist") if wheel else None
    return BuildResult(
        root=plan.root,
        variant_dir=variant_dir,
        wheel=wheel_path,
        ext_name=plan.names.ext_name,
        build_id=plan.names.build_id,
        compiled=list(result.compiled),
        linked=result.linked,
        seconds=time.perf_counter() - started,
        ccache=ccache is not None,
        prefetches=cached_prefetch_counts(variant_dir / plan.names.so_name, plan.obj_dir / "prefetch_counts.json"),
    )
