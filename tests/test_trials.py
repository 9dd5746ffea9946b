"""The trial tree: names, save/result/best/status/finalize, and that nothing is ever lost."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import PROJECT_ROOT, run_script
from kernel_harness.errors import CheckFailed, UsageError
from kernel_harness.trials import commands
from kernel_harness.trials.store import TrialStore
from kernel_harness.trials.decisions import FASTER, INTERVALS, SAME, compare

BASELINE = PROJECT_ROOT / "examples" / "rms_norm" / "baseline.py"


def make_kernel(root: Path, body: str = "int f() { return 1; }") -> Path:
    kernel = root / "kernel"
    (kernel / "demo_cpu").mkdir(parents=True, exist_ok=True)
    (kernel / "torch-ext" / "demo").mkdir(parents=True, exist_ok=True)
    (kernel / "build.toml").write_text('[general]\nname = "demo"\n')
    (kernel / "demo_cpu" / "demo_avx512.cpp").write_text(body)
    (kernel / "demo_cpu" / "cpu_features.hpp").write_text("#pragma once\n")
    (kernel / "torch-ext" / "torch_binding.cpp").write_text("// binding\n")
    (kernel / "torch-ext" / "demo" / "__init__.py").write_text("")
    # build products that must never be saved
    (kernel / "build" / "torch213-cxx11-cpu-x86_64-linux").mkdir(parents=True, exist_ok=True)
    (kernel / "build" / "torch213-cxx11-cpu-x86_64-linux" / "_demo.abi3.so").write_bytes(b"\x7fELF")
    (kernel / "dist").mkdir(exist_ok=True)
    (kernel / "dist" / "demo-0.1-py3-none-any.whl").write_bytes(b"PK")
    (kernel / "demo_cpu" / "demo_avx512.o").write_bytes(b"obj")
    (kernel / "torch-ext" / "demo" / "__pycache__").mkdir(exist_ok=True)
    (kernel / "torch-ext" / "demo" / "__pycache__" / "x.pyc").write_bytes(b"pyc")
    return kernel


@pytest.fixture
def workspace(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


def tree_files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*")) if root.exists() else []


# ------------------------------------------------------------------ names

@pytest.mark.parametrize("name", ["../x", "/abs", "a/b", "..", ".", "", "x" * 101, "a b", "a\\b", "é"])
def test_refused_names_write_nothing(tmp_path, name):
    proc = run_script("trial_manager", "init", name, BASELINE, cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout
    assert "trial-tree name" in proc.stderr and "Traceback" not in proc.stderr
    assert tree_files(tmp_path) == []
    assert not (tmp_path.parent / "x").exists()


def test_refused_names_for_every_command(tmp_path):
    for argv in (["save", "../x", ".", "--strategy", "s"], ["status", "a/b"], ["best", ".."],
                 ["baseline-us", "/abs"], ["finalize", "x" * 101, "out"], ["result", "..", "t0", "--correctness", "fail"]):
        proc = run_script("trial_manager", *argv, cwd=tmp_path)
        assert proc.returncode == 2, argv
    assert tree_files(tmp_path) == []


def test_hundred_character_name_is_accepted(workspace):
    commands.init("n" * 100, BASELINE, force=False)
    assert (workspace / "trials" / ("n" * 100) / "state.json").is_file()


# ------------------------------------------------------------------ init

def test_init_records_path_hash_and_copy(workspace):
    payload = commands.init("rms", BASELINE, force=False)
    tree = workspace / "trials" / "rms"
    assert payload["baseline"]["path"] == str(BASELINE.resolve())
    assert len(payload["baseline"]["sha256"]) == 64
    assert (tree / "baseline.py").read_text() == BASELINE.read_text()


def test_init_refuses_existing_tree_and_force_archives_it(workspace):
    commands.init("rms", BASELINE, force=False)
    commands.save("rms", make_kernel(workspace), strategy="first", parent=None)
    with pytest.raises(UsageError, match="already exists.*1 trial"):
        commands.init("rms", BASELINE, force=False)
    payload = commands.init("rms", BASELINE, force=True)
    archived = Path(payload["archived_previous"])
    assert (archived / "t0" / "build.toml").is_file()  # the old trial survives
    assert json.loads((archived / "state.json").read_text())["trials"][0]["strategy"] == "first"
    assert TrialStore("rms").load().trials == ()


def test_init_with_missing_baseline(workspace):
    with pytest.raises(UsageError, match="does not exist"):
        commands.init("rms", workspace / "nope.py", force=False)
    assert not (workspace / "trials" / "rms").exists()


def test_baseline_change_is_warned(workspace):
    baseline = workspace / "baseline.py"
    baseline.write_text("def get_inputs(): return []\n")
    commands.init("rms", baseline, force=False)
    assert commands.status("rms")[0]["warnings"] == [] or all("baseline" not in w for w in commands.status("rms")[0]["warnings"])
    baseline.write_text("def get_inputs(): return [1]\n")
    warnings = commands.save("rms", make_kernel(workspace), strategy="s", parent=None)["warnings"]
    assert any("changed since init" in w for w in warnings)


# ------------------------------------------------------------------ save

def test_save_copies_sources_only(workspace):
    commands.init("rms", BASELINE, force=False)
    payload = commands.save("rms", make_kernel(workspace), strategy="avx512 first cut", parent=None)
    assert payload["trial_id"] == "t0" and payload["parent"] is None
    saved = tree_files(workspace / "trials" / "rms" / "t0")
    assert "build.toml" in saved and "demo_cpu/demo_avx512.cpp" in saved
    assert "torch-ext/demo/__init__.py" in saved and "torch-ext/torch_binding.cpp" in saved
    assert not any(part in s for s in saved for part in ("build/", "dist", ".o", "__pycache__", ".so"))


def test_save_ids_parents_and_identical_warning(workspace):
    commands.init("rms", BASELINE, force=False)
    kernel = make_kernel(workspace)
    assert commands.save("rms", kernel, strategy="a", parent=None)["trial_id"] == "t0"
    second = commands.save("rms", kernel, strategy="b", parent="t0")
    assert second["trial_id"] == "t1" and second["parent"] == "t0"
    assert any("identical to trial t0" in w for w in second["warnings"])
    (kernel / "demo_cpu" / "demo_avx512.cpp").write_text("int f() { return 2; }")
    third = commands.save("rms", kernel, strategy="c", parent="t0")
    assert not any("identical" in w for w in third["warnings"])
    with pytest.raises(UsageError, match="not a trial"):
        commands.save("rms", kernel, strategy="d", parent="t9")
    assert len(TrialStore("rms").load().trials) == 3


def test_first_trial_cannot_name_a_parent(workspace):
    commands.init("rms", BASELINE, force=False)
    with pytest.raises(UsageError, match="first trial has no parent"):
        commands.save("rms", make_kernel(workspace), strategy="a", parent="t0")


def test_save_refuses_non_kernel_dir_and_empty_strategy(workspace):
    commands.init("rms", BASELINE, force=False)
    (workspace / "empty").mkdir()
    with pytest.raises(UsageError, match="no build.toml"):
        commands.save("rms", workspace / "empty", strategy="a", parent=None)
    with pytest.raises(UsageError, match="strategy"):
        commands.save("rms", make_kernel(workspace), strategy="  ", parent=None)
    assert TrialStore("rms").load().trials == ()


# ------------------------------------------------------------------ result

def test_result_validation(workspace):
    commands.init("rms", BASELINE, force=False)
    commands.save("rms", make_kernel(workspace), strategy="a", parent=None)

    def record(**kw):
        args = dict(correctness="pass", speedup=2.0, baseline_us=100.0, kernel_us=50.0, from_json=None, force=False)
        args.update(kw)
        return commands.result("rms", "t0", **args)

    for bad in ({"speedup": float("nan")}, {"kernel_us": -1.0}, {"baseline_us": 0.0},
                {"speedup": float("inf")}, {"kernel_us": None}):
        with pytest.raises(UsageError):
            record(**bad)
    with pytest.raises(UsageError, match="disagrees.*= 2"):
        record(speedup=2.1)
    assert record(speedup=2.03)["result"]["speedup"] == 2.03  # within 2 %
    with pytest.raises(UsageError, match="already has a result"):
        record()
    record(speedup=1.0, kernel_us=100.0, force=True)
    trial = TrialStore("rms").load().trial("t0")
    assert trial.result.speedup == 1.0 and trial.superseded_results[0].speedup == 2.03
    with pytest.raises(UsageError, match="not a trial"):
        commands.result("rms", "t7", correctness="fail", speedup=None, baseline_us=None, kernel_us=None,
                        from_json=None, force=False)


def benchmark_json(path: Path, **overrides) -> Path:
    data = {"correct": True, "speedup": 3.0, "baseline_us": 300.0, "kernel_us": 100.0, "iqr": 0.01,
            "threads": 2, "pinned": True, "failures": [], "acceptance_rule": "tolerance"}
    data.update(overrides)
    path.write_text(json.dumps(data))
    return path


def test_result_from_benchmark_json(workspace):
    commands.init("rms", BASELINE, force=False)
    commands.save("rms", make_kernel(workspace), strategy="a", parent=None)
    payload = commands.result("rms", "t0", correctness=None, speedup=None, baseline_us=None, kernel_us=None,
                              from_json=benchmark_json(workspace / "b.json"), force=False)
    assert payload["result"]["speedup"] == 3.0 and payload["result"]["details"]["pinned"] is True
    assert commands.baseline_us("rms")["baseline_us"] == 300.0
    assert commands.best("rms")["best_trial"] == "t0"


def record_benchmark_runs(workspace: Path, runs: list[dict]) -> None:
    """A tree whose trial k (children of t0) records benchmark JSON runs[k]."""
    commands.init("rms", BASELINE, force=False)
    kernel = make_kernel(workspace)
    for index, run in enumerate(runs):
        (kernel / "demo_cpu" / "demo_avx512.cpp").write_text(f"int f() {{ return {index}; }}")
        trial_id = commands.save("rms", kernel, strategy=f"change {index}",
                                 parent=None if index == 0 else "t0")["trial_id"]
        commands.result("rms", trial_id, correctness=None, speedup=None, baseline_us=None, kernel_us=None,
                        from_json=benchmark_json(workspace / f"b{index}.json", **run), force=False)


def test_trials_are_ranked_by_their_side_by_side_ratio(workspace):
    """A cached-baseline speedup shifts with the host's speed since the baseline was
    cached; the spot rounds of the same run do not, and they decide the best."""
    record_benchmark_runs(workspace, [
        # t0: measured side by side (no cache): 3.0x
        {"speedup": 3.0, "baseline_us": 300.0, "kernel_us": 100.0},
        # t1: the host slowed down after the baseline was cached: 2.5x against the cache,
        # 3.6x against the baseline timed in the same run
        {"speedup": 2.5, "baseline_us": 300.0, "kernel_us": 120.0, "baseline_cached": True,
         "speedup_spot": 3.6},
        # t2: the host sped up: 3.3x against the cache, 2.8x side by side
        {"speedup": 3.3, "baseline_us": 300.0, "kernel_us": 90.9, "baseline_cached": True,
         "speedup_spot": 2.8},
    ])
    best = commands.best("rms")
    assert best["best_trial"] == "t1" and best["speedup"] == 2.5 and best["speedup_side_by_side"] == 3.6
    payload, state, _ = commands.status("rms")
    assert payload["regression_of"] == "t2"  # slower than t0 side by side, though its cached ratio is higher
    labels = {t.id: t.result.speedup_label() for t in state.trials}
    assert labels == {"t0": "3.00x", "t1": "2.50x (3.60x side by side)", "t2": "3.30x (2.80x side by side)"}


def test_cached_baseline_trials_are_decided_by_their_spot_intervals(workspace):
    """With --baseline-us the ranking ratio is the spot ratio; its interval (a few spot
    rounds, so wide) decides, not its point estimate."""
    record_benchmark_runs(workspace, [
        {"speedup": 3.0, "baseline_us": 300.0, "kernel_us": 100.0, "speedup_ci": [2.8, 3.2]},
        # higher point, but the spot interval overlaps t0's: no measurable difference
        {"speedup": 3.1, "baseline_us": 300.0, "kernel_us": 97.0, "baseline_cached": True,
         "speedup_spot": 3.4, "speedup_spot_ci": [3.1, 3.8]},
        # separated from t0's interval: faster
        {"speedup": 4.0, "baseline_us": 300.0, "kernel_us": 75.0, "baseline_cached": True,
         "speedup_spot": 4.2, "speedup_spot_ci": [3.9, 4.5]},
    ])
    _, state, _ = commands.status("rms")
    assert commands.best("rms")["best_trial"] == "t2"
    assert compare(state.trial("t1"), state.trial("t0"), 0.05).verdict == SAME
    assert compare(state.trial("t1"), state.trial("t0"), 0.05).basis == INTERVALS
    assert compare(state.trial("t2"), state.trial("t0"), 0.05).verdict == FASTER


def test_older_cached_results_rank_by_their_drift(workspace):
    """A result recorded before speedup_spot existed still has baseline_drift:
    speedup * (1 + drift) is the same side-by-side ratio; junk values are ignored."""
    record_benchmark_runs(workspace, [
        {"speedup": 3.0, "baseline_us": 300.0, "kernel_us": 100.0, "baseline_cached": True, "baseline_drift": 0.2},
        {"speedup": 3.4, "baseline_us": 340.0, "kernel_us": 100.0, "baseline_cached": True, "speedup_spot": "inf"},
    ])
    best = commands.best("rms")
    assert best["best_trial"] == "t0" and best["speedup_side_by_side"] == pytest.approx(3.6)
    _, state, _ = commands.status("rms")
    assert state.trial("t1").result.ranking_speedup == 3.4  # its spot value is not a number


@pytest.mark.parametrize("content, fragment", [
    ("{not json", "not valid JSON"),
    ('{"speedup": 2}', "not a benchmark_cpu.py report"),
    ('{"correct": true, "speedup": 9, "baseline_us": 300, "kernel_us": 100}', "disagrees"),
])
def test_result_from_bad_json(workspace, content, fragment):
    commands.init("rms", BASELINE, force=False)
    commands.save("rms", make_kernel(workspace), strategy="a", parent=None)
    (workspace / "b.json").write_text(content)
    with pytest.raises(UsageError, match=fragment):
        commands.result("rms", "t0", correctness=None, speedup=None, baseline_us=None, kernel_us=None,
                        from_json=workspace / "b.json", force=False)
    assert TrialStore("rms").load().trial("t0").result is None


def test_failed_benchmark_json_records_a_failure(workspace):
    commands.init("rms", BASELINE, force=False)
    commands.save("rms", make_kernel(workspace), strategy="a", parent=None)
    path = benchmark_json(workspace / "b.json", correct=False, speedup=None, kernel_us=None)
    assert commands.result("rms", "t0", correctness=None, speedup=None, baseline_us=None, kernel_us=None,
                           from_json=path, force=False)["result"]["correct"] is False
    with pytest.raises(CheckFailed):
        commands.best("rms")


# ------------------------------------------------------------------ status and finalize

def build_history(workspace: Path, speedups: list[float | None], parents: list[str | None]) -> None:
    commands.init("rms", BASELINE, force=False)
    kernel = make_kernel(workspace)
    for index, (speedup, parent) in enumerate(zip(speedups, parents)):
        (kernel / "demo_cpu" / "demo_avx512.cpp").write_text(f"int f() {{ return {index}; }}")
        trial_id = commands.save("rms", kernel, strategy=f"change {index}", parent=parent)["trial_id"]
        if speedup is None:
            commands.result("rms", trial_id, correctness="fail", speedup=None, baseline_us=None, kernel_us=None,
                            from_json=None, force=False)
        else:
            commands.result("rms", trial_id, correctness="pass", speedup=speedup, baseline_us=100.0 * speedup,
                            kernel_us=100.0, from_json=None, force=False)


def test_status_reports_best_plateau_regression_and_budget(workspace):
    build_history(workspace, [2.0, 3.0, 2.5, 2.9], [None, "t0", "t1", "t1"])
    payload, _, _ = commands.status("rms")
    assert payload["best_trial"] == "t1"
    assert payload["trials_used"] == 4 and payload["max_trials"] >= 1
    assert payload["plateau"] is True
    assert payload["regression_of"] == "t3"
    assert any("--parent t1" in line for line in payload["advice"])
    assert any("Plateau" in line for line in payload["advice"])


def test_status_early_stop(workspace, tmp_path, monkeypatch):
    config = tmp_path / "cfg.yaml"
    import yaml

    values = yaml.safe_load((PROJECT_ROOT / "scripts" / "config.yaml").read_text())
    config.write_text(yaml.safe_dump({**values, "early_stop_speedup": 2.5}))
    monkeypatch.setenv("KERNEL_HARNESS_CONFIG", str(config))
    build_history(workspace, [2.0, 3.0], [None, "t0"])
    payload, _, _ = commands.status("rms")
    # typed-in speedups have no interval: a point estimate above the bar does not stop
    assert payload["early_stop"] is False and payload["early_stop_speedup"] == 2.5
    assert "no interval" in json.dumps(payload)


def test_status_cli_renders_tree(workspace):
    build_history(workspace, [2.0, None, 3.0], [None, "t0", "t0"])
    proc = run_script("trial_manager", "status", "rms", "--json", "s.json", cwd=workspace)
    assert proc.returncode == 0, proc.stderr
    assert "t2" in proc.stdout and "best" in proc.stdout and "incorrect" in proc.stdout
    assert json.loads((workspace / "s.json").read_text())["best_trial"] == "t2"


def test_finalize_copies_best_and_writes_summary(workspace):
    build_history(workspace, [2.0, 3.0, 1.0], [None, "t0", "t1"])
    payload = commands.finalize("rms", workspace / "output")
    out = workspace / "output"
    assert payload["best_trial"] == "t1"
    assert (out / "demo_cpu" / "demo_avx512.cpp").read_text() == "int f() { return 1; }"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["speedup"] == 3.0 and summary["baseline_us"] == 300.0 and len(summary["trials"]) == 3
    assert "t1 (best)" in (out / "summary.md").read_text()
    assert (out / "trial_tree.png").read_bytes()[:4] == b"\x89PNG"
    assert (out / "baseline.py").read_text() == BASELINE.read_text()


def test_finalize_without_correct_trial_refuses(workspace):
    build_history(workspace, [None], [None])
    proc = run_script("trial_manager", "finalize", "rms", "output", cwd=workspace)
    assert proc.returncode == 1 and "no correct trial" in proc.stderr
    assert not (workspace / "output").exists()


def test_finalize_refuses_foreign_nonempty_output(workspace):
    build_history(workspace, [2.0], [None])
    (workspace / "output").mkdir()
    (workspace / "output" / "notes.txt").write_text("mine")
    with pytest.raises(UsageError, match="not empty"):
        commands.finalize("rms", workspace / "output")
    commands.finalize("rms", workspace / "fresh")
    commands.finalize("rms", workspace / "fresh")  # re-finalizing our own output is fine


# ------------------------------------------------------------------ damaged state

@pytest.mark.parametrize("mutate, fragment", [
    (lambda s: "{truncated", "not valid JSON"),
    (lambda s: json.dumps({**json.loads(s), "trials": "nope"}), "$.trials"),
    (lambda s: json.dumps({**json.loads(s), "schema": 99}), "$.schema"),
    (lambda s: json.dumps({k: v for k, v in json.loads(s).items() if k != "baseline"}), "$.baseline"),
    (lambda s: s.replace('"parent": "t0"', '"parent": "t5"'), "not an earlier trial"),
    (lambda s: s.replace('"id": "t1"', '"id": "banana"'), "$.trials[1].id"),
])
def test_damaged_state_is_reported_not_reset(workspace, mutate, fragment):
    build_history(workspace, [2.0, 3.0], [None, "t0"])
    state_path = workspace / "trials" / "rms" / "state.json"
    damaged = mutate(state_path.read_text())
    state_path.write_text(damaged)
    proc = run_script("trial_manager", "status", "rms", cwd=workspace)
    assert proc.returncode == 2 and fragment in proc.stderr and "Traceback" not in proc.stderr
    assert str(state_path) in proc.stderr
    proc = run_script("trial_manager", "save", "rms", workspace / "kernel", "--strategy", "x", cwd=workspace)
    assert proc.returncode == 2
    assert state_path.read_text() == damaged  # nothing was rewritten


# ------------------------------------------------------------------ concurrency and crashes

SAVER = """
import sys
sys.path.insert(0, {root!r})
from pathlib import Path
from kernel_harness.trials import commands
kernel = Path(sys.argv[1]); tag = sys.argv[2]; count = int(sys.argv[3])
for i in range(count):
    (kernel / "demo_cpu" / "demo_avx512.cpp").write_text("int f() {{ return %d; }} // %s" % (i, tag))
    commands.save("rms", kernel, strategy="%s-%d" % (tag, i), parent=None)
"""


def _spawn_saver(workspace: Path, kernel: Path, tag: str, count: int) -> subprocess.Popen:
    script = workspace / "saver.py"
    script.write_text(SAVER.format(root=str(PROJECT_ROOT)))
    return subprocess.Popen([sys.executable, str(script), str(kernel), tag, str(count)], cwd=workspace,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def assert_tree_consistent(workspace: Path) -> list:
    state = TrialStore("rms", workspace / "trials").load()
    for trial in state.trials:
        directory = workspace / "trials" / "rms" / trial.id
        for relative in trial.files:
            assert (directory / relative).is_file(), (trial.id, relative)
    return list(state.trials)


def test_two_processes_saving_25_each_all_land(workspace):
    commands.init("rms", BASELINE, force=False)
    first = make_kernel(workspace / "a")
    second = make_kernel(workspace / "b")
    procs = [_spawn_saver(workspace, first, "A", 25), _spawn_saver(workspace, second, "B", 25)]
    for proc in procs:
        _, err = proc.communicate(timeout=240)
        assert proc.returncode == 0, err
    trials = assert_tree_consistent(workspace)
    assert [t.id for t in trials] == [f"t{i}" for i in range(50)]
    strategies = sorted(t.strategy for t in trials)
    assert strategies == sorted([f"A-{i}" for i in range(25)] + [f"B-{i}" for i in range(25)])


def test_sigkill_at_random_points_leaves_a_loadable_state(workspace):
    commands.init("rms", BASELINE, force=False)
    kernel = make_kernel(workspace)
    rng = random.Random(1234)
    for _ in range(12):
        proc = _spawn_saver(workspace, kernel, "K", 1000)
        time.sleep(rng.uniform(0.35, 0.9))  # interpreter start-up is ~0.3 s; then saves run back to back
        proc.send_signal(signal.SIGKILL)
        proc.communicate()
        assert proc.returncode == -signal.SIGKILL
        assert_tree_consistent(workspace)
    before = len(assert_tree_consistent(workspace))
    payload = commands.save("rms", kernel, strategy="after the kills", parent=None)
    assert payload["trial_id"] == f"t{before}"
    assert len(assert_tree_consistent(workspace)) == before + 1


# ------------------------------------------------------------------ issue 19: decisions a busy machine cannot fool

REPORT = PROJECT_ROOT / "tests" / "data" / "trials" / "benchmark_report.json"
KERNEL_FIXTURE = PROJECT_ROOT / "tests" / "data" / "build_kernels" / "kh_scale"


def report(workspace: Path, name: str, *, speedup: float | None = 9.5, ci: list | None = None,
           conditions: dict | None = None, **overrides) -> Path:
    """The recorded benchmark report (tests/data/trials/benchmark_report.json, with the
    keys issue 19 adds) with one run's numbers; baseline_us / kernel_us = speedup."""
    data = json.loads(REPORT.read_text())
    data.update({"baseline_file": str(BASELINE), "speedup": speedup, "kernel_us": 100.0, "speedup_ci": ci,
                 "baseline_us": round(100.0 * speedup, 3) if speedup is not None else None})
    data["conditions"] = {**data["conditions"], **(conditions or {})}
    data.update(overrides)
    path = workspace / f"{name}.json"
    path.write_text(json.dumps(data))
    return path


def tm(workspace: Path, *args) -> subprocess.CompletedProcess:
    return run_script("trial_manager", *args, cwd=workspace)


def status_json(workspace: Path) -> dict:
    proc = tm(workspace, "status", "rms", "--json", "status.json")
    assert proc.returncode == 0, proc.stderr
    return json.loads((workspace / "status.json").read_text()) | {"stdout": proc.stdout}


def config_with(workspace: Path, monkeypatch, **values) -> None:
    import yaml

    shipped = yaml.safe_load((PROJECT_ROOT / "scripts" / "config.yaml").read_text())
    path = workspace / "config.yaml"
    path.write_text(yaml.safe_dump({**shipped, **values}))
    monkeypatch.setenv("KERNEL_HARNESS_CONFIG", str(path))


def save_and_record(workspace: Path, index: int, parent: str | None, json_path: Path, *extra: str) -> str:
    kernel = make_kernel(workspace)
    (kernel / "demo_cpu" / "demo_avx512.cpp").write_text(f"int f() {{ return {index}; }}")
    argv = ["save", "rms", kernel, "--strategy", f"change {index}"] + (["--parent", parent] if parent else [])
    proc = tm(workspace, *argv)
    assert proc.returncode == 0, proc.stderr
    trial_id = f"t{index}"
    proc = tm(workspace, "result", "rms", trial_id, "--from-json", json_path, *extra)
    assert proc.returncode == 0, proc.stderr
    return trial_id


def test_rope_run_replayed_keeps_t0_until_an_interval_separates(workspace, monkeypatch):
    """The RoPE run of issue 19 on a loaded 2-vCPU machine: t0 unpinned 4.3-26.8x, t1 pinned
    6.8-10.4x (was called a regression), t2 53.85x whose interval reaches down to 17.1x (fired
    the early stop at early_stop_speedup 25)."""
    config_with(workspace, monkeypatch, early_stop_speedup=25.0, noise_threshold=0.05)
    assert tm(workspace, "init", "rms", BASELINE).returncode == 0
    save_and_record(workspace, 0, None, report(workspace, "t0", speedup=9.5, ci=[4.3, 26.8],
                                               conditions={"pinned": False}, pinned=False))
    save_and_record(workspace, 1, "t0", report(workspace, "t1", speedup=8.4, ci=[6.8, 10.4],
                                               conditions={"pinned": True, "load_before": 3.4}, pinned=True))
    status = status_json(workspace)
    assert status["best_trial"] == "t0" and status["regression_of"] is None
    assert status["decisions"]["t1"]["vs_parent"]["verdict"] == "no measurable difference"
    assert status["decisions"]["t1"]["vs_parent"]["basis"] == "intervals"
    assert status["decisions"]["t1"]["conditions_differ_from_parent"] == ["pinned (parent unpinned)"]
    assert "other conditions than its parent" in status["stdout"]
    assert not any("regressed" in line for line in status["advice"])
    assert any("t1 against the best t0: no measurable difference" in line for line in status["advice"])

    save_and_record(workspace, 2, "t1", report(workspace, "t2", speedup=53.85, ci=[17.1, 91.2],
                                               conditions={"pinned": True}, pinned=True))
    status = status_json(workspace)
    assert status["best_trial"] == "t0" and status["early_stop"] is False
    assert not any("Early stop" in line for line in status["advice"])
    assert "no measurable difference" in status["stdout"]
    best = tm(workspace, "best", "rms")
    assert best.stdout.strip() == "t0"

    # an interval that separates from t0's takes the lead; its low above 25 stops early
    save_and_record(workspace, 3, "t2", report(workspace, "t3", speedup=40.0, ci=[30.0, 52.0],
                                               conditions={"pinned": True}, pinned=True))
    status = status_json(workspace)
    assert status["best_trial"] == "t3" and status["early_stop"] is True
    assert status["decisions"]["t3"]["vs_parent"]["verdict"] == "no measurable difference"  # vs t2
    proc = tm(workspace, "best", "rms", "--json", "best.json")
    assert json.loads((workspace / "best.json").read_text())["speedup_ci"] == [30.0, 52.0]
    # the picture marks t1 (pinned, its parent was not) and still draws
    from kernel_harness.trials.render import png_node

    _, state, insights = commands.status("rms")
    assert png_node(state.trial("t1"), insights)[2] is True and png_node(state.trial("t2"), insights)[2] is False
    assert "other conditions than parent: pinned (parent unpinned)" in png_node(state.trial("t1"), insights)[1]
    assert "[6.80-10.40x]" in png_node(state.trial("t1"), insights)[1]
    assert tm(workspace, "finalize", "rms", "output").returncode == 0
    assert (workspace / "output" / "trial_tree.png").read_bytes()[:4] == b"\x89PNG"


def test_early_stop_needs_the_interval_above_the_threshold(workspace, monkeypatch):
    config_with(workspace, monkeypatch, early_stop_speedup=25.0)
    tm(workspace, "init", "rms", BASELINE)
    save_and_record(workspace, 0, None, report(workspace, "t0", speedup=53.85, ci=[17.1, 91.2]))
    status = status_json(workspace)
    assert status["best_trial"] == "t0" and status["early_stop"] is False
    assert any("goes down to 17.10x" in note for note in status["notes"])


def test_regression_needs_the_interval_below(workspace, monkeypatch):
    config_with(workspace, monkeypatch)
    tm(workspace, "init", "rms", BASELINE)
    save_and_record(workspace, 0, None, report(workspace, "t0", speedup=9.0, ci=[8.4, 9.6]))
    save_and_record(workspace, 1, "t0", report(workspace, "t1", speedup=6.0, ci=[5.6, 6.4]))
    status = status_json(workspace)
    assert status["regression_of"] == "t1" and status["best_trial"] == "t0"
    assert status["decisions"]["t1"]["vs_parent"]["verdict"] == "slower"
    assert any("--parent t0" in line and "checkout" in line for line in status["advice"])


def test_noise_threshold_decides_separated_but_small_differences(workspace, monkeypatch):
    """Intervals narrower than the benchmark's floor (an older report): separated by 3 %.
    Below the 5 % threshold that is no change; with noise_threshold 0.01 it is one."""
    config_with(workspace, monkeypatch, noise_threshold=0.05)
    tm(workspace, "init", "rms", BASELINE)
    save_and_record(workspace, 0, None, report(workspace, "t0", speedup=3.0, ci=[2.99, 3.01]))
    save_and_record(workspace, 1, "t0", report(workspace, "t1", speedup=3.09, ci=[3.08, 3.10]))
    status = status_json(workspace)
    assert status["best_trial"] == "t0" and status["noise_threshold"] == 0.05
    assert "within the noise threshold" in status["decisions"]["t1"]["vs_parent"]["detail"]
    config_with(workspace, monkeypatch, noise_threshold=0.01)
    assert status_json(workspace)["best_trial"] == "t1"
    config_with(workspace, monkeypatch, noise_threshold=-0.1)
    proc = tm(workspace, "best", "rms")
    assert proc.returncode == 0 and "noise_threshold" in proc.stderr  # bad config: warned, default used


def test_side_by_side_ratio_against_the_parent_decides_first(workspace, monkeypatch):
    config_with(workspace, monkeypatch)
    tm(workspace, "init", "rms", BASELINE)
    save_and_record(workspace, 0, None, report(workspace, "t0", speedup=3.0, ci=[2.8, 3.2]))
    faster = {"against": "kernel_t0", "ratio": 1.12, "ci": [1.07, 1.17], "verdict": "faster",
              "against_build_id": None}
    save_and_record(workspace, 1, "t0", report(workspace, "t1", speedup=3.1, ci=[2.9, 3.4], vs_against=faster))
    status = status_json(workspace)
    assert status["best_trial"] == "t1"  # the intervals overlap; side by side it is 12 % faster
    assert status["decisions"]["t1"]["vs_parent"]["basis"] == "side by side (--against)"
    within = {**faster, "ratio": 1.03, "ci": [1.01, 1.05]}  # significant, but within 5 %
    save_and_record(workspace, 2, "t1", report(workspace, "t2", speedup=3.2, ci=[3.0, 3.4], vs_against=within))
    status = status_json(workspace)
    assert status["best_trial"] == "t1"
    assert status["decisions"]["t2"]["vs_parent"]["verdict"] == "no measurable difference"
    slower = {**faster, "ratio": 0.85, "ci": [0.81, 0.89], "verdict": "slower"}
    save_and_record(workspace, 3, "t1", report(workspace, "t3", speedup=3.0, ci=[2.8, 3.2], vs_against=slower))
    status = status_json(workspace)
    assert status["regression_of"] == "t3" and status["best_trial"] == "t1"


def test_results_without_interval_fall_back_to_points_with_a_note(workspace):
    build_history(workspace, [2.0, 3.0], [None, "t0"])
    status = status_json(workspace)
    assert status["best_trial"] == "t1"
    assert status["decisions"]["t1"]["vs_parent"]["basis"] == "point estimates"
    assert any("no speedup interval" in note for note in status["notes"])


def test_conditions_travel_with_the_result(workspace):
    tm(workspace, "init", "rms", BASELINE)
    save_and_record(workspace, 0, None, report(workspace, "t0", ci=[4.3, 26.8],
                                               conditions={"oversubscribed": True, "tier_ran": "avx2"}))
    state = json.loads((workspace / "trials" / "rms" / "state.json").read_text())
    assert state["schema"] == 2
    conditions = status_json(workspace)["decisions"]["t0"]["conditions"]
    assert conditions == {
        "cpu_model": "Intel(R) Xeon(R) Platinum 8375C CPU @ 2.90GHz", "supported_tiers": ["generic", "avx2", "avx512"],
        "tier_ran": "avx2", "threads": 2, "pinned": False, "load_before": 3.3, "load_after": 4.4,
        "oversubscribed": True, "reliable": True, "speedup_ci": [4.3, 26.8],
        "inputs_from_memory": None}  # a report without the field: unknown, not "none"
    assert "OVERSUBSCRIBED" in status_json(workspace)["stdout"]


def test_conditions_of_an_older_report_are_read_from_its_keys(workspace):
    old = json.loads(REPORT.read_text())
    for key in ("conditions", "reliable", "unreliable_reasons", "vs_against", "kernel_build"):
        old.pop(key)
    (workspace / "old.json").write_text(json.dumps(old))
    tm(workspace, "init", "rms", BASELINE)
    save_and_record(workspace, 0, None, workspace / "old.json")
    conditions = status_json(workspace)["decisions"]["t0"]["conditions"]
    assert conditions["pinned"] is False and conditions["threads"] == 2 and conditions["load_after"] == 3.3
    assert conditions["oversubscribed"] is True  # load 3.3 on 2 logical CPUs, the rule of that time
    assert conditions["speedup_ci"] == [4.3, 26.8] and conditions["tier_ran"] is None


def test_unreliable_run_is_refused_unless_accepted(workspace):
    tm(workspace, "init", "rms", BASELINE)
    tm(workspace, "save", "rms", make_kernel(workspace), "--strategy", "a")
    busy = report(workspace, "busy", ci=[7.4, 61.0], reliable=False,
                  unreliable_reasons=["kernel worker got 0.52 of a CPU per wall second"])
    proc = tm(workspace, "result", "rms", "t0", "--from-json", busy)
    assert proc.returncode == 2 and "0.52 of a CPU" in proc.stderr and "--accept-unreliable" in proc.stderr
    assert TrialStore("rms").load().trial("t0").result is None
    proc = tm(workspace, "result", "rms", "t0", "--from-json", busy, "--accept-unreliable")
    assert proc.returncode == 0, proc.stderr
    assert TrialStore("rms").load().trial("t0").result.accepted_unreliable is True
    status = status_json(workspace)
    assert status["decisions"]["t0"]["accepted_unreliable"] is True and "UNRELIABLE" in status["stdout"]
    # an incorrect run has no timing to distrust
    tm(workspace, "save", "rms", make_kernel(workspace), "--strategy", "b")
    failed = report(workspace, "failed", correct=False, speedup=None, baseline_us=None, kernel_us=None, reliable=False)
    assert tm(workspace, "result", "rms", "t1", "--from-json", failed).returncode == 0


def copy_kernel(workspace: Path) -> Path:
    import shutil

    kernel = workspace / "kernel"
    shutil.copytree(KERNEL_FIXTURE, kernel)
    return kernel


def test_saved_copy_has_the_build_id_of_its_sources(workspace):
    from kernel_harness.trials.buildid import content_id_of

    kernel = copy_kernel(workspace)
    tm(workspace, "init", "rms", BASELINE)
    proc = tm(workspace, "save", "rms", kernel, "--strategy", "a", "--json", "save.json")
    assert proc.returncode == 0, proc.stderr
    build_id = content_id_of(kernel)
    assert build_id and TrialStore("rms").load().trial("t0").build_id == build_id
    assert content_id_of(workspace / "trials" / "rms" / "t0") == build_id  # the copy holds all it hashes
    # a file the content id hashes that is no C++ source by suffix (a .cuh in an include dir)
    (kernel / "kh_scale_cpu" / "table.cuh").write_text("// hashed by content_id\n")
    assert tm(workspace, "save", "rms", kernel, "--strategy", "b").returncode == 0
    saved = TrialStore("rms").load().trial("t1")
    assert "kh_scale_cpu/table.cuh" in saved.files and saved.build_id == content_id_of(kernel) != build_id


def test_result_refuses_a_json_of_another_build(workspace):
    from kernel_harness.trials.buildid import content_id_of

    kernel = copy_kernel(workspace)
    tm(workspace, "init", "rms", BASELINE)
    tm(workspace, "save", "rms", kernel, "--strategy", "a")
    t0_id = content_id_of(kernel)
    source = next((kernel / "kh_scale_cpu").glob("*.cpp"))
    source.write_text(source.read_text() + "\n// t1\n")
    tm(workspace, "save", "rms", kernel, "--strategy", "b", "--parent", "t0")
    t1_id = content_id_of(kernel)
    of_t0 = report(workspace, "of_t0", kernel_build={"module": f"_kh_scale_cpu_{t0_id}", "build_id": t0_id})
    proc = tm(workspace, "result", "rms", "t1", "--from-json", of_t0)
    assert proc.returncode == 2 and t0_id in proc.stderr and t1_id in proc.stderr
    assert "It is t0's build" in proc.stderr and "Traceback" not in proc.stderr
    assert TrialStore("rms").load().trial("t1").result is None
    assert tm(workspace, "result", "rms", "t0", "--from-json", of_t0).returncode == 0
    stranger = report(workspace, "stranger", kernel_build={"module": "_kh_scale_cpu_ffffffffff", "build_id": None})
    proc = tm(workspace, "result", "rms", "t1", "--from-json", stranger)  # the id is read from the module name
    assert proc.returncode == 2 and "ffffffffff" in proc.stderr and "No saved trial has that build" in proc.stderr


def test_save_warns_when_sources_differ_from_the_last_build(workspace):
    from kernel_harness.trials.buildid import content_id_of

    kernel = copy_kernel(workspace)
    variant = kernel / "build" / "torch213-cxx11-cpu-x86_64-linux"
    variant.mkdir(parents=True)
    (variant / "metadata.json").write_text(json.dumps({"id": f"_kh_scale_cpu_{content_id_of(kernel)}"}))
    tm(workspace, "init", "rms", BASELINE)
    proc = tm(workspace, "save", "rms", kernel, "--strategy", "built as is")
    assert proc.returncode == 0 and "last build" not in proc.stderr
    (kernel / "build.toml").write_text((kernel / "build.toml").read_text() + "\n# edited after the build\n")
    proc = tm(workspace, "save", "rms", kernel, "--strategy", "edited")
    assert proc.returncode == 0 and "differ from its last build" in " ".join(proc.stderr.split())


def test_checkout_restores_a_trial_and_protects_unsaved_work(workspace):
    kernel = make_kernel(workspace)
    tm(workspace, "init", "rms", BASELINE)
    tm(workspace, "save", "rms", kernel, "--strategy", "a")
    (kernel / "demo_cpu" / "demo_avx512.cpp").write_text("int f() { return 2; }")
    (kernel / "demo_cpu" / "extra.hpp").write_text("#pragma once // t1 only\n")
    tm(workspace, "save", "rms", kernel, "--strategy", "b", "--parent", "t0")
    proc = tm(workspace, "checkout", "rms", "t0", kernel)
    assert proc.returncode == 0, proc.stderr
    assert (kernel / "demo_cpu" / "demo_avx512.cpp").read_text() == "int f() { return 1; }"
    assert not (kernel / "demo_cpu" / "extra.hpp").exists()  # t0 never had it
    assert (kernel / "dist" / "demo-0.1-py3-none-any.whl").exists()  # build products are left alone
    # unsaved work: refused, nothing touched
    (kernel / "demo_cpu" / "demo_avx512.cpp").write_text("int f() { return 99; } // unsaved")
    proc = tm(workspace, "checkout", "rms", "t1", kernel)
    assert proc.returncode == 2 and "demo_cpu/demo_avx512.cpp" in proc.stderr and "--force" in proc.stderr
    assert "unsaved" in (kernel / "demo_cpu" / "demo_avx512.cpp").read_text()
    # --force keeps a copy first
    proc = tm(workspace, "checkout", "rms", "t1", kernel, "--force", "--json", "co.json")
    assert proc.returncode == 0, proc.stderr
    stash = Path(json.loads((workspace / "co.json").read_text())["stashed_to"])
    assert stash.parent == workspace / "trials" / "rms" / ".stash"
    assert "unsaved" in (stash / "demo_cpu" / "demo_avx512.cpp").read_text()
    assert (kernel / "demo_cpu" / "extra.hpp").is_file()
    assert tm(workspace, "checkout", "rms", "t7", kernel).returncode == 2
    fresh = workspace / "elsewhere"
    assert tm(workspace, "checkout", "rms", "t1", fresh).returncode == 0  # a new directory is fine
    assert (fresh / "build.toml").is_file()


def test_finalize_records_the_final_measurement(workspace):
    tm(workspace, "init", "rms", BASELINE)
    save_and_record(workspace, 0, None, report(workspace, "t0", speedup=9.0, ci=[8.5, 9.5], kernel_build=None))
    assert tm(workspace, "finalize", "rms", "output").returncode == 0
    assert json.loads((workspace / "output" / "summary.json").read_text())["final"] is None
    incorrect = report(workspace, "bad", correct=False, speedup=None, baseline_us=None, kernel_us=None)
    proc = tm(workspace, "finalize", "rms", "output", "--final-json", incorrect)
    assert proc.returncode == 1 and "incorrect final run" in proc.stderr
    other = workspace / "other_baseline.py"
    other.write_text(BASELINE.read_text() + "\n# another baseline\n")
    proc = tm(workspace, "finalize", "rms", "output", "--final-json",
              report(workspace, "other", baseline_file=str(other), kernel_build=None))
    assert proc.returncode == 2 and "another baseline" in proc.stderr
    cached = report(workspace, "cached", baseline_cached=True, kernel_build=None)
    assert tm(workspace, "finalize", "rms", "output", "--final-json", cached).returncode == 2
    assert json.loads((workspace / "output" / "summary.json").read_text())["final"] is None
    final = report(workspace, "final", speedup=8.8, ci=[8.3, 9.3], kernel_build=None,
                   conditions={"pinned": True, "load_before": 0.2, "load_after": 0.3})
    proc = tm(workspace, "finalize", "rms", "output", "--final-json", final)
    assert proc.returncode == 0, proc.stderr
    recorded = json.loads((workspace / "output" / "summary.json").read_text())["final"]
    assert recorded["correct"] is True and recorded["speedup"] == 8.8 and recorded["speedup_ci"] == [8.3, 9.3]
    assert recorded["conditions"]["pinned"] is True and recorded["conditions"]["threads"] == 2
    assert recorded["trial"] == "t0" and recorded["source"] == str(final.resolve())
    assert "## Final measurement" in (workspace / "output" / "summary.md").read_text()
    assert "8.80x (interval 8.30-9.30x)" in (workspace / "output" / "summary.md").read_text()
    assert tm(workspace, "finalize", "rms", "output").returncode == 0  # re-finalizing keeps it
    assert json.loads((workspace / "output" / "summary.json").read_text())["final"]["speedup"] == 8.8


def test_finalize_refuses_a_final_run_of_another_build(workspace):
    kernel = copy_kernel(workspace)
    tm(workspace, "init", "rms", BASELINE)
    tm(workspace, "save", "rms", kernel, "--strategy", "a")
    tm(workspace, "result", "rms", "t0", "--correctness", "pass", "--speedup", "2", "--baseline_us", "200",
       "--kernel_us", "100")
    proc = tm(workspace, "finalize", "rms", "output", "--final-json", report(workspace, "final"))
    assert proc.returncode == 2 and "0123abcdef" in proc.stderr and "finalized trial t0" in proc.stderr


def test_files_keep_the_users_umask(workspace):
    """Trial copies, finalized sources and summaries are 0644 under umask 022, even when
    the kernel's files were 0600 (as atomic writes made them before)."""
    previous = os.umask(0o022)
    try:
        kernel = make_kernel(workspace)
        for path in kernel.rglob("*"):
            if path.is_file():
                path.chmod(0o600)
        tm(workspace, "init", "rms", BASELINE)
        tm(workspace, "save", "rms", kernel, "--strategy", "a")
        tm(workspace, "result", "rms", "t0", "--correctness", "pass", "--speedup", "2", "--baseline_us", "200",
           "--kernel_us", "100")
        assert tm(workspace, "finalize", "rms", "output").returncode == 0
        from kernel_harness.atomic import atomic_write_text

        atomic_write_text(workspace / "generated.cpp", "// generated\n")
    finally:
        os.umask(previous)
    files = [p for p in (workspace / "trials" / "rms" / "t0").rglob("*") if p.is_file()]
    files += [p for p in (workspace / "output").rglob("*") if p.is_file()]
    files += [workspace / "trials" / "rms" / "state.json", workspace / "generated.cpp"]
    assert len(files) > 8
    modes = {str(p.relative_to(workspace)): oct(p.stat().st_mode & 0o777) for p in files}
    assert set(modes.values()) == {"0o644"}, modes


def _schema1_state(workspace: Path) -> Path:
    """A tree written by the harness before issue 19 (schema 1, no baseline history)."""
    build_history(workspace, [3.0], [None])
    path = workspace / "trials" / "rms" / "state.json"
    data = json.loads(path.read_text())
    data["schema"] = 1
    data.pop("baseline_times")
    for trial in data["trials"]:
        trial.pop("build_id")
        trial["result"].pop("accepted_unreliable")
    path.write_text(json.dumps(data))
    return path


def test_old_state_files_still_load(workspace):
    _schema1_state(workspace)
    status = status_json(workspace)
    assert status["best_trial"] == "t0"
    assert tm(workspace, "baseline-us", "rms").stdout.strip() == "300.000"


def test_baseline_refresh_times_it_again_and_keeps_history(workspace):
    small = PROJECT_ROOT / "tests" / "data" / "baselines" / "rms_norm_small.py"
    tm(workspace, "init", "rms", small)
    kernel = make_kernel(workspace)
    tm(workspace, "save", "rms", kernel, "--strategy", "a")
    tm(workspace, "result", "rms", "t0", "--correctness", "pass", "--speedup", "2", "--baseline_us", "90000",
       "--kernel_us", "45000")
    proc = run_script("trial_manager", "baseline-us", "rms", "--refresh", "--rounds", "3", "--threads", "1",
                      "--json", "b.json", cwd=workspace, timeout=240)
    assert proc.returncode == 0, proc.stderr
    payload = json.loads((workspace / "b.json").read_text())
    value = float(proc.stdout.strip().splitlines()[-1])
    assert value == pytest.approx(payload["baseline_us"], abs=1e-3) and 0 < value < 90000
    assert payload["previous_baseline_us"] == 90000.0
    assert [h["source"] for h in payload["history"]] == ["result t0", "refresh"]
    conditions = payload["conditions"]
    assert conditions["threads"] == 1 and isinstance(conditions["load_before"], float)
    assert conditions["cpu_model"] and "generic" in conditions["supported_tiers"]
    import shutil

    if shutil.which("numactl") and payload["history"][-1]["details"]["pinned_via"].startswith("numactl"):
        assert conditions["pinned"] is True
    assert float(tm(workspace, "baseline-us", "rms").stdout.strip()) == pytest.approx(value, abs=1e-3)
    state = json.loads((workspace / "trials" / "rms" / "state.json").read_text())
    assert len(state["baseline_times"]) == 2


def test_baseline_refresh_refuses_a_changed_baseline(workspace):
    baseline = workspace / "baseline.py"
    baseline.write_text(BASELINE.read_text())
    tm(workspace, "init", "rms", baseline)
    baseline.write_text(BASELINE.read_text() + "\n# changed\n")
    proc = tm(workspace, "baseline-us", "rms", "--refresh")
    assert proc.returncode == 2 and "changed" in proc.stderr
    assert tm(workspace, "baseline-us", "rms", "--threads", "2").returncode == 2  # --threads needs --refresh


def test_side_by_side_against_the_best_is_found_by_build_id(workspace, monkeypatch):
    """t2 (a child of t1) was timed --against t0's build, the best: its vs_against names t0's
    build id, so it is compared with t0 side by side, not taken to be its parent's ratio."""
    from kernel_harness.trials.buildid import content_id_of

    config_with(workspace, monkeypatch)
    kernel = copy_kernel(workspace)
    source = kernel / "kh_scale_cpu" / "kh_scale_cpu.cpp"
    tm(workspace, "init", "rms", BASELINE)
    ids = []
    for index, (ci, vs) in enumerate([([2.8, 3.2], None), ([2.9, 3.3], None), ([2.9, 3.4], "t0")]):
        source.write_text(source.read_text() + f"\n// change {index}\n")
        ids.append(content_id_of(kernel))
        parent = ["--parent", f"t{index - 1}"] if index else []
        assert tm(workspace, "save", "rms", kernel, "--strategy", f"change {index}", *parent).returncode == 0
        against = None if vs is None else {"against": "t0_build", "ratio": 1.15, "ci": [1.09, 1.21],
                                           "verdict": "faster", "against_build_id": ids[0]}
        json_path = report(workspace, f"t{index}", speedup=3.0 + 0.05 * index, ci=ci, vs_against=against,
                           kernel_build={"module": f"_kh_scale_cpu_{ids[-1]}", "build_id": ids[-1]})
        proc = tm(workspace, "result", "rms", f"t{index}", "--from-json", json_path)
        assert proc.returncode == 0, proc.stderr
    status = status_json(workspace)
    assert status["best_trial"] == "t2"
    assert status["decisions"]["t1"]["vs_parent"]["verdict"] == "no measurable difference"
    assert status["decisions"]["t2"]["vs_parent"]["basis"] == "intervals"  # its ratio is against t0, not t1


def test_finalize_refuses_a_final_run_without_a_timed_speedup(workspace):
    """A correct report whose timing did not happen (no speedup) is no final measurement:
    exit 2 naming the file, and summary.json keeps no half-recorded final run."""
    tm(workspace, "init", "rms", BASELINE)
    save_and_record(workspace, 0, None, report(workspace, "t0", speedup=9.0, ci=[8.5, 9.5], kernel_build=None))
    untimed = report(workspace, "untimed", speedup=None, kernel_us=None, kernel_build=None)
    proc = tm(workspace, "finalize", "rms", "output", "--final-json", untimed)
    assert proc.returncode == 2 and "untimed.json" in proc.stderr and "speedup" in proc.stderr, proc.stderr
    assert "internal error" not in proc.stderr
    assert not (workspace / "output" / "summary.json").exists()


def test_finalize_matches_the_baseline_by_the_reports_sha256_from_any_directory(workspace):
    """benchmark_cpu.py records baseline_file as given (often relative to where it ran);
    its baseline_sha256 lets finalize check the baseline from another directory."""
    import hashlib

    tm(workspace, "init", "rms", BASELINE)
    save_and_record(workspace, 0, None, report(workspace, "t0", speedup=9.0, ci=[8.5, 9.5], kernel_build=None))
    sha = hashlib.sha256(BASELINE.read_bytes()).hexdigest()
    elsewhere = report(workspace, "elsewhere", speedup=8.8, ci=[8.3, 9.3], kernel_build=None,
                       baseline_file="some/other/cwd/baseline.py", baseline_sha256=sha)
    proc = tm(workspace, "finalize", "rms", "output", "--final-json", elsewhere)
    assert proc.returncode == 0, proc.stderr
    assert json.loads((workspace / "output" / "summary.json").read_text())["final"]["speedup"] == 8.8
    other = report(workspace, "other", kernel_build=None, baseline_sha256="0" * 64)
    proc = tm(workspace, "finalize", "rms", "output", "--final-json", other)
    assert proc.returncode == 2 and "another baseline" in proc.stderr


def test_side_by_side_applies_to_every_trial_with_the_measured_build(workspace, monkeypatch):
    """Branching back saves the best's sources again (t2 == t0's build); t3, a child of t2
    timed --against that build, is compared with its parent side by side, though t0 has
    the same build id and comes first."""
    from kernel_harness.trials.buildid import content_id_of

    config_with(workspace, monkeypatch)
    kernel = copy_kernel(workspace)
    source = kernel / "kh_scale_cpu" / "kh_scale_cpu.cpp"
    original = source.read_text()
    tm(workspace, "init", "rms", BASELINE)
    plan = [("a", None, None), ("b", "t0", None), ("a", "t0", None), ("c", "t2", "a")]
    ids = {}
    for index, (content, parent, against) in enumerate(plan):
        source.write_text(original + f"\n// version {content}\n")
        ids[content] = content_id_of(kernel)
        argv = ["save", "rms", kernel, "--strategy", f"version {content}"] + (["--parent", parent] if parent else [])
        assert tm(workspace, *argv).returncode == 0
        vs = None if against is None else {"against": "parent_kernel", "ratio": 1.15, "ci": [1.09, 1.21],
                                           "verdict": "faster", "against_build_id": ids[against]}
        json_path = report(workspace, f"t{index}", speedup=3.0, ci=[2.8, 3.2], vs_against=vs,
                           kernel_build={"module": f"_kh_scale_cpu_{ids[content]}", "build_id": ids[content]})
        proc = tm(workspace, "result", "rms", f"t{index}", "--from-json", json_path)
        assert proc.returncode == 0, proc.stderr
    status = status_json(workspace)
    vs_parent = status["decisions"]["t3"]["vs_parent"]
    assert vs_parent["against"] == "t2" and vs_parent["basis"] == "side by side (--against)", vs_parent
    assert vs_parent["verdict"] == "faster" and status["best_trial"] == "t3"


def test_status_shows_the_interval_a_cached_baseline_trial_is_ranked_by(workspace):
    """A cached-baseline result is ranked by its spot ratio and that ratio's interval
    (speedup_spot_ci); status, the PNG and summary.md show that interval next to it."""
    from kernel_harness.trials.render import describe_result, interval_label

    record_benchmark_runs(workspace, [
        {"speedup": 3.0, "baseline_us": 300.0, "kernel_us": 100.0, "speedup_ci": [2.8, 3.2]},
        {"speedup": 3.1, "baseline_us": 300.0, "kernel_us": 97.0, "baseline_cached": True,
         "speedup_spot": 3.4, "speedup_spot_ci": [3.1, 3.8]},
    ])
    _, state, _ = commands.status("rms")
    assert interval_label(state.trial("t0")) == " [2.80-3.20x]"
    assert interval_label(state.trial("t1")) == " [3.10-3.80x]"
    assert "3.40x side by side) [3.10-3.80x]" in describe_result(state.trial("t1"))


def test_a_child_whose_weights_came_from_elsewhere_is_said_to_differ():
    """The benchmark's conditions name the inputs it read from memory (PERSISTENT_INPUTS): a
    trial timed with the weight from memory against a parent timed with it fresh from a copy
    (in the last-level cache) is not measured the same way, and the tree says so; a report
    from before the field is not guessed at."""
    from kernel_harness.trials.conditions import conditions_of, differences
    from kernel_harness.trials.model import TrialResult

    def result(conditions):
        return TrialResult(True, 2.0, 100.0, 50.0, "", "", {"conditions": conditions})

    fresh, from_memory, old = result({"inputs_from_memory": []}), result({"inputs_from_memory": [1, 2]}), result({})
    assert conditions_of(from_memory).inputs_from_memory == (1, 2)
    assert "inputs 1, 2 from memory" in conditions_of(from_memory).label()
    assert differences(conditions_of(fresh), conditions_of(from_memory)) == ["inputs from memory: 1, 2 (parent none)"]
    assert differences(conditions_of(old), conditions_of(from_memory)) == []
    assert differences(conditions_of(from_memory), conditions_of(result({"inputs_from_memory": [1, 2]}))) == []


def test_a_cached_baseline_time_without_its_input_regime_is_flagged(workspace):
    """A baseline that names PERSISTENT_INPUTS, whose cached time (t0's result) says nothing of
    where its inputs came from: it may predate the eviction, so baseline-us says to refresh;
    a record that names the regime, or a baseline without persistent inputs, gets no warning."""
    baseline = workspace / "linear_like.py"
    baseline.write_text(BASELINE.read_text() + "\nPERSISTENT_INPUTS = (1,)\n")
    commands.init("lin", baseline, force=False)
    commands.save("lin", make_kernel(workspace), strategy="a", parent=None)
    old = json.loads(benchmark_json(workspace / "old.json").read_text())
    old.pop("conditions", None)
    (workspace / "old.json").write_text(json.dumps(old))
    commands.result("lin", "t0", correctness=None, speedup=None, baseline_us=None, kernel_us=None,
                    from_json=workspace / "old.json", force=False)
    warnings = commands.baseline_us("lin")["warnings"]
    assert any("does not record where its inputs came from" in w and "--refresh" in w for w in warnings)
    commands.init("rms", BASELINE, force=False)
    commands.save("rms", make_kernel(workspace), strategy="a", parent=None)
    commands.result("rms", "t0", correctness=None, speedup=None, baseline_us=None, kernel_us=None,
                    from_json=workspace / "old.json", force=False)
    assert not any("inputs came from" in w for w in commands.baseline_us("rms")["warnings"])
