"""Where the kernel's time goes, by sampling: the hottest symbols and spilled vectors.

Hardware counters are missing in many VMs, but perf's software clock
(``cpu-clock``) samples anywhere perf runs. Sampling the op's loop names the
hottest functions of the kernel's own library, and ``perf annotate`` of the
hottest one gives the share of its samples on vector instructions that load
or store the stack: spilled vectors. That share found the avx512 unit's
accumulators kept in memory around a function-local static's guard (a
possible call clobbers every vector register): bf16 loops took 1.5-1.9x the
time until the answer was read once per call (README, issue 23). The same
signature comes from too many live vectors (an unroll or chain count past
the register file).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .perfstat import PERF_MISSING, Finding, PerfStatus, perf_denied

#: Share of the hottest kernel symbol's samples on stack vector loads/stores above which
#: the loop is reported as spilling: clean loops measured 0-3 %, the avx512 unit's bf16
#: rms_norm and add_rms_norm behind kBf16's guard 21 % and 52 % (Zen 4, 2026-12-04).
SPILL_SHARE = 0.10
#: Samples the hottest symbol needs before its spill share is judged at all.
MIN_SYMBOL_SAMPLES = 200
#: Sampling rate (Hz) of the software clock: a 3 s window gives ~6000 samples per thread.
SAMPLE_HZ = 2000

_PERCENT = re.compile(r"^\s*([\d.]+)%\s*$")
_SYMBOL_FIELD = re.compile(r"^\[[.kgu]\]\s+(.+?)\s*$")
# Instruction lines: "  12.34 :   3d081:  add ..."; perf versions differ in whether lines
# without samples print 0.00 or nothing, and the prologue (frame pointer) is such a line.
_ANNOTATE_LINE = re.compile(r"^\s*(\d+\.\d+)?\s*:\s+([0-9a-f]+):\s+(.*?)\s*$")
# Each function block's header: "Percent | ... for cpu-clock (15435 samples, ...)". perf
# annotates every function of that name (a function and its OpenMP clone), each block's
# percentages relative to its own samples.
_BLOCK_HEADER = re.compile(r"Percent\s*\|.*?\((\d+)\s+samples")
_VECTOR_REGISTER = re.compile(r"%[xyz]mm\d+")
_RSP_OPERAND = re.compile(r"\(%rsp[,)]")
_RBP_OPERAND = re.compile(r"\(%rbp[,)]")
# rbp addresses the stack only where the function made it the frame pointer; GCC's
# -O2/-O3 code otherwise uses it as one more general register (an input pointer).
_FRAME_POINTER = re.compile(r"\bmov\s+%rsp,%rbp\b")


@dataclass(frozen=True)
class SymbolShare:
    """One row of ``perf report``: a function and the share of all samples it took."""

    share: float  # 0-1 of every sample in the window
    dso: str      # the library (or executable) it lives in, as perf names it
    symbol: str


@dataclass(frozen=True)
class AnnotatedLine:
    share: float      # 0-1 of its function block's samples
    address: str
    instruction: str
    samples: float = 0.0  # share times the block's sample count (the share when the count is unknown)


@dataclass(frozen=True)
class HotSymbol:
    """The kernel's hottest function, with the share of its samples on stack vector accesses."""

    symbol: str
    dso: str
    share: float                 # of all samples
    stack_vector_share: float | None  # of this symbol's samples; None when annotate gave nothing
    top_instructions: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def parse_report(text: str) -> list[SymbolShare]:
    """Rows of ``perf report --stdio -q --sort dso,symbol -t TAB``: tab-separated, because demangled
    names hold spaces and perf pads the line with further columns."""
    rows = []
    for line in text.splitlines():
        fields = line.split("\t")
        if len(fields) < 3:
            continue
        share, symbol = _PERCENT.match(fields[0]), _SYMBOL_FIELD.match(fields[2])
        if share and symbol and fields[1].strip():
            rows.append(SymbolShare(float(share.group(1)) / 100.0, fields[1].strip(), symbol.group(1)))
    return rows


def parse_annotate(text: str) -> list[AnnotatedLine]:
    """Instruction lines of ``perf annotate --stdio`` (percent : address: instruction), each weighted
    by its block's sample count so that several blocks of one name add up by samples."""
    lines = []
    block_samples = None
    for line in text.splitlines():
        header = _BLOCK_HEADER.search(line)
        if header:
            block_samples = float(header.group(1))
            continue
        match = _ANNOTATE_LINE.match(line)
        if match:
            share = float(match.group(1)) / 100.0 if match.group(1) else 0.0
            weight = share * block_samples if block_samples is not None else share
            lines.append(AnnotatedLine(share, match.group(2), match.group(3), weight))
    return lines


def is_stack_vector_access(instruction: str, *, rbp_is_frame: bool) -> bool:
    """A vector register moved from or to a stack slot: a spill or its reload."""
    if not _VECTOR_REGISTER.search(instruction):
        return False
    return bool(_RSP_OPERAND.search(instruction) or (rbp_is_frame and _RBP_OPERAND.search(instruction)))


def stack_vector_share(lines: list[AnnotatedLine]) -> float | None:
    """The share of a symbol's samples on stack vector accesses; None without samples to judge."""
    total = sum(line.samples for line in lines)
    if total <= 0:
        return None
    rbp_is_frame = any(_FRAME_POINTER.search(line.instruction) for line in lines)
    spilled = sum(line.samples for line in lines
                  if is_stack_vector_access(line.instruction, rbp_is_frame=rbp_is_frame))
    return spilled / total


def kernel_rows(rows: list[SymbolShare], libraries: set[str]) -> list[SymbolShare]:
    """The rows whose library is one of the kernel's (by file name), hottest first."""
    return sorted((row for row in rows if Path(row.dso).name in libraries), key=lambda row: -row.share)


def spill_findings(hot: HotSymbol | None, samples: int) -> list[Finding]:
    """A finding when the kernel's hottest function, with MIN_SYMBOL_SAMPLES or more, spends
    SPILL_SHARE or more of them on stack vectors."""
    if hot is None or hot.stack_vector_share is None or hot.stack_vector_share < SPILL_SHARE:
        return []
    if hot.share * samples < MIN_SYMBOL_SAMPLES:
        return []
    return [Finding(
        "spilled vectors in the hot loop",
        f"{100 * hot.stack_vector_share:.0f}% of the samples of {hot.symbol} ({100 * hot.share:.0f}% of "
        f"{samples} cpu-clock samples) fall on vector loads and stores of the stack",
        "keep the loop's vectors in registers: look for a possible call inside it (a function-local static's "
        "guard, such as a CPU answer cached on first use, or an out-of-line helper) and read such answers "
        "once before the loop; otherwise fewer live vectors (a smaller unroll or fewer chains)",
        ("cpuid-xgetbv-detection", "multiple-accumulators", "unroll-and-prefetch"),
    )]


# ------------------------------------------------------------------ running perf


def sampling_status(perf: str = "perf") -> PerfStatus:
    """Whether ``perf record -e cpu-clock`` works here (it needs no hardware counters)."""
    binary = shutil.which(perf)
    if binary is None:
        return PerfStatus(False, PERF_MISSING)
    with tempfile.TemporaryDirectory(prefix="kh-sample-") as tmp:
        data = Path(tmp) / "probe.data"
        try:
            run = subprocess.run([binary, "record", "-q", "-e", "cpu-clock", "-o", str(data), "--", "true"],
                                 capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.SubprocessError) as exc:
            return PerfStatus(False, f"perf record could not run: {exc}")
        if run.returncode == 0 and data.is_file() and data.stat().st_size > 0:
            return PerfStatus(True, "perf record samples the software clock")
        text = (run.stderr or "").strip().splitlines()
        denied = perf_denied(text, "sample")
        if denied is not None:
            return denied
        return PerfStatus(False, f"perf record wrote no samples ({text[-1] if text else f'exit {run.returncode}'})")


def record_attached(pid: int, seconds: float, data: Path, perf: str = "perf") -> str:
    """Sample process ``pid`` on the software clock for ``seconds`` into ``data``; returns "" or,
    when perf failed, its last line of complaint. No build-id cache: perf would otherwise copy
    every sampled library (libtorch's hundreds of MB, each rebuilt kernel anew) into ~/.debug."""
    binary = shutil.which(perf) or perf
    cmd = [binary, "record", "-q", "--no-buildid-cache", "-e", "cpu-clock", "-F", str(SAMPLE_HZ), "-o", str(data),
           "-p", str(pid), "--", "sleep", f"{seconds:g}"]
    try:
        run = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 60)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"perf record failed: {exc}"
    if run.returncode != 0:
        lines = (run.stderr or "").strip().splitlines()
        return f"perf record exited {run.returncode}" + (f": {lines[-1]}" if lines else "")
    return ""


def _perf_text(args: list[str], perf: str) -> str:
    binary = shutil.which(perf) or perf
    try:
        run = subprocess.run([binary, *args], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.SubprocessError):
        return ""
    return run.stdout


def sampled_report(data: Path, perf: str = "perf") -> tuple[int, list[SymbolShare]]:
    """One ``perf report`` of ``data``: its sample count (the "# Samples: 27K of event" header; 0 when
    unreadable) and its rows by library and function, tab-separated (see parse_report)."""
    text = _perf_text(["report", "--stdio", "-i", str(data), "--sort", "dso,symbol", "--percent-limit", "0.5",
                       "-t", "\t"], perf)
    match = re.search(r"^#\s*Samples:\s*([\d.]+)([KM]?)\b", text, flags=re.MULTILINE)
    samples = int(float(match.group(1)) * {"": 1, "K": 1000, "M": 1000000}[match.group(2)]) if match else 0
    return samples, parse_report(text)


def hottest_kernel_symbol(data: Path, rows: list[SymbolShare], libraries: set[str],
                          perf: str = "perf") -> HotSymbol | None:
    """The kernel library's hottest function among ``rows`` (``data``'s report), annotated from
    ``data``; None without kernel samples."""
    mine = kernel_rows(rows, libraries)
    if not mine:
        return None
    top = mine[0]
    annotate = _perf_text(["annotate", "--stdio", "-i", str(data), "--dsos", Path(top.dso).name, "-s", top.symbol],
                          perf)
    lines = parse_annotate(annotate)
    total = sum(line.samples for line in lines) or 1.0
    hottest = sorted(lines, key=lambda line: -line.samples)[:8]
    share = stack_vector_share(lines)
    return HotSymbol(
        symbol=top.symbol, dso=Path(top.dso).name, share=top.share,
        stack_vector_share=round(share, 4) if share is not None else None,
        top_instructions=[{"share": round(line.samples / total, 4), "instruction": line.instruction}
                          for line in hottest],
    )


def summarise_samples(data: Path, libraries: list[str], complaint: str) -> dict[str, Any]:
    """The profile's ``hotspots`` fields for a recording in ``data`` (``complaint``: record_attached's):
    available, and either why not or the samples, the hottest kernel function and the findings."""
    samples, rows = sampled_report(data) if data.is_file() else (0, [])
    if samples == 0:
        return {"available": False, "reason": complaint or "perf record wrote no samples for the op's loop"}
    hot = hottest_kernel_symbol(data, rows, set(libraries))
    report: dict[str, Any] = {"available": True, "samples": samples, "libraries": libraries,
                              "hottest": hot.to_dict() if hot is not None else None,
                              "findings": [f.to_dict() for f in spill_findings(hot, samples)]}
    if hot is None:
        report["note"] = "no sample fell in the kernel's own libraries (the time went to PyTorch or Python)"
    elif hot.stack_vector_share is None:
        report["note"] = "perf annotate gave no instructions for the hottest function (is objdump installed?)"
    return report
