"""Profiling for ``scripts/cpu_profiler.py`` (procedure step 9).

* :mod:`.perfstat` - ``perf stat`` availability, parsing (human and ``-x,``), interpretation;
* :mod:`.child` - the child process that loads and calls the kernel;
* :mod:`.profile` - orchestration, the roofline profile and the next-step suggestions;
* :mod:`.render` - the human output.
"""

from .perfstat import PerfCounters, interpret, parse_perf_stat, perf_status
from .profile import profile_op, resolve_baseline, roofline_profile, roofline_suggestions
from .render import print_profile

__all__ = ["PerfCounters", "interpret", "parse_perf_stat", "perf_status", "profile_op", "resolve_baseline",
           "roofline_profile", "roofline_suggestions", "print_profile"]
