"""--against: the candidate timed side by side with another build of a kernel
(the parent trial's, e.g. written by ``trial_manager.py checkout``).

The other build runs in a worker process of its own (two builds of one package
name never meet in one process), passes the same correctness calls and the
same verification of randomly chosen timed calls, and is timed in the same
interleaved rounds as the candidate and the baseline (all six orders in turn),
on the very same fresh inputs as the candidate.  The ratio and its interval
come from the same paired-round bootstrap as the speedup (:mod:`.stats`).
"""

from __future__ import annotations

from typing import Any

from . import stats

#: stats.Speedup.verdict() in the words of a comparison with another build.
_VERDICTS = {"kernel faster": "faster", "kernel slower": "slower"}


def compare_against(spec: str, against: stats.Measurement, candidate: stats.Measurement,
                    against_info: dict[str, Any], *, seed: int) -> dict[str, Any]:
    """``vs_against``: against's median / the candidate's (> 1: the candidate is faster),
    its interval, and the verdict, which needs the interval to exclude 1.0."""
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
    }
