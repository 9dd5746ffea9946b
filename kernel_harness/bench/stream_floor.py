"""A streaming floor timed beside the kernel, instead of taken from the probe.

Issue 21's bandwidth targets ("at most 1.3x the weight-streaming floor") were
first judged against ``bytes / the machine probe's read bandwidth``. On the
shared 2-vCPU VMs that bandwidth is not a constant: five probes of one Zen 5
EPYC within the same hour read 37.5, 40.2, 44.9, 47.2 and 69.0 GB/s, so one
kernel timing sat anywhere from 1.0x to 1.8x "the floor" depending on which
probe it was divided by. A ratio measured side by side does not have that
problem: the floor here is a streaming read of the same number of bytes (the
probe's own method, a torch ``sum`` over fp32 buffers), timed in the same
rounds as the kernel, alternating which goes first, each call on its own copy
of its data so that both stream from memory rather than the last-level
cache. The ratio's interval is the paired-round bootstrap of :mod:`.stats`,
so a verdict against a target (``ratio <= 1.3``) is only claimed when the
whole interval is on one side of it.

Where the case names the buffers each call streams (``FloorCase.reads``), the
floor reads those very buffers, each viewed as fp32 (``same_bytes_calls``), not
buffers of its own. Where a buffer lies in memory changes how fast it streams:
on a Zen 4 EPYC (2026-12-03) the same fp32 sum over three sets of 32 MiB
buffers allocated one after the other read 1.10-1.13x, 1.09-1.11x and
1.01-1.02x the time of a fourth set allocated last, in shuffled rounds, and two
builds of one source, each timed on its own prepacked copies, read 15 %
apart. A floor of fresh buffers beside a kernel reading older ones charges the
kernel for its pages. Summing an fp32 view of arbitrary bits (int8, bf16
pairs: NaNs, denormals) ran at the speed of a sum over normal numbers (106 GB/s
either way from the L3 there).

The floor is the faster of two readers timed in the same rounds: torch's sum
and the lockstep reader of :mod:`kernel_harness.stream_reader` (four streams
per thread). On a Zen 4 EPYC VM (2026-12-05, five runs of
examples/stream_floors.py, floors 31-72 GB/s) the sum read 0.77-0.99x the
lockstep read's rate in 52 of 55 cases and won 3 by up to 6 %, and decode
GEMVs had read "faster than the floor" (0.73-0.95x) against the sum alone.
Which reader made the floor, and both rates, go with every result. Taking the
lower of two medians can only make the floor stricter.
"""

from __future__ import annotations

import math
import os
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from ..stream_reader import LOCKSTEP, TORCH_SUM, StreamReader, try_stream_reader
from . import stats
from .conditions import cpu_times, load_average

#: Bytes of inputs in rotation per side, as a multiple of the last-level cache:
#: with three caches' worth, no call finds its data still cached from the last
#: time its copy was used.
ROTATION_LLC_MULTIPLE = 3
#: Untimed calls of each in-cache probe side before its timed ones in a round.
#: The probe's rounds run in a block of their own after the streaming rounds:
#: interleaved with them, its inputs did not come back into the cache in a few
#: calls. Zen 4 EPYC, 2026-12-05, bf16 linear M = 1, 8 MiB weight after three
#: 32 MiB calls of the kernel (or of the lockstep reader): 141-379 us for the
#: first call, then 103-227, 96-200, and still 84-164 at the sixth, against 71
#: for a cached call (after torch's sum over 256 MiB instead: 365, 90, 72, 71).
#: With two untimed calls a round the probe read 52-75 GB/s where the same
#: calls on their own read 91-128, and the verdicts blamed the loop.
IN_CACHE_REWARM_CALLS = 1
#: Two groups of a run's rounds are told apart as memory phases when the median rates of their
#: floors differ by at least this factor. These VMs' memory swings between ~25-42 and ~53-72 GB/s
#: within minutes (Zen 4 EPYC, 2026-12-05), and a kernel's ratio to its floor moves with it (linear
#: bf16 M = 4: 1.12-1.18 in slow phases, 1.50-1.54 in fast ones): a run that caught both reports
#: each beside the ratio of all its rounds, which mixes them. Single rounds are noisier than
#: phases (a round's median of four calls: the fastest over the slowest round of a run 1.2-1.6x
#: with no gap between), so phases are told apart by the medians of two groups split at the
#: widest gap, not by single rounds.
PHASE_SPREAD = 1.25
#: The fewest rounds a phase needs: three (for an interval), and a fifth of the run's, so that a
#: dip of a few rounds is not called a phase (a run of 30 rounds on a Zen 4 EPYC had four whose
#: floor read 27 GB/s among 26 at 37).
PHASE_MIN_ROUNDS = 3
PHASE_MIN_FRACTION = 0.2
#: FloorResult.floor_source: the floor summed the case's own buffers, or fresh ones.
SAME_BUFFERS = "the same buffers"
OWN_BUFFERS = "buffers of its own"


@dataclass(frozen=True)
class InCacheProbe:
    """The case's call on two sets of inputs that both fit in the last-level cache,
    ``small_bytes`` and ``large_bytes`` of them, each reused call after call (timed in
    rounds of their own after the streaming ones, which would keep evicting them).

    Their difference in time over their difference in bytes is the kernel's rate
    with memory out of the way and its per-call costs (thread wake-up, allocation)
    cancelled: about the fastest it can stream however fast the memory is (the
    inputs sit in the last-level cache, which other tenants of the host share, so
    the probe's own noise goes into its interval). Beside the floor's rate it says
    why a ratio misses its target. A kernel whose in-cache rate is below floor
    rate / target cannot meet it in this memory phase without a faster loop (less
    arithmetic per byte, or cache-friendlier reads); one whose in-cache rate is
    well above it loses the time to how its memory reads overlap its work. (The
    bandwidth of these VMs moves 2x from minute to minute, so which one applies
    changes with it.)
    """

    small: Callable[[], object]
    small_bytes: int
    large: Callable[[], object]
    large_bytes: int

    def __post_init__(self) -> None:
        if not 0 < self.small_bytes < self.large_bytes:
            raise ValueError(f"an in-cache probe needs 0 < small_bytes < large_bytes; got {self.small_bytes} "
                             f"and {self.large_bytes}")


@dataclass(frozen=True)
class FloorCase:
    """One op call that must stream ``nbytes`` from memory; ``calls[i]`` runs it on copy i of its
    inputs, and ``reads[i]`` (optional) holds the tensors that copy streams, for the floor to read.
    ``in_cache`` (optional) times the same call on cached inputs (InCacheProbe)."""

    name: str
    nbytes: int
    calls: Sequence[Callable[[], object]]
    reads: Sequence[Sequence[Any]] = ()
    in_cache: InCacheProbe | None = None


class _Judged:
    """A ratio to the floor with its interval (ci_low, ci_high) and, with an in-cache probe, the
    best ratio the kernel's in-cache rate allows (best_ci_low, best_ci_high): verdicts on both."""

    ci_low: float | None
    ci_high: float | None
    best_ci_low: float | None
    best_ci_high: float | None

    def verdict(self, target: float) -> str:
        """'met' / 'not met' only when the whole interval lies on one side of the target,
        'undecided' when it contains the target (or there are too few rounds for one)."""
        if self.ci_low is None or self.ci_high is None:
            return "undecided"
        if self.ci_high <= target:
            return "met"
        if self.ci_low > target:
            return "not met"
        return "undecided"

    def cause(self, target: float) -> str | None:
        """Why a ratio that is "not met" misses: "in-cache rate" when even the kernel's rate
        with its data in the cache, against this floor, is beyond the target (the whole interval
        of best_ratio above it: the loop itself is too slow, by its arithmetic or by its reads
        from the cache), "memory access" when that rate would meet it (the whole interval below:
        the reads from memory do not overlap the work), else "undecided"; None when the target
        is not (yet) missed or there is no probe."""
        if self.verdict(target) != "not met" or self.best_ci_low is None or self.best_ci_high is None:
            return None
        if self.best_ci_low > target:
            return "in-cache rate"
        if self.best_ci_high <= target:
            return "memory access"
        return "undecided"


@dataclass(frozen=True)
class FloorPhase(_Judged):
    """The kernel over the floor in the rounds of one memory phase of a run (PHASE_SPREAD)."""

    floor_gbs: float  # the floor's rate over these rounds (bytes of the case per second, /1e9)
    rounds: int
    ratio: float
    ci_low: float | None
    ci_high: float | None
    best_ratio: float | None = None
    best_ci_low: float | None = None
    best_ci_high: float | None = None


@dataclass(frozen=True)
class FloorResult(_Judged):
    """The kernel's median time over the floor's, measured in the same rounds."""

    name: str
    nbytes: int
    kernel_us: float
    floor_us: float
    ratio: float  # kernel_us / floor_us
    ci_low: float | None
    ci_high: float | None
    rounds: int
    calls_per_round: int
    # SAME_BUFFERS (the case's reads) or OWN_BUFFERS (own_buffers)
    floor_source: str = OWN_BUFFERS
    # with an InCacheProbe: the kernel's in-cache rate (bytes of the case per second, /1e9), and
    # the ratio the kernel would reach streaming at that rate while the floor streams at its own
    # (floor GB/s / in-cache GB/s), with its interval; None without a probe, or when the
    # larger probe did not take longer than the smaller one
    in_cache_gbs: float | None = None
    best_ratio: float | None = None
    best_ci_low: float | None = None
    best_ci_high: float | None = None
    # the reader whose median made the floor (TORCH_SUM or LOCKSTEP), and every reader's rate
    # (bytes of the case per second, /1e9) in the same rounds
    floor_reader: str = TORCH_SUM
    reader_gbs: dict[str, float] = field(default_factory=dict)
    # the run's rounds by memory phase, slowest first, when the floor's rate moved by PHASE_SPREAD
    # or more between them (each phase with its own ratio and verdicts); empty for one phase
    phases: list[FloorPhase] = field(default_factory=list)
    # the fastest round's floor rate over the slowest's (the floor's own spread over the run)
    floor_spread: float | None = None

    @property
    def floor_gbs(self) -> float:
        return self.nbytes / (self.floor_us * 1e3)

    @property
    def kernel_gbs(self) -> float:
        return self.nbytes / (self.kernel_us * 1e3)

    def as_json(self) -> dict[str, Any]:
        return {**asdict(self), "floor_gbs": round(self.floor_gbs, 2), "kernel_gbs": round(self.kernel_gbs, 2)}


def copies_for(nbytes: int, llc_bytes: int) -> int:
    """How many copies of ``nbytes`` of inputs a side rotates through (at least two)."""
    return max(2, math.ceil(ROTATION_LLC_MULTIPLE * llc_bytes / max(nbytes, 1)))


def own_buffers(nbytes: int, copies: int) -> list[Any]:
    """``copies`` fp32 buffers of ``nbytes`` each, for a case that names none of its own."""
    import torch

    return [torch.ones(max(nbytes // 4, 1), dtype=torch.float32) for _ in range(copies)]


def same_bytes_calls(reads: Sequence[Sequence[Any]]) -> list[Callable[[], object]]:
    """The floor over the case's own buffers: call i sums an fp32 view of each tensor of
    ``reads[i]`` (contiguous; a tail of fewer than 4 bytes is left out)."""
    import torch

    views = []
    for tensors in reads:
        copy = []
        for t in tensors:
            if not t.is_contiguous():
                raise ValueError(f"a floor reads contiguous buffers; got one of shape {tuple(t.shape)} with strides "
                                 f"{t.stride()}: pass .contiguous() copies in FloorCase.reads")
            raw = t.reshape(-1).view(torch.uint8)
            copy.append(raw[: raw.numel() // 4 * 4].view(torch.float32))
        views.append(copy)
    return [lambda copy=copy: [v.sum() for v in copy] for copy in views]


def _floor_reads(case: FloorCase, llc_bytes: int) -> tuple[list[list[Any]], str]:
    """The tensors each floor call reads: the case's own (after checking they hold its bytes),
    else fresh buffers of its size."""
    if not case.reads:
        return [[b] for b in own_buffers(case.nbytes, copies_for(case.nbytes, llc_bytes))], OWN_BUFFERS
    if len(case.reads) != len(case.calls):
        raise ValueError(f"{case.name}: {len(case.reads)} sets of reads for {len(case.calls)} calls; "
                         "give one set of tensors per copy")
    held = sum(t.numel() * t.element_size() for t in case.reads[0])
    if abs(held - case.nbytes) > 4 * len(case.reads[0]):
        raise ValueError(f"{case.name}: its reads hold {held} bytes, but the case says it streams {case.nbytes}")
    return [list(tensors) for tensors in case.reads], SAME_BUFFERS


def _floor_calls(case: FloorCase, llc_bytes: int,
                 reader: StreamReader | None = None) -> tuple[dict[str, list[Callable[[], object]]], str]:
    """The floor's readers over the same tensors: torch's sum, and the lockstep read when there is
    a ``reader``; and where the tensors come from (SAME_BUFFERS or OWN_BUFFERS)."""
    reads, source = _floor_reads(case, llc_bytes)
    readers = {TORCH_SUM: same_bytes_calls(reads)}
    if reader is not None:
        readers[LOCKSTEP] = reader.calls(reads)
    return readers, source


def _round(calls: Sequence[Callable[[], object]], start: int, count: int,
           clock: Callable[[], int], rewarm: int = 0) -> list[int]:
    """``count`` timed calls from ``calls[start]`` on (cycling), after ``rewarm`` untimed ones."""
    for i in range(rewarm):
        calls[(start + i) % len(calls)]()
    times = []
    for i in range(count):
        call = calls[(start + i) % len(calls)]
        t0 = clock()
        call()
        times.append(clock() - t0)
    return times


def _run_round(sides: Sequence[tuple[stats.Measurement, Sequence[Callable[[], object]], int]], r: int, start: int,
               calls_per_round: int, clock: Callable[[], int]) -> None:
    """One round of every side (measurement, calls, untimed calls first), in order on even rounds and
    reversed on odd ones, so that no side always follows the same other."""
    for measurement, calls, rewarm in sides if r % 2 == 0 else reversed(sides):
        measurement.add_round(_round(calls, start, calls_per_round, clock, rewarm))


def time_case(case: FloorCase,
              floors: Mapping[str, Sequence[Callable[[], object]]] | Sequence[Callable[[], object]], *,
              rounds: int, calls_per_round: int, seed: int = 0, clock: Callable[[], int] = time.perf_counter_ns,
              floor_source: str = OWN_BUFFERS) -> FloorResult:
    """Alternate rounds of the kernel's calls and each floor reader's (``floors``: reader name ->
    calls; a plain sequence is torch's sum alone), first kernel, then the floor first, and so on:
    a slow phase of the machine hits every side. One warm-up call each first. An in-cache probe's
    two sides then take as many rounds of their own, each after IN_CACHE_REWARM_CALLS untimed
    calls. The floor is the reader with the lowest median."""
    if rounds < 1 or calls_per_round < 1:
        raise ValueError(f"rounds ({rounds}) and calls_per_round ({calls_per_round}) must be at least 1")
    readers = dict(floors) if isinstance(floors, Mapping) else {TORCH_SUM: floors}
    if not readers:
        raise ValueError("a floor needs at least one reader")
    kernel = stats.Measurement("kernel")
    floor_sides = {name: stats.Measurement(name) for name in readers}
    small, large = stats.Measurement("in cache, small"), stats.Measurement("in cache, large")
    probe = case.in_cache
    case.calls[0]()
    for calls in readers.values():
        calls[0]()
    if probe:
        probe.small()
        probe.large()
    for r in range(rounds):
        start = r * calls_per_round
        sides = [(kernel, case.calls, 0)] + [(floor_sides[name], calls, 0) for name, calls in readers.items()]
        _run_round(sides, r, start, calls_per_round, clock)
    if probe:  # after the streaming rounds, which would keep evicting its inputs (IN_CACHE_REWARM_CALLS)
        sides = [(small, [probe.small], IN_CACHE_REWARM_CALLS), (large, [probe.large], IN_CACHE_REWARM_CALLS)]
        for r in range(rounds):
            _run_round(sides, r, r * calls_per_round, calls_per_round, clock)
    reader = min(floor_sides, key=lambda name: floor_sides[name].median_us)
    floor = floor_sides[reader]
    ratio = stats.speedup(kernel, floor, seed=seed)  # "baseline" kernel over "kernel" floor: kernel / floor
    rates = {name: round(case.nbytes / (m.median_us * 1e3), 2) for name, m in floor_sides.items()}
    result = FloorResult(case.name, case.nbytes, kernel.median_us, floor.median_us, ratio.value, ratio.ci_low,
                         ratio.ci_high, rounds, calls_per_round, floor_source, floor_reader=reader,
                         reader_gbs=rates)
    in_cache = (small, large) if probe else None
    if probe:
        result = _with_in_cache_rate(result, probe, floor, small, large, seed)
    rates = [case.nbytes / statistics.median(r) for r in floor.rounds]  # every round holds calls_per_round >= 1
    spread = round(max(rates) / min(rates), 3)
    groups = phase_rounds(rates)
    phases = [_phase(case.nbytes, kernel, floor, group, probe, in_cache, seed) for group in groups] \
        if len(groups) > 1 else []
    return replace(result, phases=phases, floor_spread=spread)


def phase_rounds(rates: Sequence[float], spread: float = PHASE_SPREAD) -> list[list[int]]:
    """The indices of a run's rounds by memory phase, slowest first, from each round's floor rate:
    all in one group, or two split at the widest gap between the sorted rates (each side at
    least PHASE_MIN_ROUNDS rounds and PHASE_MIN_FRACTION of them) when the faster group's median
    rate is ``spread`` times the slower's or more. (Two at most: a run lasts minutes, and the
    phases seen are a slow and a fast one.)"""
    every = [list(range(len(rates)))]
    order = sorted(range(len(rates)), key=lambda i: rates[i])
    cuts = range(PHASE_MIN_ROUNDS, len(order) - PHASE_MIN_ROUNDS + 1)
    if not cuts:
        return every
    cut = max(cuts, key=lambda c: rates[order[c]] / rates[order[c - 1]])
    if min(cut, len(order) - cut) < PHASE_MIN_FRACTION * len(order):  # the widest gap sets off a dip
        return every
    slow, fast = sorted(order[:cut]), sorted(order[cut:])
    if statistics.median(rates[i] for i in fast) < spread * statistics.median(rates[i] for i in slow):
        return every
    return [slow, fast]


def _rounds_of(measurement: stats.Measurement, indices: Sequence[int]) -> stats.Measurement:
    """The measurement's rounds at ``indices`` (with their worker groups)."""
    part = stats.Measurement(measurement.label)
    groups = measurement.groups if len(measurement.groups) == len(measurement.rounds) else [0] * len(measurement.rounds)
    for i in indices:
        part.add_round(measurement.rounds[i], groups[i])
    return part


def _phase(nbytes: int, kernel: stats.Measurement, floor: stats.Measurement, indices: Sequence[int],
           probe: InCacheProbe | None, in_cache: tuple[stats.Measurement, stats.Measurement] | None,
           seed: int) -> FloorPhase:
    """The kernel over the floor in the rounds at ``indices`` (FloorPhase), with the best ratio
    the in-cache rate allows against this phase's floor."""
    kernel_part, floor_part = _rounds_of(kernel, indices), _rounds_of(floor, indices)
    ratio = stats.speedup(kernel_part, floor_part, seed=seed)
    phase = FloorPhase(round(nbytes / (floor_part.median_us * 1e3), 2), len(indices), ratio.value, ratio.ci_low,
                       ratio.ci_high)
    best = _best_ratio(nbytes, probe, floor_part, *in_cache, seed) if probe and in_cache else None
    return replace(phase, best_ratio=best[0], best_ci_low=best[1], best_ci_high=best[2]) if best else phase


def _best_ratio(nbytes: int, probe: InCacheProbe, floor: stats.Measurement, small: stats.Measurement,
                large: stats.Measurement, seed: int) -> tuple[float, float | None, float | None] | None:
    """The ratio the kernel would reach streaming at its in-cache rate against ``floor``, with its
    interval; None when the larger probe did not take longer. The probe's rounds ran after the
    floor's, not beside them: drawing them jointly by index is then the same as drawing each
    on its own, which is what their independence asks for."""
    extra = probe.large_bytes - probe.small_bytes

    def best(medians: list[float]) -> float:  # floor, small, large medians in us
        delta = medians[2] - medians[1]
        return nbytes * delta / (medians[0] * extra) if delta > 0 else math.nan

    value = best([floor.median_us, small.median_us, large.median_us])
    if not math.isfinite(value):
        return None
    low, high = stats.joint_interval([floor, small, large], best, seed=seed)
    return value, low, high


def _with_in_cache_rate(result: FloorResult, probe: InCacheProbe, floor: stats.Measurement,
                        small: stats.Measurement, large: stats.Measurement, seed: int) -> FloorResult:
    """The result with the probe's in-cache rate and the best ratio it allows (FloorResult)."""
    best = _best_ratio(result.nbytes, probe, floor, small, large, seed)
    if best is None:
        return result
    in_cache_gbs = (probe.large_bytes - probe.small_bytes) / ((large.median_us - small.median_us) * 1e3)
    return replace(result, in_cache_gbs=in_cache_gbs, best_ratio=best[0], best_ci_low=best[1], best_ci_high=best[2])


@dataclass(frozen=True)
class FloorRun:
    """Every case of one run, with the conditions they were measured under."""

    results: list[FloorResult]
    conditions: dict[str, Any]


def _steal_since(start: tuple[int, int] | None) -> float | None:
    end = cpu_times()
    if start is None or end is None or end[1] <= start[1]:
        return None
    return round((end[0] - start[0]) / (end[1] - start[1]), 4)


def run_cases(cases: Sequence[FloorCase], llc_bytes: int, *, rounds: int, calls_per_round: int,
              progress: Callable[[str], None] | None = None, lockstep: bool = True) -> FloorRun:
    """Time each case against a floor of its own size (with ``lockstep``, the faster of torch's sum
    and the lockstep reader, compiled on first use; without a compiler the sum alone, and the
    conditions say why). The conditions: the CPU, threads, the wait policy, the floor's readers,
    the load average before and after, and the hypervisor's steal over the run (read from
    /proc/stat at both ends: no sampler thread competes with the timed calls)."""
    import torch

    from ..cpu import cpu_model
    from ..machine import cache_dir

    reader, missing = try_stream_reader(cache_dir()) if lockstep else (None, "not asked for")
    load_before, steal_start = load_average(), cpu_times()
    results = []
    for case in cases:
        if progress:
            progress(case.name)
        floors, source = _floor_calls(case, llc_bytes, reader)
        results.append(time_case(case, floors, rounds=rounds, calls_per_round=calls_per_round, floor_source=source))
        del floors
    conditions = {
        "cpu": cpu_model(), "threads": torch.get_num_threads(), "pinned": False,
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "unset (libgomp spins, then sleeps)"),
        "load_before": load_before, "load_after": load_average(), "steal_fraction": _steal_since(steal_start),
        "floor_readers": [TORCH_SUM] + ([f"{LOCKSTEP} ({reader.streams_per_thread} streams per thread)"] if reader
                                        else []),
        "floor_reader_note": missing,
    }
    return FloorRun(results, conditions)
