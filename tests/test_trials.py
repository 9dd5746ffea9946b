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
    assert payload["early_stop"] is True and payload["early_stop_speedup"] == 2.5


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
