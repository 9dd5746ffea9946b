"""The coefficient table of gelu_and_mul's fp32 formula (templates/ops/gelu_and_mul.op).

fp32 gelu_and_mul computes Phi(-s) = exp(g(s)), g = log Phi(-s), s = |a| < 6, from
eight degree-5 polynomials in d = s - 0.75 i, one per interval [0.75 i, 0.75 i + 0.75],
their coefficients looked up in registers (VPERMPS). This file is both the record of how
the table was made and its check: run it as a script to print a fresh fit; under pytest
it parses the table out of the template and holds it, evaluated as the kernel evaluates
it (fp32 Horner, c0 added inside the exp), to its error budget against float64, so a
mistyped or reordered coefficient fails here rather than as a rare wrong output.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np

TEMPLATE = Path(__file__).resolve().parents[1] / "templates" / "ops" / "gelu_and_mul.op"
INTERVALS, DEGREE, WIDTH = 8, 5, 0.75
#: The fit's reach past each interval: rounding can pick the neighbour interval near a boundary.
SLACK = 0.002
#: |g| error the table is held to: fp32 rounding of lo in Horner dominates (~4e-7).
BUDGET = 6e-7


def log_phi_tail(s: np.ndarray) -> np.ndarray:
    """g(s) = log Phi(-s) in float64, without cancellation (erfc of a positive argument)."""
    return np.log(0.5 * np.vectorize(math.erfc)(np.asarray(s, dtype=np.float64) / math.sqrt(2.0)))


def fit_table() -> np.ndarray:
    """[7, 8] fp32: row 0 the fp32 value of g at each interval's start (c0), rows 1-6 the
    degree-5 polynomial in d of what is left, g - c0 (least squares on Chebyshev nodes)."""
    nodes = 400
    unit = 0.5 - 0.5 * np.cos(np.pi * (np.arange(nodes) + 0.5) / nodes)
    d = -SLACK + (WIDTH + 2 * SLACK) * unit
    table = np.zeros((DEGREE + 2, INTERVALS), dtype=np.float32)
    for i in range(INTERVALS):
        c0 = np.float32(log_phi_tail(i * WIDTH))
        rest = np.polynomial.polynomial.polyfit(d, log_phi_tail(i * WIDTH + d) - np.float64(c0), DEGREE)
        table[0, i] = c0
        table[1:, i] = rest.astype(np.float32)
    return table


def template_table() -> np.ndarray:
    """The kC table of gelu_and_mul_fp32_n, as written in the template."""
    text = TEMPLATE.read_text(encoding="utf-8")
    body = re.search(r"static constexpr float kC\[7\]\[8\] = \{(.*?)\};", text, re.S)
    assert body, f"{TEMPLATE}: no kC[7][8] table in gelu_and_mul_fp32_n"
    values = [float(v) for v in re.findall(r"[-+]?\d\.\d+e[-+]\d+", body.group(1))]
    assert len(values) == 7 * 8, f"{TEMPLATE}: kC holds {len(values)} numbers, not 56"
    return np.array(values, dtype=np.float32).reshape(7, 8)


def kernel_g(table: np.ndarray, s: np.ndarray) -> np.ndarray:
    """g(s) as the kernel forms it: the interval from round(4 s / 3 - 1/2), d exact, fp32
    Horner down to the constant row 1, then c0 + lo (summed in float64 here: the exp takes
    them apart, so that sum is never rounded to fp32)."""
    s = s.astype(np.float32)
    i = np.rint(np.float32(4.0 / 3.0) * s.astype(np.float64) - 0.5).astype(int)
    d = (s - np.float32(WIDTH) * i.astype(np.float32)).astype(np.float32)
    lo = table[6, i]
    for row in range(5, 0, -1):
        lo = (lo * d + table[row, i]).astype(np.float32)
    return table[0, i].astype(np.float64) + lo.astype(np.float64)


def test_the_template_table_meets_its_budget():
    table = template_table()
    s = np.concatenate([np.linspace(0.0, 5.99999952, 600_001), WIDTH * np.arange(8), [5.99999952]])
    error = np.abs(kernel_g(table, s) - log_phi_tail(s.astype(np.float32)))
    assert error.max() <= BUDGET, f"kC's g is {error.max():.2e} off at s = {s[error.argmax()]:.7f} (> {BUDGET:.0e})"


def test_the_template_table_is_the_fit():
    # Coefficients from another numpy may differ in their last bits; the shape of the fit
    # (which row is which power, which column which interval) must not.
    assert np.allclose(template_table(), fit_table(), rtol=1e-4, atol=1e-9)


if __name__ == "__main__":
    for row in fit_table():
        print("{" + ", ".join(f"{v:.9e}f" for v in row) + "},")
