"""Profiling for ``scripts/cpu_profiler.py`` (procedure step 9).

* :mod:`.perfstat` - ``perf stat`` availability, parsing (human and ``-x,``), interpretation;
* :mod:`.hotspots` - ``perf record`` samples: the kernel's hottest function and its spilled vectors;
* :mod:`.child` - the child process that loads and calls the kernel;
* :mod:`.profile` - orchestration, the roofline profile and the next-step suggestions;
* :mod:`.render` - the human output.
"""

from .hotspots import parse_annotate, parse_report, spill_findings, stack_vector_share
from .perfstat import PerfCounters, interpret, parse_perf_stat, perf_status
from .profile import profile_op, resolve_baseline, roofline_profile, roofline_suggestions
from .render import print_profile

__all__ = ["PerfCounters", "interpret", "parse_annotate", "parse_perf_stat", "parse_report", "perf_status",
           "profile_op", "resolve_baseline", "roofline_profile", "roofline_suggestions", "print_profile",
           "spill_findings", "stack_vector_share"]
