"""analyze_op.py: the name table, baseline tracing, FLOP/byte formulas, roofline and strategy."""

from __future__ import annotations

import json
import math
import resource
import time
from pathlib import Path

import pytest
import torch

from kernel_harness.analysis import analyze_op, classify_name, parse_shapes, roofline, trace_baseline
from kernel_harness.analysis.names import RECOGNISED_KEYWORDS
from kernel_harness.analysis.opcost import op_cost
from kernel_harness.analysis.roofline import AMX_MIN_M, Limits, choose_limits
from kernel_harness.analysis.shapes import formula_cost
from kernel_harness.analysis.strategy import KNOWN_REFERENCE_IDS, simd_strategy
from kernel_harness.errors import UsageError
from test_machine import fake_profile, install_fake_profile

PROJECT_ROOT = Path(__file__).resolve().parent.parent
DATA = Path(__file__).resolve().parent / "data" / "analysis"
EXAMPLES = PROJECT_ROOT / "examples"

TOP_LEVEL_KEYS = {"schema_version", "op", "kind", "kind_source", "name_match", "dtype", "machine", "baseline",
                  "trace_error", "shapes", "strategy", "references", "notes"}
SHAPE_KEYS = {"shape", "dims", "dtype", "source", "model", "rows", "row_len", "gemm_mnk", "flops", "input_bytes",
              "output_bytes", "min_bytes", "arithmetic_intensity", "roofline", "bound", "floor_time_us",
              "working_set", "gemm_path"}


# ------------------------------------------------------------------ name table


@pytest.mark.parametrize(
    ("name", "kind"),
    [("rms_norm", "reduction"), ("fused_add_rms_norm", "reduction"), ("layer_norm", "reduction"),
     ("softmax", "reduction"), ("gemm", "gemm"), ("linear", "gemm"), ("matmul", "gemm"),
     ("flash_attention", "attention"), ("attention_softmax", "attention"), ("gelu", "elementwise"),
     ("silu_and_mul", "elementwise"), ("relu", "elementwise"), ("moe", "gemm"), ("fused_moe", "gemm"),
     ("megablocks", "gemm")],
)
def test_recognised_names(name: str, kind: str) -> None:
    match = classify_name(name)
    assert match.recognised and match.kind == kind


def test_the_table_is_exactly_the_procedures_list() -> None:
    assert set(RECOGNISED_KEYWORDS) == {"norm", "softmax", "gemm", "linear", "matmul", "attention", "gelu",
                                        "silu", "relu", "moe", "megablocks"}


def test_unknown_name_is_elementwise_with_a_note() -> None:
    match = classify_name("rotary_embedding")
    assert not match.recognised and match.kind == "elementwise" and match.keyword is None
    assert "not recognised" in match.note and "baseline" in match.note


# ------------------------------------------------------------------ shapes and formulas


def test_parse_shapes() -> None:
    assert parse_shapes("1024x4096, 2048x8192") == [(1024, 4096), (2048, 8192)]
    assert parse_shapes("64x4096x2048") == [(64, 4096, 2048)]
    for bad in ("", "1024by4096", "0x4", "12x"):
        with pytest.raises(UsageError):
            parse_shapes(bad)


def test_rms_norm_formula_bf16() -> None:
    cost = formula_cost(classify_name("rms_norm"), (1024, 4096), "bf16")
    numel = 1024 * 4096
    assert cost.flops == 5 * numel
    assert cost.input_bytes == numel * 2 + 4096 * 2  # x and the weight
    assert cost.output_bytes == numel * 2
    assert (cost.rows, cost.row_len) == (1024, 4096)


def test_gated_activation_halves_the_output() -> None:
    cost = formula_cost(classify_name("silu_and_mul"), (1024, 8192), "fp32")
    assert cost.input_bytes == 1024 * 8192 * 4
    assert cost.output_bytes == 1024 * 4096 * 4


def test_gemm_and_attention_formulas() -> None:
    gemm = formula_cost(classify_name("linear"), (64, 4096, 2048), "bf16")
    assert gemm.flops == 2 * 64 * 4096 * 2048 and gemm.gemm_mnk == (64, 4096, 2048)
    assert gemm.input_bytes == (64 * 2048 + 4096 * 2048) * 2 and gemm.output_bytes == 64 * 4096 * 2
    attn = formula_cost(classify_name("attention"), (2, 16, 1024, 128), "bf16")
    scores = 2 * 16 * 1024 * 1024
    assert attn.flops == 4 * scores * 128 + 13 * scores
    assert attn.output_bytes == 2 * 16 * 1024 * 128 * 2


def test_op_cost_of_aten_calls() -> None:
    a, b, bias = torch.empty(8, 16), torch.empty(16, 32), torch.empty(32)
    mm = op_cost(torch.ops.aten.mm.default, (a, b), {}, torch.empty(8, 32))
    assert mm.category == "matmul" and mm.flops == 2 * 8 * 32 * 16
    assert mm.bytes_read == (8 * 16 + 16 * 32) * 4 and mm.bytes_written == 8 * 32 * 4
    addmm = op_cost(torch.ops.aten.addmm.default, (bias, a, b), {}, torch.empty(8, 32))
    assert addmm.flops == 2 * 8 * 32 * 16 + 8 * 32
    view = op_cost(torch.ops.aten.view.default, (a, [128]), {}, a.view(128))
    assert view.category == "view" and view.bytes == 0 and view.flops == 0
    x = torch.empty(4, 64)
    silu_half = op_cost(torch.ops.aten.silu.default, (x[:, :32],), {}, torch.empty(4, 32))
    assert silu_half.bytes_read == 4 * 32 * 4  # a slice reads its own elements, not the whole storage


# ------------------------------------------------------------------ roofline arithmetic


def test_roofline_against_hand_computed_values() -> None:
    limits = Limits(peak_gflops=200.0, peak_gflops_1t=100.0, peak_source="fp32_fma_avx512",
                    bandwidth_gbs=20.0, bandwidth_gbs_1t=10.0, fresh_output_gbs=5.0)
    roof = roofline(1e9, 100_000_000, 100_000_000, limits)
    assert roof.compute_time_us == pytest.approx(5000.0)  # 1e9 FLOP / 200e9 FLOP/s
    assert roof.memory_time_us == pytest.approx(10000.0)  # 2e8 B / 20e9 B/s
    assert roof.floor_time_us == pytest.approx(10000.0) and roof.bound == "memory"
    assert roof.arithmetic_intensity == pytest.approx(5.0) and roof.machine_balance == pytest.approx(10.0)
    assert roof.floor_time_1t_us == pytest.approx(20000.0)  # 2e8 B / 10e9 B/s
    # Page faults: (2/5 - 2/20) us per kB of output = 3e-4 us/B * 1e8 B = 30000 us extra.
    assert roof.floor_time_fresh_output_us == pytest.approx(40000.0)
    compute = roofline(1e12, 1_000_000, 1_000_000, limits)
    assert compute.bound == "compute" and compute.floor_time_us == pytest.approx(5e6)


def test_choose_limits_picks_the_strategy_peak() -> None:
    profile = fake_profile()
    assert choose_limits(profile, kind="reduction", dtype="bf16").peak_source == "fp32_fma_avx512"
    assert choose_limits(profile, kind="gemm", dtype="bf16", m=64).peak_gflops == 2000.0
    assert choose_limits(profile, kind="gemm", dtype="bf16", m=1).peak_source == "bf16_dot_avx512"
    assert choose_limits(profile, kind="gemm", dtype="fp32", m=64).peak_source == "fp32_fma_avx512"


def test_choose_limits_holds_a_kernel_to_the_peak_of_the_tier_it_runs() -> None:
    """An AVX2 unit on an AVX512 machine cannot reach the AVX512 or BF16-dot peak: its
    roofline uses the AVX2 FMA peak (bf16 is widened to fp32 there)."""
    profile = fake_profile()
    for kind, dtype, m in (("reduction", "bf16", None), ("gemm", "bf16", 1), ("gemm", "bf16", 64),
                           ("attention", "bf16", 1), ("gemm", "fp32", 64)):
        avx2 = choose_limits(profile, kind=kind, dtype=dtype, m=m, tier="avx2")
        assert avx2.peak_source == "fp32_fma_avx2"
        assert avx2.peak_gflops == profile.peak_gflops("fp32_fma_avx2")
        assert avx2.peak_gflops < choose_limits(profile, kind=kind, dtype=dtype, m=m, tier="avx512").peak_gflops
    # the generic tier is ATen/oneDNN: the widest instructions the CPU has
    assert choose_limits(profile, kind="gemm", dtype="bf16", m=64, tier="generic").peak_source == "amx_bf16"


def test_analysis_roofline_uses_the_tier_the_dispatcher_runs_here() -> None:
    """The roofline uses the peak of the tier the generated dispatcher runs: AVX512
    F/BW/VL/DQ is enough for the avx512 unit (Ice Lake, no AVX512-BF16); a CPU with
    AVX512F alone (Knights Landing) or none (Zen 3) runs the AVX2 unit."""
    from dataclasses import replace

    full = fake_profile()
    ice_lake = replace(full, flags=tuple(f for f in full.flags if f not in ("avx512_bf16", "amx_bf16", "amx_tile")))
    avx512f_only = replace(full, flags=tuple(f for f in full.flags if f not in ("avx512bw", "avx512vl", "avx512dq")))
    for machine, peak in ((full, "fp32_fma_avx512"), (ice_lake, "fp32_fma_avx512"), (avx512f_only, "fp32_fma_avx2")):
        report = analyze_op("rms_norm", shapes=[(1024, 4096)], dtype="bf16", baseline=None, machine=machine)
        assert report["shapes"][0]["roofline"]["peak_source"] == peak


def test_analyze_by_name_report(tmp_path: Path) -> None:
    report = analyze_op("rms_norm", shapes=[(1024, 4096), (64, 8192 * 1024)], dtype="bf16", baseline=None,
                        machine=fake_profile())
    assert set(report) == TOP_LEVEL_KEYS
    assert report["kind"] == "reduction" and report["kind_source"] == "name"
    row = report["shapes"][0]
    assert set(row) == SHAPE_KEYS
    numel = 1024 * 4096
    min_bytes = 2 * numel * 2 + 4096 * 2
    assert row["min_bytes"] == min_bytes
    assert row["floor_time_us"] == pytest.approx(min_bytes / 20e3, rel=1e-6)  # 20 GB/s copy bandwidth
    assert row["bound"] == "memory"
    assert row["working_set"]["fits_in"] == "L3"  # 16 MiB < 32 MiB fake L3
    assert report["shapes"][1]["working_set"]["fits_in"] == "DRAM"
    assert report["strategy"]["vector"]["lanes"] == {"fp32": 16, "bf16": 32, "fp16": 32}
    assert report["strategy"]["vector"]["accumulate_dtype"] == "fp32"
    assert "single-pass-row-in-cache" in report["references"]
    json.dumps(report, allow_nan=False)  # JSON-clean


def test_unknown_name_report_says_so() -> None:
    report = analyze_op("rotary_embedding", shapes=[(4096, 128)], dtype="fp32", baseline=None, machine=fake_profile())
    assert report["kind"] == "elementwise"
    assert any("not recognised" in note for note in report["notes"])


# ------------------------------------------------------------------ strategy


@pytest.mark.parametrize(("dtype", "m", "amx", "path"), [
    ("bf16", 1, True, "avx512-bf16-dot"), ("bf16", AMX_MIN_M - 1, True, "avx512-bf16-dot"),
    ("bf16", AMX_MIN_M, True, "amx-brgemm"), ("bf16", 256, False, "avx512-bf16-dot"), ("fp32", 256, True, "avx512-fma"),
])
def test_gemm_path_by_m(dtype: str, m: int, amx: bool, path: str) -> None:
    profile = fake_profile()
    if not amx:
        profile = fake_profile(flags=tuple(f for f in profile.flags if not f.startswith("amx")))
    strategy = simd_strategy("gemm", "gemm", dtype, profile, gemm_m=m, name="linear")
    assert strategy["gemm"]["path"] == path
    if path == "amx-brgemm":
        assert {"amx-tile-config", "amx-linux-permission", "vnni-packing"} <= set(strategy["references"])
    if path == "avx512-bf16-dot":
        assert "avx512-bf16-dot" in strategy["references"]
    # at decode sizes with VDPBF16PS the plain weight's one-row-at-a-time stream needs x kept in L1
    assert ("prefetchnta" in strategy["gemm"]["why"]) == (path == "avx512-bf16-dot" and m <= 8)
    assert ("nta-prefetch-read-once-stream" in strategy["references"]) == (m <= 8)


def test_gemm_advice_follows_the_tier_and_streams_the_weight_at_decode_sizes() -> None:
    """Ice Lake (AVX512 F/BW/VL/DQ, no AVX512-BF16): the dispatcher runs the avx512 unit,
    so the GEMM path is the AVX512 FMA one with bf16 widened (no dot product); Zen 3
    (AVX2 only) gets the AVX2 FMA one. At M <= 8 the advice is to stream the weight
    (bandwidth-bound) in a layout read as one sequential stream, at large M to block registers."""
    full = fake_profile()
    ice_lake = fake_profile(flags=tuple(f for f in full.flags if f not in ("avx512_bf16",)
                                        and not f.startswith("amx")))
    zen3 = fake_profile(flags=tuple(f for f in full.flags if not f.startswith(("avx512", "amx"))))
    for machine, path in ((ice_lake, "avx512-fma"), (zen3, "avx2-fma")):
        decode = simd_strategy("gemm", "gemm", "bf16", machine, gemm_m=1, name="linear")
        assert decode["gemm"]["path"] == path
        assert "stream it once" in decode["gemm"]["why"] and "widen bf16 to fp32" in decode["gemm"]["why"]
        assert "one sequential stream per thread" in decode["gemm"]["why"]  # the layout advice (prepack)
        # 16 ymm registers hold the sums of at most 3 rows of a 32-column panel: the AVX2 advice says what then
        assert ("passes over chunks of K" in decode["gemm"]["why"]) == (path == "avx2-fma")
        assert "bf16-widen-fma-avx2" in decode["references"]
        assert any("PERSISTENT_INPUTS" in step and "weight" in step for step in decode["steps"])
        large = simd_strategy("gemm", "gemm", "fp32", machine, gemm_m=1024, name="linear")["gemm"]
        assert large["path"] == path and "stream" not in large["why"] and "register-blocked" in large["why"]


def test_decode_attention_advice() -> None:
    """One query token per sequence: one pass over the KV cache, GQA groups served together,
    split-S merge when there are fewer (batch, kv head) pairs than threads."""
    strategy = simd_strategy("attention", "attention", "bf16", fake_profile(), gemm_m=1, name="decode_attention")
    text = " ".join(strategy["steps"])
    assert "online softmax" in text and "grouped-query" in text and "split S" in text
    # the benchmark must read the cache from memory, as a model does (bench/eviction.py)
    assert "PERSISTENT_INPUTS" in text and "k_cache and v_cache" in text
    assert strategy["gemm"]["path"] != "amx-brgemm"  # one query row would leave AMX tiles empty
    prefill = simd_strategy("attention", "attention", "bf16", fake_profile(), gemm_m=512, name="attention")
    assert "flash-attention" in " ".join(prefill["steps"])


def test_avx2_only_machine_gets_256_bit_advice() -> None:
    profile = fake_profile(flags=("avx2", "fma", "f16c"))
    strategy = simd_strategy("elementwise", "silu", "fp16", profile, row_bytes=8192, name="silu_and_mul")
    assert strategy["vector"]["vector_bits"] == 256 and strategy["vector"]["lanes"]["fp32"] == 8
    assert "F16C" in strategy["vector"]["load_store"]


@pytest.mark.parametrize("kind", ["elementwise", "reduction", "gemm", "attention"])
def test_reference_ids_come_from_the_contract(kind: str) -> None:
    strategy = simd_strategy(kind, "norm", "bf16", fake_profile(), row_bytes=8192, gemm_m=64, name="x_int8_glu")
    assert strategy["references"] and set(strategy["references"]) <= KNOWN_REFERENCE_IDS
    try:
        from kernel_harness.references import reference_ids

        live = reference_ids()
    except Exception:  # noqa: BLE001 - catalogue not complete yet: the contract list is the check
        live = None
    if live:
        assert set(strategy["references"]) <= live


# ------------------------------------------------------------------ tracing baselines (--file)


def test_trace_gemm_baseline() -> None:
    trace = trace_baseline(DATA / "gemm_baseline.py")
    assert trace.kind == "gemm"
    assert trace.flops == 2 * 64 * 4096 * 2048 + 64 * 4096  # addmm: GEMM + bias
    # x, the weight and the bias are read, the output written (fp32).
    assert trace.input_bytes == (64 * 2048 + 4096 * 2048 + 4096) * 4
    assert trace.output_bytes == 64 * 4096 * 4
    report = analyze_op("my_proj", shapes=None, dtype=None, baseline=DATA / "gemm_baseline.py",
                        machine=fake_profile())
    assert report["kind"] == "gemm" and report["kind_source"] == "baseline"
    assert report["shapes"][0]["gemm_mnk"] == [64, 4096, 2048] and report["shapes"][0]["shape"] == "64x4096x2048"


def test_trace_gemm_baseline_as_bf16_picks_amx() -> None:
    report = analyze_op("linear", shapes=None, dtype="bf16", baseline=DATA / "gemm_baseline.py",
                        machine=fake_profile())
    assert report["dtype"] == "bf16" and report["strategy"]["gemm"]["path"] == "amx-brgemm"
    assert report["shapes"][0]["roofline"]["peak_source"] == "amx_bf16"


@pytest.mark.parametrize("name", ["attention_baseline.py", "manual_attention_baseline.py"])
def test_trace_attention_baselines(name: str) -> None:
    trace = trace_baseline(DATA / name)
    assert trace.kind == "attention"
    if name == "attention_baseline.py":
        b, h, s, d = 2, 16, 1024, 128
        assert trace.flops == 4 * b * h * s * s * d + 13 * b * h * s * s
        assert trace.dtype == "bf16"


def test_unrecognised_name_is_decided_by_the_trace() -> None:
    report = analyze_op("my_activation", shapes=None, dtype=None, baseline=DATA / "gelu_baseline.py",
                        machine=fake_profile())
    assert report["kind"] == "elementwise" and report["kind_source"] == "baseline"
    assert not report["name_match"]["recognised"]
    ops = {op["op"] for op in report["baseline"]["ops"]}
    assert "aten.tanh.default" in ops


def test_value_reading_baseline_falls_back_to_real_tensors() -> None:
    trace = trace_baseline(DATA / "untraceable_baseline.py")
    assert not trace.fake and any("real tensors" in n for n in trace.notes)


def test_shapes_override_scales_the_trace() -> None:
    report = analyze_op("rms_norm", shapes=[(2048, 8192)], dtype="fp32", baseline=DATA / "huge_rms_norm_baseline.py",
                        machine=fake_profile())
    row = report["shapes"][0]
    assert row["source"] == "baseline trace scaled"
    assert row["output_bytes"] == 2048 * 8192 * 4


def test_huge_baseline_is_analysed_in_seconds_without_allocating(tmp_path: Path, monkeypatch, script) -> None:
    """Real inputs would be 34 GB; fake tensors make the analysis a few seconds and a few hundred MB."""
    install_fake_profile(tmp_path / "machine", monkeypatch)
    out = tmp_path / "huge.json"
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    started = time.monotonic()
    run = script("analyze_op", "--op", "rms_norm", "--file", DATA / "huge_rms_norm_baseline.py", "--json", out,
                 cwd=tmp_path)
    elapsed = time.monotonic() - started
    assert run.returncode == 0, run.stderr
    assert elapsed < 60
    peak_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    assert max(peak_kb, before) < 4 * 1024 * 1024  # < 4 GB resident (inputs alone would be 34 GB)
    data = json.loads(out.read_text())
    assert data["kind"] == "reduction"
    x_bytes = 65536 * 131072 * 4
    assert data["baseline"]["input_bytes"] == x_bytes + 131072 * 4
    assert data["shapes"][0]["shape"] == "65536x131072" and data["shapes"][0]["working_set"]["fits_in"] == "DRAM"
    assert data["baseline"]["trace_seconds"] < 20


@pytest.mark.parametrize(("example", "kind"), [("rms_norm", "reduction"), ("softmax", "reduction"),
                                               ("silu_and_mul", "elementwise")])
def test_shipped_example_baselines(example: str, kind: str) -> None:
    path = EXAMPLES / example / "baseline.py"
    if not path.is_file():
        pytest.skip(f"{path} is not there yet")
    report = analyze_op(example, shapes=None, dtype=None, baseline=path, machine=fake_profile())
    assert report["kind"] == kind and report["kind_source"] == "baseline"
    baseline = report["baseline"]
    if baseline["declared_bytes"] is not None:
        # The trace's minimum traffic agrees with the byte count the baseline declares.
        assert baseline["min_bytes"] == pytest.approx(baseline["declared_bytes"], rel=0.01)
    assert report["shapes"] and report["shapes"][0]["floor_time_us"] > 0


# ------------------------------------------------------------------ the script


def test_script_by_name_writes_json(tmp_path: Path, monkeypatch, script) -> None:
    install_fake_profile(tmp_path / "machine", monkeypatch)
    out = tmp_path / "a.json"
    run = script("analyze_op", "--op", "silu_and_mul", "--shapes", "1x4096,4096x22016", "--dtype", "bf16",
                 "--json", out, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert "kind = elementwise" in run.stdout and "Strategy" in run.stdout
    data = json.loads(out.read_text())
    assert data["kind"] == "elementwise" and [r["shape"] for r in data["shapes"]] == ["1x4096", "4096x22016"]
    assert data["shapes"][1]["bound"] == "memory"
    assert data["strategy"]["threading"]["num_tokens_threshold"] >= 1


@pytest.mark.parametrize("args", [["--op", "rms_norm"], ["--op", "rms_norm", "--shapes", "12xx4"],
                                  ["--op", "rms_norm", "--file", "missing_baseline.py"]])
def test_script_bad_usage_exits_2(tmp_path: Path, monkeypatch, script, args: list[str]) -> None:
    install_fake_profile(tmp_path / "machine", monkeypatch)
    run = script("analyze_op", *args, cwd=tmp_path)
    assert run.returncode == 2
    assert "Traceback" not in run.stderr and run.stderr.strip()


def test_broken_baseline_file_exits_2(tmp_path: Path, monkeypatch, script) -> None:
    install_fake_profile(tmp_path / "machine", monkeypatch)
    broken = tmp_path / "broken_baseline.py"
    broken.write_text("import torch\ndef get_inputs(:\n")
    run = script("analyze_op", "--op", "rms_norm", "--file", broken, cwd=tmp_path)
    assert run.returncode == 2 and "syntax error at line 2" in run.stderr


def test_math_sanity_of_intensity() -> None:
    report = analyze_op("matmul", shapes=[(4096, 4096, 4096)], dtype="bf16", baseline=None, machine=fake_profile())
    row = report["shapes"][0]
    assert row["bound"] == "compute"
    assert math.isclose(row["arithmetic_intensity"], 2 * 4096**3 / (3 * 4096 * 4096 * 2), rel_tol=1e-9)


def test_a_gemm_baseline_without_persistent_inputs_is_told_to_name_them(tmp_path: Path) -> None:
    """The shipped linear example names its weight and bias, and the analysis reports them; a copy
    without PERSISTENT_INPUTS gets a note saying what the benchmark would then time (a weight
    fresh from a copy, in the cache) and what to add. A Model form keeps its weights as
    parameters, reused by every call, and gets a note of its own."""
    shipped = analyze_op("linear", shapes=None, dtype=None, baseline=EXAMPLES / "linear" / "baseline.py",
                         machine=fake_profile())
    assert shipped["kind"] == "gemm" and shipped["baseline"]["persistent_inputs"] == [1, 2]
    assert not any("PERSISTENT_INPUTS" in note for note in shipped["notes"])
    bare = tmp_path / "baseline.py"
    bare.write_text((EXAMPLES / "linear" / "baseline.py").read_text().replace("PERSISTENT_INPUTS = (1, 2)", ""))
    report = analyze_op("linear", shapes=None, dtype=None, baseline=bare, machine=fake_profile())
    assert report["baseline"]["persistent_inputs"] == []
    assert any("names no PERSISTENT_INPUTS" in note and str(bare) in note for note in report["notes"])
    model = analyze_op("my_proj", shapes=None, dtype=None, baseline=DATA / "gemm_baseline.py", machine=fake_profile())
    assert model["kind"] == "gemm" and not any("names no PERSISTENT_INPUTS" in note for note in model["notes"])
    # a Model's parameters are reused call after call: timed from the cache when they fit
    assert any("Model parameters" in note and "PERSISTENT_INPUTS" in note for note in model["notes"])
    # decode attention: the KV cache persists (the note names it); prefill attention's K and V
    # are the current tokens' activations, so it gets no note
    decode = tmp_path / "decode.py"
    decode.write_text((EXAMPLES / "decode_attention" / "baseline.py").read_text()
                      .replace("PERSISTENT_INPUTS = (1, 2)", ""))
    report = analyze_op("my_attn", shapes=None, dtype=None, baseline=decode, machine=fake_profile())
    assert report["kind"] == "attention"
    assert any("names no PERSISTENT_INPUTS" in note and "KV cache" in note for note in report["notes"])
    prefill = analyze_op("attention", shapes=None, dtype=None, baseline=DATA / "attention_baseline.py",
                         machine=fake_profile())
    assert not any("PERSISTENT_INPUTS" in note for note in prefill["notes"])
