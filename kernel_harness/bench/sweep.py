"""--tier all: time every tier the kernel declares and this CPU runs, on each
distinct input source, and check that the dispatcher picks the fastest.

A correctness set is drawn by calling the baseline's ``get_correctness_inputs()``
whole (the set's own random state depends on the sets before it), so one fresh
set can cost far more than the call it feeds: linear's fourteen sets hold two
4096 x 4096 weights, about a second per draw, and thirty calls per round made
one sweep run for over half an hour.  The calls per round are therefore sized
by the draw as well as the call (``SWEEP_ROUND_BUDGET_S``).  And a dispatch
violation is a decision: it needs the picked tier's lag to exceed the
tolerance *and* its interval to lie above 1.0, as every decision here does.
"""

from __future__ import annotations

from typing import Any

from . import stats
from .options import InputSet
from .session import Session

#: Time (call plus input draw) one tier's round on one input set may take.
SWEEP_ROUND_BUDGET_S = 0.5


def sweep_calls(t_call_ns: float, gen_ns: float) -> int:
    """Calls per round: ~10 ms of calls (3-30), fewer when drawing the inputs is slow."""
    wanted = max(3, min(30, int(0.01e9 / max(t_call_ns, 1.0))))
    affordable = int(SWEEP_ROUND_BUDGET_S * 1e9 / max(t_call_ns + gen_ns, 1.0))
    return max(1, min(wanted, affordable))


def sweep_tiers(session: Session, sets: list[InputSet]) -> None:
    """Fill ``result.tiers`` and ``result.dispatch_violations``."""
    s, o, r = session, session.o, session.result
    assert s.kworker is not None and s.baseline is not None
    tiers = s.sweep_tiers()
    # one representative per distinct source: the headline set and each correctness set
    reps = [sets[0]] + [x for x in sets if x.source[0] == "correctness"]
    table = []
    for x in reps:
        pick = None
        if s.kernel_info.get("has_dispatch_tier"):
            pick = s.kworker.request("dispatch", f"asking dispatch_tier for {x.label}",
                                     inputs=x.inputs)["tier"]
        meas = {t: stats.Measurement(t) for t in tiers}
        t_call = gen = 0.0
        for t in tiers:
            s.set_tier(t)
            warm, _, warm_gen = s.time(s.kworker, x.source, 2, keep=False, warmup=1,
                                       what=f"warming tier {t} on {x.label}")
            t_call = max(t_call, stats.Measurement(t, [warm]).median_us * 1e3)
            gen = max(gen, warm_gen / 3)
        n = sweep_calls(t_call, gen)
        for rnd in range(o.sweep_rounds):
            order = tiers[rnd % len(tiers):] + tiers[:rnd % len(tiers)]
            for t in order:
                s.set_tier(t)
                times, _, _ = s.time(s.kworker, x.source, n, keep=False,
                                     what=f"timing tier {t} on {x.label}")
                meas[t].rounds.append(times)
        s.set_tier(None)
        moved = s.baseline.amount("BYTES", x.inputs)
        rows = sorted(({"tier": t, "median_us": m.median_us, "iqr_us": m.iqr_us,
                        "gbps": (moved / (m.median_us * 1e3)) if moved else None,
                        "dispatched": t == pick} for t, m in meas.items()),
                      key=lambda row: row["median_us"])
        fastest = rows[0]
        entry: dict[str, Any] = {"input_set": x.label, "dispatch": pick, "rows": rows,
                                 "fastest": fastest["tier"]}
        chosen = next((row for row in rows if row["tier"] == pick), None)
        if chosen is not None:
            lag = chosen["median_us"] / fastest["median_us"] - 1.0
            entry["dispatch_lag_pct"] = 100 * lag
            # the rounds alternate the tiers, so the lag gets the paired-round interval
            ratio = stats.speedup(meas[pick], meas[fastest["tier"]], seed=s.rng.randrange(2**31), floor=0.0)
            entry["dispatch_lag_ci_pct"] = ([round(100 * (ratio.ci_low - 1), 2), round(100 * (ratio.ci_high - 1), 2)]
                                            if ratio.ci_low is not None and ratio.ci_high is not None else None)
            separated = ratio.ci_low is None or ratio.ci_low > 1.0
            if lag * 100 > o.dispatch_tolerance_pct and separated:
                r.dispatch_violations.append(
                    f"{x.label}: the dispatcher picks {pick} ({chosen['median_us']:.1f} us) but "
                    f"{fastest['tier']} is {100 * lag:.1f} % faster ({fastest['median_us']:.1f} us)")
            elif lag * 100 > o.dispatch_tolerance_pct:
                entry["dispatch_note"] = (f"{fastest['tier']} read {100 * lag:.1f} % faster, within the "
                                          "interval of this sweep's rounds: not a violation")
        table.append(entry)
    r.tiers = {"swept": tiers, "by_input_set": table, "tolerance_pct": o.dispatch_tolerance_pct}
