"""--tier all: time every tier the kernel declares and this CPU runs, on each
distinct input source, and check that the dispatcher picks the fastest."""

from __future__ import annotations

from typing import Any

from . import stats
from .options import InputSet
from .session import Session


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
        t_call = 0.0
        for t in tiers:
            s.set_tier(t)
            warm, _, _ = s.time(s.kworker, x.source, 2, keep=False, warmup=1,
                                what=f"warming tier {t} on {x.label}")
            t_call = max(t_call, stats.Measurement(t, [warm]).median_us * 1e3)
        n = max(3, min(30, int(0.01e9 / max(t_call, 1.0))))
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
            if lag * 100 > o.dispatch_tolerance_pct:
                r.dispatch_violations.append(
                    f"{x.label}: the dispatcher picks {pick} ({chosen['median_us']:.1f} us) but "
                    f"{fastest['tier']} is {100 * lag:.1f} % faster ({fastest['median_us']:.1f} us)")
        table.append(entry)
    r.tiers = {"swept": tiers, "by_input_set": table, "tolerance_pct": o.dispatch_tolerance_pct}
