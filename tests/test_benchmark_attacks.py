"""Every way of fooling the benchmark named in the issue is tried by a test kernel
of its own (tests/data/bench_kernels/bk_attack_*) and must be rejected."""

from __future__ import annotations

import os
import time

import pytest
from bench_helpers import FAST, KERNELS, RMS, checks, run_bench, run_bench_subprocess


pytestmark = pytest.mark.usefixtures("bench_kernels")


def _attack(tmp_path, package, *extra, expect_code=1):
    code, report = run_bench(tmp_path, RMS, "--kernel-package", package, "--op",
                             f"{package}.rms_norm", *FAST, *extra)
    assert code == expect_code, report and report["failures"]
    assert report is not None and report["correct"] is False
    return report


def test_cache_keyed_by_shape_is_rejected(tmp_path):
    # three independently seeded get_inputs() sets of one shape: the second one
    # gets the first one's result
    report = _attack(tmp_path, "bk_attack_cache_shape")
    assert "values" in checks(report)


def test_cache_keyed_by_pointer_is_never_served(tmp_path, monkeypatch):
    """A result cached by pointer is served only when a pointer repeats. The worker hands the
    kernel every input (correctness checks, traces and timed calls alike) at an address no
    earlier call had (bench/layout.py), so the cache never hits: every call computes its result
    afresh and the attack gains nothing. Before the checks' inputs were moved too, a timed
    call once landed where a check's input had been and was served a stale result that none
    of the four verified calls happened to be."""
    log = tmp_path / "attack.log"
    monkeypatch.setenv("BK_ATTACK_LOG", str(log))
    code, report = run_bench(tmp_path, RMS, "--kernel-package", "bk_attack_cache_ptr", "--op",
                             "bk_attack_cache_ptr.rms_norm", *FAST, "--rounds", "4", "--calls", "6")
    calls = log.read_text().split() if log.exists() else []
    assert len(calls) > 24, "the attack kernel did not run every check and timed call"
    assert set(calls) == {"miss"}, (calls.count("hit"), calls.count("stale"))
    assert code == 0, report["failures"]


def test_correct_only_for_the_first_calls_is_caught_in_timed_calls(tmp_path):
    # it passes every correctness call; only verifying randomly chosen timed calls
    # (with fresh inputs each) catches it
    report = _attack(tmp_path, "bk_attack_first_calls", "--rounds", "6", "--calls", "10")
    assert checks(report) == {"timed-call"}
    failure = report["failures"][0]
    assert "cached" in failure["message"]


def test_outputs_hardcoded_for_fixed_seeds_are_rejected(tmp_path):
    report = _attack(tmp_path, "bk_attack_hardcoded")
    assert "values" in checks(report)
    # the inputs come from seeds nobody can predict
    assert len({label for label in report["input_sets"] if label.startswith("get_inputs()")}) >= 3


def test_output_aliasing_an_input_is_rejected(tmp_path):
    report = _attack(tmp_path, "bk_attack_alias")
    assert {"aliasing", "input-modified"} <= checks(report)


def test_modified_input_is_rejected(tmp_path):
    report = _attack(tmp_path, "bk_attack_modify_input")
    assert "input-modified" in checks(report)


def test_uninitialised_output_is_rejected(tmp_path):
    # no reference was ever computed (or freed) in the kernel's process
    report = _attack(tmp_path, "bk_attack_uninit")
    assert "values" in checks(report)


def test_asynchronous_completion_is_rejected(tmp_path):
    report = _attack(tmp_path, "bk_attack_async")
    assert "async" in checks(report)
    assert "values" in checks(report)  # what was there at return was wrong


def test_patched_timers_are_rejected(tmp_path):
    report = _attack(tmp_path, "bk_attack_timer")
    assert checks(report) == {"tamper"}
    assert "time.perf_counter" in report["failures"][0]["message"]
    assert report["kernel_us"] is None


def test_gc_and_stack_snooping_finds_nothing(tmp_path):
    report = _attack(tmp_path, "bk_attack_snoop")
    assert "values" in checks(report)


def _snapshot(root):
    return {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in root.rglob("*") if p.is_file()}


def test_segfault_is_contained_and_named(tmp_path):
    work = tmp_path / "cwd"
    (work / "trials" / "k" / "t0").mkdir(parents=True)
    (work / "trials" / "k" / "baseline.json").write_text('{"baseline_us": 12.5}\n')
    before = _snapshot(work)
    proc, report = run_bench_subprocess(tmp_path, RMS, "--kernel-package", "bk_crash_segv",
                                        "--op", "bk_crash_segv.rms_norm", *FAST, cwd=work)
    assert proc.returncode == 3, proc.stderr
    assert "SIGSEGV" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert report["crash"]["kind"] == "SIGSEGV" and report["correct"] is False
    assert _snapshot(work) == before  # the trial tree and cached baseline are untouched


def test_hang_is_killed_after_the_timeout(tmp_path):
    started = time.monotonic()
    code, report = run_bench(tmp_path, RMS, "--kernel-package", "bk_hang", "--op", "bk_hang.rms_norm",
                             "--timeout", "3", *FAST)
    assert code == 3
    assert report["crash"]["kind"] == "timeout"
    assert "--timeout 3" in report["crash"]["message"]
    assert time.monotonic() - started < 60


def test_exception_in_the_kernel_is_exit_3(tmp_path):
    code, report = run_bench(tmp_path, RMS, "--kernel-package", "bk_raises", "--op", "bk_raises.rms_norm", *FAST)
    assert code == 3
    assert report["crash"]["kind"] == "exception"
    assert "expected a contiguous bfloat16 tensor" in report["crash"]["message"]


def test_unloadable_kernel_is_exit_3(tmp_path):
    code, report = run_bench(tmp_path, RMS, "--kernel-package", "bk_import_error",
                             "--op", "bk_import_error.rms_norm", *FAST)
    assert code == 3
    assert "undefined symbol" in report["crash"]["message"]
    code, _ = run_bench(tmp_path, RMS, "--kernel-package", "bk_not_installed_anywhere",
                        "--op", "bk_not_installed_anywhere.rms_norm", *FAST)
    assert code == 3


def test_no_worker_is_left_running_after_a_hang(tmp_path):
    # the hung worker runs in its own session and is killed with its whole group
    code, _ = run_bench(tmp_path, RMS, "--kernel-package", "bk_hang", "--op", "bk_hang.rms_norm",
                        "--timeout", "2", *FAST)
    assert code == 3
    mine = os.getpid()
    children = [p for p in os.listdir("/proc") if p.isdigit() and _ppid(p) == mine]
    alive = [p for p in children if _state(p) not in ("Z", None)]
    assert alive == []


def _ppid(pid: str) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return int(fh.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def _state(pid: str) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None
