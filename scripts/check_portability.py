"""Prove a kernel package on CPUs this machine is not, under QEMU user-mode emulation.

Runs the package inside ``qemu-x86_64 -cpu Haswell`` (AVX2, no AVX512) and
``-cpu Nehalem`` (no AVX: the generic tier): it must load, ``available_tiers()``
and the dispatch must match the emulated CPU, no illegal instruction may occur,
and the outputs on the baseline's inputs must pass the benchmark's correctness
rules. QEMU emulates no AVX512: this proves the fallbacks, not the AVX512 tier.
Exit 0 ok, 1 a check failed, 2 bad input / qemu missing, 3 crash (SIGILL) or hang.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

import _bootstrap  # noqa: F401  (makes kernel_harness importable from any directory)
from rich.markup import escape
from rich.table import Table

from kernel_harness.cli import add_json_option, console, run_main, write_json_report
from kernel_harness.portability.check import PortabilityOptions, check_portability, preflight
from kernel_harness.portability.emulate import DEFAULT_TIMEOUT_S
from kernel_harness.portability.models import MODELS


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__.split("\n\n", 1)[1])
    parser.add_argument("kernel", help="kernel directory (holding build.toml, built) or installed package name")
    parser.add_argument("--baseline", required=True, type=Path, help="the baseline.py the benchmark uses")
    parser.add_argument("--op", required=True, help="<package>.<function>, e.g. my_kernel.rms_norm")
    parser.add_argument("--cpu", default="all", choices=[*MODELS, "all"],
                        help="emulated CPU model(s) (default: all, run side by side)")
    parser.add_argument("--seed", type=int, default=None, help="input seed (default: random, recorded)")
    parser.add_argument("--seeds", type=int, default=1,
                        help="get_inputs() sets besides get_correctness_inputs() (default 1)")
    parser.add_argument("--atol", type=float, default=None, help="widen float tolerances as the benchmark does")
    parser.add_argument("--rtol", type=float, default=None, help="widen float tolerances as the benchmark does")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S,
                        help=f"seconds per emulated run (default {DEFAULT_TIMEOUT_S:.0f}; torch's import alone takes ~35 s)")
    add_json_option(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    options = PortabilityOptions(kernel_spec=args.kernel, baseline_path=args.baseline, op_path=args.op,
                                 cpu=args.cpu, seed=args.seed, seeds=args.seeds, atol=args.atol,
                                 rtol=args.rtol, timeout=args.timeout)
    preflight(options)
    console.print(f"emulating {args.cpu} with qemu-x86_64 (import torch alone takes ~35 s per CPU) ...")
    report = check_portability(options)
    data = report.to_dict()
    table = Table(title=f"{escape(args.op)} under QEMU (seed {report.seed}, qemu {report.qemu_version})")
    for col in ("CPU", "expected tiers", "available_tiers()", "dispatch", "calls correct", "time", "verdict"):
        table.add_column(col)
    for run in data["runs"]:
        dispatched = sorted({d["tier"] for d in run["dispatch"]}) or ["-"]
        verdict = "[green]ok[/]" if run["ok"] else f"[red]exit {run['exit_code']}[/]"
        table.add_row(run["label"], ", ".join(run["expected_tiers"] or ["?"]),
                      ", ".join(run["available_tiers"] or ["-"]), ", ".join(dispatched),
                      f"{run['checks_passed']}/{len(run['checks'])}",
                      f"{run['seconds']} s" if run["seconds"] is not None else "-", verdict)
    console.print(table)
    for run in data["runs"]:
        for text in filter(None, [run["crash"], run["emulation_problem"], *run["problems"][:20]]):
            console.print(f"[red]{escape(run['label'])}:[/] {escape(text)}", soft_wrap=True)
    evidence = Table(title="tier evidence (emulated)")
    for col in ("tier", "executed", "correct", "cpu", "source hash / reason"):
        evidence.add_column(col)
    for e in data["tier_evidence"]:
        detail = (e["source_hash"] or "-")[:12] if e["executed"] else escape(e["reason"] or "")
        evidence.add_row(e["tier"], "yes" if e["executed"] else "no",
                         {True: "yes", False: "[red]no[/]", None: "-"}[e["correct"]], escape(e["cpu"]), detail)
    console.print(evidence)
    hashes = data["unit_hashes"]
    for note in hashes["notes"] + ([f"no unit hashes: {hashes['reason']}"] if hashes["reason"] else []):
        console.print(f"note: {escape(note)}", soft_wrap=True)
    write_json_report(args.json, data)
    return report.exit_code


if __name__ == "__main__":
    run_main(main)
