"""What makes an --against comparison precise (issue 19): rounds added until the
ratio's own interval is tight, and inputs moved to a new page offset every call so
a worker's memory layout cannot bias one build against another."""

from __future__ import annotations

import random
import time

import pytest
import torch

from bench_helpers import RMS, run_bench
from kernel_harness.bench import layout, stats
from kernel_harness.bench.against import extend_until_precise, half_width


def _noisy_rounds(label: str, centre: float, count: int, rng: random.Random, spread: float = 0.15,
                  calls: int = 5) -> list[list[int]]:
    return [[int(centre * rng.uniform(1 - spread, 1 + spread)) for _ in range(calls)] for _ in range(count)]


class _Source:
    """A fake pair of builds: ``run_block`` appends noisy rounds to both measurements."""

    def __init__(self, against_us: float, candidate_us: float, seed: int = 0) -> None:
        self.rng = random.Random(seed)
        self.against = stats.Measurement("against")
        self.candidate = stats.Measurement("candidate")
        self.against_us, self.candidate_us = against_us, candidate_us
        self.blocks: list[int] = []

    def add(self, count: int) -> None:
        for a, c in zip(_noisy_rounds("a", self.against_us, count, self.rng),
                        _noisy_rounds("c", self.candidate_us, count, self.rng), strict=True):
            self.against.add_round(a)
            self.candidate.add_round(c)

    def run_block(self, first: int) -> None:
        assert first == len(self.candidate.rounds)  # blocks continue where the last one stopped
        self.blocks.append(first)
        self.add(6)


def test_rounds_are_added_until_the_interval_is_tight():
    source = _Source(1000, 1000)
    source.add(6)
    before = half_width(source.against, source.candidate, seed=1)
    ext = extend_until_precise(source.against, source.candidate, rounds_done=6, block=6, run_block=source.run_block,
                               started=time.monotonic(), precision=0.02, max_s=60, seed=1)
    assert before is not None and before > 0.02  # six noisy rounds were not enough
    assert ext["stopped"] == "precise" and ext["half_width"] <= 0.02
    assert ext["rounds"] == len(source.candidate.rounds) == 6 + ext["added_rounds"]
    assert ext["added_rounds"] > 0 and ext["added_rounds"] % 6 == 0  # whole cycles of orders only
    # and the tighter interval still holds the truth (the same build on both sides)
    ratio = stats.speedup(source.against, source.candidate, seed=2, floor=0.0)
    assert ratio.ci_low <= 1.0 <= ratio.ci_high


def test_a_real_difference_is_resolved_by_the_added_rounds():
    source = _Source(1100, 1000, seed=3)  # the candidate is 10 % faster
    source.add(6)
    extend_until_precise(source.against, source.candidate, rounds_done=6, block=6, run_block=source.run_block,
                         started=time.monotonic(), precision=0.02, max_s=60, seed=1)
    assert stats.speedup(source.against, source.candidate, seed=4).verdict() == "kernel faster"


def test_the_time_limit_stops_the_rounds_and_says_so():
    source = _Source(1000, 1000)
    source.add(6)
    # as if the usual rounds had already taken 50 s of a 60 s allowance: one more block won't fit
    ext = extend_until_precise(source.against, source.candidate, rounds_done=6, block=6, run_block=source.run_block,
                               started=time.monotonic() - 50, precision=0.001, max_s=60, seed=1)
    assert ext["stopped"] == "time" and ext["added_rounds"] == 0 and source.blocks == []
    assert ext["half_width"] > 0.001


def test_max_s_zero_keeps_the_usual_rounds():
    source = _Source(1000, 1000)
    source.add(6)
    ext = extend_until_precise(source.against, source.candidate, rounds_done=6, block=6, run_block=source.run_block,
                               started=time.monotonic(), precision=0.02, max_s=0, seed=1)
    assert ext["stopped"] == "disabled" and source.blocks == []


def test_each_side_keeps_its_own_calls_per_round():
    """A slow baseline with few calls per round next to a fast kernel with many: the
    interval uses all of the kernel's calls (it used to cut every side to the fewest)."""
    rng = random.Random(5)
    base = stats.Measurement("b", _noisy_rounds("b", 8000, 20, rng, calls=3))
    kern = stats.Measurement("k", _noisy_rounds("k", 1000, 20, rng, calls=30))
    s = stats.speedup(base, kern, seed=1, floor=0.0)
    assert 7.0 < s.value < 9.0 and s.ci_low < s.value < s.ci_high


# --------------------------------------------------------------------------- layout jitter


def test_relocated_inputs_keep_their_values_and_move_within_the_page():
    x = torch.randn(64, 128).bfloat16()
    w = torch.randn(128)
    offsets = set()
    for seed in range(32):
        moved_x, moved_w, eps = layout.Relocator().relocate([x, w, 1e-6], seed)
        assert torch.equal(moved_x, x) and torch.equal(moved_w, w) and eps == 1e-6
        assert moved_x.is_contiguous() and moved_x.shape == x.shape and moved_x.dtype == x.dtype
        assert moved_x.data_ptr() % layout.STEP_BYTES == 0  # torch's own alignment is kept
        offsets.add(moved_x.data_ptr() % layout.PAGE_BYTES)
    # 32 seeds over 64 possible offsets: a fixed layout would give one
    assert len(offsets) >= 12, offsets


def test_no_address_is_handed_out_twice_and_the_page_offset_is_the_seeds():
    """A kernel caching by pointer must never meet a repeated address with new values
    (bk_attack_cache_ptr was served stale results in 6 of 24 timed calls when a random
    offset repeated at the same heap address)."""
    relocator = layout.Relocator()
    seen, offsets = set(), []
    for seed in range(300):  # far more calls than the 64 page offsets
        (x,) = relocator.relocate([torch.randn(16, 33)], seed)
        assert x.data_ptr() not in seen
        seen.add(x.data_ptr())
        offsets.append((x.data_ptr() - x.untyped_storage().data_ptr()) % layout.PAGE_BYTES)
    # moving on by whole pages keeps the offset within the page that the seed chose
    expected = [(layout.Relocator().relocate([torch.randn(16, 33)], seed)[0].storage_offset() * 4)
                % layout.PAGE_BYTES for seed in range(300)]
    assert offsets == expected


def test_the_same_seed_gives_the_same_offsets_to_both_builds():
    x = torch.randn(1000)
    a = layout.Relocator().relocate({"x": x, "n": 3}, 1234)
    b = layout.Relocator().relocate({"x": x, "n": 3}, 1234)
    assert (a["x"].data_ptr() - a["x"].untyped_storage().data_ptr()) == \
        (b["x"].data_ptr() - b["x"].untyped_storage().data_ptr())
    assert a["n"] == 3


def test_tensors_the_kernel_may_rely_on_are_left_alone():
    strided = torch.randn(8, 8).t()
    empty = torch.empty(0)
    grad = torch.randn(4, requires_grad=True)
    out = layout.Relocator().relocate((strided, empty, grad), 7)
    assert out[0] is strided and out[1] is empty and out[2] is grad


# --------------------------------------------------------------------------- through the CLI


def test_against_adds_rounds_and_reports_why_it_stopped(tmp_path, bench_kernels):
    code, report = run_bench(tmp_path, RMS, "--kernel-package", "bk_honest", "--op", "bk_honest.rms_norm",
                             "--against", "bk_honest", "--rounds", "6", "--calls", "5",
                             "--against-precision", "3", "--against-max-s", "15")
    assert code == 0, report["failures"]
    ext = report["vs_against"]["rounds"]
    assert ext["stopped"] in ("precise", "time") and ext["precision"] == pytest.approx(0.03)
    assert ext["rounds"] == 6 + ext["added_rounds"] and ext["added_rounds"] % 6 == 0
    if ext["stopped"] == "precise":
        assert ext["half_width"] <= 0.03
    # every side ran every added round: the baseline's speedup gets them too
    assert report["timing"]["rounds"] == report["timing"]["kernel"]["rounds"] == ext["rounds"]
    assert report["timing"]["baseline"]["rounds"] == report["against"]["timing"]["rounds"] == ext["rounds"]


@pytest.mark.parametrize("value", ["0", "-1", "100"])
def test_against_precision_outside_0_100_is_a_usage_error(tmp_path, bench_kernels, value):
    code, _ = run_bench(tmp_path, RMS, "--kernel-package", "bk_honest", "--op", "bk_honest.rms_norm",
                        "--against", "bk_honest", "--against-precision", value)
    assert code == 2


def test_speedup_precision_adds_rounds_to_the_plain_run(tmp_path, bench_kernels):
    """--speedup-precision does for the speedup over the baseline what --against does for the
    ratio of two builds: whole cycles of orders until the interval is tight or the time is spent."""
    code, report = run_bench(tmp_path, RMS, "--kernel-package", "bk_honest", "--op", "bk_honest.rms_norm",
                             "--rounds", "4", "--calls", "5", "--speedup-precision", "3",
                             "--speedup-max-s", "10")
    assert code == 0, report["failures"]
    ext = report["timing"]["speedup_rounds"]
    assert ext["stopped"] in ("precise", "time") and ext["precision"] == pytest.approx(0.03)
    assert ext["rounds"] == 4 + ext["added_rounds"] and ext["added_rounds"] % 2 == 0  # 2 orders of b, k
    if ext["stopped"] == "precise":
        assert ext["half_width"] <= 0.03
    else:
        assert ext["seconds"] <= 10 + 5  # the block that would pass the limit is not started
    assert report["timing"]["kernel"]["rounds"] == report["timing"]["baseline"]["rounds"] == ext["rounds"]


def test_speedup_precision_is_off_by_default(tmp_path, bench_kernels):
    code, report = run_bench(tmp_path, RMS, "--kernel-package", "bk_honest", "--op", "bk_honest.rms_norm",
                             "--rounds", "3", "--calls", "3")
    assert code == 0 and report["timing"]["speedup_rounds"] is None
    assert report["timing"]["kernel"]["rounds"] == 3


@pytest.mark.parametrize("args", [["--speedup-precision", "-1"], ["--speedup-precision", "100"],
                                  ["--speedup-precision", "2", "--baseline-us", "100"]])
def test_speedup_precision_usage_errors(tmp_path, bench_kernels, args):
    code, _ = run_bench(tmp_path, RMS, "--kernel-package", "bk_honest", "--op", "bk_honest.rms_norm", *args)
    assert code == 2


def test_against_rounds_count_the_rounds_speedup_precision_added_after_it(tmp_path, bench_kernels):
    """With both options the comparison's record covers every round its ratio was computed from."""
    code, report = run_bench(tmp_path, RMS, "--kernel-package", "bk_honest", "--op", "bk_honest.rms_norm",
                             "--against", "bk_honest", "--rounds", "6", "--calls", "3", "--against-max-s", "3",
                             "--speedup-precision", "0.5", "--speedup-max-s", "8")
    assert code == 0, report["failures"]
    total = report["timing"]["kernel"]["rounds"]
    assert report["timing"]["speedup_rounds"]["rounds"] == total
    assert report["vs_against"]["rounds"]["rounds"] == total == report["against"]["timing"]["rounds"]
