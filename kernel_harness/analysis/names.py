"""Classify an operation by its plain name (procedure step 2 and its failure-table row).

The procedure fixes the recognised names: norm, softmax, gemm, linear, matmul,
attention, gelu, silu, relu, moe and megablocks.  Anything else is treated as
plain element-wise, and the report must say the name was not recognised so
the agent decides the kind from the baseline (``--file`` does that by tracing).

A name matches a keyword when the keyword is one of its ``_``/``-``/space
separated words or a substring of one (``fused_add_rms_norm`` -> norm,
``silu_and_mul`` -> silu, ``flash_attention`` -> attention).  The order of
:data:`NAME_TABLE` decides ties: ``attention_softmax`` is attention.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

KINDS: tuple[str, ...] = ("elementwise", "reduction", "gemm", "attention")


@dataclass(frozen=True)
class NameRule:
    keyword: str
    kind: str
    category: str  # finer label used to pick FLOP estimates and references
    why: str


@dataclass(frozen=True)
class NameMatch:
    name: str
    kind: str
    category: str
    keyword: str | None  # None when the name was not recognised
    recognised: bool
    note: str


#: Checked in order; the first keyword found in the name wins.
NAME_TABLE: tuple[NameRule, ...] = (
    NameRule("attention", "attention", "attention",
             "scaled dot-product attention: two GEMMs around a row softmax"),
    NameRule("megablocks", "gemm", "moe", "MegaBlocks MoE: grouped (block-sparse) GEMMs over experts"),
    NameRule("moe", "gemm", "moe", "mixture of experts: one small GEMM per expert after routing"),
    NameRule("gemm", "gemm", "gemm", "general matrix multiply"),
    NameRule("linear", "gemm", "gemm", "linear layer: activation x weight^T (+ bias)"),
    NameRule("matmul", "gemm", "gemm", "matrix multiply"),
    NameRule("softmax", "reduction", "softmax", "row max and row sum over the last dimension"),
    NameRule("norm", "reduction", "norm", "row statistics (mean / mean of squares) over the last dimension"),
    NameRule("gelu", "elementwise", "gelu", "element-wise activation (erf or tanh)"),
    NameRule("silu", "elementwise", "silu", "element-wise activation x * sigmoid(x)"),
    NameRule("relu", "elementwise", "relu", "element-wise max(x, 0)"),
)

RECOGNISED_KEYWORDS: tuple[str, ...] = tuple(rule.keyword for rule in NAME_TABLE)

_GATED = re.compile(r"(and_mul|_glu|glu$|swiglu|geglu|gated)")


def is_gated(name: str) -> bool:
    """``silu_and_mul``-style ops split the last dimension in two: act(x[..., :d]) * x[..., d:]."""
    return bool(_GATED.search(name.lower()))


def classify_name(name: str) -> NameMatch:
    lowered = name.strip().lower()
    for rule in NAME_TABLE:
        if rule.keyword in lowered:
            return NameMatch(
                name=name,
                kind=rule.kind,
                category=rule.category,
                keyword=rule.keyword,
                recognised=True,
                note=f"name matched '{rule.keyword}': {rule.why}",
            )
    return NameMatch(
        name=name,
        kind="elementwise",
        category="elementwise",
        keyword=None,
        recognised=False,
        note=(
            f"'{name}' was not recognised (known: {', '.join(RECOGNISED_KEYWORDS)}), so it is treated "
            "as plain element-wise; decide the kind from the baseline (pass --file baseline.py to "
            "trace it: a matmul inside means GEMM, a row reduction means reduction)."
        ),
    )
