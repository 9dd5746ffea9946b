"""Plan and write a complete kernel project from the templates.

:func:`plan_project` renders every file into memory (nothing touches the disk
until everything rendered), :func:`write_project` then writes them, refusing
to replace existing files unless ``force`` is set — a kernel directory holds
the agent's work, and silently regenerating it would destroy that work.
"""

from __future__ import annotations

import json
import keyword
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..atomic import atomic_write_text
from ..buildtoml import kernel_builder_name
from ..errors import UsageError
from ..paths import TEMPLATES_DIR
from .catalogue import (
    AVX2_FLAGS,
    DTYPE_ENUM,
    DTYPE_HUMAN,
    DTYPE_TORCH,
    DTYPES,
    KINDS,
    TIERS,
    OpSpec,
    avx512_flags,
    fp_contract_flag,
    op_spec,
)
from .codegen import signature_sections
from .render import OP_SECTIONS, OPTIONAL_OP_SECTIONS, parse_sections, render, render_file
from .signature import Signature

IDENT_RE = re.compile(r"^[a-z_][a-z0-9_]*$")


@dataclass(frozen=True)
class ScaffoldOptions:
    """What ``new_kernel.py`` was asked for (already split into lists)."""

    ops: tuple[str, ...]
    name: str
    directory: Path
    kind: str | None = None
    dtypes: tuple[str, ...] = DTYPES
    tiers: tuple[str, ...] = TIERS
    force: bool = False
    #: ops outside the catalogue with a known signature (--from-baseline / --signature);
    #: their every layer is generated from it instead of a skeleton template.
    signatures: tuple[Signature, ...] = ()
    #: a directory of units whose op parts replace the generated ones (--bodies)
    bodies: Path | None = None


@dataclass
class ProjectPlan:
    """The rendered files (relative path -> text) and what they contain."""

    directory: Path
    name: str
    specs: list[OpSpec]
    files: dict[str, str] = field(default_factory=dict)

    @property
    def unfinished_ops(self) -> list[str]:
        return [spec.name for spec in self.specs if not spec.complete]


def _check_identifier(value: str, what: str) -> None:
    if not IDENT_RE.match(value) or keyword.iskeyword(value):
        raise UsageError(
            f"{what} {value!r} is not usable: it must be a lower-case Python/C++ identifier "
            "(letters, digits, underscores, not starting with a digit), e.g. my_kernel."
        )


def validate_options(options: ScaffoldOptions) -> None:
    _check_identifier(options.name, "--name")
    if not options.ops:
        raise UsageError("--op needs at least one op name, e.g. --op rms_norm or --op rms_norm,softmax.")
    for op in options.ops:
        _check_identifier(op, "op name")
    if len(set(options.ops)) != len(options.ops):
        raise UsageError(f"--op lists an op twice: {','.join(options.ops)}.")
    if options.kind is not None and options.kind not in KINDS:
        raise UsageError(f"--kind {options.kind!r} is not one of {', '.join(KINDS)}.")
    for dtype in options.dtypes:
        if dtype not in DTYPES:
            raise UsageError(f"--dtypes: {dtype!r} is not one of {', '.join(DTYPES)}.")
    if not options.dtypes:
        raise UsageError(f"--dtypes needs at least one of {', '.join(DTYPES)}.")
    for tier in options.tiers:
        if tier not in TIERS:
            raise UsageError(f"--tiers: {tier!r} is not one of {', '.join(TIERS)}.")
    if "generic" not in options.tiers:
        raise UsageError(
            "--tiers must include generic: the ATen-only tier is the fallback the dispatcher "
            "uses for small inputs and on CPUs without the SIMD tiers."
        )


def _kind_of(specs: Sequence[OpSpec], requested: str | None) -> str:
    """The package's kind for flags: gemm/attention if any op needs AMX."""
    kinds = {spec.kind for spec in specs}
    if requested is not None:
        kinds.add(requested)
    for heavy in ("attention", "gemm"):
        if heavy in kinds:
            return heavy
    return "reduction" if "reduction" in kinds else "elementwise"


def _toml_list(items: Sequence[str]) -> str:
    return "[" + ", ".join(f'"{item}"' for item in items) + "]"


def _kernel_sections(name: str, ns: str, tiers: Sequence[str], tier_flags: dict[str, tuple[str, ...]]) -> str:
    generic_src = [
        f"{ns}/cpu_features.hpp",
        f"{ns}/{name}_tiers.hpp",
        f"{ns}/{name}_dispatch.hpp",
        f"{ns}/{ns}.cpp",
        f"{ns}/{ns}_torch.cpp",
    ]
    blocks = [
        "# Generic tier: dispatcher, bridge and the ATen-only fallback (no SIMD flags).\n"
        f"[kernel.{ns}]\nbackend = \"cpu\"\ndepends = [\"torch\"]\ninclude = [\"{ns}\"]\n"
        f"src = {_toml_list(generic_src)}\ncxx-flags = []\n"
    ]
    if "avx2" in tiers:
        blocks.append(
            "# AVX2 tier: raw pointers only, no torch headers.\n"
            f"[kernel.{ns}_avx2]\nbackend = \"cpu\"\ndepends = [\"torch\"]\ninclude = [\"{ns}\"]\n"
            f"src = {_toml_list([f'{ns}/{name}_avx2.cpp'])}\ncxx-flags = {_toml_list(tier_flags['avx2'])}\n"
        )
    if "avx512" in tiers:
        blocks.append(
            "# AVX512 tier: raw pointers only, no torch headers.\n"
            f"[kernel.{ns}_avx512]\nbackend = \"cpu\"\ndepends = [\"torch\"]\ninclude = [\"{ns}\"]\n"
            f"src = {_toml_list([f'{ns}/{name}_avx512.cpp'])}\ncxx-flags = {_toml_list(tier_flags['avx512'])}\n"
        )
    return "\n" + "\n".join(blocks)


def _signature_spec(sig: Signature) -> OpSpec:
    """An OpSpec for an op generated from its signature (no template file)."""
    return OpSpec(sig.op, "elementwise", sig.describe(), "", 1, complete=False)


#: The SIMD vocabulary both units share (cpu/simd_shared.inc): each section is
#: pasted verbatim at the unit's ${simd_<section>} line, so a function whose text
#: is the same at 8 and 16 lanes is written once.
SHARED_SIMD_FILE = "cpu/simd_shared.inc"


def shared_simd_values(project: Path) -> dict[str, str]:
    """``simd_<section>`` -> that section's text, for the units' placeholders."""
    path = project / SHARED_SIMD_FILE
    if not path.is_file():
        raise UsageError(f"The shared SIMD template {path} is missing; restore templates/ from version control.")
    parsed = parse_sections(path.read_text(encoding="utf-8"), source=str(path), required=(), comment_preamble=True)
    # the placeholder's own line ends the pasted text: no blank line is added
    return {f"simd_{name}": text.rstrip("\n") for name, text in parsed.items()}


def plan_project(options: ScaffoldOptions, templates_dir: Path = TEMPLATES_DIR) -> ProjectPlan:
    """Render every file of the project into memory."""
    validate_options(options)
    name = options.name
    ns = f"{name}_cpu"
    by_op = {sig.op: sig for sig in options.signatures}
    specs = [_signature_spec(by_op[op]) if op in by_op else op_spec(op, options.kind) for op in options.ops]
    kind = _kind_of(specs, options.kind)
    contract = fp_contract_flag(all(spec.complete for spec in specs))
    tier_flags = {"avx2": (*AVX2_FLAGS, contract), "avx512": (*avx512_flags(kind), contract)}
    # build.toml spells the kernel with dashes, as the real kernel-builder
    # requires; the Python package (torch-ext/<name>/) keeps the underscores.
    base = {"name": name, "ns": ns, "kernel_name": kernel_builder_name(name)}

    sections: dict[str, list[str]] = {key: [] for key in (*OP_SECTIONS, *OPTIONAL_OP_SECTIONS)}
    layered: list[str] = []  # ops whose template has a kernelize layer
    simd_tiers = [tier for tier in ("avx2", "avx512") if tier in options.tiers]
    simd_by_tier: dict[str, list[str]] = {tier: [] for tier in simd_tiers}
    for spec in specs:
        if spec.name in by_op:
            path = Path(f"<signature of {spec.name}>")
            parsed = signature_sections(by_op[spec.name])
        else:
            path = templates_dir / "ops" / spec.template
            if not path.is_file():
                raise UsageError(f"The op template {path} is missing; restore templates/ from version control.")
            parsed = parse_sections(path.read_text(encoding="utf-8"), source=str(path))
        values = {**base, "op": spec.name}
        for key in sections:
            if key in parsed and key != "simd":
                sections[key].append(render(parsed[key], values, source=f"{path} [{key}]"))
        # the SIMD bodies are rendered once per tier: a KERNEL_TODO names its tier
        for tier in simd_tiers:
            simd_by_tier[tier].append(render(parsed["simd"], {**values, "tier": tier}, source=f"{path} [simd]"))
        if "layer" in parsed:
            layered.append(spec.name)

    tier_decls = "".join(
        f"namespace {tier} {{\n" + "\n".join(sections["tier_decl"]) + f"}}  // namespace {tier}\n\n"
        for tier in simd_tiers
    )
    thresholds = "".join(
        f'  if (op == "{spec.name}") return {spec.generic_threshold};\n' for spec in specs
    )
    library_rules = "".join(
        f'  if (op == "{spec.name}" && dt == {DTYPE_ENUM[rule.dtype]} && rows >= {rule.min_rows} && '
        f'rows * cols >= {rule.min_elements}{" && mkl_is_fast()" if rule.intel_only else ""}) return true;\n'
        for spec in specs for rule in spec.library_rules
    )
    avx2_rules = "".join(
        f'  if (op == "{spec.name}" && dt == {DTYPE_ENUM[dtype]}) return true;\n'
        for spec in specs for dtype in spec.slow_gather_avx2_dtypes
    )
    dtype_condition = " || ".join(f"t == {DTYPE_TORCH[d]}" for d in options.dtypes)
    values = {
        **base,
        "have_avx2": "1" if "avx2" in options.tiers else "0",
        "have_avx512": "1" if "avx512" in options.tiers else "0",
        "parallel_min_elements": "32768",
        "tier_decls": tier_decls,
        "generic_decls": "".join(sections["generic_decl"]),
        "generic_bodies": "\n".join(sections["generic"]),
        "thresholds": thresholds,
        "library_rules": library_rules,
        "slow_gather_avx2_rules": avx2_rules,
        "bridge_bodies": "\n".join(sections["bridge"]),
        "bridge_decls": "".join(sections["bridge_decl"]),
        "binding_defs": "".join(sections["binding"]),
        "dtype_condition": dtype_condition,
        "dtype_list": ", ".join(DTYPE_HUMAN[d] for d in options.dtypes),
        "python_bodies": "\n\n".join(sections["python"]),
        "layer_bodies": "\n\n".join(sections["layer"]),
        "layered_ops": ", ".join(layered),
        "layers_import": (
            "\n# kernels.kernelize looks the layers up as <kernel>.layers; imported last, they use the\n"
            "# functions above.\nfrom . import layers  # noqa: E402,F401\n"
        ) if sections["layer"] else "",
        "op_list": ", ".join(spec.name for spec in specs),
        "export_list": ", ".join(f'"{spec.name}"' for spec in specs),
        "dispatch_queries": json.dumps({spec.name: f"{spec.name}_dispatch_tier" for spec in specs if spec.dispatch_query}),
        "kernel_sections": _kernel_sections(name, ns, options.tiers, tier_flags),
    }
    project = templates_dir / "project"
    layout = {
        "build.toml": "build.toml.in",
        "torch-ext/torch_binding.cpp": "torch-ext/torch_binding.cpp.in",
        "torch-ext/torch_binding.h": "torch-ext/torch_binding.h.in",
        f"torch-ext/{name}/__init__.py": "torch-ext/__init__.py.in",
        f"{ns}/cpu_features.hpp": "cpu/cpu_features.hpp.in",
        f"{ns}/{name}_tiers.hpp": "cpu/tiers.hpp.in",
        f"{ns}/{name}_dispatch.hpp": "cpu/dispatch.hpp.in",
        f"{ns}/{ns}.cpp": "cpu/dispatcher.cpp.in",
        f"{ns}/{ns}_torch.cpp": "cpu/bridge.cpp.in",
    }
    if sections["layer"]:
        layout[f"torch-ext/{name}/layers.py"] = "torch-ext/layers.py.in"
    plan = ProjectPlan(directory=options.directory, name=name, specs=specs)
    for rel, template in layout.items():
        plan.files[rel] = render_file(project / template, values)
    shared = shared_simd_values(project)
    for tier in simd_tiers:
        tier_values = {**values, **shared, "cxx_flags": " ".join(tier_flags[tier]),
                       "op_bodies": "\n".join(simd_by_tier[tier])}
        plan.files[f"{ns}/{name}_{tier}.cpp"] = render_file(project / f"cpu/{tier}.cpp.in", tier_values)
    return plan


def existing_files(plan: ProjectPlan) -> list[Path]:
    return [plan.directory / rel for rel in plan.files if (plan.directory / rel).exists()]


def write_project(plan: ProjectPlan, *, force: bool) -> list[Path]:
    """Write the planned files; refuse to replace any existing one unless ``force``."""
    clash = existing_files(plan)
    if clash and not force:
        shown = ", ".join(str(p) for p in clash[:4]) + (" ..." if len(clash) > 4 else "")
        raise UsageError(
            f"{plan.directory} already holds a kernel project ({len(clash)} file(s) would be "
            f"replaced: {shown}). Nothing was written. Pass --force to overwrite them, or choose "
            "another --dir."
        )
    written = []
    for rel, text in plan.files.items():
        path = plan.directory / rel
        atomic_write_text(path, text)
        written.append(path)
    return written


def generate_project(options: ScaffoldOptions, templates_dir: Path = TEMPLATES_DIR) -> ProjectPlan:
    """Plan and write the project described by ``options`` (with the op bodies of
    ``options.bodies`` spliced in, see :mod:`.bodies`)."""
    plan = plan_project(options, templates_dir)
    if options.bodies is not None:
        from .bodies import splice_bodies  # bodies imports this module

        splice_bodies(plan, options.bodies)
    write_project(plan, force=options.force)
    return plan
