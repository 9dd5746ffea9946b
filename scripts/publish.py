"""Publish a finalized kernel to the Hugging Face Hub (the last step of the procedure).

Stages the repository exactly as the Hub layout expects, re-hashes each staged
build variant against the kernels-data digest its builder recorded, proves the
staged copy loads in a fresh process and is correct, renders the card, and uploads
it to a ``kernel`` repository: the build on branch ``v<version>``, the card on
``main``.  See docs/publish.md.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import _bootstrap  # noqa: F401  (makes kernel_harness importable from any directory)
from rich.markdown import Markdown
from rich.panel import Panel

from kernel_harness.cli import add_json_option, console, run_main, write_json_report
from kernel_harness.errors import HarnessError
from kernel_harness.publish import PublishOptions, publish


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="Stage, verify and upload a kernel to a Hugging Face Hub kernel repository.",
        epilog="Exit codes: 0 published (or dry run verified); 1 a staged variant differs from the digest in its "
        "metadata.json (rebuild), the staged kernel is incorrect or a check could not run; 2 bad input, or no/insufficient Hub token; 3 the staged kernel does not load or "
        "crashes, or the Hub could not be reached. The stage directory is kept in every case.",
    )
    parser.add_argument("directory", type=Path, help="a built kernel directory, or the output/ directory of trial_manager.py finalize")
    parser.add_argument("--repo-id", required=True, metavar="ORG/NAME", help="the Hub repository, named after the package with dashes, e.g. my-org/my-kernel")
    parser.add_argument("--version", type=int, default=None, help="kernel major version (default: [general] version of build.toml)")
    parser.add_argument("--branch", default=None, help="branch for the build (default: v<version>, the kernels convention)")
    parser.add_argument("--create-pr", action="store_true", help="open pull requests instead of committing directly")
    parser.add_argument("--dry-run", action="store_true", help="stage and verify, list every file and print the card; upload nothing")
    parser.add_argument("--stage", type=Path, default=None, help="where to stage the repository (default: ./publish/<name>-v<version>)")
    parser.add_argument("--baseline", type=Path, default=None, help="baseline.py (default: <directory>/baseline.py or summary.json's baseline_file)")
    parser.add_argument("--op", default=None, metavar="PKG.FN", help="the function the baseline measures (default: inferred)")
    parser.add_argument("--description", default=None, help="one paragraph for the card (default: the package docstring)")
    parser.add_argument("--private", action="store_true", help="create the repository as private")
    parser.add_argument("--no-build", action="store_true", help="fail instead of building when build/ is missing or not made from these sources")
    parser.add_argument("--tier-evidence", type=Path, action="append", default=[], metavar="FILE",
                        help="a benchmark_cpu.py or check_portability.py --json made elsewhere: evidence for tiers this machine cannot run (checked against each unit's source hash; repeatable)")
    parser.add_argument("--drop-unverified-tiers", action="store_true",
                        help="publish without the tiers nobody ran as they are now (and this machine cannot run): the dispatcher falls back to the best verified tier")
    check = parser.add_argument_group("correctness check", "passed on to scripts/benchmark_cpu.py; use what the trial used")
    check.add_argument("--atol", type=float, default=None, help="widen the absolute tolerance (see benchmark_cpu.py)")
    check.add_argument("--rtol", type=float, default=None, help="widen the relative tolerance (see benchmark_cpu.py)")
    check.add_argument("--accept-if-as-accurate", action="store_true", help="see benchmark_cpu.py")
    check.add_argument("--rounds", type=int, default=None, help="timing rounds of the publish-time measurement")
    add_json_option(parser)
    return parser


def _check_args(args: argparse.Namespace) -> list[str]:
    extra: list[str] = []
    for flag in ("atol", "rtol", "rounds"):
        value = getattr(args, flag)
        if value is not None:
            extra += [f"--{flag}", str(value)]
    if args.accept_if_as_accurate:
        extra.append("--accept-if-as-accurate")
    return extra


def _print_dry_run(report: dict[str, Any]) -> None:
    console.print(f"[bold]Dry run[/bold]: staged {len(report['files'])} files in {report['stage_dir']} (nothing uploaded):")
    for name in report["files"]:
        console.print(f"  {name}")
    console.print(Panel(Markdown(report["card"]), title="README.md (card)", expand=False))
    console.print("To upload, rerun without --dry-run, or by hand:")
    for command in report["manual_commands"]:
        console.print(f"  {command}", soft_wrap=True)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    options = PublishOptions(
        source_dir=args.directory,
        repo_id=args.repo_id,
        version=args.version,
        branch=args.branch,
        create_pr=args.create_pr,
        dry_run=args.dry_run,
        stage=args.stage,
        baseline=args.baseline,
        op=args.op,
        description=args.description,
        private=args.private,
        allow_build=not args.no_build,
        check_args=_check_args(args),
        tier_evidence=args.tier_evidence,
        drop_unverified_tiers=args.drop_unverified_tiers,
    )
    report: dict[str, Any] = {"dry_run": args.dry_run, "uploaded": False, "error": None, "exit_code": 0}
    try:
        publish(options, report, log=lambda line: console.print(line, soft_wrap=True))
    except HarnessError as error:
        report.update(error=error.message, exit_code=int(error.exit_code))
        write_json_report(args.json, _json_view(report))
        raise
    console.print(f"[green]✓[/green] {report['integrity']['line']}", soft_wrap=True)
    for line in report["verification"]["lines"]:
        mark = "[yellow]![/yellow]" if "SKIPPED" in line else "[green]✓[/green]"
        console.print(f"{mark} {line}", soft_wrap=True)
    for note in report.get("notes", []):
        console.print(f"note: {note}", soft_wrap=True)
    if args.dry_run:
        _print_dry_run(report)
    else:
        for commit in report["upload"]["commits"]:
            console.print(f"committed to {commit['branch']}: {commit['pr_url'] or commit['commit_url']}")
        console.print(f"[bold green]Published[/bold green] {report['url']}")
        console.print(
            f'Load it with: get_kernel("{report["repo_id"]}", version={report["version"]}, trust_remote_code=True)'
        )
    write_json_report(args.json, _json_view(report))
    return 0


def _json_view(report: dict[str, Any]) -> dict[str, Any]:
    """The --json payload: every key always present, the card itself left in the stage."""
    keys = (
        "repo_id", "version", "branch", "function", "source_dir", "stage_dir", "baseline", "files",
        "card_path", "verification", "dry_run", "uploaded", "upload", "url", "manual_commands",
        "notes", "error", "exit_code", "integrity", "tiers", "dropped_tiers",
    )  # fmt: skip
    return {key: report.get(key) for key in keys}


if __name__ == "__main__":
    run_main(main)
