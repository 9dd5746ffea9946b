"""Render the repository card (``README.md``) from ``templates/publish/README.md.tmpl``.

The template holds the prose and structure; this module computes the parts
that depend on the kernel (API, tiers, the measured table) and fills them in
with :class:`string.Template`, whose ``$name`` placeholders never clash with
the braces of the Python and JSON examples in the card.  ``substitute`` (not
``safe_substitute``) is used so a placeholder the code forgot to fill is an
error instead of a ``$name`` left in a published card.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from string import Template
from typing import Any

from ..cpu import cpu_model
from ..errors import UsageError
from ..paths import TEMPLATES_DIR
from .layout import KernelSource, Signature, kernel_functions

CARD_TEMPLATE = TEMPLATES_DIR / "publish" / "README.md.tmpl"

#: What each tier needs from the CPU, and examples of CPUs that have it.
TIER_CPUS: dict[str, tuple[str, str]] = {
    "generic": ("none beyond x86_64", "any x86_64 CPU (ATen fallback)"),
    "avx2": ("AVX2, FMA, F16C", "Intel Haswell (2013) and later, AMD Zen and later"),
    "avx512": (
        "AVX512 F/BW/VL/DQ (AVX512-BF16 instructions only where the CPU has them)",
        "Intel Skylake-SP (2017) and later Xeons; AMD Zen 4 and later",
    ),
    # a section built with -mamx-*: a GEMM package's avx512 unit, whose AMX branches run only
    # where the CPU has AMX (the dispatcher runs the unit as its avx512 tier)
    "amx": (
        "AVX512 F/BW/VL/DQ; its AMX-BF16 tile code only where the CPU has AMX-TILE/BF16/INT8 "
        "and Linux grants it to the process",
        "Intel Skylake-SP (2017) and later Xeons, AMD Zen 4 and later; AMX on Intel Sapphire Rapids and later",
    ),
}


@dataclass
class Measurement:
    """One row of the benchmark table."""

    label: str
    workload: str
    baseline_us: float
    kernel_us: float
    speedup: float
    origin: str
    machine: str = "not recorded"


@dataclass
class CardFacts:
    """Everything the card states that is not in build.toml or the sources."""

    repo_id: str
    version: int
    variants: list[str]
    dtypes: list[str]
    headline: str  # e.g. "bfloat16 1024x4096"
    measurements: list[Measurement]
    machine: str
    verification: list[str]  # one line per check that ran, with its outcome
    description: str = ""
    baseline_doc: str = ""
    function: str = ""  # the operation the baseline measures
    headline_args: list[dict[str, Any]] = field(default_factory=list)
    compat_dir: bool = True  # build/<variant>/<package>/__init__.py exists (older kernels releases import it)
    notes: list[str] = field(default_factory=list)
    digest_algorithm: str | None = None  # the staged variants' digest, checked before upload (None: not checked)
    signed: bool = False  # every variant carries a metadata.json.sigstore (never made by this harness)


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def best_trial_details(summary: dict[str, Any] | None) -> dict[str, Any]:
    """The benchmark details trial_manager.py kept for the best trial (empty if recorded by hand)."""
    if not summary:
        return {}
    for trial in summary.get("trials") or []:
        if isinstance(trial, dict) and trial.get("id") == summary.get("best_trial"):
            result = trial.get("result") or {}
            details = result.get("details") if isinstance(result, dict) else None
            return details if isinstance(details, dict) else {}
    return {}


def _run_detail(data: dict[str, Any]) -> str:
    threads = data.get("threads")
    if "pinned" not in data and not isinstance(threads, int):
        return ""
    pinned = "pinned" if data.get("pinned") else "not pinned"
    return f" ({threads} threads, {pinned})" if isinstance(threads, int) else f" ({pinned})"


def measurements_from(summary: dict[str, Any] | None, benchmark: dict[str, Any] | None, headline: str) -> list[Measurement]:
    """The table rows: the finalized trial's numbers, then the publish-time run."""
    rows: list[Measurement] = []
    if summary:
        values = [_number(summary.get(k)) for k in ("baseline_us", "kernel_us", "speedup")]
        if all(v is not None for v in values):
            trial = summary.get("best_trial")
            details = best_trial_details(summary)
            label = f"finalized trial {trial}" if trial is not None else "finalized trial"
            rows.append(
                Measurement(
                    label=label + _run_detail(details),
                    workload=headline,
                    baseline_us=values[0],  # type: ignore[arg-type]
                    kernel_us=values[1],  # type: ignore[arg-type]
                    speedup=values[2],  # type: ignore[arg-type]
                    origin="trial_manager.py finalize (summary.json)",
                    machine=machine_text(details["machine"]) if details.get("machine") else "not recorded",
                )
            )
    if benchmark:
        values = [_number(benchmark.get(k)) for k in ("baseline_us", "kernel_us", "speedup")]
        if all(v is not None for v in values):
            rows.append(
                Measurement(
                    label="publish-time check" + _run_detail(benchmark),
                    workload=headline,
                    baseline_us=values[0],  # type: ignore[arg-type]
                    kernel_us=values[1],  # type: ignore[arg-type]
                    speedup=values[2],  # type: ignore[arg-type]
                    origin="scripts/benchmark_cpu.py on the staged repository",
                    machine=machine_text(benchmark.get("machine")),
                )
            )
    return rows


def machine_text(value: Any) -> str:
    """A one-line machine description from benchmark_cpu.py's ``machine`` value."""
    if isinstance(value, str) and value.strip():
        return value.strip()
    if isinstance(value, dict):
        model = value.get("cpu_model") or value.get("cpu") or value.get("model")
        parts = [str(model)] if model else []
        for key, label in (("logical_cpus", "logical CPUs"), ("threads", "threads"), ("numa_nodes", "NUMA nodes")):
            if isinstance(value.get(key), int):
                parts.append(f"{value[key]} {label}")
        if isinstance(value.get("torch"), str):
            parts.append(f"torch {value['torch']}")
        if parts:
            return ", ".join(parts)
    return local_machine_text()


def local_machine_text() -> str:
    """The CPU model of this machine from /proc/cpuinfo (no probing, no timing)."""
    return cpu_model()


def _api_section(source: KernelSource) -> str:
    lines: list[str] = []
    for function in source.functions:
        lines.append(f"- `{function.signature}`" + (f": {function.doc}" if function.doc else ""))
    if not lines:
        return "The package exports no public functions."
    return "\n".join(lines)


def _support_table(source: KernelSource, facts: CardFacts) -> str:
    tiers = sorted({t.tier for t in source.tiers}, key=list(TIER_CPUS).index) or ["generic"]
    rows = [
        ("Operating system / architecture", "Linux, x86_64"),
        ("PyTorch build variants", ", ".join(f"`{v}`" for v in facts.variants) or "none staged"),
        ("Dtypes (those the baseline checks)", ", ".join(f"`{d}`" for d in facts.dtypes) or "not recorded"),
        ("Tiers in this build", ", ".join(tiers)),
        ("CPUs", "any x86_64 CPU runs the generic tier; the SIMD tiers need the flags listed below"),
    ]
    out = ["| | |", "| --- | --- |"]
    out += [f"| {key} | {value} |" for key, value in rows]
    return "\n".join(out)


def _tiers_table(source: KernelSource) -> str:
    out = ["| Tier | build.toml section | Needs | Examples |", "| --- | --- | --- | --- |"]
    tiers = source.tiers or []
    if not tiers:
        out.append("| generic | (none) | none beyond x86_64 | any x86_64 CPU |")
    for tier in tiers:
        needs, examples = TIER_CPUS[tier.tier]
        out.append(f"| {tier.tier} | `{tier.section}` | {needs} | {examples} |")
    return "\n".join(out)


def _benchmark_table(facts: CardFacts) -> str:
    if not facts.measurements:
        return "No measurement was recorded for this build."
    out = [
        "| Measurement | Workload | PyTorch (µs) | Kernel (µs) | Speedup | Machine |",
        "| --- | --- | ---: | ---: | ---: | --- |",
    ]
    for row in facts.measurements:
        out.append(
            f"| {row.label} | {row.workload} | {row.baseline_us:.1f} | {row.kernel_us:.1f} | "
            f"{row.speedup:.2f}x | {row.machine.replace('|', '/')} |"
        )
    return "\n".join(out)


def _benchmark_notes(facts: CardFacts) -> str:
    origins = sorted({row.origin for row in facts.measurements})
    lines = [f"Published from: {facts.machine}."]
    if origins:
        lines.append("Sources: " + "; ".join(origins) + ".")
    lines.append(
        "PyTorch is the baseline's eager implementation on the same inputs; both times come from "
        "kernel-harness's `scripts/benchmark_cpu.py`. Other CPUs, thread counts and shapes will differ."
    )
    return "\n".join(lines)


GUARANTEES = """\
Every check listed under "Verification before publishing" ran on the staged files, exactly as
they were uploaded, each in a fresh Python process; `get_local_kernel` is the loader `get_kernel`
uses after downloading, so the uploaded variant imports the same way on a machine like this one.

Not guaranteed, because this build was made by kernel-harness's local builder and not by
`kernel-builder` in its Nix sandbox:

- Only the build variants listed above exist. A compliant CPU kernel provides every variant in
  kernel-builder's build-variant list for x86_64-linux (one per supported PyTorch version); on
  any other PyTorch version `get_kernel` finds no matching variant.
- The extension was compiled with this machine's toolchain and glibc and was not checked against
  `manylinux_2_28` or the Python 3.9 stable ABI (`kernel-builder check-abi`), so it may not load
  on an older Linux distribution.
- The build is not reproducible from a pinned `flake.lock`, and its `metadata.json` carries no
  provenance. Rebuild with `kernel-builder build-and-upload` for a compliant release."""

INTEGRITY_UNSIGNED = """
- Integrity, not identity: each variant's `metadata.json` records a {algorithm} digest of every
  other file of the variant (computed at build time by kernels-data, the code `kernels` verifies
  with), so a changed, added or removed file is detectable. The build is **unsigned**: there is no
  `metadata.json.sigstore`, which only a CI workflow with an OIDC identity can make, so nothing
  proves who built it and `kernels verify-signature` reports "signature not found" for it."""

INTEGRITY_FOREIGN_BUNDLE = """
- Each variant's `metadata.json` records a {algorithm} digest of every other file (checked
  before upload). The variants carry a `metadata.json.sigstore` bundle that this harness did not
  make and did not verify; check it with `kernels verify-signature` or
  `kernels.verify.verify_variant` before trusting it."""

NO_DIGEST = """
- The variants' files were not checked against a digest before upload, and the build is unsigned."""


def integrity_text(facts: CardFacts) -> str:
    """The card's statement of the digest algorithm and of the (absent) signature."""
    if facts.digest_algorithm is None:
        return NO_DIGEST
    template = INTEGRITY_FOREIGN_BUNDLE if facts.signed else INTEGRITY_UNSIGNED
    return template.format(algorithm=facts.digest_algorithm)


COMPAT_BULLET = """
- The variant has no `{name}/` compatibility directory, which kernels' requirements ask for so
  that older `kernels` releases (which import `build/<variant>/{name}/`) can load it; current
  releases import the variant's own `__init__.py`."""


def render_card(source: KernelSource, facts: CardFacts, template_path: Path = CARD_TEMPLATE) -> str:
    """Fill the card template; raises UsageError if the template is missing or malformed."""
    try:
        template = Template(template_path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise UsageError(f"The card template {template_path} could not be read: {exc}. Restore it from version control.") from exc
    operations = kernel_functions(source)
    module_var = source.name
    example = _example(module_var, operations, facts)
    tier_names = "/".join(sorted({t.tier for t in source.tiers if t.tier != "generic"}, key=list(TIER_CPUS).index)) or "SIMD"
    description = facts.description or source.package_doc or _first_line(facts.baseline_doc)
    if not description:
        names = ", ".join(f"`{f.name}`" for f in operations) or "its operations"
        description = f"Fast CPU implementations of {names}."
    namespace = facts.repo_id.split("/", 1)[0]
    values = {
        # The Hub's card metadata spells license identifiers in lower case.
        "license_id": source.license.lower(),
        "extra_tags": "".join(f"- {t}\n" for t in sorted({t.tier for t in source.tiers} - {"generic"})),
        "title": source.name,
        "description": description,
        "tier_names": tier_names,
        "version": str(facts.version),
        "repo_id": facts.repo_id,
        "namespace": namespace,
        "module_var": module_var,
        "example": example,
        "variant_list": ", ".join(f"`{v}`" for v in facts.variants) or "none",
        "api_section": _api_section(source),
        "support_table": _support_table(source, facts),
        "tiers_table": _tiers_table(source),
        "benchmark_table": _benchmark_table(facts),
        "benchmark_notes": _benchmark_notes(facts),
        "verification": "\n".join(f"- {line}" for line in facts.verification) or "- No check ran.",
        "guarantees": GUARANTEES
        + integrity_text(facts)
        + ("" if facts.compat_dir else COMPAT_BULLET.format(name=source.name)),
        "name": source.name,
    }
    try:
        return template.substitute(values)
    except (KeyError, ValueError) as exc:
        raise UsageError(
            f"The card template {template_path} uses a placeholder this publisher does not fill ({exc}). "
            "Use only the documented placeholders (see docs/publish.md) or escape a literal dollar as $$."
        ) from exc


def _example(module_var: str, operations: list[Signature], facts: CardFacts) -> str:
    """A runnable call at the baseline's headline shapes, or the signature as a comment."""
    chosen = next((f for f in operations if f.name == facts.function), operations[0] if operations else None)
    if chosen is None:
        return f"print(dir({module_var}))"
    args = facts.headline_args
    if chosen.name == facts.function and args and all(a["kind"] != "other" for a in args) and len(args) <= len(chosen.params):
        lines = []
        for name, arg in zip(chosen.params, args):
            if arg["kind"] == "tensor":
                shape = repr(tuple(arg["shape"]))
                maker = "randn" if "float" in arg["dtype"] else "zeros"  # randn has no integer dtypes
                lines.append(f"{name} = torch.{maker}({shape}, dtype=torch.{arg['dtype']})")
            else:
                lines.append(f"{name} = {arg['repr']}")
        call = ", ".join(chosen.params[: len(args)])
        lines.append(f"y = {module_var}.{chosen.name}({call})")
        return "\n".join(lines)
    return f"# {module_var}.{chosen.signature}"


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0].strip() if text.strip() else ""
