"""--against: the candidate timed side by side with another build of a kernel
(the parent trial's, e.g. written by ``trial_manager.py checkout``).

The other build runs in a worker process of its own (two builds of one package
name never meet in one process), passes the same correctness calls and the
same verification of randomly chosen timed calls, and is timed in the same
interleaved rounds as the candidate and the baseline (all six orders in turn),
on the very same fresh inputs as the candidate.  The ratio and its interval
come from the same paired-round bootstrap as the speedup (:mod:`.stats`).

A comparison of two builds is asked a finer question than the speedup over
eager (is the child 3 % faster than its parent?), so it gets more rounds:
after the usual ones, whole cycles of orders are added until the ratio's own
interval is within ``--against-precision`` of it, or ``--against-max-s`` of
timing is spent (:func:`extend_until_precise`).  Measured on the 2-vCPU VM, twenty
rounds left an identical build reading 0.978-1.056 (6 of 10 runs within
+-2 %): each call varies by 15-20 % there, and an op whose fresh inputs take
30x the call to draw gets only about a hundred calls per side in twenty rounds.
Stopping on precision (never on the verdict) keeps the estimate unbiased.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from . import stats

#: stats.Speedup.verdict() in the words of a comparison with another build.
_VERDICTS = {"kernel faster": "faster", "kernel slower": "slower"}


def compare_against(spec: str, against: stats.Measurement, candidate: stats.Measurement,
                    against_info: dict[str, Any], *, seed: int,
                    extension: dict[str, Any] | None = None) -> dict[str, Any]:
    """``vs_against``: against's median / the candidate's (> 1: the candidate is faster),
    its interval, and the verdict, which needs the interval to exclude 1.0; with
    ``extension``, the rounds :func:`extend_until_precise` added (key ``rounds``)."""
    ratio = stats.speedup(against, candidate, seed=seed)
    verdict = _VERDICTS.get(ratio.verdict(), "no measurable difference")
    build = against_info.get("kernel_build") or {}
    return {
        "against": spec,
        "ratio": round(ratio.value, 4),
        "ci": [round(ratio.ci_low, 4), round(ratio.ci_high, 4)] if ratio.ci_low is not None
        and ratio.ci_high is not None else None,
        "verdict": verdict,
        "against_build_id": build.get("build_id"),
        "against_module": build.get("module"),
        "against_us": round(against.median_us, 3),
        "candidate_us": round(candidate.median_us, 3),
        "paired": round(ratio.paired, 4) if ratio.paired is not None else None,
        "rounds": extension,
    }


def half_width(against: stats.Measurement, candidate: stats.Measurement, *, seed: int) -> float | None:
    """Half the width of the ratio's bootstrap interval, relative to the ratio, before
    the reproducibility floor widens it (None while there are too few rounds)."""
    ratio = stats.speedup(against, candidate, seed=seed, floor=0.0)
    if ratio.ci_low is None or ratio.ci_high is None or ratio.value <= 0:
        return None
    return (ratio.ci_high - ratio.ci_low) / 2 / ratio.value


def extend_until_precise(against: stats.Measurement, candidate: stats.Measurement, *, rounds_done: int,
                         block: int, run_block: Callable[[int], None], started: float, precision: float,
                         max_s: float, seed: int) -> dict[str, Any]:
    """Run ``block`` more rounds at a time (``run_block(first_round)``) until the ratio's
    interval is within ``precision`` of it or the next block would end after ``max_s``
    seconds of timing (counted from ``started``, a ``time.monotonic()`` value).  It
    serves both ratios: candidate vs ``--against`` and kernel vs baseline
    (``--speedup-precision``); ``against`` is the denominator's measurement.

    Returns what happened, for the JSON: the rounds run, why it stopped ("precise",
    "time" or "disabled"), the interval's relative half-width then, and the seconds spent.
    """
    rounds = rounds_done
    while True:
        half = half_width(against, candidate, seed=seed)
        elapsed = time.monotonic() - started
        if max_s <= 0:
            stopped = "disabled"
        elif half is not None and half <= precision:
            stopped = "precise"
        elif elapsed + elapsed / max(rounds, 1) * block > max_s:
            stopped = "time"
        else:
            run_block(rounds)
            rounds += block
            continue
        return {"rounds": rounds, "added_rounds": rounds - rounds_done, "stopped": stopped,
                "half_width": round(half, 4) if half is not None else None,
                "precision": precision, "max_s": max_s, "seconds": round(elapsed, 2)}
