"""Op bodies kept apart from the template text of a generated unit.

A generated unit (``<ns>/<name>_cpu.cpp``, ``_avx2.cpp``, ``_avx512.cpp``) is the
templates' shared text (includes, namespaces and, in the SIMD units, the vector
vocabulary: loads, stores, the bf16 rounding screen, exp) followed by each op's
section, which begins with a generated comment line ``// <op> ...``.  The agent
writes only in the op sections.

``new_kernel.py --bodies DIR`` generates the package from today's templates and
takes each unit's op part, from its first op line to the end, from the file of
the same name in DIR (a kernel directory's ``<ns>/`` or an example's
``solution/``; a whole unit or its op part alone).  So a kernel written against
older templates picks up their improvements without losing its code, and the
examples ship their bodies without a copy of the vocabulary that would go stale
whenever the templates change.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from ..errors import UsageError
from .project import ProjectPlan

__all__ = ["editable_units", "op_part_start", "splice_bodies"]


def editable_units(plan: ProjectPlan) -> list[str]:
    """The package's editable units (relative paths in ``plan.files``): generic, avx2, avx512."""
    ns = f"{plan.name}_cpu"
    names = [f"{ns}/{plan.name}_cpu.cpp", f"{ns}/{plan.name}_avx2.cpp", f"{ns}/{plan.name}_avx512.cpp"]
    return [rel for rel in names if rel in plan.files]


def op_part_start(lines: list[str], ops: list[str]) -> int | None:
    """Index of the first line that opens an op's section (``// <op>`` then a space or ':')."""
    for i, line in enumerate(lines):
        for op in ops:
            rest = line.removeprefix(f"// {op}")
            if rest != line and rest[:1] in (" ", ":", ""):
                return i
    return None


def splice_bodies(plan: ProjectPlan, bodies: Path) -> list[str]:
    """Replace each editable unit's op part with the one in ``bodies``; returns the
    units spliced.  Units without a file in ``bodies`` keep the generated text."""
    if not bodies.is_dir():
        raise UsageError(f"--bodies {bodies}: not a directory. Give the directory that holds the units "
                         f"(e.g. examples/rope/solution/rope_kernel_cpu or an earlier kernel's {plan.name}_cpu/).")
    ops = [spec.name for spec in plan.specs]
    spliced = []
    for rel in editable_units(plan):
        source = bodies / Path(rel).name
        if not source.is_file():
            continue
        generated = plan.files[rel].splitlines(keepends=True)
        written = source.read_text(encoding="utf-8").splitlines(keepends=True)
        g, w = op_part_start(generated, ops), op_part_start(written, ops)
        if w is None:
            raise UsageError(
                f"--bodies: {source} has no op section (no line starting with '// <op>' for "
                f"{', '.join(ops)}), so there is nothing to take from it. Nothing was written. Give the "
                "unit an agent edited (or its part from the op's first generated comment on), or leave "
                "the file out to keep the generated text.")
        assert g is not None, f"the generated {rel} has no op section"
        plan.files[rel] = "".join(generated[:g] + written[w:])
        spliced.append(rel)
    # an op whose every body was supplied is complete, whatever its template said
    plan.specs = [spec if spec.complete or any(f'KERNEL_TODO("{spec.name}"' in plan.files[rel]
                                               for rel in editable_units(plan))
                  else replace(spec, complete=True) for spec in plan.specs]
    return spliced
