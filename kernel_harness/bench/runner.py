"""The whole benchmark: correctness that cannot be fooled, then trustworthy timing.

Who holds what:

* the **parent** loads the baseline, draws every correctness input set, keeps
  pristine copies, computes the reference outputs (and the float64 oracle) and
  does every comparison (:mod:`.checking`);
* the **kernel worker** imports the kernel and runs it: on input sets the
  parent sends (correctness), and on fresh sets it draws itself from seeds
  the parent hands over one round at a time (timing).  It never computes a
  reference output, so there is none in its memory to find or to recycle;
* the **baseline worker** times the baseline the same way under the same
  thread settings.  Rounds alternate between the two (ABAB..., :mod:`.timing`);
* with ``--processes N`` timing rotates over N such pairs (the extra kernel
  workers only import and time): a process can settle into its own
  performance regime (memory placement, heap history), and the interval then
  resamples the pairs as well as the rounds.  Measured here, one pair per
  side already kept an identical kernel within 0.95-1.05 in 10 of 10 runs,
  and two pairs did not narrow the spread, so the default is one.

After each kernel round the parent picks, at random and only then, which of
the round's calls to verify; the worker copied every output at return, so
each call had to be right.  See ``docs/benchmark.md`` for the mechanisms
against each attack class.

This module only validates the options and runs the phases in order; each
phase lives in a module of its own (:mod:`.session` holds the shared state and
the worker handles, :mod:`.sweep` the tier sweep, :mod:`.throughput` the
machine limits).
"""

from __future__ import annotations

import os
import random
from typing import Any

import torch

from ..baseline import check_persistent_positions, load_baseline
from ..cpu import cpu_model, supported_tiers
from ..errors import KernelCrashed, UsageError
from . import timing
from .checking import Checker, check_reproducible
from .conditions import advice, assess, load_average
from .eviction import inputs_from_memory
from .options import (
    DRIFT_NOTE,
    MAX_COLD_SETS,
    TIERS,
    BenchOptions,
    BenchResult,
    Failure,
    InputSet,
    baseline_drift,
    spot_speedup,
)
from .options import spot_rounds as _spot_rounds
from .pinning import detect_pinning
from .session import Session, cpu_has, omp_wait_policy, system_seed
from .sweep import sweep_tiers
from ..machine import last_level_cache_bytes as _last_level_cache_bytes
from .throughput import machine_limits as _machine_limits
from .throughput import measure_throughput
from .timing import calibrate as _calibrate


def validate_options(o: BenchOptions) -> None:
    """Reject contradictory or impossible options before any process starts."""
    if o.tier not in (None, "all", *TIERS):
        raise UsageError(f"--tier {o.tier!r} is not one of generic, avx2, avx512, all.")
    if o.tier in TIERS and not cpu_has(o.tier):
        raise UsageError(f"--tier {o.tier}: this CPU cannot run the {o.tier} tier. "
                         "Choose a tier it supports (or --tier all to sweep those).")
    if o.assert_dispatch and o.tier != "all":
        raise UsageError("--assert-dispatch compares the tiers, so it needs --tier all.")
    if o.oracle not in (None, "fp64"):
        raise UsageError(f"--oracle {o.oracle!r}: the only oracle is fp64.")
    if o.accept_if_as_accurate and o.oracle is None:
        o.oracle = "fp64"
    if o.rounds < 1 or (o.calls_per_round is not None and o.calls_per_round < 1):
        raise UsageError("--rounds and --calls must be at least 1.")
    if not 0 <= o.speedup_precision < 1:
        raise UsageError(f"--speedup-precision {100 * o.speedup_precision:g}: give the speedup interval's "
                         "wanted half-width as a percentage between 0 (off, the default) and 100, e.g. 2.")
    if o.speedup_precision > 0 and o.baseline_us is not None:
        raise UsageError("--speedup-precision adds rounds of the baseline and the kernel side by side, but "
                         "--baseline-us skips timing the baseline. Drop one of the two.")
    if not 0 < o.against_precision < 1:
        raise UsageError(f"--against-precision {100 * o.against_precision:g}: give the interval's wanted "
                         "half-width as a percentage between 0 and 100 (default 2).")
    if not 1 <= o.timing_processes <= 4:
        raise UsageError(f"--processes {o.timing_processes}: use 1 to 4 worker processes per side "
                         "(each one costs a torch import, ~2 s).")


class Benchmark:
    """One run: ``Benchmark(options).run()``; ``result`` is readable even after a failure."""

    def __init__(self, options: BenchOptions) -> None:
        self.o = options
        rng = random.Random(options.seed if options.seed is not None else system_seed())
        self.session = Session(o=options, rng=rng, result=BenchResult(options=options))
        self.checker = Checker(self.session)

    @property
    def result(self) -> BenchResult:
        return self.session.result

    @property
    def kernel_info(self) -> dict[str, Any]:
        return self.session.kernel_info

    def run(self) -> BenchResult:
        o, s, r = self.o, self.session, self.session.result
        validate_options(o)
        r.widened = o.atol is not None or o.rtol is not None
        r.acceptance_rule = "widened-tolerance" if r.widened else "tolerance"
        r.threads = o.threads or torch.get_num_threads()
        pin = detect_pinning()
        r.pinned, r.pinned_detail = pin.pinned, pin.detail
        r.conditions = static_conditions(r)

        s.baseline = load_baseline(o.baseline_path)
        check_persistent_positions(s.baseline, check_reproducible(s.baseline, s.seed()))
        # --cold draws a round's sets first: each is evicted by the later ones, activations too
        r.inputs_from_memory = None if o.cold else inputs_from_memory(s.baseline.persistent_inputs)
        # a condition too: two runs compare only when their weights came from the same place
        # (None with --cold, where every input came from memory: not comparable with either)
        r.conditions["inputs_from_memory"] = None if o.cold else list(s.baseline.persistent_inputs)
        try:
            # spawn the kernel's worker now: its imports (torch, the kernel) overlap with
            # the parent's own work on the inputs and references
            s.kworker = s.spawn("kernel")
            sets = self.checker.draw_correctness_sets()
            r.input_sets = [x.label for x in sets]
            s.start_kernel()
            r.kernel_build = s.kernel_info.get("kernel_build")
            # started once the kernel imported (two torch imports at once only slow
            # each other on a small machine); it imports while correctness runs. With
            # a cached baseline it only times the spot rounds (see timing).
            s.bworker = s.spawn("baseline")
            if o.against:
                s.aworker = s.spawn("against")
            self.checker.correctness(sets)
            if r.correct:
                s.spawn_spares()
            self.checker.trace(sets[0])
            r.conditions["tier_ran"] = self._tier_ran(sets[0])
            if not r.correct:
                r.timing_skipped = "the kernel is incorrect; fix it before timing it"
                return r
            if s.aworker is not None:
                self._check_against(sets)
            timing.run_timing(s, self.checker)
            timing.note_load(r)
            record_watch(r, s)
            if r.correct and o.tier == "all":
                sweep_tiers(s, sets)
            measure_throughput(s, sets[0])
        finally:
            for w in s.workers():
                w.close()
        return r


    def _tier_ran(self, headline: InputSet) -> str | None:
        """The tier the timed calls ran: forced by --tier, else the dispatcher's pick
        for the headline input set when the package says (dispatch_tier), else unknown."""
        s = self.session
        if self.o.tier in TIERS:
            return self.o.tier
        if s.kernel_info.get("has_dispatch_tier") and s.kworker is not None:
            return str(s.kworker.request("dispatch", "asking dispatch_tier for the timed input set",
                                         inputs=headline.inputs)["tier"])
        return None

    def _check_against(self, sets: list[InputSet]) -> None:
        """Load the --against build and put it through the same correctness calls."""
        s, r = self.session, self.session.result
        assert s.aworker is not None
        s.start_against()
        r.against_build = s.against_info.get("kernel_build")
        self.checker.check_build(s.aworker, sets, "against: ")
        if r.against_failures:
            r.notes.append(
                f"--against {self.o.against}: that build fails the correctness check "
                f"({len(r.against_failures)} failure(s), first: {r.against_failures[0].message[:200]}); "
                "it is not timed, and there is no side-by-side ratio")


def static_conditions(r: BenchResult) -> dict[str, Any]:
    """The conditions known before any timing: CPU, tiers, threads, pinning, OpenMP policy."""
    return {
        "cpu_model": cpu_model(),
        "supported_tiers": supported_tiers(),
        "tier_ran": None,
        "threads": r.threads,
        "pinned": r.pinned,
        "pinned_detail": r.pinned_detail,
        "load_before": load_average(),
        "load_after": None,
        "oversubscribed": False,
        "omp_wait_policy": omp_wait_policy(),
    }


def record_watch(r: BenchResult, s: Session) -> None:
    """Add what the timing rounds saw; decide ``reliable`` and say what to do if not."""
    if s.watch is None:
        return
    cpus = os.cpu_count() or 1
    measured, reasons, suggest = assess(s.watch, cpus)
    r.conditions.update(measured)
    r.reliable = not reasons
    r.unreliable_reasons = reasons
    r.unreliable_advice = advice(reasons, suggest, r.threads)
    r.conditions["suggested_threads"] = suggest


def run_benchmark(options: BenchOptions) -> BenchResult:
    """Run the benchmark; raises UsageError / KernelCrashed / CheckFailed (tamper) as fitting."""
    return Benchmark(options).run()


__all__ = ["DRIFT_NOTE", "MAX_COLD_SETS", "TIERS", "BenchOptions", "BenchResult", "Benchmark", "Failure",
           "InputSet", "KernelCrashed", "_calibrate", "_last_level_cache_bytes", "_machine_limits",
           "_spot_rounds", "baseline_drift", "run_benchmark", "spot_speedup"]
