"""Operation analysis for ``scripts/analyze_op.py`` (procedure step 2).

* :mod:`.names` - classification by name (the procedure's fixed keyword table);
* :mod:`.trace` - tracing a baseline under fake tensors, ATen op by ATen op;
* :mod:`.opcost` - FLOPs and bytes of one ATen op;
* :mod:`.shapes` - shape strings and the per-name FLOP/byte model;
* :mod:`.roofline` - floor time, memory/compute bound, working set vs caches;
* :mod:`.strategy` - the suggested SIMD strategy and references to read;
* :mod:`.report` - the JSON report and its human rendering.
"""

from .names import KINDS, NAME_TABLE, RECOGNISED_KEYWORDS, classify_name
from .report import analyze_op, print_report
from .roofline import Limits, Roofline, choose_limits, roofline
from .shapes import parse_shapes
from .trace import TraceError, trace_baseline

__all__ = [
    "KINDS", "NAME_TABLE", "RECOGNISED_KEYWORDS", "classify_name", "analyze_op", "print_report",
    "Limits", "Roofline", "choose_limits", "roofline", "parse_shapes", "TraceError", "trace_baseline",
]
