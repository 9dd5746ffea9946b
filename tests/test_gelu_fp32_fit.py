"""The coefficient table of gelu_and_mul's fp32 formula (templates/ops/gelu_and_mul.op).

fp32 gelu_and_mul computes Phi(-s) = exp(g(s)), g = log Phi(-s), s = |a| < 6, from
eight degree-5 polynomials in d = s - i w around the centres i w, w = fp32(0.8), i =
round(1.25 s) from 0 to 7, their coefficients looked up in registers (VPERMPS). This file
is both the record of how the table was made and its check: run it as a script to print a
fresh fit; under pytest it parses the table out of the template and holds it, evaluated as
the kernel evaluates it (fp32 Horner, the interval's power of two n_i ln2 carried by the
exp's shifter), to its error budget against float64, so a mistyped or reordered
coefficient fails here rather than as a rare wrong output.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np

TEMPLATE = Path(__file__).resolve().parents[1] / "templates" / "ops" / "gelu_and_mul.op"
INTERVALS, DEGREE = 8, 5
#: The centres' spacing as the kernel has it (fp32's 0.8, 0.800000012); i = round(s / 0.8)
#: is round(1.25 s), exact, and s - i w is exact in one FMA, so the fits are centred on i
#: times this float, not on 0.8 i.
WIDTH = float(np.float32(0.8))
#: The fit's reach past each interval: rounding can pick the neighbour interval near a boundary.
SLACK = 0.002
#: |g| error the table is held to: fp32 rounding of lo in Horner dominates (~3e-7).
BUDGET = 5e-7
#: The exp's rounding shifter, 1.5 * 2^23: row 0 holds it plus each interval's n_i.
SHIFTER = 12582912.0


def log_phi_tail(s: np.ndarray) -> np.ndarray:
    """g(s) = log Phi(-s) in float64, without cancellation (erfc of a positive argument)."""
    return np.log(0.5 * np.vectorize(math.erfc)(np.asarray(s, dtype=np.float64) / math.sqrt(2.0)))


def fit_fp32(d: np.ndarray, target: np.ndarray) -> np.ndarray:
    """A degree-DEGREE polynomial in d with fp32 coefficients: the highest power fitted and
    rounded first, each lower one fitted (least squares) to what the rounded ones leave, so
    that rounding a coefficient costs only what the lower powers cannot take back."""
    coefficients = np.zeros(DEGREE + 1)
    for k in range(DEGREE, -1, -1):
        left = target - sum(coefficients[j] * d**j for j in range(k + 1, DEGREE + 1))
        coefficients[k] = np.float32(np.polynomial.polynomial.polyfit(d, left, k)[k])
    return coefficients


def fit_table() -> np.ndarray:
    """[7, 8] fp32: row 0 the exp's shifter plus n_i = round(g(i w) / ln2), the power of two
    each centre carries (an integer under 2^24: exact); rows 1-6 the degree-5 polynomial in
    d of what is left, g - n_i ln2 (Chebyshev nodes over d in [-w/2, w/2], [0, w/2] for
    i = 0), whose values stay within about [-2.8, 2], so fp32 rounds them to ~1.6e-7."""
    nodes = 400
    unit = 0.5 - 0.5 * np.cos(np.pi * (np.arange(nodes) + 0.5) / nodes)
    table = np.zeros((DEGREE + 2, INTERVALS), dtype=np.float32)
    for i in range(INTERVALS):
        low = -SLACK if i == 0 else -WIDTH / 2 - SLACK
        d = low + (WIDTH / 2 + SLACK - low) * unit
        n = round(float(log_phi_tail(i * WIDTH)) / math.log(2.0))
        table[0, i] = SHIFTER + n
        table[1:, i] = fit_fp32(d, log_phi_tail(i * WIDTH + d) - n * math.log(2.0)).astype(np.float32)
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
    """g(s) as the kernel forms it: i = round(1.25 s) (one FMA with the shifter, ties to
    even), d = s - i w exact, fp32 Horner down to the constant row 1, then n_i ln2 + lo (in
    float64 here: the exp adds n_i to its own exponent, so that sum is never rounded)."""
    s = s.astype(np.float32)
    i = np.rint(1.25 * s.astype(np.float64)).astype(int)
    exact = s.astype(np.float64) - i * WIDTH
    d = exact.astype(np.float32)
    assert np.array_equal(d.astype(np.float64), exact), "s - i w must be exact in fp32"
    lo = table[6, i]
    for row in range(5, 0, -1):
        lo = (lo * d + table[row, i]).astype(np.float32)
    return (table[0, i].astype(np.float64) - SHIFTER) * math.log(2.0) + lo.astype(np.float64)


def test_the_template_table_meets_its_budget():
    table = template_table()
    centres, boundaries = WIDTH * np.arange(8), WIDTH * (np.arange(7) + 0.5)
    s = np.concatenate([np.linspace(0.0, 5.99999952, 600_001), centres, boundaries, [5.99999952]])
    error = np.abs(kernel_g(table, s) - log_phi_tail(s.astype(np.float32)))
    assert error.max() <= BUDGET, f"kC's g is {error.max():.2e} off at s = {s[error.argmax()]:.7f} (> {BUDGET:.0e})"


def test_the_template_table_is_the_fit():
    # Coefficients from another numpy may differ in their last bits; the shape of the fit
    # (which row is which power, which column which interval) must not.
    assert np.allclose(template_table(), fit_table(), rtol=1e-4, atol=1e-9)


if __name__ == "__main__":
    for row in fit_table():
        print("{" + ", ".join(f"{v:.9e}f" for v in row) + "},")
