"""Issue 19 on the benchmark side: the conditions every result carries, the
reliability verdict a busy machine cannot fool (tested with real busy
processes), the kernel build that was loaded, and --against (another build timed
side by side in the same rounds)."""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from bench_helpers import FAST, KERNELS, RMS, ROOT, run_bench, run_bench_subprocess

from kernel_harness.bench.conditions import MIN_CPU_WALL_RATIO, SideCpu, Watch, advice, assess

CONDITION_KEYS = {"cpu_model", "supported_tiers", "tier_ran", "threads", "pinned", "pinned_detail",
                  "load_before", "load_after", "oversubscribed", "omp_wait_policy", "cpu_wall_ratio",
                  "run_queue_max", "steal_fraction"}


pytestmark = pytest.mark.usefixtures("bench_kernels")


def _assert_honest_verdict(report):
    """Unreliable runs say why and what to do; reliable ones have no reasons."""
    if report["reliable"]:
        assert report["unreliable_reasons"] == []
    else:
        assert report["unreliable_reasons"]
        assert "stop the other jobs" in report["unreliable_advice"]


# --------------------------------------------------------------------------- conditions


def test_conditions_and_kernel_build_travel_with_the_result(tmp_path, monkeypatch):
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    code, report = run_bench(tmp_path, RMS, "--kernel-package", "bk_honest", "--op", "bk_honest.rms_norm",
                             *FAST, "--threads", "1")
    assert code == 0, report["failures"]
    c = report["conditions"]
    assert CONDITION_KEYS <= set(c)
    assert c["threads"] == 1 and c["omp_wait_policy"] == "PASSIVE"
    assert c["tier_ran"] is None  # a plain package: no dispatch_tier, no --tier
    assert set(c["cpu_wall_ratio"]) == {"kernel", "baseline"}
    assert all(0 < v <= 1.5 for v in c["cpu_wall_ratio"].values())
    assert c["run_queue_max"] >= 1 and isinstance(c["oversubscribed"], bool)
    assert report["kernel_build"] == {"module": "bk_honest", "build_id": None}
    assert report["vs_against"] is None
    import hashlib

    assert report["baseline_sha256"] == hashlib.sha256(Path(RMS).read_bytes()).hexdigest()
    _assert_honest_verdict(report)


def test_a_wait_policy_the_user_set_is_kept_and_recorded(tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    code, report = run_bench(tmp_path, RMS, "--kernel-package", "bk_honest", "--op", "bk_honest.rms_norm",
                             *FAST, "--tier", "generic")
    assert code == 0
    assert report["conditions"]["omp_wait_policy"] == "ACTIVE"
    assert report["conditions"]["tier_ran"] == "generic"  # forced


def test_report_prints_the_conditions_line(tmp_path):
    proc, report = run_bench_subprocess(tmp_path, RMS, "--kernel-package", "bk_honest", "--op",
                                        "bk_honest.rms_norm", *FAST)
    assert proc.returncode == 0, proc.stderr
    text = " ".join(proc.stdout.split())
    assert "conditions: " in text and "OMP_WAIT_POLICY=PASSIVE" in text and "build bk_honest" in text
    assert ("UNRELIABLE" in text) == (not report["reliable"])


def test_assess_names_each_sign_of_a_busy_machine():
    def watch(ratio=1.0, queue=(3, 3, 3), steal=0.0):
        w = Watch(threads=2, run_queue=list(queue), steal_fraction=steal)
        side = w.side("kernel")
        side.wall_ns, side.thread_cpu_ns, side.process_cpu_ns = 1000, int(1000 * ratio), int(2000 * ratio)
        return w

    # the sampler and two timing threads on a 2-CPU machine: nothing else runs
    measured, reasons, suggest = assess(watch(), cpus=2)
    assert reasons == [] and suggest is None and measured["oversubscribed"] is False
    assert advice(reasons, suggest, 2) is None
    # two busy loops: two more runnable tasks than fit
    measured, reasons, suggest = assess(watch(queue=(5, 5, 4)), cpus=2)
    assert measured["oversubscribed"] and "oversubscribed" in reasons[0] and suggest == 1
    assert "--threads 1" in advice(reasons, suggest, 2)
    # the timing thread descheduled for a third of the time
    _, reasons, _ = assess(watch(ratio=MIN_CPU_WALL_RATIO - 0.2), cpus=8)
    assert len(reasons) == 1 and "kernel worker's timing thread" in reasons[0]
    # where schedstat exists, the wait for a CPU decides, not the CPU/wall ratio: a thread
    # asleep at a passive OpenMP barrier reads low CPU time but never waited for a CPU
    w = watch(ratio=0.5)
    w.sides["kernel"].round_ns, w.sides["kernel"].wait_ns = 1000, 20
    assert assess(w, cpus=8)[1] == []
    w.sides["kernel"].wait_ns = 300
    _, reasons, _ = assess(w, cpus=8)
    assert len(reasons) == 1 and "waited for a CPU during 30 %" in reasons[0]
    _, reasons, _ = assess(watch(steal=0.2), cpus=8)
    assert "stole 20 %" in reasons[0]
    # one idle core left for a 1-thread side is not oversubscription
    w = Watch(threads=1, run_queue=[3, 3, 3])
    assert assess(w, cpus=2)[0]["oversubscribed"] is False
    assert SideCpu().thread_ratio is None


# --------------------------------------------------------------------------- busy machine


def _busy_loops(count):
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]


def test_busy_processes_never_give_a_confident_wrong_ratio(tmp_path):
    """Two real busy loops run during the whole benchmark of a kernel identical to its
    baseline (F.rms_norm): the run is marked unreliable, or it reads 0.8-1.25x."""
    busy = _busy_loops(2)
    try:
        code, report = run_bench(tmp_path, RMS, "--kernel-package", "bk_delegating", "--op",
                                 "bk_delegating.rms_norm", "--rounds", "6", "--calls", "10")
    finally:
        for proc in busy:
            proc.kill()
        for proc in busy:
            proc.wait()
    assert code == 0
    _assert_honest_verdict(report)
    assert report["reliable"] is False or 0.8 <= report["speedup"] <= 1.25, report["conditions"]
    assert report["conditions"]["run_queue_samples"] > 0


# --------------------------------------------------------------------------- --against


def test_against_a_slower_build_times_both_side_by_side(tmp_path, monkeypatch):
    # a spin of the call's own time: 2x slower, so that 6 rounds of a ~100 us Python op
    # (whose run-to-run noise hid a 30 % spin in one reliable run) call it slower
    monkeypatch.setenv("BK_SPIN_FRACTION", "1.0")
    code, report = run_bench(tmp_path, RMS, "--kernel-package", "bk_honest_spin", "--op",
                             "bk_honest_spin.rms_norm", "--against", "bk_honest", "--rounds", "6",
                             "--calls", "10", "--against-max-s", "0")
    assert code == 0, report["failures"]
    vs = report["vs_against"]
    assert vs["against"] == "bk_honest" and vs["against_build_id"] is None
    assert vs["ratio"] == pytest.approx(vs["against_us"] / vs["candidate_us"], rel=1e-2)
    lo, hi = vs["ci"]
    assert lo <= vs["ratio"] <= hi
    # the same rounds for all three sides; the other build's timed calls are verified too
    assert report["against"]["timing"]["rounds"] == report["timing"]["kernel"]["rounds"] == 6
    assert report["against"]["correct"] is True
    assert set(report["conditions"]["cpu_wall_ratio"]) == {"kernel", "baseline", "against"}
    # twice its own time: never faster, and slower unless the run says it is unreliable
    assert vs["verdict"] != "faster"
    assert vs["verdict"] == "slower" or report["reliable"] is False, (vs, report["conditions"])


def test_against_an_incorrect_build_gives_no_ratio(tmp_path):
    code, report = run_bench(tmp_path, RMS, "--kernel-package", "bk_honest", "--op", "bk_honest.rms_norm",
                             "--against", "bk_attack_uninit", "--against-max-s", "0", *FAST)
    assert code == 0  # the candidate is correct; the build it was compared with is not
    assert report["correct"] is True and report["vs_against"] is None
    assert report["against"]["correct"] is False and report["against"]["failures"]
    assert any(n.startswith("--against bk_attack_uninit") for n in report["notes"])


def test_against_a_build_that_cannot_load_is_exit_3(tmp_path):
    code, report = run_bench(tmp_path, RMS, "--kernel-package", "bk_honest", "--op", "bk_honest.rms_norm",
                             "--against", "bk_not_installed_anywhere", *FAST)
    assert code == 3
    assert report["crash"]["role"] == "against"


def test_against_times_both_builds_in_workers_of_the_same_history(tmp_path):
    """The candidate's checked worker also ran the ATen trace; the other build's did
    not. A kernel whose speed depends on that history (bk_history: 5x slower once
    traced) must still read the same as itself: both builds are timed by fresh workers.
    The effect is made large so that even a busy machine (which moved an identical
    build by at most ~15 % here under OMP_WAIT_POLICY=PASSIVE) cannot hide it."""
    code, report = run_bench(tmp_path, RMS, "--kernel-package", "bk_history", "--op", "bk_history.rms_norm",
                             "--against", "bk_history", "--rounds", "6", "--calls", "10",
                             "--against-max-s", "0")
    assert code == 0, report["failures"]
    vs = report["vs_against"]
    # timed by the traced worker, the candidate read ~0.2x of itself, called "slower".
    # How close a build reads to itself is the harness's precision, a property of many
    # runs (scripts/bench_harness_precision.py --mode against), not of one: with six
    # rounds and no extension (--against-max-s 0), fresh-clone CI runs of this ~100 us
    # op read 0.936x (CI 0.882-0.983) and 1.427x (CI 1.018-1.634, call IQRs 60 % of the
    # median), both marked reliable. What one run can show is the 5x history effect:
    # a build against itself stays within 2x either way.
    assert 0.5 <= vs["ratio"] <= 2.0, (vs, report["conditions"])


@pytest.mark.slow
def test_an_identical_build_against_itself(tmp_path, request):
    """The shared catalogue build, compared with itself: two processes load the same
    build; the interval contains 1.0 unless the run says it is unreliable."""
    try:
        kernel_dir = request.getfixturevalue("catalogue_kernel_dir")
    except pytest.FixtureLookupError:
        pytest.skip("the catalogue_kernel_dir fixture (tests/fixtures_kernels.py) is not available")
    # one run of eight rounds is a sample: a reliable run of a build against itself reads
    # within the noise a shared VM adds (its 9-of-10 precision is a benchmark,
    # scripts/bench_harness_precision.py --mode against, not a unit test: a 95 % interval
    # misses the truth in one run in twenty by design, and a fresh-clone CI run on the
    # Zen 4 read 1.28x with every worker's run-queue wait under the limit). So a reading
    # outside 0.8-1.25 gets a second, independent run: a bias of the harness (one side
    # favoured by its order, its process or its loading) reads outside in both.
    readings = []
    for _ in range(2):
        code, report = run_bench(tmp_path, str(ROOT / "examples" / "rms_norm" / "baseline.py"),
                                 "--kernel-package", str(kernel_dir), "--against", str(kernel_dir),
                                 "--op", "harness_catalogue.rms_norm", "--accept-if-as-accurate",
                                 "--rounds", "8", "--calls", "5", "--against-max-s", "0")
        assert code == 0, report and report["failures"][:3]
        build = report["kernel_build"]
        assert re.fullmatch(r"_harness_catalogue_cpu_[0-9a-f]{10}", build["module"])
        assert build["module"].endswith(build["build_id"])
        vs = report["vs_against"]
        assert vs["against_build_id"] == build["build_id"]
        assert report["conditions"]["tier_ran"] in report["conditions"]["supported_tiers"]
        lo, hi = vs["ci"]
        assert lo <= vs["ratio"] <= hi
        readings.append((vs, report["reliable"], report["conditions"]))
        if 0.8 <= vs["ratio"] <= 1.25 or not report["reliable"]:
            return
    assert False, f"a reliable run of a build against itself read outside 0.8-1.25 twice: {readings}"


# --------------------------------------------------------------------------- precision script


def _precision_script():
    import importlib.util

    path = ROOT / "scripts" / "bench_harness_precision.py"
    if str(path.parent) not in sys.path:
        sys.path.insert(0, str(path.parent))
    spec = importlib.util.spec_from_file_location("bench_harness_precision_under_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_precision_script_counts_each_target():
    script = _precision_script()

    def run(speedup=1.0, ci=(0.95, 1.05), reliable=True, vs=None):
        return {"speedup": speedup, "speedup_ci": list(ci), "speedup_paired": speedup,
                "reliable": reliable, "vs_against": vs, "wall_s": 10.0}

    same = {"ratio": 1.01, "ci": [0.96, 1.06], "verdict": "no measurable difference"}
    off = {"ratio": 1.05, "ci": [1.01, 1.10], "verdict": "faster"}
    s = script.summarize([run(vs=same), run(vs=same), run(vs=off)], "against")
    assert s["against_within_0.98_1.02"] == 2 and s["against_ci_contains_1"] == 2
    slow = {"ratio": 0.9, "ci": [0.85, 0.95], "verdict": "slower"}
    s = script.summarize([run(vs=slow), run(vs=same)], "slower")
    assert s["called_slower"] == 1 and s["called_faster"] == 0
    # how the added --against rounds ended, counted per reason
    ext = {"rounds": 44, "stopped": "precise", "seconds": 24.0}
    s = script.summarize([run(vs={**same, "rounds": ext}), run(vs={**same, "rounds": {**ext, "stopped": "time",
                                                                                      "rounds": 200, "seconds": 88.0}})],
                         "against")
    assert s["against_stopped"] == {"precise": 1, "time": 1} and s["against_rounds_median"] == 122
    # busy: a confident 10x counts only when the run admitted it was unreliable
    s = script.summarize([run(10.9, (7.4, 61)), run(10.9, (7.4, 61), reliable=False), run(1.1)], "identical")
    assert s["unreliable_or_within_0.8_1.25"] == 2 and s["unreliable"] == 1
    assert s["within_0.95_1.05"] == 0 and s["speedup_ci_contains_1"] == 1
    s = script.summarize([run(1.01), run(0.975), run(1.03)], "identical")
    assert s["within_0.98_1.02"] == 1 and s["within_0.95_1.05"] == 3



def test_precision_script_passes_absolute_paths_to_its_runs(tmp_path, monkeypatch):
    """Each run starts in a temporary directory, so a relative --baseline, a kernel
    directory or an --against directory given relative to the caller must reach it
    resolved (they pointed nowhere before: every run exited 2)."""
    script = _precision_script()
    seen = []

    def fake_run(baseline, package, op, extra, env):
        seen.append((baseline, package, extra))
        return {"exit": 0, "wall_s": 1.0, "load_before": 0.1, "speedup": 1.0, "speedup_ci": [0.95, 1.05],
                "speedup_paired": 1.0, "reliable": True, "vs_against": None, "stderr": ""}

    monkeypatch.setattr(script, "one_run", fake_run)
    kernel_dir = tmp_path / "kernel"
    kernel_dir.mkdir()
    (tmp_path / "base.py").write_text(Path(RMS).read_text())
    monkeypatch.chdir(tmp_path)
    assert script.main(["--runs", "1", "--mode", "against", "--baseline", "base.py",
                        "--kernel-package", "kernel", "--op", "kernel.rms_norm"]) == 0
    baseline, package, extra = seen[0]
    assert Path(baseline).is_absolute() and Path(baseline).is_file()
    assert package == str(kernel_dir) and extra[-2:] == ["--against", str(kernel_dir)]
    # an installed package name is passed on as it is
    assert script.main(["--runs", "1", "--mode", "slower"]) == 0
    assert seen[1][1] == "bk_native_spin" and seen[1][2][-2:] == ["--against", "bk_native"]
    # identical: the kernel is eager's own op, accepted by the fp64 oracle rule (eager's bf16
    # rms_norm flips ~30 of 4M elements by one ulp against the float64 ground truth)
    assert script.main(["--runs", "1", "--mode", "identical", "--extra", "--speedup-precision 2"]) == 0
    assert seen[2][2] == ["--oracle", "fp64", "--accept-if-as-accurate", "--speedup-precision", "2"]

def test_a_refreshed_baseline_is_judged_by_the_run_itself_not_the_load_average():
    """``trial_manager.py baseline-us --refresh`` times the value every later --baseline-us
    run divides by: with real busy loops on every CPU (started just now, so the load
    average still lags), it must say reliable: false, from the run's own detector."""
    from kernel_harness.bench.baseline_timing import time_baseline

    cpus = os.cpu_count() or 1
    if cpus > 8:
        pytest.skip(f"{cpus} CPUs: too many busy loops to start for this test")
    busy = _busy_loops(cpus)
    try:
        report = time_baseline(RMS, threads=1, rounds=4)
    finally:
        for proc in busy:
            proc.kill()
        for proc in busy:
            proc.wait()
    conditions = report["conditions"]
    assert conditions["run_queue_samples"] > 0 and "run_queue_wait" in conditions
    assert report["reliable"] is False and report["unreliable_reasons"], conditions
    assert conditions["oversubscribed"] is True


@pytest.mark.parametrize("pairs", [1, 2])
def test_three_sides_follow_each_other_equally_often(pairs):
    """With --against, each worker pair's rounds put every side in every position and
    right after every other side equally often (a bias-free comparison of two builds)."""
    from collections import Counter

    from kernel_harness.bench.timing import round_order

    sides = ("b", "k", "a")
    for pair in range(pairs):
        orders = [round_order(rnd, pairs, sides) for rnd in range(pair, 6 * pairs, pairs)]
        positions = Counter((side, order.index(side)) for order in orders for side in sides)
        follows = Counter((o[i], o[i + 1]) for o in orders for i in range(len(o) - 1))
        assert set(positions.values()) == {2} and len(positions) == 9
        assert set(follows.values()) == {2} and len(follows) == 6, follows
    # two sides keep the ABAB order: baseline first, then kernel first
    assert [round_order(r, 1, ("b", "k")) for r in range(4)] == [("b", "k"), ("k", "b")] * 2


@pytest.mark.parametrize("sides", [("b", "k", "a"), ("torch", "ours", "floor", "extra")])
def test_every_aligned_block_of_rounds_puts_each_side_in_each_position_once(sides):
    """A caller that stops after len(sides) rounds (the tier sweep's three) still runs every side
    in every position; all len(sides)! rounds give every order once."""
    from kernel_harness.bench.timing import round_order

    n, total = len(sides), math.factorial(len(sides))
    orders = [round_order(r, 1, sides) for r in range(total)]
    assert len(set(orders)) == total
    for start in range(0, total, n):
        block = orders[start:start + n]
        assert all(sorted(o[pos] for o in block) == sorted(sides) for pos in range(n)), block
