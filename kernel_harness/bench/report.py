"""The benchmark's output: a rich report for people and a JSON record with stable keys.

Stable JSON keys (``trial_manager.py result --from-json`` reads ``correct``,
``speedup``, ``baseline_us`` and ``kernel_us``): ``correct``, ``failures``,
``baseline_us``, ``kernel_us``, ``speedup``, ``iqr``, ``threads``, ``pinned``,
``tiers``, ``acceptance_rule``, ``aten_ops``, ``versions``, ``machine``; plus
``speedup_ci``, ``speedup_verdict``, ``baseline_cached``, ``tolerances``,
``oracle``, ``delegation``, ``throughput``, ``timing``, ``input_sets``,
``dispatch_violations``, ``dispatch_undecided``, ``notes``, ``crash``; plus (issue 19) ``conditions`` (CPU,
tiers, the tier that ran, threads, pinning, load before/after, ``oversubscribed``,
``omp_wait_policy`` and what the run measured of its machine), ``reliable`` and
``unreliable_reasons``, ``kernel_build`` (the loaded op namespace and its content
id) and ``vs_against`` (``--against``: ratio, interval, verdict).
"""

from __future__ import annotations

import hashlib
import platform
import sys
from typing import Any

from rich.console import Console
from rich.table import Table

from .. import __version__
from ..cpu import cpu_model
from ..portability import record_tier_evidence
from .coverage import baseline_coverage
from .options import DRIFT_NOTE, BenchResult, baseline_drift, spot_speedup
from ..machine import last_level_cache_bytes as llc_bytes

SCHEMA_VERSION = 1


def versions(kernel_version: str | None = None) -> dict[str, Any]:
    import torch

    try:
        import kernels

        kernels_version = getattr(kernels, "__version__", None)
    except ImportError:
        kernels_version = None
    return {"python": platform.python_version(), "torch": torch.__version__,
            "kernels": kernels_version, "kernel_harness": __version__, "kernel": kernel_version}


def machine() -> dict[str, Any]:
    model = cpu_model()
    model = "unknown" if model == "unknown CPU" else model
    try:
        from ..cpu import supported_tiers

        tiers = supported_tiers()
    except ImportError:  # pragma: no cover
        tiers = None
    import os

    return {"cpu_model": model, "logical_cpus": os.cpu_count(), "supported_tiers": tiers,
            "llc_bytes": llc_bytes(), "arch": platform.machine(), "platform": sys.platform}


def _ci(s: Any) -> list[float | None] | None:
    """A Speedup's interval as [low, high], or None without one."""
    if s is None or s.ci_low is None:
        return None
    return [_num(s.ci_low, 4), _num(s.ci_high, 4)]


def _sha256(path: str) -> str | None:
    try:
        with open(path, "rb") as fh:
            return hashlib.sha256(fh.read()).hexdigest()
    except OSError:
        return None


def _num(x: float | None, digits: int = 3) -> float | None:
    return None if x is None else round(float(x), digits)


def to_json(result: BenchResult, *, crash: dict[str, Any] | None = None,
            kernel_version: str | None = None) -> dict[str, Any]:
    o = result.options
    s = result.speedup
    payload: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "baseline_file": str(o.baseline_path),
        # the baseline's content, so a report can be matched with a trial tree's baseline from
        # any directory (baseline_file is the path as given, often relative)
        "baseline_sha256": _sha256(o.baseline_path),
        "kernel_package": o.kernel_spec,
        "op": o.op_path,
        "correct": bool(result.correct) and crash is None,
        "failures": [f.to_dict() for f in result.failures],
        "baseline_us": _num(result.baseline_us),
        "kernel_us": _num(result.kernel_us),
        "speedup": _num(s.value, 4) if s else None,
        "speedup_ci": [_num(s.ci_low, 4), _num(s.ci_high, 4)] if s and s.ci_low is not None else None,
        "speedup_verdict": s.verdict() if s else None,
        "speedup_paired": _num(s.paired, 4) if s and s.paired is not None else None,
        "baseline_cached": result.baseline_cached,
        "baseline_spot_us": _num(result.baseline_spot.median_us) if result.baseline_spot else None,
        # the kernel's median over the rounds timed beside the spot rounds: speedup_spot's denominator
        "kernel_spot_us": _num(result.kernel_spot.median_us) if result.kernel_spot else None,
        "baseline_drift": _num(baseline_drift(result), 4),
        "speedup_spot": _num(spot_speedup(result), 4),
        "speedup_spot_ci": _ci(result.speedup_spot),
        "iqr": {
            "baseline_us": _num(result.baseline.iqr_us) if result.baseline else None,
            "kernel_us": _num(result.kernel.iqr_us) if result.kernel else None,
            "baseline_noisy": result.baseline.noisy if result.baseline else None,
            "kernel_noisy": result.kernel.noisy if result.kernel else None,
        },
        "timing": {
            "baseline": result.baseline.summary() if result.baseline else None,
            "baseline_spot": result.baseline_spot.summary() if result.baseline_spot else None,
            "kernel": result.kernel.summary() if result.kernel else None,
            "calls_per_round": result.calls_per_round,
            "rounds": len(result.kernel.rounds) if result.kernel else o.rounds,
            "speedup_rounds": result.speedup_rounds,
            "processes_per_side": result.timing_processes,
            "cold": o.cold,
            # positions of the inputs read from memory (the baseline's PERSISTENT_INPUTS) and
            # the bytes read to evict them before each call; None: every input fresh from the copy
            "inputs_from_memory": result.inputs_from_memory,
            "verified_timed_calls": result.verified_calls,
            "skipped": result.timing_skipped,
        },
        "threads": result.threads,
        "load_average": result.load_average,
        "pinned": result.pinned,
        "pinned_detail": result.pinned_detail,
        "tiers": result.tiers or None,
        "dispatch_violations": result.dispatch_violations,
        "dispatch_undecided": result.dispatch_undecided,
        "acceptance_rule": result.acceptance_rule,
        "tolerances": result.tolerances,
        "widened": {"atol": o.atol, "rtol": o.rtol} if result.widened else None,
        "oracle": result.oracle or None,
        "would_pass_as_accurate": result.would_pass_as_accurate,
        "aten_ops": result.aten_ops,
        "delegation": bool(result.aten_ops.get("delegates_to_baseline")),
        "throughput": result.throughput or None,
        "input_sets": result.input_sets,
        "notes": result.notes,
        "versions": versions(kernel_version),
        "machine": machine(),
        "crash": crash,
        "conditions": _conditions(result),
        # null when nothing was timed (an incorrect kernel): there is no timing to trust or distrust
        "reliable": bool(result.reliable) if result.kernel is not None else None,
        "unreliable_reasons": list(result.unreliable_reasons),
        "unreliable_advice": result.unreliable_advice,
        "kernel_build": result.kernel_build,
        "vs_against": result.vs_against,
        "against": _against(result),
        "coverage": baseline_coverage(o.baseline_path),  # issue 20: edge cases the checked sets reach
    }
    record_tier_evidence(result, payload)  # "tier_evidence" (issue 24, kernel_harness/portability)
    return payload


def _print_extension(console: Console, ext: dict[str, Any] | None, purpose: str, limit_flag: str) -> None:
    """How many rounds were added until a ratio was precise (against.extend_until_precise), and why it stopped."""
    if not ext or ext["stopped"] == "disabled":
        return
    why = (f"its interval was within +-{100 * ext['precision']:g} %" if ext["stopped"] == "precise"
           else f"{limit_flag} {ext['max_s']:g} s of timing was spent, the interval still "
                f"+-{100 * (ext['half_width'] or 0):.1f} % (a difference smaller than that is not "
                f"resolved: rerun, or raise {limit_flag})")
    console.print(f"  {ext['rounds']} rounds ({ext['added_rounds']} added for {purpose}, "
                  f"{ext['seconds']:.0f} s of timing), stopped because {why}")


def _conditions(result: BenchResult) -> dict[str, Any]:
    conditions = dict(result.conditions)
    conditions.setdefault("threads", result.threads)
    conditions.setdefault("pinned", result.pinned)
    conditions.setdefault("pinned_detail", result.pinned_detail)
    return conditions


def _against(result: BenchResult) -> dict[str, Any] | None:
    """The --against build's own record: its build, times and failures."""
    o = result.options
    if not o.against:
        return None
    return {"spec": o.against, "kernel_build": result.against_build,
            "timing": result.against.summary() if result.against else None,
            "correct": not result.against_failures,
            "failures": [f.to_dict() for f in result.against_failures]}


# --------------------------------------------------------------------------- rich


def print_report(payload: dict[str, Any], console: Console) -> None:
    ok = payload["correct"]
    console.print(f"[bold]benchmark[/bold] {payload['op']} from {payload['kernel_package']} "
                  f"against {payload['baseline_file']}")
    console.print(f"input sets checked: {len(payload['input_sets'])} "
                  f"({', '.join(payload['input_sets'][:4])}{' ...' if len(payload['input_sets']) > 4 else ''})")
    rule = payload["acceptance_rule"]
    tol = "; ".join(f"{k}: {v}" for k, v in payload["tolerances"].items())
    console.print(f"tolerances: {tol or 'n/a'}")
    if payload["widened"]:
        w = payload["widened"]
        console.print(f"[yellow]tolerance widened by the user: --atol {w['atol']} --rtol {w['rtol']}[/yellow]")
    if payload["failures"]:
        table = Table(title="correctness failures", show_lines=True)
        for col in ("check", "input set", "tier", "leaf", "what"):
            table.add_column(col, overflow="fold")
        for f in payload["failures"][:20]:
            table.add_row(f["check"], f["input_set"], f["tier"], f.get("path") or "-",
                          f.get("leaf_message") or f["message"])
        console.print(table)
        diags = sorted({f.get("diagnosis") for f in payload["failures"] if f.get("diagnosis")})
        for d in diags:
            advice = next(f["advice"] for f in payload["failures"] if f.get("diagnosis") == d)
            console.print(f"[bold]diagnosis[/bold] {d}: {advice}")
        if len(payload["failures"]) > 20:
            console.print(f"... and {len(payload['failures']) - 20} more failures (see --json)")
    if payload.get("would_pass_as_accurate"):
        console.print("[yellow]the kernel is as accurate as the baseline against a float64 oracle: "
                      "--oracle fp64 --accept-if-as-accurate would accept it[/yellow]")
    if payload["oracle"]:
        worst: dict[str, dict[str, Any]] = {}
        for leaf in payload["oracle"]:
            cur = worst.get(leaf["path"])
            if cur is None or _as_float(leaf["kernel_error"]) > _as_float(cur["kernel_error"]):
                worst[leaf["path"]] = leaf
        for path, leaf in worst.items():
            console.print(f"oracle fp64 {path}: kernel worst error {leaf['kernel_error']}, baseline's "
                          f"own {leaf['baseline_error']} (as accurate: {leaf['as_accurate']})")
    console.print(("[bold green]correct[/bold green]" if ok else "[bold red]INCORRECT[/bold red]")
                  + f" (acceptance rule: {rule})")
    ops = payload["aten_ops"]
    if ops:
        console.print(f"ops dispatched by the kernel call: {', '.join(ops.get('kernel', [])) or 'none'}")
        if ops.get("delegates_to_baseline"):
            console.print("[bold yellow]delegation:[/bold yellow] the kernel call ran every compute op "
                          "of the baseline; it is not a kernel of its own")
    timing = payload["timing"]
    if timing["skipped"]:
        console.print(f"timing skipped: {timing['skipped']}")
    if payload["kernel_us"] is not None:
        _print_timing(payload, console)
    if payload["tiers"]:
        _print_tiers(payload, console)
    for v in payload["dispatch_violations"]:
        console.print(f"[bold red]dispatch lags:[/bold red] {v}")
    for v in payload["dispatch_undecided"]:
        console.print(f"[yellow]dispatch lag undecided:[/yellow] {v}")
    for note in payload["notes"]:
        console.print(f"note: {note}")
    for warning in (payload.get("coverage") or {}).get("warnings", []):
        console.print(f"[yellow]warning:[/yellow] {warning}")
    print_conditions(payload, console)


def print_conditions(payload: dict[str, Any], console: Console) -> None:
    """One line with every condition the numbers depend on, then the reliability verdict."""
    c = payload.get("conditions") or {}
    build = payload.get("kernel_build") or {}
    parts = [c.get("cpu_model") or "unknown CPU",
             f"tiers {'/'.join(c.get('supported_tiers') or []) or '?'}",
             f"tier ran: {c.get('tier_ran') or 'unknown'}",
             f"{c.get('threads')} thread(s)",
             "pinned" if c.get("pinned") else "NOT pinned",
             f"load {_fmt(c.get('load_before'))} -> {_fmt(c.get('load_after'))}",
             f"OMP_WAIT_POLICY={c.get('omp_wait_policy')}"]
    ratios = c.get("cpu_wall_ratio") or {}
    if ratios:
        parts.append("timing thread on CPU " + ", ".join(
            f"{name} {100 * v:.0f} %" for name, v in ratios.items() if v is not None))
    waits = {name: v for name, v in (c.get("run_queue_wait") or {}).items() if v is not None}
    if waits:
        parts.append("waited for a CPU " + ", ".join(f"{name} {100 * v:.0f} %" for name, v in waits.items()))
    if c.get("run_queue_max") is not None:
        parts.append(f"run queue median {_fmt(c.get('run_queue_median'))} / max {c['run_queue_max']}")
    if c.get("steal_fraction") is not None:
        parts.append(f"steal {100 * c['steal_fraction']:.1f} %")
    if build.get("module"):
        parts.append(f"build {build['module']}")
    console.print("conditions: " + ", ".join(parts))
    if payload.get("kernel_us") is None:
        return
    if payload.get("reliable", True):
        console.print("[green]reliable[/green]: nothing else competed for the CPUs during the rounds")
        return
    console.print("[bold red]UNRELIABLE[/bold red]: " + "; ".join(payload.get("unreliable_reasons") or []))
    if payload.get("unreliable_advice"):
        console.print(f"[bold]what to do[/bold]: {payload['unreliable_advice']}")


def _fmt(value: Any) -> str:
    return "?" if value is None else f"{value:g}"

def _as_float(value: Any) -> float:
    return float(value)  # JSON spells infinities as the strings "inf"/"nan"; float() reads them


def _add_spot_row(table: Table, payload: dict[str, Any]) -> None:
    """The baseline timed now beside its cached value (spot rounds), with the drift."""
    spot, drift = payload["timing"].get("baseline_spot"), payload.get("baseline_drift")
    if spot is None or drift is None:
        return
    colour = "yellow" if abs(drift) > DRIFT_NOTE else "green"
    table.add_row("baseline now", f"{spot['median_us']:.2f}", f"{spot['iqr_us']:.2f}", f"{spot['min_us']:.2f}",
                  str(spot["calls"]), f"[{colour}]spot rounds: {drift * 100:+.1f} % from cached[/{colour}]")


def _from_memory(regime: dict[str, Any] | None) -> str:
    if not regime:
        return ""
    where = ", ".join(str(p) for p in regime["positions"])
    return f"; inputs {where} from memory ({regime['scrub_bytes'] / 2**20:.0f} MiB read between draw and call)"


def _print_timing(payload: dict[str, Any], console: Console) -> None:
    t = payload["timing"]
    table = Table(title=f"timing ({payload['threads']} threads, "
                        f"{'pinned: ' + payload['pinned_detail'] if payload['pinned'] else 'NOT pinned'}, "
                        f"{'cold' if t['cold'] else 'warm'} cache, {t['rounds']} interleaved rounds of "
                        f"{t['calls_per_round']} calls over {t.get('processes_per_side', 1)} worker "
                        f"process(es) per side{' (one baseline worker for the spot rounds)' if t.get('baseline_spot') else ''}"
                        f", fresh inputs per call{_from_memory(t.get('inputs_from_memory'))})")
    for col in ("", "median us", "IQR us", "min us", "calls", "noise"):
        table.add_column(col)
    for name in ("baseline", "kernel"):
        s = t[name]
        if s is None:
            if name == "baseline" and payload["baseline_cached"]:
                table.add_row(name, f"{payload['baseline_us']:.2f}", "-", "-", "-", "cached (--baseline-us)")
                _add_spot_row(table, payload)
            continue
        noise = "[yellow]noisy: IQR > 10 % of median[/yellow]" if s["noisy"] else "ok"
        table.add_row(name, f"{s['median_us']:.2f}", f"{s['iqr_us']:.2f}", f"{s['min_us']:.2f}",
                      str(s["calls"]), noise)
    console.print(table)
    ci = payload["speedup_ci"]
    verdict = payload["speedup_verdict"]
    line = f"speedup {payload['speedup']:.3f}x"
    if ci:
        line += f" (95 % CI {ci[0]:.3f}-{ci[1]:.3f}): {verdict}"
    else:
        line += f" ({verdict})"
    console.print(f"[bold]{line}[/bold]")
    if payload.get("speedup_spot") is not None:
        spot_ci = payload.get("speedup_spot_ci")
        spot_range = f" (95 % CI {spot_ci[0]:.3f}-{spot_ci[1]:.3f})" if spot_ci else ""
        console.print(f"side by side with this run's baseline spot rounds: {payload['speedup_spot']:.3f}x"
                      f"{spot_range} (what the trial tree ranks trials by)")
    _print_extension(console, t.get("speedup_rounds"), "--speedup-precision", "--speedup-max-s")
    console.print(f"verified {t['verified_timed_calls']} randomly chosen timed calls")
    vs = payload.get("vs_against")
    if vs:
        ci = vs.get("ci")
        interval = f" (95 % CI {ci[0]:.3f}-{ci[1]:.3f})" if ci else ""
        console.print(f"[bold]side by side with --against {vs['against']}: {vs['ratio']:.3f}x{interval}: "
                      f"{vs['verdict']}[/bold] (against {vs['against_us']:.2f} us, candidate "
                      f"{vs['candidate_us']:.2f} us; > 1 means the candidate is faster)")
        _print_extension(console, vs.get("rounds"), "the comparison", "--against-max-s")
    tp = payload["throughput"]
    if tp:
        parts = []
        if tp.get("gbps"):
            frac = f" ({100 * tp['bandwidth_fraction']:.0f} % of measured {tp['bandwidth_gbps']:.1f} GB/s)" \
                if tp.get("bandwidth_fraction") else ""
            parts.append(f"{tp['gbps']:.2f} GB/s{frac} [{tp['bytes_source']}]")
        if tp.get("gflops"):
            source = f", {tp['peak_source']}" if tp.get("peak_source") else ""
            frac = f" ({100 * tp['peak_fraction']:.1f} % of peak {tp['peak_gflops']:.0f}{source})" \
                if tp.get("peak_fraction") else ""
            parts.append(f"{tp['gflops']:.2f} GFLOP/s{frac}")
        if parts:
            console.print("kernel achieves " + ", ".join(parts))
        if not tp.get("bandwidth_gbps"):
            console.print(tp.get("machine_limits", "machine limits unknown"))


def _print_tiers(payload: dict[str, Any], console: Console) -> None:
    tiers = payload["tiers"]
    table = Table(title=f"tiers (fastest first; <-- = the dispatcher's pick; tolerance "
                        f"{tiers['tolerance_pct']:g} %)")
    for col in ("input set", "tier", "median us", "IQR us", "GB/s", ""):
        table.add_column(col, overflow="fold")
    for entry in tiers["by_input_set"]:
        for i, row in enumerate(entry["rows"]):
            table.add_row(entry["input_set"] if i == 0 else "", row["tier"], f"{row['median_us']:.2f}",
                          f"{row['iqr_us']:.2f}", f"{row['gbps']:.2f}" if row["gbps"] else "-",
                          "<--" if row["dispatched"] else "")
    console.print(table)
