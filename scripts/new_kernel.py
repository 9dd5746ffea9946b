"""Write a complete kernel project from templates/ (procedure step 4).

Catalogue ops (rms_norm, add_rms_norm, silu_and_mul, gelu_and_mul, softmax,
layer_norm, decode_attention) get finished, tested tiers; any other op name gets everything
generated and wired, with its compute bodies marked KERNEL_TODO(...) for you
to write (validate_cpu_kernel.py reports those as unfinished). For an op
outside the catalogue, --from-baseline baseline.py (or --signature "...")
generates every layer with the baseline's own parameters: you then write only
the generic tier and the two SIMD bodies.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

import _bootstrap  # noqa: F401  (makes kernel_harness importable from any directory)
from rich.table import Table

from kernel_harness.cli import add_json_option, console, run_main, write_json_report
from kernel_harness.errors import UsageError
from kernel_harness.scaffold import CATALOGUE, DTYPES, KINDS, TIERS, ScaffoldOptions, generate_project
from kernel_harness.scaffold.from_baseline import signature_from_baseline
from kernel_harness.scaffold.signature import Signature, parse_signature


def _csv(value: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in value.split(",") if part.strip())


def _signatures(ops: tuple[str, ...], baselines: list[Path], texts: list[str],
                dtypes: tuple[str, ...]) -> tuple[Signature, ...]:
    """One signature per op outside the catalogue, from --from-baseline then --signature, in --op order."""
    sources = [("baseline", b) for b in baselines] + [("signature", t) for t in texts]
    if not sources:
        return ()
    targets = [op for op in ops if op not in CATALOGUE]
    if len(sources) != len(targets):
        raise UsageError(
            f"{len(sources)} --from-baseline/--signature value(s) for {len(targets)} op(s) outside the catalogue "
            f"({', '.join(targets) or 'none'}); give exactly one per such op, in --op order.")
    sigs = []
    for op, (kind, value) in zip(targets, sources):
        if kind == "baseline":
            sigs.append(signature_from_baseline(value, op))
        else:
            sigs.append(parse_signature(op, value, default_dtypes=dtypes))
    return tuple(sigs)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog="catalogue ops: " + ", ".join(spec.signature for spec in CATALOGUE.values()),
    )
    parser.add_argument("--op", required=True, type=_csv, help="op name(s), comma separated, e.g. rms_norm,softmax")
    parser.add_argument("--name", required=True, help="Python package name of the kernel, e.g. my_kernel")
    parser.add_argument("--dir", type=Path, default=Path("kernel"), help="kernel directory (default: kernel/)")
    parser.add_argument("--kind", choices=KINDS, default=None, help="kernel kind (sets flags; skeleton signature)")
    parser.add_argument("--dtypes", type=_csv, default=DTYPES, help="accepted dtypes (default: fp32,bf16,fp16)")
    parser.add_argument("--tiers", type=_csv, default=TIERS, help="tiers to generate (default: generic,avx2,avx512)")
    parser.add_argument("--force", action="store_true", help="overwrite an existing kernel project")
    parser.add_argument("--from-baseline", type=Path, action="append", default=[], metavar="BASELINE.py",
                        help="generate the op's every layer from this baseline's signature (traced under fake "
                             "tensors); once per op outside the catalogue, in --op order")
    parser.add_argument("--signature", action="append", default=[], metavar="SIG",
                        help='explicit signature instead of a baseline, e.g. "q: Tensor, cos: Tensor[fp32], '
                             'sin: Tensor[fp32] -> Tensor(like q)" (see SKILL.md)')
    parser.add_argument("--bodies", type=Path, default=None, metavar="DIR",
                        help="take each unit's op part (from its first '// <op>' line on) from the file of "
                             "the same name in DIR: an earlier kernel's <name>_cpu/ (regenerate it with "
                             "today's templates, keeping its bodies) or an example's solution/")
    add_json_option(parser)
    args = parser.parse_args(argv)
    signatures = _signatures(args.op, args.from_baseline, args.signature, tuple(args.dtypes))

    options = ScaffoldOptions(
        ops=args.op,
        name=args.name,
        directory=args.dir,
        kind=args.kind,
        dtypes=tuple(args.dtypes),
        tiers=tuple(args.tiers),
        force=args.force,
        signatures=signatures,
        bodies=args.bodies,
    )
    plan = generate_project(options)

    table = Table(title=f"Kernel project {plan.name} written to {plan.directory}")
    table.add_column("op")
    table.add_column("kind")
    table.add_column("Python function")
    table.add_column("compute bodies")
    for spec in plan.specs:
        table.add_row(spec.name, spec.kind, f"{plan.name}.{spec.signature}",
                      "complete" if spec.complete else "[yellow]KERNEL_TODO: write them[/yellow]")
    console.print(table)
    for rel in plan.files:
        console.print(f"  {plan.directory / rel}")
    for sig in signatures:
        for note in sig.notes:
            console.print(f"[yellow]note ({sig.op}):[/yellow] {note}")
    if plan.unfinished_ops:
        console.print(
            f"[yellow]Next:[/yellow] write the bodies marked KERNEL_TODO for {', '.join(plan.unfinished_ops)}, "
            f"then run scripts/validate_cpu_kernel.py {plan.directory}."
        )
    else:
        console.print(f"Next: python scripts/validate_cpu_kernel.py {plan.directory}")
    write_json_report(
        args.json,
        {
            "name": plan.name,
            "directory": str(plan.directory),
            "ops": [
                {"name": s.name, "kind": s.kind, "signature": s.signature, "complete": s.complete}
                for s in plan.specs
            ],
            "signatures": {sig.op: _signature_json(sig) for sig in signatures},
            "files": sorted(plan.files),
            "unfinished_ops": plan.unfinished_ops,
        },
    )
    return 0


def _signature_json(sig: Signature) -> dict:
    from dataclasses import asdict

    return asdict(sig)


if __name__ == "__main__":
    run_main(main)
