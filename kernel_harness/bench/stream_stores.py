"""Where non-temporal output stores pay: a sweep that re-measures bypass_caches_for's bound.

The generated fp32 rms_norm, layer_norm and add_rms_norm stream their rows
once a call's inputs and outputs fill 3/4 of the last-level cache
(``bypass_caches_for`` in cpu_features.hpp). That bound was measured on one Zen 4 EPYC; a CPU with
another cache or memory system may want another. This sweep times each op at
row counts that put its call at given fractions of the last-level cache, with
streaming forced on (``KERNEL_CPU_FORCE=streamstores``) and off
(``KERNEL_CPU_MASK=streamstores``) in two worker processes (a unit reads the
knobs once per process), in alternating rounds on identical inputs, twice:

* ``same input``: every call reads the one input (a loop over one tensor, as
  a benchmark does: it stays cached while it fits);
* ``rotated``: the calls rotate through copies three caches deep, so every
  call reads its input from memory (as in a model, where other work has
  passed through the cache since the input was written).

Each point gets the streamed time over the cached-store time with the
paired-round bootstrap interval of :mod:`.stats`; "streams faster" or
"streams slower" is claimed only when the whole interval lies on one side of
1. The rule is meant for an input the previous op has just written (cached
while it fits) and keeps an output that fits cached for the op that reads it
next, which this sweep does not time: so a point where streaming measured
slower above the bound, or (same input) faster below it, is flagged
(``rule_disagrees``), while a rotated point where streaming wins below the
bound is only noted as the gain the rule leaves when the input comes from
memory (``gain_left``). On the Zen 4 EPYC
(2026-12-04) every rotated point streamed faster, from 1/4 of the cache up.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from . import stats
from .process import with_steady_malloc
from .stream_floor import ROTATION_LLC_MULTIPLE

#: The ops whose fp32 rows follow bypass_caches_for (their STREAM_STORES knob at 2), and how
#: many tensors of the call's shape each reads and writes (what the rule is given).
TENSORS_TOUCHED = {"rms_norm": 2, "layer_norm": 2, "add_rms_norm": 4}
OPS = tuple(TENSORS_TOUCHED)
#: bypass_caches_for streams from this fraction of the last-level cache.
RULE_FRACTION = 0.75
MODES = ("same input", "rotated")
#: Which knob each worker lists "streamstores" in (see setting_env).
SETTINGS = {"streamed": "KERNEL_CPU_FORCE", "cached": "KERNEL_CPU_MASK"}
TOKEN = "streamstores"


@dataclass(frozen=True)
class SweepPoint:
    """One op at one size and input mode: streamed time over cached-store time."""

    op: str
    rows: int
    cols: int
    mode: str
    nbytes: int  # the call's input and output bytes (every tensor it reads and writes)
    llc_fraction: float
    streamed_us: float
    cached_us: float
    ratio: float  # streamed_us / cached_us: below 1, streaming wins
    ci_low: float | None
    ci_high: float | None
    rounds: int
    rule_streams: bool  # what bypass_caches_for decides for this call

    @property
    def verdict(self) -> str:
        """'streams faster' / 'streams slower' when the whole interval lies on one side of 1."""
        if self.ci_low is None or self.ci_high is None:
            return "undecided"
        if self.ci_high < 1.0:
            return "streams faster"
        if self.ci_low > 1.0:
            return "streams slower"
        return "no measurable difference"

    @property
    def rule_disagrees(self) -> bool:
        """The rule streams where streaming measured slower, or (same input: the case the rule is
        for) keeps the cache where streaming measured faster."""
        return (self.rule_streams and self.verdict == "streams slower") or (
            self.mode == "same input" and not self.rule_streams and self.verdict == "streams faster")

    @property
    def gain_left(self) -> bool:
        """Rotated inputs: streaming measured faster where the rule keeps the output cached."""
        return self.mode == "rotated" and not self.rule_streams and self.verdict == "streams faster"

    def as_json(self) -> dict[str, Any]:
        return {**asdict(self), "verdict": self.verdict, "rule_disagrees": self.rule_disagrees,
                "gain_left": self.gain_left}


def rows_for(fraction: float, cols: int, llc_bytes: int, tensors: int = 2, element_bytes: int = 4) -> int:
    """Rows of ``cols`` fp32 elements whose ``tensors`` inputs and outputs fill ``fraction`` of the cache."""
    return max(1, math.ceil(fraction * llc_bytes / (tensors * cols * element_bytes)))


def rule_streams(nbytes: int, llc_bytes: int) -> bool:
    """bypass_caches_for's decision (cpu_features.hpp): 4 * bytes >= 3 * the cache."""
    return 4 * nbytes >= 3 * llc_bytes


# --------------------------------------------------------------------------- worker


def worker_main(kernel_dir: str) -> int:
    """A timing worker: loads the kernel, answers one JSON request per stdin line with the
    per-call times (ns) of ``calls`` calls, inputs made once per (op, rows, cols, mode)."""
    import time

    import torch

    from ..kernel_loader import load_kernel_module

    try:
        kernel = load_kernel_module(kernel_dir)
    except Exception as exc:  # noqa: BLE001 - reported to the driver as one line
        print(json.dumps({"error": f"could not load the kernel: {exc}"}), flush=True)
        return 3
    inputs: dict[tuple, list] = {}
    cursor = 0  # the next copy to call: rotation continues across requests, as in stream_floor
    for line in sys.stdin:
        request = json.loads(line)
        key = (request["op"], request["rows"], request["cols"], request["mode"])
        try:
            if key not in inputs:
                inputs.clear()  # one size at a time: the rotated copies are large
                inputs[key] = _inputs(torch, *key, request["copies"])
                cursor = 0
            calls = inputs[key]
            times = []
            for _ in range(request["calls"]):
                call = calls[cursor % len(calls)]
                cursor += 1
                start = time.perf_counter_ns()
                call(kernel)
                times.append(time.perf_counter_ns() - start)
        except Exception as exc:  # noqa: BLE001 - the op refused its inputs or failed
            print(json.dumps({"error": f"{request['op']} {request['rows']}x{request['cols']}: {exc}"}), flush=True)
            return 3
        print(json.dumps(times), flush=True)
    return 0


def _inputs(torch, op: str, rows: int, cols: int, mode: str, copies: int) -> list:
    """Calls on identical inputs in every worker (fixed seed), one per copy."""
    generator = torch.Generator().manual_seed(rows * 7919 + cols)
    weight, bias = torch.randn(cols, generator=generator), torch.randn(cols, generator=generator)
    xs = [torch.randn(rows, cols, generator=generator) for _ in range(copies if mode == "rotated" else 1)]
    outs = [torch.empty_like(x) for x in xs]
    if op == "add_rms_norm":  # two inputs and two outputs per copy: the four tensors the rule counts
        calls = []
        for x, o in zip(xs, outs, strict=True):
            residual, pair = torch.randn(rows, cols, generator=generator), (o, torch.empty_like(o))
            calls.append(lambda k, x=x, r=residual, o=pair: k.add_rms_norm(x, r, weight, 1e-6, out=o))
        return calls
    if op == "rms_norm":
        return [lambda k, x=x, o=o: k.rms_norm(x, weight, 1e-6, out=o) for x, o in zip(xs, outs, strict=True)]
    return [lambda k, x=x, o=o: k.layer_norm(x, weight, bias, 1e-5, out=o) for x, o in zip(xs, outs, strict=True)]


# --------------------------------------------------------------------------- driver


def setting_env(base: dict[str, str], knob: str) -> dict[str, str]:
    """``base`` with "streamstores" listed in ``knob`` only: taken out of KERNEL_CPU_FORCE and
    KERNEL_CPU_MASK (a force the user left set would make both workers stream) and added to
    ``knob``, every other token kept (a masked instruction set must stay masked on both sides)."""
    env = dict(base)
    for var in SETTINGS.values():
        tokens = [t for t in env.get(var, "").split(",") if t.strip() and t.strip().lower() != TOKEN]
        if var == knob:
            tokens.append(TOKEN)
        if tokens:
            env[var] = ",".join(tokens)
        else:
            env.pop(var, None)
    return env


class _Worker:
    """One worker process under one streaming setting."""

    def __init__(self, kernel_dir: Path, script: Path, knob: str):
        self.process = subprocess.Popen([sys.executable, str(script), "--worker", str(kernel_dir)],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                        env=with_steady_malloc(setting_env(dict(os.environ), knob)))

    def times(self, request: dict[str, Any]) -> list[int]:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"the timing worker exited (code {self.process.wait()}) on {request['op']}")
        try:
            answer = json.loads(line)
        except ValueError:
            raise RuntimeError(f"the timing worker printed {line.strip()[:200]!r} instead of its times") from None
        if isinstance(answer, dict):
            raise RuntimeError(answer["error"])
        return answer

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()


def sweep(kernel_dir: Path, script: Path, llc_bytes: int, ops: Sequence[str], fractions: Sequence[float],
          cols: int = 4096, rounds: int = 8, calls: int = 10, progress=None) -> list[SweepPoint]:
    """Every (op, fraction, mode), streamed against cached stores in alternating rounds."""
    workers = {name: _Worker(kernel_dir, script, knob) for name, knob in SETTINGS.items()}
    points = []
    try:
        for op in ops:
            for fraction in fractions:
                tensors = TENSORS_TOUCHED[op]
                rows = rows_for(fraction, cols, llc_bytes, tensors)
                nbytes = tensors * rows * cols * 4
                for mode in MODES:
                    if progress:
                        progress(f"{op} {rows}x{cols} ({fraction:g} of the cache), {mode}")
                    # each copy: one input and its outputs, so copies x (every tensor) spans three caches
                    copies = max(2, math.ceil(ROTATION_LLC_MULTIPLE * llc_bytes / nbytes))
                    request = {"op": op, "rows": rows, "cols": cols, "mode": mode, "copies": copies,
                               "calls": calls}
                    points.append(_point(workers, request, rounds, nbytes, fraction, llc_bytes))
    finally:
        for worker in workers.values():
            worker.close()
    return points


def _point(workers: dict[str, _Worker], request: dict[str, Any], rounds: int, nbytes: int, fraction: float,
           llc_bytes: int) -> SweepPoint:
    for worker in workers.values():
        worker.times({**request, "calls": 2})  # warm-up: inputs made, pages touched
    measured = {name: stats.Measurement(name) for name in workers}
    order = list(workers)
    for r in range(rounds):
        for name in order if r % 2 == 0 else reversed(order):
            measured[name].add_round(workers[name].times(request))
    # streamed over cached is a "speedup" of the cached time by the streamed one: the same paired bootstrap
    ratio = stats.speedup(measured["streamed"], measured["cached"])
    return SweepPoint(
        op=request["op"], rows=request["rows"], cols=request["cols"], mode=request["mode"], nbytes=nbytes,
        llc_fraction=fraction, streamed_us=measured["streamed"].median_us, cached_us=measured["cached"].median_us,
        ratio=ratio.value, ci_low=ratio.ci_low, ci_high=ratio.ci_high, rounds=rounds,
        rule_streams=rule_streams(nbytes, llc_bytes))
