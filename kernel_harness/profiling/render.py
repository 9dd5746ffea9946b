"""Human rendering of the ``cpu_profiler.py`` report."""

from __future__ import annotations

from typing import Any

from rich.console import Console


def print_profile(report: dict[str, Any], console: Console) -> None:
    console.print(f"[bold]{report['op']}[/bold] from {report['kernel_package']} "
                  f"(inputs: {report['baseline']}, {report['baseline_source']})", soft_wrap=True)
    perf = report["perf"]
    if perf.get("available") and perf.get("metrics"):
        m = perf["metrics"]

        def pct(v: float | None) -> str:
            return f"{100 * v:.1f}%" if v is not None else "n/a"

        ipc = f"{m['ipc']:.2f}" if m["ipc"] is not None else "n/a"
        console.print(f"perf stat: IPC {ipc}, L1d miss {pct(m['l1d_miss_rate'])}, LLC miss "
                      f"{pct(m['llc_miss_rate'])}, branch miss {pct(m['branch_miss_rate'])}", soft_wrap=True)
        for f in perf.get("findings", []):
            console.print(f"  [bold]{f['finding']}[/bold]: {f['evidence']}", soft_wrap=True)
    else:
        console.print(f"[yellow]perf stat: no counters - {perf['reason']}; showing the roofline profile "
                      "instead.[/yellow]", soft_wrap=True)
    print_hotspots(report.get("hotspots", {}), console)
    rp = report["roofline_profile"]
    lim = rp["limits"]
    console.print(f"Roofline profile ({rp['kind']}, {rp['dtype']}, FLOPs/bytes from {rp['counts_source']}):",
                  soft_wrap=True)
    console.print(f"  time {rp['time_us']:.1f} us on {rp['threads']} threads, {rp['time_1t_us']:.1f} us on 1 thread "
                  f"(scaling {rp['thread_scaling']:.2f}x)", soft_wrap=True)
    console.print(f"  achieved {rp['achieved_gbs']:.2f} GB/s of {lim['bandwidth_gbs']:.1f} "
                  f"({100 * rp['bandwidth_fraction']:.0f}%), {rp['achieved_gflops']:.2f} GFLOP/s of "
                  f"{lim['peak_gflops']:.1f} {lim['peak_source']} ({100 * rp['compute_fraction']:.1f}%)"
                  + (f", the peak of the {lim['tier']} tier the kernel runs" if lim.get("tier") else ""),
                  soft_wrap=True)
    frac = rp["roofline_fraction"]
    console.print(f"  {rp['bound']}-bound: floor {rp['floor_time_us']:.1f} us -> "
                  f"{100 * frac:.0f}% of the roofline" if frac is not None else "  roofline fraction unknown",
                  soft_wrap=True)
    out = rp["output"]
    if out.get("alloc_overhead_us") is not None:
        console.print(f"  output {out['bytes'] / 1024**2:.2f} MiB: allocation + first touch "
                      f"{out['alloc_overhead_us']:.1f} us ({100 * (out['alloc_share'] or 0):.0f}% of the call; "
                      f"{out['alloc_method']})", soft_wrap=True)
    vt = report["vtune"]
    console.print(f"VTune: {vt['note']}", soft_wrap=True)
    if vt.get("report_excerpt"):
        console.print(vt["report_excerpt"], soft_wrap=True)
    console.print("[bold]Next[/bold]:")
    for s in report["suggestions"]:
        console.print(f"  - {s['next_step']}  [dim]({s['why']}; read: {', '.join(s['references'])})[/dim]",
                      soft_wrap=True)
    for note in report["notes"]:
        console.print(f"  [yellow]note[/yellow]: {note}", soft_wrap=True)


def print_hotspots(hotspots: dict[str, Any], console: Console) -> None:
    """One line on where the samples fell, and the spill finding when there is one."""
    if not hotspots.get("available"):
        console.print(f"[yellow]perf record: no samples - {hotspots.get('reason', 'not run')}.[/yellow]",
                      soft_wrap=True)
        return
    hot = hotspots.get("hottest")
    if hot is None:
        console.print(f"perf record ({hotspots['samples']} cpu-clock samples): {hotspots.get('note', '')}",
                      soft_wrap=True)
        return
    spills = hot["stack_vector_share"]
    spill_text = (f"{100 * spills:.0f}% of its samples on vector loads/stores of the stack" if spills is not None
                  else hotspots.get("note", "annotate unavailable"))
    console.print(f"perf record ({hotspots['samples']} cpu-clock samples): hottest kernel function "
                  f"{hot['symbol']} ({100 * hot['share']:.0f}% of the samples), {spill_text}", soft_wrap=True)
    for f in hotspots.get("findings", []):
        console.print(f"  [bold]{f['finding']}[/bold]: {f['evidence']}", soft_wrap=True)
