"""The timing rounds: warm-up and calibration, then baseline and kernel timed in
interleaved rounds (ABAB...) on fresh inputs per call, with randomly chosen
timed calls handed to the checker afterwards.

With ``--processes N`` round ``r`` runs on worker pair ``r % N`` and each pair
sees both orders; with a cached baseline (``--baseline-us``) the baseline only
runs in a few spot rounds, so a drift of the machine's speed shows.
"""

from __future__ import annotations

import itertools
import math
import os
import time
from typing import Any

from . import stats, tree
from .against import compare_against, extend_until_precise, half_width
from .checking import Checker
from .conditions import RunQueueSampler, Watch, load_average
from .options import DRIFT_NOTE, MAX_COLD_SETS, BenchResult, baseline_drift, spot_rounds
from .session import Session
from ..machine import last_level_cache_bytes


def calibrate(t_call_ns: float, gen_ns: float, target_round_s: float, rounds: int,
              budget_s: float, *, sides: int) -> int:
    """Calls per round: enough to fill ``target_round_s`` of op time, within the budget."""
    n = math.ceil(target_round_s * 1e9 / max(t_call_ns, 1.0))
    per_call = max(t_call_ns + gen_ns, 1.0)
    affordable = int(budget_s * 1e9 / (per_call * rounds * sides))
    return max(1, min(n, 50, affordable))


def round_order(rnd: int, pairs: int, sides: tuple[str, ...]) -> tuple[str, ...]:
    """The order of the sides in round ``rnd`` run on worker pair ``rnd % pairs``.

    Each pair goes through every permutation of the sides in turn (two sides: AB
    then BA; three: all six orders), so every side runs in every position and right
    after every other side equally often.  A mere rotation of three sides (bka, kab,
    abk) put the --against build right after the candidate twice per cycle and the
    candidate right after it never, so whatever one side leaves behind for the next
    (caches, a waking OpenMP pool) would have favoured one build of an identical pair.
    The permutations come as the rotations of each order that starts with the first
    side, so every aligned block of ``len(sides)`` rounds also puts each side in each
    position once: a caller that stops early (the tier sweep's three rounds) still gets
    balanced positions, where the lexicographic order ran the first side first twice
    and the last one never.
    """
    n = len(sides)
    if n == 0:
        return sides
    heads = [(sides[0], *rest) for rest in itertools.permutations(sides[1:])]
    i = (rnd // pairs) % math.factorial(n)
    head = heads[i // n]
    return head[i % n:] + head[:i % n]


def _cold_sets(session: Session, set_bytes: int) -> int:
    llc = last_level_cache_bytes()
    if not llc or not set_bytes:
        return 0
    wanted = math.ceil(1.5 * llc / set_bytes) + 1
    cap = max(2, min(MAX_COLD_SETS, (2 << 30) // set_bytes))
    if wanted > cap:
        session.result.notes.append(
            f"--cold: rotating {cap} input sets ({cap * set_bytes / 2**20:.0f} MiB) of the "
            f"{wanted} needed to exceed 1.5x the {llc / 2**20:.0f} MiB last-level cache; "
            "the measurement is partly warm")
    return min(wanted, cap)


def _fetch(s: Session, worker: Any, n: int, count: int,
           seeds: list[int] | None = None) -> list[tuple[int, tuple[Any, Any]]]:
    """Fetch ``count`` of the round's kept outputs, picked now, after the round;
    with ``seeds`` return them paired with their seeds for verification."""
    idx = s.rng.sample(range(n), min(count, n))
    calls = worker.request("fetch", "fetching verified outputs", indices=idx)["calls"]
    if seeds is None:
        return []
    return [(seeds[i], c) for i, c in zip(idx, calls, strict=True)]


def run_timing(session: Session, checker: Checker) -> None:
    """Time baseline and kernel; fill the result's measurements and speedup."""
    s, o, r = session, session.o, session.result
    assert s.baseline is not None and s.kworker is not None
    source = ("inputs", 0)
    cached = o.baseline_us is not None
    kworkers, aworkers = s.timing_workers()
    if r.against_failures:
        aworkers = []  # a build that fails the check is not timed
    bworkers = [s.bworker, *s.bspares] if s.bworker is not None else []
    for w in kworkers:
        if w is not s.kworker:
            s.check_tamper(s.load(w), "import")
    for w in aworkers:
        if w is not s.aworker:
            s.check_tamper(s.load(w), "the --against build's import")
    for w in bworkers:
        s.load(w)
    # warm-up, which also calibrates the number of calls per round
    t_call, gen = 0.0, 0.0
    for w in kworkers:
        warm, _, w_gen = s.time(w, source, 3, keep=False, warmup=2, what="the kernel's warm-up calls")
        t_call = max(t_call, stats.Measurement("k", [warm]).median_us * 1e3)
        gen = max(gen, w_gen / 5)
    for w in bworkers:
        warm, _, _ = s.time(w, source, 3, keep=False, warmup=2, what="the baseline's warm-up calls")
        if not cached:  # a cached run sizes its rounds for the kernel, as before spot rounds existed
            t_call = max(t_call, stats.Measurement("b", [warm]).median_us * 1e3)
    for w in aworkers:
        warm, _, _ = s.time(w, source, 3, keep=False, warmup=2, what="the --against build's warm-up calls")
        t_call = max(t_call, stats.Measurement("a", [warm]).median_us * 1e3)
    n = o.calls_per_round or calibrate(t_call, gen, o.target_round_s, o.rounds, o.time_budget_s,
                                       sides=(1 if cached else 2) + bool(aworkers))
    if o.cold:
        n = max(n, _cold_sets(s, tree.nbytes(s.baseline.draw_inputs(s.seed()))))
    r.calls_per_round = n
    r.timing_processes = len(kworkers)
    kernel = stats.Measurement("kernel")
    # with a cached baseline: the kernel's rounds that have a baseline spot round beside
    # them, so the spot ratio gets an interval from the same paired resampling
    kernel_at_spots = stats.Measurement("kernel at spot rounds")
    base = stats.Measurement("baseline")
    against = stats.Measurement("against")
    # a cached baseline runs in a few spot rounds only; otherwise in every round,
    # including the rounds --against adds
    spots = spot_rounds(o.rounds) if cached else None
    picked: list[tuple[int, tuple[Any, Any]]] = []
    picked_against: list[tuple[int, tuple[Any, Any]]] = []
    # which rounds get a verified call is decided here, in the parent; the worker
    # keeps a copy of every output of every round and learns the pick only after it
    verify_rounds = set(s.rng.sample(range(o.rounds), min(o.verified_calls, o.rounds)))
    extra = max(0, o.verified_calls - o.rounds)
    sides = ("b", "k", "a") if aworkers else ("b", "k")
    watch = Watch(threads=r.threads, load_before=load_average())
    extension: dict[str, Any] | None = None  # the rounds --against adds (against.extend_until_precise)

    def one_round(rnd: int) -> None:
        # round rnd runs on worker pair rnd % P; each pair sees every order of the sides
        pair = rnd % len(kworkers)
        order = round_order(rnd, len(kworkers), sides)
        count = 0
        if rnd < o.rounds:
            count = (rnd in verify_rounds) + (extra // o.rounds + (rnd < extra % o.rounds))
        # the candidate and the --against build run on the very same fresh inputs
        seeds = [s.seed() for _ in range(n)]
        for side in order:
            if side == "b" and bworkers and (spots is None or rnd in spots):
                bw = bworkers[pair % len(bworkers)]
                # keep=True on every side: identical copying work and allocator state
                reply, _ = s.time_reply(bw, source, [s.seed() for _ in range(n)], keep=True,
                                        what=f"baseline timing round {rnd + 1}")
                base.add_round(reply["times_ns"], group=pair)
                watch.side("baseline").add(reply["times_ns"], reply)
                # and the same fetch as the kernel's: no work between rounds that only one side does
                _fetch(s, bw, n, count)
            elif side == "k":
                worker = kworkers[pair]
                reply, _ = s.time_reply(worker, source, seeds, keep=True,
                                        what=f"kernel timing round {rnd + 1}")
                kernel.add_round(reply["times_ns"], group=pair)
                if spots is not None and rnd in spots:
                    kernel_at_spots.add_round(reply["times_ns"], group=pair)
                watch.side("kernel").add(reply["times_ns"], reply)
                picked.extend(_fetch(s, worker, n, count, seeds))
            elif side == "a" and aworkers:
                aworker = aworkers[pair % len(aworkers)]
                reply, _ = s.time_reply(aworker, source, seeds, keep=True,
                                        what=f"--against timing round {rnd + 1}")
                against.add_round(reply["times_ns"], group=pair)
                watch.side("against").add(reply["times_ns"], reply)
                picked_against.extend(_fetch(s, aworker, n, count, seeds))

    with RunQueueSampler() as sampler:
        started = time.monotonic()
        for rnd in range(o.rounds):
            one_round(rnd)
        # more rounds, a whole cycle of orders at a time, until a ratio is precise enough
        # to tell a small difference, or the time allowed is spent: the --against ratio,
        # then (--speedup-precision) the speedup over the baseline
        block = len(kworkers) * math.factorial(len(sides))

        def run_block(first: int) -> None:
            for rnd in range(first, first + block):
                one_round(rnd)

        done = o.rounds
        if aworkers:
            extension = extend_until_precise(
                against, kernel, rounds_done=done, block=block, run_block=run_block,
                started=started, precision=o.against_precision, max_s=o.against_max_s,
                seed=s.rng.randrange(2**31))
            done = extension["rounds"]
        if o.speedup_precision > 0 and not cached:
            r.speedup_rounds = extend_until_precise(
                base, kernel, rounds_done=done, block=block, run_block=run_block, started=started,
                precision=o.speedup_precision, max_s=o.speedup_max_s, seed=s.rng.randrange(2**31))
            if extension is not None and r.speedup_rounds["added_rounds"]:
                # the ratio is computed from every round: say so, with the interval it now has
                extension["rounds"] = r.speedup_rounds["rounds"]
                extension["added_rounds"] = extension["rounds"] - o.rounds
                width = half_width(against, kernel, seed=s.rng.randrange(2**31))
                extension["half_width"] = round(width, 4) if width is not None else None
    watch.run_queue, watch.steal_fraction = sampler.samples, sampler.steal_fraction
    watch.load_after = load_average()
    s.watch = watch
    if picked_against:
        with checker.into(r.against_failures):
            checker.verify_timed(picked_against, who="against: ")
    if aworkers:
        r.against = against
    checker.verify_timed(picked)
    r.kernel = kernel
    r.kernel_us = kernel.median_us
    if cached:
        r.baseline_cached = True
        r.baseline_us = float(o.baseline_us)  # type: ignore[arg-type]
        r.speedup = stats.Speedup(r.baseline_us / r.kernel_us, None, None, 0.95)
        if base.count:
            r.baseline_spot, r.kernel_spot = base, kernel_at_spots
            # a handful of rounds: a wide interval, honestly so (decisions need it)
            r.speedup_spot = stats.speedup(base, kernel_at_spots, seed=s.rng.randrange(2**31))
            note_drift(r)
    else:
        r.baseline = base
        r.baseline_us = base.median_us
        r.speedup = stats.speedup(base, kernel, seed=s.rng.randrange(2**31))
    if r.against is not None and not r.against_failures:
        r.vs_against = compare_against(o.against or "", r.against, kernel, s.against_info,
                                       seed=s.rng.randrange(2**31), extension=extension)
    r.correct = not r.failures


def note_drift(r: BenchResult) -> None:
    """Say so when the baseline's spot rounds disagree with the cached value."""
    drift = baseline_drift(r)
    if drift is None or abs(drift) <= DRIFT_NOTE:
        return
    assert r.baseline_spot is not None
    noisy = (" The spot rounds were themselves noisy (IQR > 10 % of their median), so the drift is "
             "uncertain too.") if r.baseline_spot.noisy else ""
    r.notes.append(
        f"baseline drift: the baseline took {r.baseline_spot.median_us:.1f} us in this run's spot rounds, "
        f"{drift * 100:+.0f} % from the cached {r.baseline_us:.1f} us (--baseline-us): the machine's speed "
        "changed since the value was cached (or the value belongs to another baseline), so this speedup "
        "is off by about as much. Re-cache it with `python scripts/trial_manager.py baseline-us LABEL "
        "--refresh` (it times the baseline alone, pinned), then measure again; or rerun without "
        "--baseline-us for a side-by-side ratio." + noisy)


def note_load(r: BenchResult) -> None:
    """Record the load average after timing; mention a high one without judging by it.

    The load average is a minute-long moving average that lags the run (it read 1.5-1.9
    while two busy loops ran beside a benchmark): whether this run's timing can be
    trusted is decided from what its own rounds saw (``reliable``), so a high value
    here is context, not a verdict that could contradict that one.
    """
    try:
        load = os.getloadavg()[0]
    except OSError:
        return
    cpus = len(os.sched_getaffinity(0)) or 1
    r.load_average = round(load, 2)
    if load > cpus:
        r.notes.append(
            f"the load average was {load:.1f} on {cpus} CPUs after timing (a one-minute average that "
            "lags the run; `reliable` and its reasons say whether other tasks competed with these rounds)")
