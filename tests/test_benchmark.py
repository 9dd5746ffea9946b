"""scripts/benchmark_cpu.py: honest kernels pass, the contract's exit codes, the
JSON keys, timing and speedup reporting, tiers, the oracle rules, loading."""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy
import pytest
import torch
from bench_helpers import BASELINES, FAST, KERNELS, RMS, ROOT, checks, load_script, run_bench

from kernel_harness.bench import stats
from kernel_harness.bench.pinning import detect_pinning, parse_cpu_list
from kernel_harness.bench.process import is_steady_malloc, with_steady_malloc
from kernel_harness.bench.runner import DRIFT_NOTE, _spot_rounds
from kernel_harness.errors import KernelCrashed, UsageError
from kernel_harness.kernel_loader import kernel_name_from_build_toml, load_kernel_module, resolve_op

STABLE_KEYS = {"correct", "failures", "baseline_us", "kernel_us", "speedup", "iqr", "threads",
               "pinned", "tiers", "acceptance_rule", "aten_ops", "versions", "machine"}


pytestmark = pytest.mark.usefixtures("bench_kernels")


# --------------------------------------------------------------------------- honest kernels


def test_honest_kernel_passes_with_a_full_report(tmp_path):
    code, report = run_bench(tmp_path, RMS, "--kernel-package", "bk_honest", "--op",
                             "bk_honest.rms_norm", "--rounds", "4", "--calls", "5")
    assert code == 0, report["failures"]
    assert STABLE_KEYS <= set(report)
    assert report["correct"] is True and report["failures"] == []
    assert report["acceptance_rule"] == "tolerance"
    assert report["baseline_us"] > 0 and report["kernel_us"] > 0
    # trial_manager.py checks this consistency (2 %); the JSON rounds to 3 decimals
    assert report["speedup"] == pytest.approx(report["baseline_us"] / report["kernel_us"], rel=1e-2)
    assert report["speedup_paired"] > 0
    lo, hi = report["speedup_ci"]
    assert lo <= report["speedup"] <= hi
    assert report["timing"]["kernel"]["calls"] == 20 and report["timing"]["baseline"]["calls"] == 20
    assert report["timing"]["verified_timed_calls"] == 4  # the default count
    assert report["threads"] == torch.get_num_threads()
    assert isinstance(report["pinned"], bool)
    assert report["tolerances"]["float32"] == "|k - r| <= 1e-06 + 1e-05 * |r|"
    assert report["tolerances"]["float64"] == "|k - r| <= 1e-12 + 1e-09 * |r|"
    # 3 seeded get_inputs() sets + 2 get_correctness_inputs() sets
    assert len(report["input_sets"]) == 5
    assert "aten.bmm" in report["aten_ops"]["kernel"] and report["delegation"] is False
    assert report["versions"]["torch"] == torch.__version__
    assert report["throughput"]["gbps"] > 0
    assert report["machine"]["logical_cpus"] >= 1
    assert report["timing"]["processes_per_side"] == 1


def test_timing_rounds_rotate_over_worker_processes(tmp_path):
    code, report = run_bench(tmp_path, RMS, "--kernel-package", "bk_honest", "--op",
                             "bk_honest.rms_norm", "--rounds", "4", "--calls", "3", "--processes", "2")
    assert code == 0, report["failures"]
    assert report["timing"]["processes_per_side"] == 2
    assert report["timing"]["kernel"]["calls"] == 12 and report["timing"]["baseline"]["calls"] == 12
    assert report["timing"]["verified_timed_calls"] == 4
    lo, hi = report["speedup_ci"]
    assert lo <= report["speedup"] <= hi


def test_bad_process_count_is_a_usage_error(tmp_path):
    code, _ = run_bench(tmp_path, RMS, "--kernel-package", "bk_honest", "--op", "bk_honest.rms_norm",
                        "--processes", "0")
    assert code == 2


def test_slower_kernel_passes_and_reports_it(tmp_path):
    code, report = run_bench(tmp_path, RMS, "--kernel-package", "bk_honest_slow", "--op",
                             "bk_honest_slow.rms_norm", *FAST)
    assert code == 0  # the speedup is data, not an exit code
    assert report["speedup"] < 1.0
    assert report["speedup_verdict"] == "kernel slower"


def test_delegating_kernel_is_flagged(tmp_path):
    code, report = run_bench(tmp_path, RMS, "--kernel-package", "bk_delegating", "--op",
                             "bk_delegating.rms_norm", *FAST)
    assert code == 0
    assert report["delegation"] is True
    assert any("delegation" in n for n in report["notes"])


def test_model_form_baseline(tmp_path):
    code, report = run_bench(tmp_path, str(BASELINES / "model_form.py"), "--kernel-package",
                             "bk_softmax_scaled", "--op", "bk_softmax_scaled.softmax", *FAST)
    assert code == 0, report["failures"]


def test_tuple_output_and_wrong_second_output(tmp_path):
    base = str(BASELINES / "tuple_out.py")
    code, _ = run_bench(tmp_path, base, "--kernel-package", "bk_tuple", "--op", "bk_tuple.add_twice", *FAST)
    assert code == 0
    code, report = run_bench(tmp_path, base, "--kernel-package", "bk_tuple", "--op",
                             "bk_tuple.add_twice_bad", *FAST)
    assert code == 1
    failure = report["failures"][0]
    assert failure["path"] == "out[1]" and failure["diagnosis"] == "wrong-second-output"
    assert failure["worst_index"] is not None and failure["ulps"] is not None
    assert report["timing"]["skipped"]
    assert report["reliable"] is None  # nothing was timed, so nothing to trust or distrust


def test_cached_baseline_is_reused_and_said(tmp_path):
    code, report = run_bench(tmp_path, RMS, "--kernel-package", "bk_honest", "--op",
                             "bk_honest.rms_norm", "--baseline-us", "250", "--rounds", "8", "--calls", "3")
    assert code == 0
    assert report["baseline_cached"] is True and report["baseline_us"] == 250
    assert report["timing"]["baseline"] is None
    assert report["speedup"] == pytest.approx(250 / report["kernel_us"], rel=1e-2)
    # the baseline still ran in spot rounds; a made-up 250 us is far from its real time
    spot = report["baseline_spot_us"]
    assert spot > 0 and report["timing"]["baseline_spot"]["rounds"] >= 1
    assert report["baseline_drift"] == pytest.approx(spot / 250 - 1, rel=1e-2, abs=1e-3)
    # the spot ratio is the spot rounds over the kernel rounds timed beside them, not over
    # all kernel rounds (on a busy machine the two kernel medians differed by 35 %)
    assert report["kernel_spot_us"] > 0
    assert report["speedup_spot"] == pytest.approx(spot / report["kernel_spot_us"], rel=1e-3)
    # the spot ratio carries its own (wide) interval from three spot rounds on, so the
    # trial tree can decide by it; fewer pairs give no interval rather than a false one
    assert report["timing"]["baseline_spot"]["rounds"] == 4  # spread over the 8 rounds
    low, high = report["speedup_spot_ci"]
    assert low <= report["speedup_spot"] <= high and low < high
    drift_notes = [n for n in report["notes"] if n.startswith("baseline drift")]
    assert bool(drift_notes) == (abs(report["baseline_drift"]) > DRIFT_NOTE)


def test_spot_rounds_are_spread_and_skip_the_first():
    for rounds in range(1, 41):
        spots = _spot_rounds(rounds)
        assert 1 <= len(spots) <= 4 and all(0 <= r < rounds for r in spots)
        if rounds > 1:
            assert 0 not in spots  # right after the warm-up
        if rounds >= 8:
            assert len(spots) == 4 and max(spots) >= rounds // 2


def test_uncached_run_reports_no_drift(tmp_path):
    code, report = run_bench(tmp_path, RMS, "--kernel-package", "bk_honest", "--op", "bk_honest.rms_norm", *FAST)
    assert code == 0 and report["baseline_cached"] is False
    assert report["baseline_spot_us"] is None and report["baseline_drift"] is None
    assert report["speedup_spot"] is None


def test_cold_cache_rotation(tmp_path):
    code, report = run_bench(tmp_path, RMS, "--kernel-package", "bk_honest", "--op",
                             "bk_honest.rms_norm", "--cold", "--rounds", "2")
    assert code == 0
    assert report["timing"]["cold"] is True
    assert report["timing"]["calls_per_round"] > 3  # enough sets to exceed the LLC (or the cap)


# --------------------------------------------------------------------------- accuracy rules


SILU = str(BASELINES / "silu_mul_bf16.py")


def test_strict_bf16_rule_and_the_oracle_acceptance(tmp_path):
    # eager bf16 silu*mul rounds twice: one ulp off the float64 reference on many elements
    code, report = run_bench(tmp_path, SILU, "--kernel-package", "bk_silu", "--op", "bk_silu.eager", *FAST)
    assert code == 1
    assert {f["diagnosis"] for f in report["failures"]} == {"rounding-or-conversion"}
    assert report["would_pass_as_accurate"] is True
    code, report = run_bench(tmp_path, SILU, "--kernel-package", "bk_silu", "--op", "bk_silu.eager",
                             "--accept-if-as-accurate", *FAST)
    assert code == 0, report["failures"]
    assert report["acceptance_rule"] == "as-accurate-as-baseline"
    assert report["oracle"] and all(leaf["as_accurate"] for leaf in report["oracle"])
    # a kernel less accurate than the baseline is still rejected
    code, report = run_bench(tmp_path, SILU, "--kernel-package", "bk_silu", "--op", "bk_silu.sloppy",
                             "--accept-if-as-accurate", *FAST)
    assert code == 1
    assert not all(leaf["as_accurate"] for leaf in report["oracle"])


def test_widened_tolerance_is_reported(tmp_path):
    code, report = run_bench(tmp_path, SILU, "--kernel-package", "bk_silu", "--op", "bk_silu.eager",
                             "--rtol", "0.01", *FAST)
    assert code == 0
    assert report["acceptance_rule"] == "widened-tolerance"
    assert report["widened"] == {"atol": None, "rtol": 0.01}
    assert report["tolerances"]["bfloat16"] == "|k - r| <= 0.01 * |r|"


def test_oracle_report_on_a_correct_kernel(tmp_path):
    code, report = run_bench(tmp_path, RMS, "--kernel-package", "bk_honest", "--op",
                             "bk_honest.rms_norm", "--oracle", "fp64", *FAST)
    assert code == 0
    assert report["acceptance_rule"] == "tolerance"
    leaf = report["oracle"][0]
    assert leaf["kernel_error"] >= 0 and leaf["baseline_error"] >= 0


# --------------------------------------------------------------------------- tiers


def test_tier_sweep_marks_the_pick_and_asserts_dispatch(tmp_path, monkeypatch):
    from kernel_harness.cpu import has_isa

    if not has_isa("avx2"):
        pytest.skip("this CPU has no AVX2 tier to compare against")
    monkeypatch.setenv("BK_TIERED_PICK", "generic")
    args = [RMS, "--kernel-package", "bk_tiered", "--op", "bk_tiered.rms_norm", "--tier", "all",
            "--assert-dispatch", *FAST]
    code, report = run_bench(tmp_path, *args)
    assert code == 0, report["dispatch_violations"]
    tiers = report["tiers"]
    assert "generic" in tiers["swept"] and "avx2" in tiers["swept"]
    # the headline set plus each correctness set, each sorted fastest first
    assert len(tiers["by_input_set"]) == 3
    for entry in tiers["by_input_set"]:
        medians = [row["median_us"] for row in entry["rows"]]
        assert medians == sorted(medians)
        assert entry["rows"][0]["tier"] == "generic" and entry["rows"][0]["dispatched"]
    # the slow tier picked: the dispatcher lags the fastest by far more than 5 %
    monkeypatch.setenv("BK_TIERED_PICK", "avx2")
    code, report = run_bench(tmp_path, *args)
    assert code == 1
    assert report["correct"] is True and report["dispatch_violations"]
    # each violation was seen in the first three rounds and held in the confirmation rounds
    from kernel_harness.bench.sweep import CONFIRM_ROUNDS
    flagged = [e for e in report["tiers"]["by_input_set"]
               if any(v.startswith(e["input_set"] + ":") for v in report["dispatch_violations"])]
    assert flagged and all(e["confirm_rounds"] % CONFIRM_ROUNDS == 0 and e["confirm_rounds"] > 0
                           for e in flagged)
    # and reproduced in a second, fresh kernel worker before it counted
    assert all(e["fresh_worker_rounds"] == CONFIRM_ROUNDS and e["fresh_worker_lag_ci_pct"][0] > 5 for e in flagged)
    assert all(v.endswith("a fresh worker process saw it too") for v in report["dispatch_violations"])
    assert {e["regime"] for e in report["tiers"]["by_input_set"]} == {"steady"}  # RMS's sets are small


def test_a_dispatch_lag_fails_only_when_its_interval_clears_the_tolerance():
    from kernel_harness.bench.sweep import lag_verdict

    assert lag_verdict(4.0, (1.0, 7.0), 5.0) == "ok"
    # seen on a Zen 4 EPYC: 5.3 % behind, interval 1.6-9.7 %, tolerance 5 %
    assert lag_verdict(5.3, (1.6, 9.7), 5.0) == "undecided"
    assert lag_verdict(12.0, (-2.0, 25.0), 5.0) == "noise"
    assert lag_verdict(12.0, (6.0, 18.0), 5.0) == "violation"
    assert lag_verdict(12.0, None, 5.0) == "violation"  # too few rounds for an interval


def test_tier_all_needs_available_tiers(tmp_path):
    code, _ = run_bench(tmp_path, RMS, "--kernel-package", "bk_honest", "--op", "bk_honest.rms_norm",
                        "--tier", "all", *FAST)
    assert code == 2


def test_assert_dispatch_needs_tier_all(tmp_path):
    code, _ = run_bench(tmp_path, RMS, "--kernel-package", "bk_honest", "--op", "bk_honest.rms_norm",
                        "--assert-dispatch", *FAST)
    assert code == 2


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("name", ["no_get_inputs.py", "no_reference.py", "syntax_error.py",
                                  "inputs_not_list.py", "raises_on_import.py", "nondeterministic.py",
                                  "persistent_not_positions.py", "persistent_twice.py",
                                  "persistent_past_the_inputs.py", "does_not_exist.py"])
def test_bad_baseline_files_exit_2(tmp_path, name, capsys):
    code, report = run_bench(tmp_path, str(BASELINES / name), "--kernel-package", "bk_honest",
                             "--op", "bk_honest.rms_norm", *FAST)
    assert code == 2
    assert report is None
    err = capsys.readouterr().err
    assert name in err and "Traceback" not in err


def test_wrong_op_path_exit_2(tmp_path, capsys):
    code, _ = run_bench(tmp_path, RMS, "--kernel-package", "bk_honest", "--op", "other.rms_norm", *FAST)
    assert code == 2
    assert "bk_honest.rms_norm" in capsys.readouterr().err


def test_help_states_the_exact_formulas():
    text = load_script().build_parser().format_help().replace("\n", " ")
    text = " ".join(text.split())
    for needle in ("|k - r| <= 0.00390625 * |r|", "|k - r| <= 0.00048828125 * |r|",
                   "|k - r| <= 1e-06 + 1e-05 * |r|", "|k - r| <= 1e-12 + 1e-09 * |r|",
                   "k == r (exact)", "NaN matches only NaN"):
        assert needle in text


def test_script_runs_from_any_directory(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "benchmark_cpu.py"), "--help"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert proc.returncode == 0 and "--kernel-package" in proc.stdout


# --------------------------------------------------------------------------- units


def test_kernel_loader_errors(tmp_path):
    module = load_kernel_module("bk_tuple")
    assert resolve_op(module, "bk_tuple.add_twice")(torch.ones(1), torch.ones(1))[1].item() == 4
    with pytest.raises(UsageError, match="bk_tuple.add_twice"):
        resolve_op(module, "wrong.add_twice")
    with pytest.raises(UsageError, match="add_twice_bad"):
        resolve_op(module, "bk_tuple.nothing_here")
    with pytest.raises(UsageError):
        resolve_op(module, "bk_tuple")
    with pytest.raises(KernelCrashed, match="not installed"):
        load_kernel_module("bk_no_such_package_here")
    with pytest.raises(KernelCrashed, match="build.toml"):
        load_kernel_module(str(tmp_path))
    (tmp_path / "build.toml").write_text('[general]\nname = "my_kernel"\n')
    with pytest.raises(KernelCrashed, match="build"):
        load_kernel_module(str(tmp_path))
    # kernel-builder's dashed spelling names the underscored package --op uses
    (tmp_path / "build.toml").write_text('[general]\nname = "my-kernel"\n')
    assert kernel_name_from_build_toml(tmp_path) == "my_kernel"


def test_measurement_statistics():
    m = stats.Measurement("k", [[1000, 2000, 3000], [4000, 5000]])
    assert m.count == 5 and m.median_us == 3.0 and m.min_us == 1.0
    assert m.iqr_us == pytest.approx(2.0)
    assert m.noisy
    steady = stats.Measurement("s", [[1000, 1010, 1005, 995]])
    assert not steady.noisy


def test_speedup_interval_and_verdicts():
    import random

    rng = random.Random(0)

    def rounds(center):
        return [[int(center * rng.uniform(0.97, 1.03)) for _ in range(5)] for _ in range(10)]

    same = stats.speedup(stats.Measurement("b", rounds(1000)), stats.Measurement("k", rounds(1000)))
    assert same.includes_one and same.verdict() == "no measurable difference"
    faster = stats.speedup(stats.Measurement("b", rounds(2000)), stats.Measurement("k", rounds(1000)))
    assert faster.ci_low > 1.5 and faster.verdict() == "kernel faster"


def test_speedup_interval_resamples_blocks_of_neighbouring_rounds():
    """A slow phase lasting several rounds is one event, not several independent ones."""
    from kernel_harness.bench.stats import _block_picks

    picks = _block_picks(16, 200, numpy.random.default_rng(1))
    assert picks.shape == (200, 16)
    steps = numpy.diff(picks, axis=1) % 16
    assert (steps == 1).mean() > 0.6  # mostly runs of consecutive rounds (blocks of 4)


def test_speedup_interval_covers_disagreeing_worker_processes():
    """Rounds from two process pairs that disagree by 16 % must not give a narrow interval."""
    import random

    rng = random.Random(3)

    def measurement(label, centers):
        m = stats.Measurement(label)
        for r in range(20):
            group = r % 2
            m.add_round([int(centers[group] * rng.uniform(0.99, 1.01)) for _ in range(4)], group=group)
        return m

    base = measurement("b", (1000, 1000))
    kern = measurement("k", (920, 1080))  # pair 0 runs 8 % fast, pair 1 8 % slow
    pooled = stats.speedup(base, kern, seed=1)
    assert pooled.includes_one and pooled.ci_high - pooled.ci_low > 0.12
    one_process = stats.speedup(stats.Measurement("b", base.rounds[::2]),
                                stats.Measurement("k", kern.rounds[::2]), seed=1)
    assert not one_process.includes_one  # one pair alone looks like a real 8 % difference


def test_speedup_interval_never_claims_less_than_the_harness_can_reproduce():
    base = stats.Measurement("b", [[1000] * 4 for _ in range(20)])
    kern = stats.Measurement("k", [[970] * 4 for _ in range(20)])  # 3 %: steady, yet below the floor
    s = stats.speedup(base, kern)
    assert s.includes_one and s.verdict() == "no measurable difference"
    assert s.ci_high >= s.value * (1 + stats.REPRODUCIBILITY_FLOOR) - 1e-12


def test_pinning_detection():
    assert parse_cpu_list("0-2,5") == {0, 1, 2, 5}
    assert detect_pinning().pinned is False  # the test suite itself is not pinned
    if shutil.which("numactl") is None:
        pytest.skip("numactl is not installed")
    code = "from kernel_harness.bench.pinning import detect_pinning; print(detect_pinning().pinned)"
    proc = subprocess.run(["numactl", "--cpunodebind=0", "--membind=0", sys.executable, "-c", code],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    if proc.returncode != 0 and "set_mempolicy" in proc.stderr:
        pytest.skip(f"numactl cannot bind here: {proc.stderr.strip()}")
    assert proc.stdout.strip() == "True", proc.stderr


# --------------------------------------------------------------------------- catalogue


@pytest.mark.slow
def test_generated_catalogue_kernels_in_every_dtype(tmp_path, request):
    """The build issue's generated kernels pass on the examples in fp32, bf16 and fp16."""
    try:
        kernel_dir = request.getfixturevalue("catalogue_kernel_dir")
    except pytest.FixtureLookupError:
        pytest.skip("the catalogue_kernel_dir fixture (tests/fixtures_kernels.py) is not available yet")
    for op in ("rms_norm", "softmax", "silu_and_mul"):
        baseline = ROOT / "examples" / op / "baseline.py"
        code, report = run_bench(tmp_path, str(baseline), "--kernel-package", str(kernel_dir),
                                 "--op", f"harness_catalogue.{op}", "--accept-if-as-accurate",
                                 "--rounds", "3", "--calls", "3")
        assert code == 0, (op, report and report["failures"][:3])
        dtypes = {m.group(1) for label in report["input_sets"]
                  if (m := re.search(r"\] \((\w+)\[", label))}
        assert {"float32", "bfloat16", "float16"} <= dtypes
        assert report["delegation"] is False
        assert not checks(report)


def test_copy_pool_round_trip():
    """Timed outputs are kept through preallocated buffers; what comes back must be exact."""
    from kernel_harness.bench.tree import bitwise_equal
    from kernel_harness.bench.worker import CopyPool

    pool = CopyPool()
    obj = ((torch.randn(3, 5).to(torch.bfloat16), {"m": torch.tensor([True, False])}),
           [torch.arange(6, dtype=torch.int64).reshape(2, 3)[:, 1], torch.tensor(2.5), 7])
    template = pool.store(0, obj)
    buffer_before = pool.buffers[0].data_ptr()
    back = pool.load(0, template)
    assert bitwise_equal(back, obj) and back[1][2] == 7 and isinstance(back[0][1], dict)
    # a second store of the same size reuses the buffer: no allocation between timed calls
    pool.store(0, obj)
    assert pool.buffers[0].data_ptr() == buffer_before


def test_calibration_bounds():
    from kernel_harness.bench.runner import _calibrate

    # a 10 us op: many calls per round, capped at 50
    assert _calibrate(10e3, 5e3, 0.02, 20, 14.0, sides=2) == 50
    # a 100 ms op with a 40 ms input draw: the budget allows one call per round
    assert _calibrate(100e6, 40e6, 0.02, 20, 14.0, sides=2) == 1


def test_tier_sweep_sizes_its_rounds_by_the_input_draw_too():
    """linear's correctness sets cost ~1 s to draw (get_correctness_inputs() is drawn whole):
    thirty calls per round made one --tier all run last over half an hour."""
    from kernel_harness.bench.sweep import sweep_calls

    assert sweep_calls(10e3, 50e3) == 30  # a cheap op on cheap inputs: ~10 ms of calls, capped
    assert sweep_calls(5e6, 0.0) == 3  # a 5 ms op: at least three calls
    assert sweep_calls(2e6, 1e9) == 1  # a second to draw each set: one call per round
    assert sweep_calls(1e6, 0.1e9) == 4  # within half a second per round


_COUNTING_BASELINE = """
import torch
DRAWS = []

def get_inputs():
    DRAWS.append("inputs")
    return [torch.randn(4, 8)]

def get_correctness_inputs():
    DRAWS.append("correctness")
    return [[torch.randn(3, 5)], [torch.randn(2, 7)]]

def get_reference_output(x):
    return x * 2
"""


def test_the_tier_sweep_times_steady_calls_on_one_draw(tmp_path):
    """The sweep's calls must not each follow a draw: a correctness set is drawn with all
    its siblings, which evicted the caches of small calls (a 3x13 call read 80-170 us
    instead of 7, and the tiers' order flipped between processes). One draw per round,
    each call on a copy at a new address with the same values; the headline timing
    keeps a fresh draw per call."""
    from kernel_harness.baseline import load_baseline
    from kernel_harness.bench.worker import Worker

    path = tmp_path / "counting_baseline.py"
    path.write_text(_COUNTING_BASELINE)
    worker = Worker()
    worker.baseline = load_baseline(path)
    seen = []
    worker.op = lambda x: seen.append((x.data_ptr(), x.clone())) or x * 2
    draws = worker.baseline.module.DRAWS
    reply = worker.time({"source": ["correctness", 1], "seeds": [11, 12, 13, 14], "keep": False,
                         "warmup": 1, "steady": True})
    assert draws == ["correctness"]
    assert len(reply["times_ns"]) == 3  # the first call is the warm-up
    assert len({ptr for ptr, _ in seen}) == 4  # a new address every call
    assert all(torch.equal(x, seen[0][1]) and x.shape == (2, 7) for _, x in seen)
    draws.clear()
    worker.time({"source": ["correctness", 1], "seeds": [11, 12, 13], "keep": False})
    assert draws == ["correctness"] * 3  # not steady: a fresh draw for every call


_PERSISTENT_BASELINE = """
import torch
PERSISTENT_INPUTS = (1,)

def get_inputs():
    return [torch.randn(4, 8), torch.randn(300, 8)]

def get_correctness_inputs():
    return [[torch.randn(2, 8), torch.randn(5, 8)]]

def get_reference_output(x, weight):
    return x @ weight.T
"""


class _RecordingScrubber:
    def __init__(self, events):
        self.events = events

    def scrub(self):
        self.events.append("scrub")


def test_persistent_inputs_are_evicted_between_their_copy_and_the_activations(tmp_path, monkeypatch):
    """A weight copied just before the call sits dirty in the L3, where oneDNN beat our
    bf16 tiles by 7 % at M = 128 on a Zen 4 and failed --assert-dispatch; read from memory,
    as a model reads it, ours was faster. So a fresh call's PERSISTENT_INPUTS are copied
    first, the caches scrubbed, and only then the activations copied (they stay cached,
    as a previous layer's output). The steady and --cold regimes are left alone."""
    from kernel_harness.baseline import load_baseline
    from kernel_harness.bench.worker import Worker

    path = tmp_path / "persistent_baseline.py"
    path.write_text(_PERSISTENT_BASELINE)
    worker = Worker()
    worker.baseline = load_baseline(path)
    assert worker.baseline.persistent_inputs == (1,)
    events: list[str] = []
    worker.scrubber = _RecordingScrubber(events)
    relocate = worker.relocator.relocate

    def recording_relocate(value, seed):
        events.append("weight" if isinstance(value, torch.Tensor) and value.shape[0] in (300, 5) else "x")
        return relocate(value, seed)

    worker.relocator.relocate = recording_relocate
    seen = []
    worker.op = lambda x, w: seen.append((x.clone(), w.clone())) or x @ w.T
    worker.time({"source": ["inputs", 0], "seeds": [3, 4], "keep": False})
    assert events == ["weight", "scrub", "x"] * 2
    # the values are the draw's: moving them changed addresses only
    for seed, (x, w) in zip([3, 4], seen):
        drawn = worker.baseline.draw_inputs(seed)
        assert torch.equal(x, drawn[0]) and torch.equal(w, drawn[1])
    # an activation the relocator leaves in place (here: not contiguous) is read back into
    # the cache after the scrub, so the activations are cached whatever their layout
    from kernel_harness.bench import eviction

    read_back: list[torch.Tensor] = []
    monkeypatch.setattr(eviction, "_read_into_cache", read_back.append)
    strided_x = torch.randn(8, 4).T
    placed = eviction.place_from_memory([strided_x, torch.randn(5, 8)], (1,),
                                        lambda position, value: worker.relocator.relocate(value, position),
                                        _RecordingScrubber([]))
    assert placed[0] is strided_x and len(read_back) == 1 and read_back[0] is strided_x
    for regime in ({"steady": True, "warmup": 1}, {"cold": True}):
        events.clear()
        worker.time({"source": ["correctness", 0], "seeds": [5, 6, 7], "keep": False, **regime})
        assert "scrub" not in events


def test_a_loop_rotates_through_enough_copies_of_the_persistent_inputs():
    """A loop that cannot scrub between calls (the profiler's) rotates through copies of the
    weights that together exceed the scrub size; the activations are shared, values equal."""
    from kernel_harness.bench.eviction import MAX_ROTATED_COPIES, SCRUB_LLC_MULTIPLE, rotated_sets

    x, w, eps = torch.randn(4, 8), torch.randn(1 << 18), 1e-6  # a 1 MiB weight
    sets = rotated_sets([x, w, eps], (1,), llc_bytes=1 << 20, domains=1)
    assert len(sets) == SCRUB_LLC_MULTIPLE  # 3 MiB of copies of a 1 MiB weight
    assert len({s[1].data_ptr() for s in sets}) == len(sets) and w.data_ptr() not in {s[1].data_ptr() for s in sets}
    assert all(s[0] is x and s[2] == eps and torch.equal(s[1], w) for s in sets)
    assert len(rotated_sets([x, torch.randn(1 << 20), eps], (1,), llc_bytes=1 << 20, domains=1)) == 2  # >= two
    assert rotated_sets([x, w, eps], (), llc_bytes=1 << 20) == [[x, w, eps]]  # nothing named: one list
    assert len(rotated_sets([x, w], (1, 5), llc_bytes=1 << 20, domains=1)) == 3  # past a short set: left out
    assert len(rotated_sets([x, w], (1,), llc_bytes=1 << 20, domains=2)) == 6  # an L3 per core complex
    assert len(rotated_sets([x, torch.tensor(2.0)], (1,), llc_bytes=1 << 20, domains=1)) == MAX_ROTATED_COPIES


def test_a_report_says_which_inputs_came_from_memory(tmp_path):
    path = tmp_path / "persistent_rms.py"
    path.write_text(Path(RMS).read_text() + "\nPERSISTENT_INPUTS = (1,)\n")
    code, report = run_bench(tmp_path, str(path), "--kernel-package", "bk_honest", "--op",
                             "bk_honest.rms_norm", *FAST)
    assert code == 0, report["failures"]
    regime = report["timing"]["inputs_from_memory"]
    assert regime["positions"] == [1] and regime["scrub_bytes"] >= 2 * 2**20
    assert report["conditions"]["inputs_from_memory"] == [1]  # carried into a trial's conditions
    code, report = run_bench(tmp_path, RMS, "--kernel-package", "bk_honest", "--op",
                             "bk_honest.rms_norm", *FAST)
    assert report["timing"]["inputs_from_memory"] is None and report["conditions"]["inputs_from_memory"] == []
    # --cold: every input from memory, the activations too; not comparable with either regime
    code, report = run_bench(tmp_path, str(path), "--kernel-package", "bk_honest", "--op",
                             "bk_honest.rms_norm", "--cold", "--rounds", "2")
    assert code == 0 and report["timing"]["inputs_from_memory"] is None
    assert report["conditions"]["inputs_from_memory"] is None


def test_a_dispatch_lag_inside_the_sweeps_interval_is_not_a_violation(tmp_path, monkeypatch):
    """bk_tiered's avx2 tier sleeps 2 ms more than generic; with a jitter larger than
    that (BK_TIERED_JITTER) on every tier, the picked avx2's lag is not separated from the
    noise of three rounds, and --assert-dispatch must not fail on it."""
    from kernel_harness.cpu import has_isa

    if not has_isa("avx2"):
        pytest.skip("this CPU has no AVX2 tier to compare against")
    monkeypatch.setenv("BK_TIERED_PICK", "avx2")
    monkeypatch.setenv("BK_TIERED_JITTER", "0.2")
    code, report = run_bench(tmp_path, RMS, "--kernel-package", "bk_tiered", "--op", "bk_tiered.rms_norm",
                             "--tier", "all", "--assert-dispatch", *FAST)
    entries = report["tiers"]["by_input_set"]
    for entry in entries:
        assert entry["dispatch_lag_ci_pct"] is not None
        if entry["dispatch_lag_ci_pct"][0] <= 0:  # the interval reaches "no lag"
            assert not any(v.startswith(entry["input_set"] + ":") for v in report["dispatch_violations"])
    assert code == (1 if report["dispatch_violations"] else 0)


# ------------------------------------------------------------- allocator steady state


def test_steady_malloc_adds_the_tcache_tunable_and_keeps_the_users():
    env = with_steady_malloc({})
    assert env["GLIBC_TUNABLES"] == "glibc.malloc.tcache_count=0"
    assert is_steady_malloc(env) and not is_steady_malloc({})
    # the user's own tunables stay, and a tcache_count they chose wins
    mine = with_steady_malloc({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2", "MALLOC_MMAP_THRESHOLD_": "1"})
    assert mine["GLIBC_TUNABLES"] == "glibc.malloc.arena_max=2:glibc.malloc.tcache_count=0"
    assert mine["MALLOC_MMAP_THRESHOLD_"] == "1"
    chosen = with_steady_malloc({"GLIBC_TUNABLES": "glibc.malloc.tcache_count=7"})
    assert chosen["GLIBC_TUNABLES"] == "glibc.malloc.tcache_count=7"


# PyTorch's allocation pattern for a large output: posix_memalign(64), written, freed.
_REALLOC_LOOP = """
import ctypes, resource
libc = ctypes.CDLL(None)
libc.posix_memalign.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t, ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
def call(size=8 << 20):
    p = ctypes.c_void_p()
    assert libc.posix_memalign(ctypes.byref(p), 64, size) == 0
    ctypes.memset(p, 1, size)
    libc.free(p)
call()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
    call()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the steady state is tuned for glibc's malloc")
def test_steady_malloc_reuses_the_pages_of_a_freed_aligned_output():
    """An 8 MB aligned block freed and asked for again comes back without page faults.

    With glibc's defaults the remainder of each aligned block sits in the
    tcache and the next block is carved from fresh pages (~2048 faults a call
    for several calls); the timing processes must not pay that.
    """
    env = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", "MALLOC_MMAP_THRESHOLD_",
                                                           "MALLOC_TRIM_THRESHOLD_")}
    run = subprocess.run([sys.executable, "-c", _REALLOC_LOOP], env=with_steady_malloc(env),
                         capture_output=True, text=True, timeout=60, check=True)
    faults = int(run.stdout)
    assert faults < 200, f"{faults} page faults in 20 reallocations of an 8 MB output (2048 pages each)"


def test_tier_sweep_rounds_go_through_every_order_of_the_tiers():
    """Each tier runs in every position and right after every other tier equally often (a rotation
    of three tiers would always put one right after the same other inside a round)."""
    import types

    from kernel_harness.bench import stats
    from kernel_harness.bench.sweep import _time_rounds

    ran: list[str] = []
    session = types.SimpleNamespace(kworker=object(), set_tier=ran.append,
                                    time=lambda *a, **k: ([1.0], None, None))
    inputs = types.SimpleNamespace(source=None, label="set")
    tiers = ["generic", "avx2", "avx512"]
    meas = {t: stats.Measurement(t) for t in tiers}
    _time_rounds(session, inputs, tiers, rounds=6, n=1, steady=True, meas=meas)
    rounds = [ran[i:i + 3] for i in range(0, len(ran), 3)]
    assert len({tuple(r) for r in rounds}) == 6 and all(len(m.rounds) == 6 for m in meas.values())
    for t in tiers:
        assert sorted(r.index(t) for r in rounds) == [0, 0, 1, 1, 2, 2]
        assert sorted(r[r.index(t) - 1] for r in rounds if r.index(t) > 0) == sorted(2 * [o for o in tiers if o != t])
    # the sweep's default three rounds alone already run every tier in every position once
    assert all(sorted(r[pos] for r in rounds[:3]) == sorted(tiers) for pos in range(3))
