"""Kernel project scaffolding: render ``templates/`` into a kernel directory.

``scripts/new_kernel.py`` is the command-line front end; tests and the demo
call :func:`generate_project` directly.
"""

from .catalogue import CATALOGUE, DTYPES, KINDS, TIERS, OpSpec, avx512_flags, op_spec
from .project import ProjectPlan, ScaffoldOptions, generate_project, plan_project, write_project

__all__ = [
    "CATALOGUE",
    "DTYPES",
    "KINDS",
    "TIERS",
    "OpSpec",
    "ProjectPlan",
    "ScaffoldOptions",
    "avx512_flags",
    "generate_project",
    "op_spec",
    "plan_project",
    "write_project",
]
