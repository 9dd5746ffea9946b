"""The timing rounds: warm-up and calibration, then baseline and kernel timed in
interleaved rounds (ABAB...) on fresh inputs per call, with randomly chosen
timed calls handed to the checker afterwards.

With ``--processes N`` round ``r`` runs on worker pair ``r % N`` and each pair
sees both orders; with a cached baseline (``--baseline-us``) the baseline only
runs in a few spot rounds, so a drift of the machine's speed shows.
"""

from __future__ import annotations

import math
import os
from typing import Any

from . import stats, tree
from .checking import Checker
from .options import DRIFT_NOTE, MAX_COLD_SETS, BenchResult, baseline_drift, spot_rounds
from .session import Session
from .throughput import last_level_cache_bytes


def calibrate(t_call_ns: float, gen_ns: float, target_round_s: float, rounds: int,
              budget_s: float, *, sides: int) -> int:
    """Calls per round: enough to fill ``target_round_s`` of op time, within the budget."""
    n = math.ceil(target_round_s * 1e9 / max(t_call_ns, 1.0))
    per_call = max(t_call_ns + gen_ns, 1.0)
    affordable = int(budget_s * 1e9 / (per_call * rounds * sides))
    return max(1, min(n, 50, affordable))


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


def run_timing(session: Session, checker: Checker) -> None:
    """Time baseline and kernel; fill the result's measurements and speedup."""
    s, o, r = session, session.o, session.result
    assert s.baseline is not None and s.kworker is not None
    source = ("inputs", 0)
    cached = o.baseline_us is not None
    kworkers = [s.kworker, *s.kspares]
    bworkers = [s.bworker, *s.bspares] if s.bworker is not None else []
    for w in s.kspares:
        s.check_tamper(s.load(w), "import")
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
    n = o.calls_per_round or calibrate(t_call, gen, o.target_round_s, o.rounds,
                                       o.time_budget_s, sides=1 if cached else 2)
    if o.cold:
        n = max(n, _cold_sets(s, tree.nbytes(s.baseline.draw_inputs(s.seed()))))
    r.calls_per_round = n
    r.timing_processes = len(kworkers)
    kernel = stats.Measurement("kernel")
    base = stats.Measurement("baseline")
    spots = spot_rounds(o.rounds) if cached else set(range(o.rounds))
    picked: list[tuple[int, tuple[Any, Any]]] = []
    # which rounds get a verified call is decided here, in the parent; the worker
    # keeps a copy of every output of every round and learns the pick only after it
    verify_rounds = set(s.rng.sample(range(o.rounds), min(o.verified_calls, o.rounds)))
    extra = max(0, o.verified_calls - o.rounds)
    for rnd in range(o.rounds):
        # round rnd runs on worker pair rnd % P; each pair sees both orders
        pair = rnd % len(kworkers)
        order = ("b", "k") if (rnd // len(kworkers)) % 2 == 0 else ("k", "b")
        for side in order:
            if side == "b" and bworkers and rnd in spots:
                # keep=True on both sides: identical copying work and allocator state
                times, _, _ = s.time(bworkers[pair % len(bworkers)], source, n, keep=True,
                                     what=f"baseline timing round {rnd + 1}")
                base.add_round(times, group=pair)
            elif side == "k":
                worker = kworkers[pair]
                times, seeds, _ = s.time(worker, source, n, keep=True,
                                         what=f"kernel timing round {rnd + 1}")
                kernel.add_round(times, group=pair)
                count = (rnd in verify_rounds) + (extra // o.rounds + (rnd < extra % o.rounds))
                idx = s.rng.sample(range(n), min(count, n))
                calls = worker.request("fetch", "fetching verified outputs", indices=idx)["calls"]
                picked.extend((seeds[i], c) for i, c in zip(idx, calls, strict=True))
    checker.verify_timed(picked)
    r.kernel = kernel
    r.kernel_us = kernel.median_us
    if cached:
        r.baseline_cached = True
        r.baseline_us = float(o.baseline_us)  # type: ignore[arg-type]
        r.speedup = stats.Speedup(r.baseline_us / r.kernel_us, None, None, 0.95)
        if base.count:
            r.baseline_spot = base
            note_drift(r)
    else:
        r.baseline = base
        r.baseline_us = base.median_us
        r.speedup = stats.speedup(base, kernel, seed=s.rng.randrange(2**31))
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
        "is off by about as much. Compare trials measured at the same speed, or rerun without "
        "--baseline-us for a side-by-side ratio." + noisy)


def note_load(r: BenchResult) -> None:
    """Say so when other processes competed for the CPUs during the timing."""
    try:
        load = os.getloadavg()[0]
    except OSError:
        return
    cpus = len(os.sched_getaffinity(0)) or 1
    r.load_average = round(load, 2)
    if load > cpus:
        r.notes.append(
            f"the machine was oversubscribed while timing (load average {load:.1f} on {cpus} "
            "CPUs): timings and the speedup are unreliable; rerun when it is quiet")
