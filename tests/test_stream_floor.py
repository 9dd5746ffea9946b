"""The side-by-side streaming floor (kernel_harness/bench/stream_floor.py, examples/stream_floors.py).

Timing is replaced by a fake clock that each call advances by a fixed amount, so
the ratio, its interval and the verdicts are deterministic: no test here times
anything real (performance numbers live in the README, measured by the script).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kernel_harness.bench import stream_floor as sf
from kernel_harness.paths import PROJECT_ROOT
from kernel_harness.stream_reader import LOCKSTEP, TORCH_SUM

SCRIPT = PROJECT_ROOT / "examples" / "stream_floors.py"


class FakeClock:
    """perf_counter_ns stand-in: calls made through ``call(cost)`` advance it by their cost."""

    def __init__(self) -> None:
        self.now = 0
        self.log: list[str] = []

    def __call__(self) -> int:
        return self.now

    def call(self, name: str, cost: int):
        def run() -> None:
            self.now += cost
            self.log.append(name)
        return run


def _time(kernel_ns: int, floor_ns: int, rounds: int = 12, calls: int = 3):
    clock = FakeClock()
    case = sf.FloorCase("k", 1 << 20, [clock.call("kernel", kernel_ns)] * 2)
    result = sf.time_case(case, [clock.call("floor", floor_ns)] * 2, rounds=rounds, calls_per_round=calls,
                          clock=clock)
    return result, clock


def test_ratio_is_kernel_over_floor_with_an_interval():
    result, _ = _time(1300, 1000)
    assert result.ratio == pytest.approx(1.3)
    assert result.kernel_us == pytest.approx(1.3) and result.floor_us == pytest.approx(1.0)  # 1300 and 1000 ns
    # a constant ratio still gets the harness's reproducibility floor (+-5 %) as its interval
    assert result.ci_low == pytest.approx(1.3 / 1.05) and result.ci_high == pytest.approx(1.3 * 1.05)
    assert result.floor_gbs == pytest.approx((1 << 20) / 1000.0)


def test_a_verdict_needs_the_whole_interval_on_one_side_of_the_target():
    result, _ = _time(1300, 1000)
    assert result.verdict(1.5) == "met"
    assert result.verdict(1.3) == "undecided"  # the interval 1.24-1.37 contains it
    assert result.verdict(1.2) == "not met"
    few, _ = _time(1300, 1000, rounds=2)
    assert few.ci_low is None and few.verdict(2.0) == "undecided"


def test_rounds_alternate_which_side_goes_first():
    _, clock = _time(10, 10, rounds=4, calls=2)
    warm, timed = clock.log[:2], clock.log[2:]
    assert warm == ["kernel", "floor"]
    firsts = [timed[i] for i in range(0, len(timed), 4)]
    assert firsts == ["kernel", "floor", "kernel", "floor"]


def test_bad_rounds_are_refused():
    clock = FakeClock()
    case = sf.FloorCase("k", 64, [clock.call("kernel", 1)])
    with pytest.raises(ValueError, match="rounds"):
        sf.time_case(case, [clock.call("floor", 1)], rounds=0, calls_per_round=1, clock=clock)


def _time_with_probe(kernel_ns: int, floor_ns: int, small_ns: int, large_ns: int, rounds: int = 12):
    """A 1 MiB case whose probe reads 64 KiB and 256 KiB in the cache."""
    clock = FakeClock()
    probe = sf.InCacheProbe(clock.call("small", small_ns), 1 << 16, clock.call("large", large_ns), 1 << 18)
    case = sf.FloorCase("k", 1 << 20, [clock.call("kernel", kernel_ns)] * 2, in_cache=probe)
    result = sf.time_case(case, [clock.call("floor", floor_ns)] * 2, rounds=rounds, calls_per_round=2, clock=clock)
    return result, clock


def test_the_in_cache_rate_is_the_probes_difference_and_bounds_the_ratio():
    """The probe's per-call costs cancel: 192 KiB more took 150 ns more, 1310.72 GB/s, whatever
    both calls spend on their own; against a floor streaming 1 MiB in 1000 ns that rate allows a
    ratio of 0.8, with the harness's +-5 % at least around it."""
    result, clock = _time_with_probe(1300, 1000, small_ns=100, large_ns=250)
    assert result.in_cache_gbs == pytest.approx((3 << 16) / 150)
    assert result.best_ratio == pytest.approx(result.floor_gbs / result.in_cache_gbs)
    assert result.best_ratio == pytest.approx(0.8)
    assert result.best_ci_low == pytest.approx(0.8 / 1.05) and result.best_ci_high == pytest.approx(0.8 * 1.05)
    assert clock.log[:4] == ["kernel", "floor", "small", "large"]  # one warm-up call each
    # the streaming sides' rounds first, then as many rounds of the probe's two sides on their own
    # (the streams would evict its inputs), alternating which goes first, each side's timed calls
    # after IN_CACHE_REWARM_CALLS untimed ones
    rewarm = sf.IN_CACHE_REWARM_CALLS
    streaming, probing = clock.log[4:4 + 12 * 4], clock.log[4 + 12 * 4:]
    assert set(streaming) == {"kernel", "floor"}
    per_round = 2 * (rewarm + 2)
    assert len(probing) == 12 * per_round
    assert probing[:per_round] == ["small"] * (rewarm + 2) + ["large"] * (rewarm + 2)
    assert probing[per_round:2 * per_round] == ["large"] * (rewarm + 2) + ["small"] * (rewarm + 2)
    data = result.as_json()
    assert {"in_cache_gbs", "best_ratio", "best_ci_low", "best_ci_high"} <= set(data)


class EvictingClock(FakeClock):
    """The kernel and floor stream past the cache, and the probe's inputs come back slowly: its
    calls after either take ``cold`` times as long, less by 0.25 a call, until cached (as a Zen 4's
    L3 refilled after the kernel's own streams: 2-5x, then 1.2-2.3x for six calls)."""

    def __init__(self, cold: float) -> None:
        super().__init__()
        self.cold, self.since_stream = cold, 0

    def streaming(self, name: str, cost: int):
        def run() -> None:
            self.now += cost
            self.log.append(name)
            self.since_stream = 0
        return run

    def cached(self, name: str, cost: int):
        def run() -> None:
            factor = max(1.0, self.cold - 0.25 * self.since_stream)
            self.now += round(cost * factor)
            self.log.append(name)
            self.since_stream += 1
        return run


def test_the_in_cache_rate_is_timed_away_from_the_streams_that_evict_the_probe():
    """The kernel and floor evict the probe's inputs, which take a dozen calls to come back; the
    rate must still be that of cached calls (192 KiB in 150 ns), not a mix with the reads that
    bring them back (interleaved with the streams, the probe's calls are never cached here)."""
    clock = EvictingClock(cold=4.0)
    probe = sf.InCacheProbe(clock.cached("small", 100), 1 << 16, clock.cached("large", 250), 1 << 18)
    case = sf.FloorCase("k", 1 << 20, [clock.streaming("kernel", 1300)] * 2, in_cache=probe)
    result = sf.time_case(case, [clock.streaming("floor", 1000)] * 2, rounds=12, calls_per_round=2, clock=clock)
    assert result.in_cache_gbs == pytest.approx((3 << 16) / 150)
    assert result.cause(1.2) == "memory access"


@pytest.mark.parametrize("large_ns, cause", [
    (250, "memory access"),  # in the cache it would reach 0.8x the floor: the misses are its memory reads
    (400, "in-cache rate"),  # 1.6x: not even its in-cache rate meets 1.2 against this floor
    (325, "undecided"),  # 1.2 (1.14-1.26): the interval holds the target
])
def test_a_missed_target_names_its_cause(large_ns: int, cause: str):
    result, _ = _time_with_probe(1300, 1000, small_ns=100, large_ns=large_ns)
    assert result.verdict(1.2) == "not met"
    assert result.cause(1.2) == cause
    assert result.cause(1.5) is None  # met: nothing to explain


def test_no_in_cache_rate_from_a_probe_whose_larger_call_was_not_slower():
    result, _ = _time_with_probe(1300, 1000, small_ns=200, large_ns=200)
    assert result.in_cache_gbs is None and result.best_ratio is None and result.cause(1.2) is None
    plain, _ = _time(1300, 1000)
    assert plain.in_cache_gbs is None and plain.cause(1.2) is None


class PhasedClock(FakeClock):
    """Memory that switches speed: calls made through ``phased`` cost ``slow`` until the switch
    (after ``switch_after`` calls of that side), ``fast`` from then on."""

    def phased(self, name: str, slow: int, fast: int, switch_after: int):
        made = [0]

        def run() -> None:
            self.now += slow if made[0] < switch_after else fast
            made[0] += 1
            self.log.append(name)
        return run


def test_a_run_that_caught_two_memory_phases_reports_each():
    """Six rounds in a slow phase (floor 1000 ns, kernel 1050: 1.05), six in a fast one (floor
    500, kernel 750: 1.5). The whole run's ratio mixes them; each phase gets its own, with its
    floor's rate and verdict, slowest first."""
    clock = PhasedClock()
    calls = 2
    switch = 1 + 6 * calls  # the warm-up call, then six rounds
    case = sf.FloorCase("k", 1 << 20, [clock.phased("kernel", 1050, 750, switch)] * 2)
    result = sf.time_case(case, [clock.phased("floor", 1000, 500, switch)] * 2, rounds=12, calls_per_round=calls,
                          clock=clock)
    assert [p.rounds for p in result.phases] == [6, 6]
    slow, fast = result.phases
    assert slow.floor_gbs == pytest.approx((1 << 20) / 1000.0, rel=1e-3)
    assert fast.floor_gbs == pytest.approx((1 << 20) / 500.0, rel=1e-3)
    assert slow.ratio == pytest.approx(1.05) and fast.ratio == pytest.approx(1.5)
    assert slow.verdict(1.25) == "met" and fast.verdict(1.25) == "not met"
    assert result.floor_spread == pytest.approx(2.0)
    data = json.loads(json.dumps(result.as_json()))
    assert [p["ratio"] for p in data["phases"]] == pytest.approx([1.05, 1.5])


def test_one_memory_phase_reports_no_split():
    result, _ = _time(1300, 1000)
    assert result.phases == [] and result.floor_spread == pytest.approx(1.0)


@pytest.mark.parametrize("rates, groups", [
    ([30, 31, 29, 30, 32, 31], [[0, 1, 2, 3, 4, 5]]),  # one phase: within 1.1x
    ([30, 31, 60, 29, 62, 64, 33, 61], [[0, 1, 3, 6], [2, 4, 5, 7]]),  # two, interleaved in time
    ([30, 31, 32, 60, 61], [[0, 1, 2, 3, 4]]),  # a fast side of two rounds is no phase
    ([30, 32, 34, 36, 38, 40], [[0, 1, 2, 3, 4, 5]]),  # a steady drift: the halves' medians within 1.25x
    ([30, 31, 32, 40, 41, 42], [[0, 1, 2], [3, 4, 5]]),  # 1.29x apart
    ([37] * 13 + [27] * 3, [list(range(16))]),  # a dip of three rounds in sixteen: under a fifth
    ([37] * 12 + [27] * 4, [[12, 13, 14, 15], list(range(12))]),  # four: a phase
])
def test_memory_phases_split_only_at_a_real_gap(rates, groups):
    assert sf.phase_rounds(rates) == groups


def test_an_in_cache_probe_needs_a_larger_second_size():
    with pytest.raises(ValueError, match="small_bytes < large_bytes"):
        sf.InCacheProbe(lambda: None, 1 << 18, lambda: None, 1 << 16)


def test_copies_reach_three_last_level_caches():
    llc = 32 << 20
    assert sf.copies_for(16 << 20, llc) == 6
    assert sf.copies_for(256 << 20, llc) == 2  # never fewer than two
    buffers = sf.own_buffers(4096, 3)
    assert len(buffers) == 3 and float(buffers[0].sum()) == 1024.0  # 1024 fp32 ones


def test_the_floor_reads_the_cases_own_buffers_when_it_names_them():
    """Buffers of the same size stream at different speeds by where they lie, so a case that
    names its buffers gets a floor over exactly those bytes: an fp32 view of each, whatever
    their dtype (int8 weights, bf16 caches), summed per copy in the copy's order."""
    import torch

    weights = [torch.full((8, 16), i + 1, dtype=torch.int8) for i in range(3)]  # 128 bytes each
    caches = [(torch.zeros(4, 8, dtype=torch.bfloat16), torch.ones(4, 8, dtype=torch.bfloat16))]
    calls = sf.same_bytes_calls([[w] for w in weights])
    assert len(calls) == 3
    before = calls[1]()[0]
    assert torch.equal(before, weights[1].view(-1).view(torch.float32).sum())  # 32 fp32 words of 0x02020202
    weights[1].fill_(3)  # the very bytes, not a copy: the floor's next read sees the change
    after = calls[1]()[0]
    assert not torch.equal(after, before) and torch.equal(after, weights[1].view(-1).view(torch.float32).sum())
    assert len(sf.same_bytes_calls(caches)[0]()) == 2  # K and V both read
    case = sf.FloorCase("k", 128, [lambda: None] * 3, [[w] for w in weights])
    floors, source = sf._floor_calls(case, 1 << 20)
    assert source == sf.SAME_BUFFERS and list(floors) == [TORCH_SUM] and len(floors[TORCH_SUM]) == 3
    with pytest.raises(ValueError, match="holds? 128 bytes, but the case says it streams 4096"):
        sf._floor_calls(sf.FloorCase("k", 4096, [lambda: None] * 3, [[w] for w in weights]), 1 << 20)
    with pytest.raises(ValueError, match="2 sets of reads for 3 calls"):
        sf._floor_calls(sf.FloorCase("k", 128, [lambda: None] * 3, [[w] for w in weights[:2]]), 1 << 20)
    with pytest.raises(ValueError, match="contiguous"):
        sf.same_bytes_calls([[weights[0].t()]])
    _, own = sf._floor_calls(sf.FloorCase("k", 128, [lambda: None] * 3), 1 << 20)
    assert own == sf.OWN_BUFFERS


def test_the_floor_is_the_faster_reader_timed_in_the_same_rounds():
    """Two readers of the same bytes: both take part in every round's alternation, the faster one's
    median is the floor whichever was listed first, and both rates go with the result."""
    for slow_first in (True, False):
        clock = FakeClock()
        case = sf.FloorCase("k", 1 << 20, [clock.call("kernel", 1300)] * 2)
        readers = {"sum": [clock.call("sum", 1250)] * 2, "lockstep": [clock.call("lockstep", 1000)] * 2}
        if not slow_first:
            readers = dict(reversed(list(readers.items())))
        result = sf.time_case(case, readers, rounds=6, calls_per_round=2, clock=clock)
        assert result.floor_reader == "lockstep" and result.floor_us == pytest.approx(1.0)
        assert result.ratio == pytest.approx(1.3)
        assert result.reader_gbs == {"sum": pytest.approx((1 << 20) / 1250, rel=1e-3),
                                     "lockstep": pytest.approx((1 << 20) / 1000, rel=1e-3)}
        timed = clock.log[3:]  # after one warm-up call of each side
        assert timed.count("sum") == timed.count("lockstep") == timed.count("kernel") == 12
        per_round = 6
        assert timed[0] == "kernel" and timed[per_round + 4] == "kernel"  # first, then last in the next round
    with pytest.raises(ValueError, match="at least one reader"):
        sf.time_case(case, {}, rounds=3, calls_per_round=1, clock=clock)


def test_with_a_reader_the_floor_reads_the_same_tensors_twice_over(tmp_path: Path):
    """The lockstep reader's calls read exactly the case's buffers (its checksum is theirs)."""
    import numpy as np
    import torch

    from kernel_harness.stream_reader import try_stream_reader

    reader, missing = try_stream_reader(tmp_path)
    if reader is None:
        pytest.skip(missing)
    weights = [torch.full((8, 16), i + 1, dtype=torch.int8) for i in range(3)]
    case = sf.FloorCase("k", 128, [lambda: None] * 3, [[w] for w in weights])
    floors, source = sf._floor_calls(case, 1 << 20, reader)
    assert source == sf.SAME_BUFFERS and set(floors) == {TORCH_SUM, LOCKSTEP}
    words = np.frombuffer(weights[2].numpy().tobytes(), dtype=np.uint64)
    assert floors[LOCKSTEP][2]() == int(words.sum(dtype=np.uint64))
    own, own_source = sf._floor_calls(sf.FloorCase("k", 128, [lambda: None] * 3), 1 << 20, reader)
    assert own_source == sf.OWN_BUFFERS and len(own[LOCKSTEP]) == len(own[TORCH_SUM]) >= 2
    assert own[LOCKSTEP][0]() == int(np.frombuffer(torch.ones(32).numpy().tobytes(), np.uint64).sum(dtype=np.uint64))


def test_json_keeps_its_keys():
    result, _ = _time(1200, 1000)
    data = result.as_json()
    assert {"name", "nbytes", "kernel_us", "floor_us", "ratio", "ci_low", "ci_high", "rounds", "calls_per_round",
            "floor_gbs", "kernel_gbs", "floor_source", "floor_reader", "reader_gbs", "phases", "floor_spread"} <= set(data)
    json.dumps(data)


@pytest.mark.parametrize("args, message", [
    (["--cases", "gemv"], "unknown case"),
    (["--rounds", "2"], "at least 3 rounds"),
])
def test_script_refuses_bad_usage(tmp_path: Path, args: list[str], message: str):
    (tmp_path / "build").mkdir()
    run = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path), *args], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 2 and message in run.stderr, run.stderr


def test_script_names_an_unbuilt_directory(tmp_path: Path):
    run = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and "build_kernel.py" in run.stderr and "Traceback" not in run.stderr


def test_script_times_a_built_package_against_its_floor(gemm_kernel_dir: Path, tmp_path: Path):
    """The real script on the shared GEMM package, one case, few rounds: it runs, and the JSON
    holds a ratio with its interval and a verdict under the stated conditions (no speed asserted)."""
    out = tmp_path / "floors.json"
    run = subprocess.run([sys.executable, str(SCRIPT), str(gemm_kernel_dir), "--cases", "linear_int8",
                          "--rounds", "3", "--calls", "1", "--json", str(out)],
                         capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    data = json.loads(out.read_text())
    assert {"cpu", "threads", "load_before", "steal_fraction", "omp_wait_policy"} <= set(data["conditions"])
    (row,) = data["results"]
    assert row["name"] == "linear_int8 bf16 M=1" and row["nbytes"] == 4096 * 4096
    assert row["ratio"] > 0 and row["ci_low"] <= row["ratio"] <= row["ci_high"]
    assert row["verdict"] in ("met", "not met", "undecided") and row["target"] == 1.3
    assert row["floor_source"] == sf.SAME_BUFFERS
    # the floor is the faster of the two readers, both timed (the reader compiles with g++)
    assert data["conditions"]["floor_reader_note"] is None and len(data["conditions"]["floor_readers"]) == 2
    assert set(row["reader_gbs"]) == {TORCH_SUM, LOCKSTEP} and row["floor_reader"] in row["reader_gbs"]
    assert row["reader_gbs"][row["floor_reader"]] == max(row["reader_gbs"].values())
    # the in-cache probe ran beside it: a rate (or none, if noise made the larger probe no slower)
    assert "in_cache_gbs" in row and row["cause"] in (None, "in-cache rate", "memory access", "undecided")
    assert row["in_cache_gbs"] is None or (row["in_cache_gbs"] > 0 and row["best_ratio"] > 0)
    # three rounds cannot hold two phases of three: the floor's spread is reported, no split
    assert row["phases"] == [] and row["floor_spread"] >= 1.0


def test_the_int8_probe_holds_more_rows_than_the_weight_on_a_large_last_level_cache(monkeypatch):
    """On a 480 MiB L3 (a Xeon with AMX) the probe's quarter of the cache is 30720 int8 rows of
    K = 4096, more than the N = 4096 the streamed case has: its scales must follow its rows (a
    slice of the case's scales stopped the script there with a shape error)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("stream_floors_script", SCRIPT)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    monkeypatch.setattr(script, "copies_for", lambda nbytes, llc: 2)
    calls = []

    class Kernel:
        def linear_int8(self, x, w, scales, bias):
            assert scales.shape == (w.shape[0],), (tuple(scales.shape), tuple(w.shape))
            calls.append(w.shape[0])

    ((case, _),) = script.linear_int8_cases(Kernel(), llc=96 << 20)
    case.in_cache.large()
    case.in_cache.small()
    assert calls[0] > script.N and calls == [calls[0], calls[0] // 4]
