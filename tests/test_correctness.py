"""The correctness comparison: per-dtype tolerance boundaries on both sides, the
structure walk, NaN/inf rules, ulps, the failure diagnosis and the oracle rule,
and the agreement of references/correctness.yaml with the code."""

from __future__ import annotations

import math

import pytest
import torch
import yaml

from kernel_harness import correctness as corr
from kernel_harness.paths import REFERENCES_DIR


def _fail(k, r, **kw):
    result = corr.compare_outputs(k, r, **kw)
    assert not result.ok
    return result.failures[0]


def _ok(k, r, **kw):
    result = corr.compare_outputs(k, r, **kw)
    assert result.ok, [f.message for f in result.failures]


# --------------------------------------------------------------------------- boundaries


@pytest.mark.parametrize("r_value", [1.0, 3.0, 1000.0, -0.37])
def test_fp32_boundary_both_sides(r_value):
    r = torch.tensor([r_value], dtype=torch.float64)
    allowed = 1e-6 + 1e-5 * abs(r_value)
    # build the fp32 values in float64 then check the rule on the exact fp32 numbers
    inside = torch.tensor([r_value + 0.9 * allowed], dtype=torch.float32)
    outside = torch.tensor([r_value + 1.1 * allowed], dtype=torch.float32)
    ref = r.to(torch.float32)
    assert (inside.double() - ref.double()).abs() <= 1e-6 + 1e-5 * ref.double().abs()
    _ok(inside, ref)
    _fail(outside, ref)


def test_fp32_absolute_term_near_zero():
    ref = torch.zeros(1)
    _ok(torch.tensor([0.9e-6]), ref)
    _fail(torch.tensor([1.1e-6]), ref)


def test_fp64_boundary_both_sides():
    ref = torch.tensor([2.0], dtype=torch.float64)
    allowed = 1e-12 + 1e-9 * 2.0
    _ok(ref + 0.99 * allowed, ref)
    _fail(ref + 1.01 * allowed, ref)


@pytest.mark.parametrize("dtype,half_ulp", [(torch.bfloat16, 2.0**-8), (torch.float16, 2.0**-11)])
def test_half_ulp_relative_for_16_bit_floats(dtype, half_ulp):
    assert corr.tolerance_for(dtype).rtol == half_ulp == torch.finfo(dtype).eps / 2
    ref = torch.tensor([1.5], dtype=dtype)
    up = torch.nextafter(ref.float(), torch.tensor([10.0])).to(dtype)
    # the next representable value above 1.5 is one ulp away: more than half an ulp
    next_up = (ref.float() + torch.finfo(dtype).eps).to(dtype)
    assert float(next_up) != float(ref)
    _fail(next_up, ref)
    _ok(ref.clone(), ref)
    del up
    # below a power of two the spacing halves: one ulp down from 2.0 is exactly
    # half an ulp of 2.0 relative, the rule's boundary, and passes
    two = torch.tensor([2.0], dtype=dtype)
    below = (two.float() - torch.finfo(dtype).eps).to(dtype)
    assert float(below) < 2.0
    _ok(below, two)
    # and 2 ulps below 2.0 fails
    below2 = (two.float() - 2 * torch.finfo(dtype).eps).to(dtype)
    _fail(below2, two)


def test_16_bit_reference_zero_needs_exact_zero():
    ref = torch.zeros(3, dtype=torch.bfloat16)
    _ok(torch.tensor([0.0, -0.0, 0.0], dtype=torch.bfloat16), ref)
    _fail(torch.tensor([0.0, 1e-30, 0.0], dtype=torch.bfloat16), ref)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.uint8, torch.int8])
def test_integers_exact(dtype):
    ref = torch.tensor([1, 2, 3], dtype=dtype)
    _ok(ref.clone(), ref)
    _fail(torch.tensor([1, 2, 4], dtype=dtype), ref)
    # widening never applies to integers
    _fail(torch.tensor([1, 2, 4], dtype=dtype), ref, atol=10.0, rtol=10.0)


def test_bool_exact():
    ref = torch.tensor([True, False])
    _ok(ref.clone(), ref)
    _fail(torch.tensor([True, True]), ref)


def test_widening_uses_the_larger_value():
    ref = torch.ones(1)
    k = torch.tensor([1.001])
    _fail(k, ref)
    _ok(k, ref, rtol=2e-3)
    _ok(k, ref, atol=2e-3)
    # a smaller value than the default does not tighten the rule
    _ok(torch.tensor([1.0 + 5e-6]), ref, rtol=1e-9)
    widened = corr.tolerance_for(torch.bfloat16, atol=0.5)
    assert widened.atol == 0.5 and widened.rtol == 2.0**-8


# --------------------------------------------------------------------------- NaN / inf


def test_nan_matches_only_nan_in_the_same_place():
    ref = torch.tensor([1.0, math.nan, 3.0])
    _ok(torch.tensor([1.0, math.nan, 3.0]), ref)
    f = _fail(torch.tensor([math.nan, 2.0, 3.0]), ref)
    assert f.mismatches == 2


def test_infinities_match_exactly():
    ref = torch.tensor([math.inf, -math.inf, 1.0])
    _ok(ref.clone(), ref)
    _fail(torch.tensor([math.inf, math.inf, 1.0]), ref)
    _fail(torch.tensor([1e38, -math.inf, 1.0]), ref, rtol=1e30)  # huge rtol cannot make inf close
    _fail(torch.tensor([math.inf, -math.inf, math.inf]), ref)


# --------------------------------------------------------------------------- structure


def test_structure_walk_paths_and_types():
    ref = (torch.ones(2), {"h": torch.zeros(3), "n": 4}, [torch.ones(1)])
    _ok((torch.ones(2), {"h": torch.zeros(3), "n": 4}, [torch.ones(1)]), ref)
    f = _fail((torch.ones(2), {"h": torch.ones(3), "n": 4}, [torch.ones(1)]), ref)
    assert f.path == "out[1]['h']"
    f = _fail((torch.ones(2), {"h": torch.zeros(3), "n": 5}, [torch.ones(1)]), ref)
    assert f.path == "out[1]['n']" and f.kind == "value"
    f = _fail([torch.ones(2), {"h": torch.zeros(3), "n": 4}, [torch.ones(1)]], ref)
    assert f.kind == "structure" and f.diagnosis == "binding-or-dispatcher"
    f = _fail((torch.ones(2), {"h": torch.zeros(3)}, [torch.ones(1)]), ref)
    assert f.path == "out[1]"
    f = _fail((torch.ones(2),), (torch.ones(2), torch.ones(2)))
    assert "expected 2 items" in f.message


def test_dtype_and_shape_mismatch_are_binding_bugs():
    ref = torch.ones(4, dtype=torch.bfloat16)
    f = _fail(torch.ones(4, dtype=torch.float32), ref)
    assert f.kind == "dtype" and f.diagnosis == "binding-or-dispatcher"
    f = _fail(torch.ones(2, 2, dtype=torch.bfloat16), ref)
    assert f.kind == "shape" and f.diagnosis == "binding-or-dispatcher"
    f = _fail(None, ref)
    assert f.kind == "structure"


def test_non_tensor_leaves_compare_exactly():
    _ok((1, "a", None, 2.5), (1, "a", None, 2.5))
    _fail((1, "a", None, 2.5000001), (1, "a", None, 2.5))
    _fail(1.0, 1)  # an int is not a float


# --------------------------------------------------------------------------- report


def test_failure_report_fields():
    ref = torch.arange(40, dtype=torch.float32).reshape(2, 20)
    k = ref.clone()
    k[1, 3] = 1000.0
    f = _fail(k, ref)
    assert f.worst_index == [1, 3]
    assert f.kernel_value == 1000.0 and f.reference_value == 23.0
    assert f.mismatches == 1 and f.elements == 40 and f.fraction == pytest.approx(1 / 40)
    assert f.ulps is not None and f.ulps > 1e6
    assert f.dtype == "float32" and f.shape == [2, 20]
    d = f.to_dict()
    assert d["path"] == "out" and d["diagnosis"] == f.diagnosis


def test_ulp_distance():
    a = torch.tensor([1.0, 1.0, -0.0, 1.0], dtype=torch.bfloat16)
    b = torch.tensor([1.0, 1.0078125, 0.0, -1.0], dtype=torch.bfloat16)
    d = corr.ulp_distance(a, b)
    assert d.tolist()[:3] == [0.0, 1.0, 0.0]
    assert d[3] == 2 * 0x3F80  # across zero: both magnitudes counted
    f32 = torch.tensor([1.0])
    assert corr.ulp_distance(torch.nextafter(f32, torch.tensor([2.0])), f32).item() == 1.0
    assert math.isinf(corr.ulp_distance(torch.tensor([math.nan]), f32).item())


# --------------------------------------------------------------------------- diagnosis


def test_diagnosis_missing_tail():
    ref = torch.randn(6, 4096 + 13)
    k = ref.clone()
    k[:, -5:] = 0.0  # only the last partial vector (13 = 4096+13 mod 16) of each row
    assert _fail(k, ref).diagnosis == "missing-tail-handling"


def test_diagnosis_many_one_ulp_bf16_is_rounding_bug():
    torch.manual_seed(0)
    exact = torch.randn(64, 128)
    ref = exact.to(torch.bfloat16)  # round to nearest even
    truncated = (exact.view(torch.int32) & ~0xFFFF).view(torch.float32).to(torch.bfloat16)
    f = _fail(truncated, ref)
    assert f.diagnosis == "rounding-or-conversion"
    assert f.ulps == 1.0 and f.fraction > 0.1


def test_diagnosis_rare_one_ulp_is_double_rounding():
    ref = torch.ones(10000, dtype=torch.bfloat16)
    k = ref.clone()
    k[1234] = torch.tensor(1.0078125, dtype=torch.bfloat16)
    assert _fail(k, ref).diagnosis == "double-rounding"


def test_diagnosis_second_output():
    ref = (torch.randn(8, 64), torch.randn(8, 64))
    k = (ref[0].clone(), torch.randn(8, 64))
    f = _fail(k, ref)
    assert f.path == "out[1]" and f.diagnosis == "wrong-second-output"


def test_diagnosis_scattered_is_alignment_or_indexing():
    torch.manual_seed(1)
    ref = torch.randn(8, 64)
    k = ref.clone()
    k[0, 1], k[3, 17], k[6, 40] = 5.0, -7.0, 9.0
    assert _fail(k, ref).diagnosis == "alignment-or-indexing"


def test_diagnosis_non_finite():
    ref = torch.randn(8, 64)
    k = ref.clone()
    k[2, 5] = math.nan
    k[6, 1] = math.inf
    assert _fail(k, ref).diagnosis == "non-finite"


def test_diagnosis_accumulation_order_fp32():
    ref = torch.full((4, 64), 3.0)
    k = ref.clone()
    allowed = 1e-6 + 1e-5 * 3.0
    k[0, 0] = 3.0 + 4 * allowed  # a near miss: accumulation order
    assert _fail(k, ref).diagnosis == "accumulation-order"
    k[0, 0] = 3.0 + 100 * allowed  # far off: not an ordering effect
    assert _fail(k, ref).diagnosis == "alignment-or-indexing"


# --------------------------------------------------------------------------- oracle


def test_oracle_errors_and_as_accurate_rule():
    oracle = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)
    baseline = torch.tensor([1.0, 2.0, 3.01])
    kernel_ok = torch.tensor([1.0, 2.019, 3.0])
    kernel_bad = torch.tensor([1.0, 2.03, 3.0])
    ref = baseline
    for kernel, expected in ((kernel_ok, True), (kernel_bad, False)):
        comparison = corr.compare_outputs(kernel, ref)
        assert not comparison.ok
        leaves = corr.oracle_errors(kernel, baseline, oracle)
        assert leaves[0].baseline_error == pytest.approx(0.01, rel=1e-3)
        assert corr.passes_as_accurate(comparison, leaves) is expected
    # a structural failure is never accepted by the oracle rule
    comparison = corr.compare_outputs(torch.ones(2), ref)
    assert not corr.passes_as_accurate(comparison, corr.oracle_errors(torch.ones(2), baseline, oracle))


def test_worst_error_nan_mismatch_is_infinite():
    assert math.isinf(corr.worst_error(torch.tensor([math.nan]), torch.tensor([1.0])))
    assert corr.worst_error(torch.tensor([math.nan, 1.0]), torch.tensor([math.nan, 1.0])) == 0.0


# --------------------------------------------------------------------------- the yaml


def test_reference_yaml_agrees_with_code():
    data = yaml.safe_load((REFERENCES_DIR / "correctness.yaml").read_text())
    tolerances = data["tolerances"]
    assert set(tolerances) == set(corr.DEFAULT_TOLERANCES)
    for name, rule in corr.DEFAULT_TOLERANCES.items():
        entry = tolerances[name]
        assert entry["exact"] == rule.exact, name
        if not rule.exact:
            assert entry["atol"] == rule.atol and entry["rtol"] == rule.rtol, name
        assert entry["formula"] == rule.formula(), name
    assert data["nan_rule"] == corr.NAN_RULE
    assert data["inf_rule"] == corr.INF_RULE
    assert data["widening"] == corr.WIDEN_RULE
    assert data["as_accurate_factor"] == corr.AS_ACCURATE_FACTOR
    assert [d["id"] for d in data["diagnoses"]] == [d.id for d in corr.DIAGNOSES]
    for entry, diag in zip(data["diagnoses"], corr.DIAGNOSES, strict=True):
        assert entry["when"] == diag.condition and entry["advice"] == diag.advice
    assert data["thresholds"]["double_rounding_max_fraction"] == corr.DOUBLE_ROUNDING_MAX_FRACTION
    assert data["thresholds"]["accumulation_order_max_excess"] == corr.ACCUMULATION_ORDER_MAX_EXCESS


def test_help_text_states_the_formulas():
    text = corr.help_text()
    for needle in ("0.00390625 * |r|", "0.00048828125 * |r|", "1e-06 + 1e-05 * |r|",
                   "1e-12 + 1e-09 * |r|", "exact", "NaN"):
        assert needle in text
