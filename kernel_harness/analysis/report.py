"""Assemble and print the ``analyze_op.py`` report (JSON keys: ``docs/analysis.md``)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from ..machine import MachineProfile
from ..portability.host import widest_tier
from .names import NameMatch, classify_name
from .roofline import choose_limits, roofline, working_set
from .shapes import DTYPE_BYTES, ShapeCost, formula_cost, scaled_trace_cost, shape_str
from .strategy import check_reference_ids, gemm_path, simd_strategy
from .trace import BaselineTrace, TraceError, trace_baseline

SCHEMA_VERSION = 1


def machine_summary(machine: MachineProfile) -> dict[str, Any]:
    bw = machine.bandwidth
    return {
        "cpu_model": machine.cpu_model,
        "cache_key": machine.cache_key,
        "logical_cpus": machine.logical_cpus,
        "physical_cores": machine.physical_cores,
        "flags": list(machine.flags),
        "peak_gflops": {name: {"single_thread": p.single_thread_gflops, "all_threads": p.all_threads_gflops}
                        for name, p in machine.peaks.items()},
        "bandwidth_gbs": {"read": bw.read_gbs, "copy_prealloc": bw.copy_prealloc_gbs, "copy_fresh": bw.copy_fresh_gbs,
                          "read_1t": bw.read_gbs_1t, "copy_prealloc_1t": bw.copy_prealloc_gbs_1t,
                          "copy_fresh_1t": bw.copy_fresh_gbs_1t},
        # which reader gave "read" and "read_1t" (the faster of torch's sum and the lockstep read)
        "read_bandwidth_reader": {"all_threads": bw.read_reader, "single_thread": bw.read_reader_1t},
        "caches": {"l1d_bytes": machine.cache_bytes(1), "l2_bytes": machine.cache_bytes(2),
                   "l3_bytes": machine.cache_bytes(3)},
        "quick_probe": machine.quick,
    }


def _shape_row(shape: tuple[int, ...], cost: ShapeCost, *, kind: str, dtype: str, source: str,
               machine: MachineProfile) -> dict[str, Any]:
    m = cost.gemm_mnk[0] if cost.gemm_mnk else None
    # the roofline of the kernel to write: its compute ceiling is the peak of the tier
    # the generated dispatcher runs here (AVX2 on a CPU without AVX512 F/BW/VL/DQ)
    limits = choose_limits(machine, kind=kind, dtype=dtype, m=m, tier=widest_tier(machine.has_flag))
    roof = roofline(cost.flops, cost.input_bytes, cost.output_bytes, limits)
    row_bytes = cost.row_len * DTYPE_BYTES[dtype] if kind in ("elementwise", "reduction") else None
    return {
        "shape": shape_str(shape),
        "dims": list(shape),
        "dtype": dtype,
        "source": source,
        "model": cost.description,
        "rows": cost.rows,
        "row_len": cost.row_len,
        "gemm_mnk": list(cost.gemm_mnk) if cost.gemm_mnk else None,
        "flops": int(cost.flops),
        "input_bytes": cost.input_bytes,
        "output_bytes": cost.output_bytes,
        "min_bytes": cost.input_bytes + cost.output_bytes,
        "arithmetic_intensity": roof.arithmetic_intensity if math.isfinite(roof.arithmetic_intensity) else None,
        "roofline": roof.to_dict(),
        "bound": roof.bound,
        "floor_time_us": round(roof.floor_time_us, 4),
        "working_set": working_set(cost.input_bytes + cost.output_bytes, row_bytes, machine),
        "gemm_path": gemm_path(dtype, m, machine)[0] if kind in ("gemm", "attention") else None,
    }


def _one_query(trace: BaselineTrace) -> bool:
    """Whether the traced attention has one query row (decode): its KV cache then persists."""
    attn = [op for op in trace.ops if op.category == "attention" and op.shapes]
    return bool(attn) and len(attn[0].shapes[0]) >= 2 and attn[0].shapes[0][-2] == 1


def analyze_op(name: str, *, shapes: list[tuple[int, ...]] | None, dtype: str | None,
               baseline: Path | None, machine: MachineProfile) -> dict[str, Any]:
    """The whole analysis as a JSON-ready dict."""
    match: NameMatch = classify_name(name)
    notes: list[str] = []
    trace: BaselineTrace | None = None
    trace_error: str | None = None
    if baseline is not None:
        try:
            trace = trace_baseline(baseline, dtype=dtype)
        except TraceError as exc:
            trace_error = str(exc)
            notes.append(
                f"could not trace {baseline} under fake tensors ({exc}); the analysis below is by name only"
            )
    if trace is not None:
        kind, kind_source = trace.kind, "baseline"
        if match.recognised and match.kind != trace.kind:
            notes.append(f"the name suggests {match.kind} but the baseline traces as {trace.kind}; "
                         "the baseline wins")
    else:
        kind, kind_source = match.kind, "name"
        if not match.recognised:
            notes.append(match.note)
    decode = "decode" in name.lower() or (trace is not None and kind == "attention" and _one_query(trace))
    if trace is not None and (kind == "gemm" or (kind == "attention" and decode)) and not trace.model_weights \
            and not trace.persistent_inputs:
        what, example = (("KV cache", "(1, 2) for k_cache and v_cache") if kind == "attention"
                         else ("weight", "(1, 2) for a weight and its bias"))
        notes.append(f"{baseline} names no PERSISTENT_INPUTS: the benchmark will hand each timed call its {what} "
                     "freshly copied, still in the last-level cache, where a model reads it from memory, and "
                     f"that regime changed which GEMM won on a Zen 4 EPYC; add PERSISTENT_INPUTS = {example}, "
                     "the positions in get_inputs() (examples/README.md)")
    if trace is not None and kind == "gemm" and trace.model_weights:
        notes.append(f"{baseline} keeps its weights as Model parameters, reused by every timed call: a weight "
                     "that fits the last-level cache is then timed from the cache, where a model with many "
                     "layers reads it from memory. To time it as a model does, pass the weight as an input of "
                     "get_inputs() and name its position in PERSISTENT_INPUTS (examples/README.md)")
    effective_dtype = dtype or (trace.dtype if trace else None) or "fp32"
    if effective_dtype not in DTYPE_BYTES:
        effective_dtype = "fp32"

    rows: list[dict[str, Any]] = []
    # Category for formulas: the name's when recognised, else the traced kind's generic one.
    formula_match = match if match.recognised else NameMatch(
        name=name, kind=kind, category={"gemm": "gemm", "attention": "attention",
                                        "reduction": "norm"}.get(kind, "elementwise"),
        keyword=None, recognised=False, note="")
    if shapes:
        for shape in shapes:
            if trace is not None and kind in ("elementwise", "reduction") and trace.primary_input:
                primary = trace.primary_input
                cost = scaled_trace_cost(trace.flops, trace.input_bytes, trace.output_bytes,
                                         math.prod(primary.shape) or 1, shape,
                                         DTYPE_BYTES.get(primary.dtype, 4), DTYPE_BYTES[effective_dtype])
                source = "baseline trace scaled"
            else:
                cost = formula_cost(formula_match, shape, effective_dtype)
                source = "formula"
            rows.append(_shape_row(shape, cost, kind=kind, dtype=effective_dtype, source=source, machine=machine))
    elif trace is not None and trace.primary_input is not None:
        primary = trace.primary_input
        gemm_mnk = None
        mm = [op for op in trace.ops if op.category in ("matmul", "attention")]
        if mm and mm[0].out_shapes and mm[0].shapes:
            out_shape = mm[0].out_shapes[0]
            act = mm[0].shapes[1] if mm[0].base in ("addmm", "baddbmm") else mm[0].shapes[0]
            if mm[0].category == "attention":
                gemm_mnk = (act[-2], mm[0].shapes[1][-2], act[-1])
            elif len(out_shape) >= 2 and act:
                gemm_mnk = (math.prod(out_shape[:-1]), out_shape[-1], act[-1])
        cost = ShapeCost(trace.flops, trace.input_bytes, trace.output_bytes,
                         math.prod(primary.shape[:-1]) if len(primary.shape) > 1 else 1,
                         primary.shape[-1] if primary.shape else 1, gemm_mnk,
                         "traced ATen ops of the baseline")
        # A GEMM is known by its MxNxK, not by its largest operand (usually the weight).
        shown = tuple(gemm_mnk) if kind == "gemm" and gemm_mnk else primary.shape
        rows.append(_shape_row(shown, cost, kind=kind, dtype=effective_dtype, source="baseline trace",
                               machine=machine))
    first = rows[0] if rows else None
    row_bytes = (first["row_len"] * DTYPE_BYTES[effective_dtype]) if first else None
    gemm_m = first["gemm_mnk"][0] if first and first["gemm_mnk"] else None
    strategy = simd_strategy(kind, formula_match.category, effective_dtype, machine,
                             row_bytes=row_bytes, gemm_m=gemm_m, name=name)
    # The strategy is written for the first shape; other shapes may need another GEMM path.
    paths = {row["gemm_path"] for row in rows if row["gemm_path"]}
    extra = {"amx-brgemm": ["amx-tile-config", "amx-linux-permission", "vnni-packing"],
             "avx512-bf16-dot": ["avx512-bf16-dot", "vnni-packing"]}
    strategy["references"] = check_reference_ids(
        strategy["references"] + [ref for path in sorted(paths) for ref in extra.get(path, [])])
    if machine.quick:
        notes.append("the machine profile was measured in quick mode; run `python -m kernel_harness.machine "
                     "--refresh` for accurate limits")
    return {
        "schema_version": SCHEMA_VERSION,
        "op": name,
        "kind": kind,
        "kind_source": kind_source,
        "name_match": {"recognised": match.recognised, "keyword": match.keyword, "category": match.category,
                       "kind": match.kind, "note": match.note},
        "dtype": effective_dtype,
        "machine": machine_summary(machine),
        "baseline": trace.to_dict() if trace else None,
        "trace_error": trace_error,
        "shapes": rows,
        "strategy": strategy,
        "references": strategy["references"],
        "notes": notes,
    }


# ---------------------------------------------------------------------- printing


def _si(value: float, unit: str) -> str:
    for factor, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.2f} {prefix}{unit}"
    return f"{value:.0f} {unit}"


def _bytes(value: float) -> str:
    for factor, prefix in ((1024**3, "GiB"), (1024**2, "MiB"), (1024, "KiB")):
        if value >= factor:
            return f"{value / factor:.1f} {prefix}"
    return f"{value:.0f} B"


KIND_ADVICE = {
    "elementwise": "write an ELEMENT-WISE kernel: one streaming pass, memory-bound; the win is bandwidth and not "
                   "allocating/faulting the output",
    "reduction": "write a REDUCTION (row-wise) kernel: one thread per row block, fp32 accumulators, the row kept "
                 "in cache between passes",
    "gemm": "write a GEMM kernel: blocked micro-kernel / brgemm; compute-bound at large M, weight-bandwidth-bound at small M",
    "attention": "write an ATTENTION kernel: flash-style blocking with online softmax around two GEMMs",
}


def _print_wide(console: Console, table: Table) -> None:
    """Tables have many numeric columns: render them at least 150 columns wide even when piped."""
    previous = console.width
    try:
        console.width = max(previous, 150)
        console.print(table)
    finally:
        console.width = previous


def print_report(report: dict[str, Any], console: Console) -> None:
    kind = report["kind"]
    console.print(f"[bold]{report['op']}[/bold]: kind = [bold cyan]{kind}[/bold cyan] "
                  f"(from the {report['kind_source']}), dtype {report['dtype']}")
    console.print(f"  name: {report['name_match']['note']}", soft_wrap=True)
    baseline = report["baseline"]
    if baseline:
        console.print(f"  baseline: {baseline['kind_reason']}; traced in {baseline['trace_seconds']:.2f} s "
                      f"on {baseline['traced_with']}", soft_wrap=True)
        table = Table(title="ATen ops executed by the reference")
        for col in ("op", "count", "shapes", "FLOPs", "bytes"):
            table.add_column(col)
        for op in baseline["ops"]:
            table.add_row(op["op"], str(op["count"]), ", ".join(op["shapes"]), _si(op["flops"], "FLOP"),
                          _bytes(op["bytes"]))
        _print_wide(console, table)
        console.print(f"  unfused ATen traffic {_bytes(baseline['aten_bytes'])} vs minimum "
                      f"{_bytes(baseline['min_bytes'])} (inputs + outputs once)")
    m = report["machine"]
    console.print(f"  machine: {m['cpu_model']}, {m['logical_cpus']} threads; copy bandwidth "
                  f"{m['bandwidth_gbs']['copy_prealloc']:.1f} GB/s (fresh output "
                  f"{m['bandwidth_gbs']['copy_fresh']:.1f} GB/s)", soft_wrap=True)
    table = Table(title="Roofline on this machine (all threads)")
    for col in ("shape", "FLOPs", "min bytes", "FLOP/B", "floor µs", "floor µs fresh out", "1-thread µs",
                "bound", "working set"):
        table.add_column(col)
    for row in report["shapes"]:
        roof = row["roofline"]
        ai = row["arithmetic_intensity"]
        table.add_row(row["shape"], _si(row["flops"], "FLOP"), _bytes(row["min_bytes"]),
                      f"{ai:.2f}" if ai is not None else "-", f"{roof['floor_time_us']:.1f}",
                      f"{roof['floor_time_fresh_output_us']:.1f}", f"{roof['floor_time_1t_us']:.1f}",
                      f"{row['bound']} ({roof['peak_source']})", row["working_set"]["fits_in"])
    _print_wide(console, table)
    for row in report["shapes"]:
        roof = row["roofline"]
        path = f"; GEMM path {row['gemm_path']}" if row["gemm_path"] else ""
        console.print(f"  {row['shape']}: intensity {row['arithmetic_intensity'] or 0:.2f} FLOP/B vs machine balance "
                      f"{roof['machine_balance']:.1f} FLOP/B -> {row['bound']}-bound{path}; {row['working_set']['note']}",
                      soft_wrap=True)
    s = report["strategy"]
    v = s["vector"]
    console.print(f"[bold]Strategy[/bold]: {KIND_ADVICE[kind]}", soft_wrap=True)
    console.print(f"  vectors: {v['isa']} {v['vector_bits']}-bit, lanes fp32 {v['lanes']['fp32']} / bf16 "
                  f"{v['lanes']['bf16']} / fp16 {v['lanes']['fp16']}, accumulate in {v['accumulate_dtype']}",
                  soft_wrap=True)
    if v.get("tier_note"):
        console.print(f"  [yellow]tier[/yellow]: {v['tier_note']}", soft_wrap=True)
    console.print(f"  load/store: {v['load_store']}", soft_wrap=True)
    console.print(f"  tail: {v['tail']}", soft_wrap=True)
    t = s["threading"]
    console.print(f"  threading: {t['threads']} threads over {t['axis']}; {t['rule']}"
                  + (f" (= {t['num_tokens_threshold']} rows of this shape)" if "num_tokens_threshold" in t else ""),
                  soft_wrap=True)
    if s["gemm"]:
        console.print(f"  GEMM path (first shape): [bold]{s['gemm']['path']}[/bold] - {s['gemm']['why']}", soft_wrap=True)
    for step in s["steps"]:
        console.print(f"  - {step}", soft_wrap=True)
    console.print(f"  read: {', '.join(report['references'])}", soft_wrap=True)
    for note in report["notes"]:
        console.print(f"  [yellow]note[/yellow]: {note}", soft_wrap=True)
