"""Pictures of a trial tree: a rich tree for the terminal and a PNG for people.

The PNG lays trials out by depth (x) and order (y) so a branch back to the
best trial is visible at a glance; every node shows its id and speedup.
"""

from __future__ import annotations

from pathlib import Path

from rich.markup import escape
from rich.tree import Tree

from . import decisions
from .conditions import conditions_of
from .insights import TreeInsights
from .model import TreeState, Trial


def interval_label(trial: Trial) -> str:
    """' [6.80-10.40x]': the interval the trial is ranked by (the spot ratio's for a
    cached-baseline result, see decisions.estimate), else ''."""
    value = decisions.estimate(trial)
    ci = value.interval if value is not None else None
    return f" [{ci[0]:.2f}-{ci[1]:.2f}x]" if ci else ""


def describe_result(trial: Trial) -> str:
    result = trial.result
    if result is None:
        return "[dim]no result yet[/dim]"
    if not result.correct:
        return "[red]incorrect[/red]"
    timing = ""
    if result.speedup is not None:
        timing = (f" {result.speedup_label()}{interval_label(trial)} "
                  f"({result.baseline_us:.1f} us -> {result.kernel_us:.1f} us)")
    unreliable = " [bold red]UNRELIABLE (accepted)[/bold red]" if result.accepted_unreliable else ""
    return f"[green]correct[/green]{timing}{unreliable}"


def decision_lines(trial: Trial, insights: TreeInsights) -> list[str]:
    """What status says under a trial: its conditions, its verdict against the parent, and
    whether it was measured under other conditions than the parent."""
    lines = []
    label = conditions_of(trial.result).label() if trial.result else ""
    if label:
        lines.append(f"[dim]measured: {escape(label)}[/dim]")
    comparison = insights.vs_parent.get(trial.id)
    if comparison is not None:
        colour = {"faster": "green", "slower": "red"}.get(comparison.verdict, "yellow")
        lines.append(f"[{colour}]vs parent {comparison.earlier}: {comparison.verdict}[/{colour}] "
                     f"[dim]({escape(comparison.basis)})[/dim]")
    changed = insights.condition_changes.get(trial.id)
    if changed:
        lines.append(f"[bold yellow]other conditions than its parent: {escape('; '.join(changed))}[/bold yellow]")
    return lines


def rich_tree(state: TreeState, insights: TreeInsights) -> Tree:
    root = Tree(f"[bold]{state.name}[/bold]  baseline: {state.baseline.path}")
    nodes: dict[str | None, Tree] = {None: root}
    best_id = insights.best.id if insights.best else None
    for trial in state.trials:
        marker = " [bold yellow]<- best[/bold yellow]" if trial.id == best_id else ""
        label = "\n".join([f"[bold]{trial.id}[/bold] {describe_result(trial)}{marker}",
                           f"[dim]{escape(trial.strategy)}[/dim]", *decision_lines(trial, insights)])
        nodes[trial.id] = nodes[trial.parent].add(label)
    return root


def png_node(trial: Trial, insights: TreeInsights) -> tuple[str, str, bool]:
    """A trial's box in the PNG: fill colour, text, and whether it is flagged (measured
    under other conditions than its parent, or an accepted unreliable run)."""
    result = trial.result
    best_id = insights.best.id if insights.best else None
    if result is None:
        colour, text = "#dddddd", f"{trial.id}: no result"
    elif not result.correct:
        colour, text = "#f4a6a6", f"{trial.id}: incorrect"
    else:
        colour = "#ffd54f" if trial.id == best_id else "#a5d6a7"
        text = (f"{trial.id}: {result.speedup_label()}{interval_label(trial)}" if result.speedup
                else f"{trial.id}: correct")
    strategy = trial.strategy if len(trial.strategy) <= 38 else trial.strategy[:35] + "..."
    flags = []
    if trial.id in insights.condition_changes:
        flags.append("(!) other conditions than parent: " + "; ".join(insights.condition_changes[trial.id])[:60])
    if result is not None and result.accepted_unreliable:
        flags.append("(!) unreliable run (accepted)")
    return colour, "\n".join([text, strategy, *flags]), bool(flags)


def _layout(state: TreeState) -> dict[str, tuple[float, float]]:
    depth: dict[str, int] = {}
    for trial in state.trials:
        depth[trial.id] = 0 if trial.parent is None else depth[trial.parent] + 1
    return {t.id: (float(depth[t.id]), -float(t.number)) for t in state.trials}


def save_tree_png(state: TreeState, insights: TreeInsights, path: Path) -> Path:
    """Draw the tree with each trial's speedup; the best trial is highlighted."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    positions = _layout(state)
    width = 3 + 2.6 * (max((x for x, _ in positions.values()), default=0) + 1)
    height = 1.5 + 0.9 * max(len(state.trials), 1)  # room for a flag line under a box
    fig, ax = plt.subplots(figsize=(width, height))
    for trial in state.trials:
        if trial.parent is not None:
            (x0, y0), (x1, y1) = positions[trial.parent], positions[trial.id]
            ax.plot([x0, x0, x1], [y0, y1, y1], color="#999999", linewidth=1, zorder=1)
    for trial in state.trials:
        x, y = positions[trial.id]
        colour, text, flagged = png_node(trial, insights)
        edge = "#d35400" if flagged else "#555555"
        ax.annotate(
            text,
            (x, y),
            ha="left",
            va="center",
            fontsize=8,
            bbox={"boxstyle": "round,pad=0.3", "facecolor": colour, "edgecolor": edge,
                  "linestyle": "--" if flagged else "-"},
            zorder=2,
        )
    ax.set_xlim(-0.3, width / 2.6)
    ax.set_ylim(-len(state.trials) - 0.4, 0.8)
    ax.axis("off")
    title = f"Trial tree {state.name}"
    if insights.best is not None:
        title += f"  (best {insights.best.id}: {insights.best.result.speedup_label()})"
    ax.set_title(title)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path
