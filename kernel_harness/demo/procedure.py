"""The demo: SKILL.md's procedure, step by step, on one shipped example.

It drives only the public commands (the scripts and the configured build and
install commands) so it proves the documented path works, and it records
real, different trials: the recipe shipped next to the example changes one
knob of the AVX512 unit per trial.
"""

from __future__ import annotations

import json
import shlex
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.rule import Rule
from rich.table import Table

from ..config import Config, load_config
from ..errors import UsageError
from ..paths import EXAMPLES_DIR
from ..trials.model import side_by_side, speedup_label
from .recipe import Recipe, apply_defines, load_recipe
from .runner import DemoRunner

EXAMPLE_OPS = ("rms_norm", "silu_and_mul", "softmax", "linear")


@dataclass
class DemoContext:
    recipe: Recipe
    config: Config
    runner: DemoRunner
    workspace: Path
    baseline: Path
    pin: list[str]

    @property
    def kernel_dir(self) -> Path:
        return self.workspace / "kernel"

    @property
    def op_path(self) -> str:
        return f"{self.recipe.package}.{self.recipe.function}"

    def script(self, name: str, *args: Any) -> list[str]:
        return self.runner.script(name, *args)

    def json_path(self, stem: str) -> Path:
        return self.runner.log_dir / f"{stem}.json"


def _pin_prefix(console: Console) -> list[str]:
    if shutil.which("numactl"):
        return ["numactl", "--cpunodebind=0", "--membind=0"]
    console.print("[yellow]numactl is not installed: the 'pinned' runs below are not pinned.[/yellow]")
    return []


def _heading(ctx: DemoContext, text: str) -> None:
    ctx.runner.console.print(Rule(f"[bold]{text}"))


def _build_and_install(ctx: DemoContext, kernel_dir: Path, label: str) -> None:
    ctx.runner.run(f"{label}: validate", ctx.script("validate_cpu_kernel", kernel_dir))
    ctx.runner.run(f"{label}: build", ctx.config.build_command, cwd=kernel_dir, shell=True)
    ctx.runner.run(f"{label}: install", ctx.config.install_command, cwd=kernel_dir, shell=True)


def _benchmark(ctx: DemoContext, label: str, stem: str, *extra: Any, pinned: bool = True,
               baseline: Path | None = None) -> dict[str, Any]:
    argv = ctx.script("benchmark_cpu", baseline or ctx.baseline, "--kernel-package", ctx.recipe.package,
                      "--op", ctx.op_path, *map(str, extra))
    prefix = ctx.pin if pinned else []
    report = ctx.runner.run_json(label, [*prefix, *argv], ctx.json_path(stem))
    ctx.runner.console.print(f"      {_verdict(report)}")
    return report


def _verdict(report: dict[str, Any]) -> str:
    """One line of a benchmark report: correctness, speedup with its interval, pinning."""
    if not report.get("correct"):
        return "[red]incorrect[/red]"
    parts = ["[green]correct[/green]"]
    if report.get("speedup"):
        interval = report.get("speedup_ci") or []
        ci = f" [{interval[0]:.2f}, {interval[1]:.2f}]" if len(interval) == 2 else ""
        parts.append(f"{report['speedup']:.2f}x{ci} ({report['baseline_us']:.0f} us -> {report['kernel_us']:.0f} us)")
    parts.append("pinned" if report.get("pinned") else "unpinned")
    if report.get("baseline_cached"):
        drift = report.get("baseline_drift")
        parts.append("cached baseline" + (f" (now {drift * 100:+.0f} %)" if drift is not None else ""))
        if report.get("speedup_spot"):
            parts.append(f"{report['speedup_spot']:.2f}x side by side")
    return ", ".join(parts)


def _trial_manager(ctx: DemoContext, label: str, *args: Any) -> str:
    return ctx.runner.run(label, ctx.script("trial_manager", *args)).stdout.strip()


def _save_and_record(ctx: DemoContext, trial_label: str, strategy: str, parent: str | None, report: Path) -> str:
    name = ctx.recipe.package
    args = ["save", name, ctx.kernel_dir, "--strategy", strategy, "--json", ctx.json_path(f"save-{trial_label}")]
    if parent is not None:
        args += ["--parent", parent]
    _trial_manager(ctx, f"{trial_label}: save", *args)
    trial_id = json.loads(ctx.json_path(f"save-{trial_label}").read_text())["trial_id"]
    _trial_manager(ctx, f"{trial_id}: record result", "result", name, trial_id, "--from-json", report,
                   *_unreliable_flag(ctx, report))
    return trial_id


def _unreliable_flag(ctx: DemoContext, report: Path) -> list[str]:
    """``--accept-unreliable`` when the benchmark said its machine was too busy to trust.

    The demo goes on on a busy machine, but the measurement is recorded as
    unreliable (the tree and the summary show it) and the reason is printed:
    labelled, never silently ranked.
    """
    measured = json.loads(Path(report).read_text())
    if measured.get("reliable") is not False:
        return []
    reasons = "; ".join(measured.get("unreliable_reasons") or []) or "the benchmark marked it unreliable"
    ctx.runner.console.print(f"      [yellow]unreliable measurement, recorded as such: {escape(reasons)}[/yellow]")
    return ["--accept-unreliable"]


def _correctness_phase(ctx: DemoContext) -> None:
    name, recipe = ctx.recipe.package, ctx.recipe
    _heading(ctx, "Steps 1-3: configuration, analysis, trial tree")
    ctx.runner.run("read the configuration", ctx.script("config", "--json", ctx.json_path("config")))
    ctx.runner.run("analyse the op", ctx.script("analyze_op", "--op", recipe.op, "--shapes", recipe.shapes,
                                                "--dtype", recipe.dtype, "--file", ctx.baseline,
                                                "--json", ctx.json_path("analysis")))
    analysis = json.loads(ctx.json_path("analysis").read_text())
    ctx.runner.console.print(f"  kernel kind: [bold]{analysis.get('kind')}[/bold]")
    _trial_manager(ctx, "init the trial tree", "init", name, ctx.baseline)

    _heading(ctx, "Steps 4-6: scaffold, validate, build, install, check the generic tier")
    ctx.runner.run("scaffold the kernel", ctx.script("new_kernel", "--op", recipe.op, "--name", name,
                                                     "--dir", ctx.kernel_dir))
    apply_defines(recipe.source_path(ctx.kernel_dir), recipe.initial_defines)
    _build_and_install(ctx, ctx.kernel_dir, "t0")
    _benchmark(ctx, "benchmark the generic tier", "bench-generic", "--tier", "generic", pinned=False)

    _heading(ctx, "Step 7: the SIMD tiers, every tier this CPU runs checked, trial t0")
    _benchmark(ctx, "check and time every tier", "bench-tiers", "--tier", "all", pinned=False)
    report = ctx.json_path("bench-t0")
    _benchmark(ctx, "benchmark t0", "bench-t0", pinned=False)
    _save_and_record(ctx, "t0", recipe.initial_strategy, None, report)


def _performance_phase(ctx: DemoContext) -> None:
    name = ctx.recipe.package
    _heading(ctx, "Steps 8-9: pinned measurement and profile")
    baseline_us = _trial_manager(ctx, "cached baseline time", "baseline-us", name)
    ctx.runner.run("profile t0", ctx.script("cpu_profiler", "--kernel-package", name, "--op", ctx.op_path,
                                            "--baseline", ctx.baseline, "--json", ctx.json_path("profile-t0")))
    _heading(ctx, f"Step 10: {len(ctx.recipe.trials)} trials from the recipe, one change each")
    for index, trial in enumerate(ctx.recipe.trials, start=1):
        label = f"trial {index}"
        parent = _trial_manager(ctx, f"{label}: choose parent", "best", name) if trial.parent == "best" else trial.parent
        # branch from the parent: its saved sources back into the kernel directory
        _trial_manager(ctx, f"{label}: check out {parent}", "checkout", name, parent, ctx.kernel_dir)
        apply_defines(ctx.recipe.source_path(ctx.kernel_dir), trial.defines)
        ctx.runner.console.print(f"  [bold]{label}[/bold] from {parent}: {escape(trial.strategy)}")
        _build_and_install(ctx, ctx.kernel_dir, label)
        report = ctx.json_path(f"bench-{label.replace(' ', '')}")
        _benchmark(ctx, f"{label}: pinned benchmark", report.stem, "--baseline-us", baseline_us)
        _save_and_record(ctx, label.replace(" ", ""), trial.strategy, parent, report)
        status = _status(ctx)
        if status["early_stop"]:
            ctx.runner.console.print("[bold green]early stop fired[/bold green]")
            break
        if status["trials_used"] >= (status["max_trials"] or 10**9):
            break


def _status(ctx: DemoContext) -> dict[str, Any]:
    path = ctx.json_path("status")
    ctx.runner.run("trial tree status", ctx.script("trial_manager", "status", ctx.recipe.package, "--json", path))
    return json.loads(path.read_text())


def _finalize(ctx: DemoContext) -> dict[str, Any]:
    name = ctx.recipe.package
    _heading(ctx, "Step 11: finalize, rebuild the best trial, final pinned measurement")
    output = ctx.workspace / "output"
    _trial_manager(ctx, "finalize the best trial", "finalize", name, output, "--json", ctx.json_path("finalize"))
    _build_and_install(ctx, output, "finalized kernel")
    final = _benchmark(ctx, "final pinned benchmark", "bench-final")
    # step 11's "recorded": the final run goes into summary.json / summary.md
    _trial_manager(ctx, "record the final measurement", "finalize", name, output,
                   "--final-json", ctx.json_path("bench-final"), "--json", ctx.json_path("finalize-final"),
                   *_unreliable_flag(ctx, ctx.json_path("bench-final")))
    if ctx.recipe.large_baseline:
        _benchmark(ctx, "final pinned benchmark, large shape", "bench-final-large",
                   baseline=EXAMPLES_DIR / ctx.recipe.op / ctx.recipe.large_baseline)
    return final


def _summary_table(ctx: DemoContext, status: dict[str, Any], final: dict[str, Any]) -> None:
    table = Table(title=f"Trials of {ctx.recipe.package}")
    for column in ("trial", "parent", "strategy", "correct", "speedup", "kernel us"):
        table.add_column(column)
    for trial in status["trials"]:
        result = trial["result"] or {}
        best = " (best)" if trial["id"] == status["best_trial"] else ""
        table.add_row(trial["id"] + best, trial["parent"] or "-", escape(trial["strategy"]),
                      {True: "yes", False: "no"}.get(result.get("correct"), "-"),
                      speedup_label(result.get("speedup"), side_by_side(result.get("details") or {}, result.get("speedup"))),
                      f"{result['kernel_us']:.1f}" if result.get("kernel_us") else "-")
    console = ctx.runner.console
    console.print(table)
    console.print(
        f"Final pinned measurement of the finalized kernel: {final.get('speedup', 0):.2f}x "
        f"({final.get('baseline_us', 0):.1f} us -> {final.get('kernel_us', 0):.1f} us), correct: {final.get('correct')}"
    )
    console.print(f"Picture of the tree: {ctx.workspace / 'output' / 'trial_tree.png'}")


def run_demo(op: str, workspace: Path, console: Console) -> int:
    if op not in EXAMPLE_OPS:
        raise UsageError(f"No demo for op {op!r}; choose one of {', '.join(EXAMPLE_OPS)}.")
    recipe = load_recipe(EXAMPLES_DIR / op / "recipe.yaml")
    config = load_config()
    if workspace.exists():
        shutil.rmtree(workspace)
    workspace.mkdir(parents=True)
    runner = DemoRunner(workspace=workspace, console=console)
    ctx = DemoContext(recipe=recipe, config=config, runner=runner, workspace=workspace,
                      baseline=EXAMPLES_DIR / op / "baseline.py", pin=_pin_prefix(console))
    console.print(Rule(f"[bold]make demo: {op} ({recipe.dtype}, {recipe.shapes}) in {workspace}"))
    console.print(f"pinned runs use: {shlex.join(ctx.pin) or '(unpinned)'}")
    console.print(f"the trials edit the {recipe.tier} unit ({recipe.source_path(Path(recipe.package))}): the widest "
                  "tier this machine runs, so every knob changes code that executes here")
    _correctness_phase(ctx)
    _performance_phase(ctx)
    final = _finalize(ctx)
    _summary_table(ctx, _status(ctx), final)
    total = sum(step.seconds for step in runner.steps)
    console.print(f"[bold green]demo complete[/bold green] in {total / 60:.1f} min; logs in {runner.log_dir}")
    return 0
