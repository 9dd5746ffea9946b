"""Record every kernel attempt in a trial tree under ./trials/<name>/ (procedure steps 3, 7, 10, 11)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

import _bootstrap  # noqa: F401  (makes kernel_harness importable from any directory)
from rich.table import Table

from kernel_harness.cli import add_json_option, console, err_console, run_main, write_json_report
from kernel_harness.trials import commands
from kernel_harness.trials.render import rich_tree


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="Manage the trial tree of a kernel. NAME is a label (e.g. my_rmsnorm), one "
        "directory name under ./trials/, never a path."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("init", help="start a tree and record the baseline file")
    p.add_argument("name")
    p.add_argument("baseline_file", type=Path)
    p.add_argument("--force", action="store_true", help="archive an existing tree of this name and start again")

    p = sub.add_parser("save", help="copy a kernel directory's sources into a new trial")
    p.add_argument("name")
    p.add_argument("kernel_dir", type=Path)
    p.add_argument("--parent", help="the trial this one changes (default: the latest trial)")
    p.add_argument("--strategy", required=True, help="what this trial changed, and why")

    p = sub.add_parser("result", help="record a trial's correctness and timings")
    p.add_argument("name")
    p.add_argument("trial_id")
    p.add_argument("--correctness", choices=["pass", "fail"])
    p.add_argument("--speedup", type=float)
    p.add_argument("--baseline_us", type=float)
    p.add_argument("--kernel_us", type=float)
    p.add_argument("--from-json", dest="from_json", type=Path, metavar="FILE",
                   help="read correctness and timings from benchmark_cpu.py --json output")
    p.add_argument("--force", action="store_true",
                   help="replace an existing result, e.g. after re-measuring (the old one is kept in the trial's history)")
    p.add_argument("--accept-unreliable", dest="accept_unreliable", action="store_true",
                   help="record a benchmark JSON that says reliable: false (recorded on the trial, shown by status)")

    for command, text in [
        ("status", "show the tree, the best trial and what to do next"),
        ("best", "print the id of the best correct trial (displaced only by a measurably faster one)"),
    ]:
        p = sub.add_parser(command, help=text)
        p.add_argument("name")

    p = sub.add_parser("baseline-us", help="print the baseline time later benchmark runs pass as --baseline-us")
    p.add_argument("name")
    p.add_argument("--refresh", action="store_true",
                   help="time the baseline again (under numactl --cpunodebind=0 --membind=0 when available) "
                        "and make that the cached value; earlier values are kept in history")
    p.add_argument("--threads", type=int, help="with --refresh: threads for the baseline (default: torch's, "
                                               "as benchmark_cpu.py; pass the --threads your runs use)")
    p.add_argument("--rounds", type=int, help="with --refresh: timing rounds (default 10)")

    p = sub.add_parser("checkout", help="write a trial's saved sources into a kernel directory (branch back)")
    p.add_argument("name")
    p.add_argument("trial_id")
    p.add_argument("kernel_dir", type=Path)
    p.add_argument("--force", action="store_true",
                   help="overwrite unsaved work there, after copying it to trials/NAME/.stash/<timestamp>/")

    p = sub.add_parser("finalize", help="copy the best correct trial and a summary to OUTPUT_DIR")
    p.add_argument("name")
    p.add_argument("output_dir", type=Path)
    p.add_argument("--final-json", dest="final_json", type=Path, metavar="FILE",
                   help="record the final benchmark of the finalized build (benchmark_cpu.py --json, run "
                        "without --baseline-us) in summary.json and summary.md")
    p.add_argument("--accept-unreliable", dest="accept_unreliable", action="store_true",
                   help="with --final-json: record a final run that says reliable: false")

    for subparser in sub.choices.values():
        add_json_option(subparser)
    return parser


def _print_warnings(payload: dict) -> None:
    for warning in payload.get("warnings", []):
        err_console.print(f"[bold yellow]warning:[/bold yellow] {warning}", soft_wrap=True)


def _show_status(payload: dict, state, insights) -> None:
    console.print(rich_tree(state, insights))
    table = Table(show_header=False, box=None)
    limit = payload["max_trials"] if payload["max_trials"] is not None else "?"
    table.add_row("trials used", f"{payload['trials_used']} / {limit}")
    table.add_row("best", payload["best_trial"] or "none yet")
    table.add_row("early stop", "fired" if payload["early_stop"] else "not reached")
    table.add_row("plateau", "yes" if payload["plateau"] else "no")
    table.add_row("noise threshold", f"{payload['noise_threshold']:.0%}")
    console.print(table)
    for line in payload["notes"]:
        console.print(f"[bold yellow]note:[/bold yellow] {line}", soft_wrap=True)
    for line in payload["advice"]:
        console.print(f"[bold]next:[/bold] {line}", soft_wrap=True)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "init":
        payload = commands.init(args.name, args.baseline_file, force=args.force)
        if payload["archived_previous"]:
            console.print(f"Archived the previous tree to {payload['archived_previous']}")
        console.print(f"Initialised {payload['directory']} (baseline sha256 {payload['baseline']['sha256'][:12]})")
    elif args.command == "save":
        payload = commands.save(args.name, args.kernel_dir, strategy=args.strategy, parent=args.parent)
        parent = payload["parent"] or "none (root)"
        console.print(f"Saved trial [bold]{payload['trial_id']}[/bold] (parent {parent}, {len(payload['files'])} files)")
        console.print(payload["trial_id"])
    elif args.command == "result":
        payload = commands.result(
            args.name, args.trial_id, correctness=args.correctness, speedup=args.speedup,
            baseline_us=args.baseline_us, kernel_us=args.kernel_us, from_json=args.from_json, force=args.force,
            accept_unreliable=args.accept_unreliable,
        )
        recorded = payload["result"]
        verdict = "pass" if recorded["correct"] else "fail"
        speed = f", {recorded['speedup']:.3f}x" if recorded["speedup"] else ""
        ci = payload["conditions"]["speedup_ci"]
        speed += f" (interval {ci[0]:.2f}-{ci[1]:.2f}x)" if ci and recorded["speedup"] else ""
        unreliable = ", UNRELIABLE (accepted)" if recorded["accepted_unreliable"] else ""
        console.print(f"Recorded {payload['trial_id']}: {verdict}{speed}{unreliable}")
    elif args.command == "best":
        payload = commands.best(args.name)
        console.print(payload["best_trial"])
    elif args.command == "baseline-us":
        payload = commands.baseline_us(args.name, refresh_timing=args.refresh, threads=args.threads,
                                       rounds=args.rounds)
        if args.refresh:
            before = payload["previous_baseline_us"]
            was = f" (was {before:.3f} us)" if before else ""
            cond = payload["conditions"]
            err_console.print(f"Re-timed the baseline: {payload['baseline_us']:.3f} us{was}; "
                              f"{cond.get('threads')} threads, {'pinned' if cond.get('pinned') else 'unpinned'}, "
                              f"load {cond.get('load_before')}-{cond.get('load_after')}", soft_wrap=True)
        console.print(f"{payload['baseline_us']:.3f}")
    elif args.command == "status":
        payload, state, insights = commands.status(args.name)
        _show_status(payload, state, insights)
    elif args.command == "checkout":
        payload = commands.checkout(args.name, args.trial_id, args.kernel_dir, force=args.force)
        if payload["stashed_to"]:
            console.print(f"Kept the directory's previous sources in {payload['stashed_to']}")
        removed = f", removed {len(payload['removed'])} file(s) it does not have" if payload["removed"] else ""
        console.print(f"Checked out {payload['trial_id']} into {payload['directory']} "
                      f"({len(payload['files'])} files{removed}); rebuild and reinstall it before benchmarking.")
    else:
        payload = commands.finalize(args.name, args.output_dir, final_json=args.final_json,
                                    accept_unreliable=args.accept_unreliable)
        console.print(
            f"Finalized {payload['best_trial']} ({payload['speedup']:.2f}x) into {payload['output_dir']}"
        )
        final = payload["final"]
        if final is not None and args.final_json is not None:
            ci = final["speedup_ci"]
            console.print(f"Recorded the final measurement: correct, {final['speedup']:.2f}x"
                          + (f" (interval {ci[0]:.2f}-{ci[1]:.2f}x)" if ci else ""))
    _print_warnings(payload)
    write_json_report(args.json, payload)
    return 0


if __name__ == "__main__":
    run_main(main)
