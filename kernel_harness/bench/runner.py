"""The whole benchmark: correctness that cannot be fooled, then trustworthy timing.

Who holds what:

* the **parent** (this module) loads the baseline, draws every correctness
  input set, keeps pristine copies, computes the reference outputs (and the
  float64 oracle) and does every comparison;
* the **kernel worker** imports the kernel and runs it: on input sets the
  parent sends (correctness), and on fresh sets it draws itself from seeds
  the parent hands over one round at a time (timing).  It never computes a
  reference output, so there is none in its memory to find or to recycle;
* the **baseline worker** times the baseline the same way under the same
  thread settings.  Rounds alternate between the two (ABAB...);
* with ``--processes N`` timing rotates over N such pairs (the extra kernel
  workers only import and time): a process can settle into its own
  performance regime (memory placement, heap history), and the interval then
  resamples the pairs as well as the rounds.  Measured here, one pair per
  side already kept an identical kernel within 0.95-1.05 in 10 of 10 runs,
  and two pairs did not narrow the spread, so the default is one.

After each kernel round the parent picks, at random and only then, which of
the round's calls to verify; the worker copied every output at return, so
each call had to be right.  See ``docs/benchmark.md`` for the mechanisms
against each attack class.
"""

from __future__ import annotations

import math
import os
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from .. import correctness as corr
from ..baseline import Baseline, load_baseline
from ..errors import CheckFailed, KernelCrashed, UsageError
from . import stats, trace, tree
from .pinning import detect_pinning
from .process import WorkerProcess, with_steady_malloc

TIERS = ("generic", "avx2", "avx512")
#: Upper bound of input sets rotated per round with --cold (memory and time).
MAX_COLD_SETS = 256


@dataclass
class BenchOptions:
    baseline_path: str
    kernel_spec: str
    op_path: str
    baseline_us: float | None = None
    atol: float | None = None
    rtol: float | None = None
    tier: str | None = None  # None: the dispatcher's choice; "all": sweep
    timeout: float = 120.0
    cold: bool = False
    oracle: str | None = None  # None or "fp64"
    accept_if_as_accurate: bool = False
    assert_dispatch: bool = False
    dispatch_tolerance_pct: float = 5.0
    rounds: int = 20
    calls_per_round: int | None = None  # None: calibrated
    target_round_s: float = 0.03
    timing_processes: int = 1  # worker pairs the timing rounds rotate over (--processes)
    time_budget_s: float = 14.0
    threads: int | None = None
    verified_calls: int = 4  # timed calls verified per run, in rounds the worker cannot predict
    correctness_seeds: int = 3
    settle_s: float = 0.01
    sweep_rounds: int = 3
    seed: int | None = None  # run seed; random by default so nothing can be precomputed


@dataclass
class InputSet:
    label: str
    source: tuple[str, int]
    seed: int
    inputs: list[Any]


@dataclass
class Failure:
    check: str  # values | aliasing | input-modified | async | timed-call | tamper
    input_set: str
    tier: str
    message: str
    leaf: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        data = {"check": self.check, "input_set": self.input_set, "tier": self.tier,
                "message": self.message}
        if self.leaf is not None:
            data.update({k: v for k, v in self.leaf.items() if k != "message"})
            data["leaf_message"] = self.leaf.get("message")
        return data


@dataclass
class BenchResult:
    options: BenchOptions
    correct: bool = False
    failures: list[Failure] = field(default_factory=list)
    acceptance_rule: str = "tolerance"
    tolerances: dict[str, str] = field(default_factory=dict)
    widened: bool = False
    oracle: list[dict[str, Any]] = field(default_factory=list)
    would_pass_as_accurate: bool | None = None
    baseline: stats.Measurement | None = None
    kernel: stats.Measurement | None = None
    baseline_us: float | None = None
    kernel_us: float | None = None
    baseline_cached: bool = False
    # With a cached baseline: the baseline timed now in a few spot rounds, so a
    # change of the machine's speed since the value was cached shows (drift).
    baseline_spot: stats.Measurement | None = None
    speedup: stats.Speedup | None = None
    threads: int = 0
    pinned: bool = False
    pinned_detail: str = ""
    tiers: dict[str, Any] = field(default_factory=dict)
    aten_ops: dict[str, Any] = field(default_factory=dict)
    throughput: dict[str, Any] = field(default_factory=dict)
    verified_calls: int = 0
    input_sets: list[str] = field(default_factory=list)
    calls_per_round: int = 0
    timing_processes: int = 1
    notes: list[str] = field(default_factory=list)
    timing_skipped: str | None = None
    dispatch_violations: list[str] = field(default_factory=list)
    load_average: float | None = None


#: Spot rounds this far (relative) from a cached baseline earn a note: two
#: uncached runs of the eager rms_norm baseline a minute apart differed by
#: 15-17 % on this shared VM, so smaller drifts are within its noise.
DRIFT_NOTE = 0.15


def _spot_rounds(rounds: int) -> set[int]:
    """Up to four rounds spread over the run for a cached baseline's spot timing;
    never round 0 (it follows the warm-up) unless it is the only one."""
    return {max(min(1, rounds - 1), (2 * k + 1) * rounds // 8) for k in range(4)}


def spot_speedup(result: BenchResult) -> float | None:
    """Baseline spot median / kernel median: the ratio measured side by side in this
    run, which a change of the machine's speed since the baseline was cached moves
    on both sides alike (None without spot rounds)."""
    if not result.baseline_cached or result.baseline_spot is None or not result.kernel_us:
        return None
    return result.baseline_spot.median_us / result.kernel_us


def baseline_drift(result: BenchResult) -> float | None:
    """Relative change of the baseline since it was cached (spot median / cached - 1)."""
    if not result.baseline_cached or result.baseline_spot is None or not result.baseline_us:
        return None
    return result.baseline_spot.median_us / result.baseline_us - 1.0


# =========================================================================== helpers


def _system_seed() -> int:
    return random.SystemRandom().randrange(1, 2**31 - 1)


def check_reproducible(baseline: Baseline, seed: int) -> None:
    """Timed calls draw inputs from seeds in the worker and the parent redraws them to
    verify: that only works when get_inputs() draws from the seeded generators."""
    a, b = baseline.draw_inputs(seed), baseline.draw_inputs(seed)
    if not tree.bitwise_equal(a, b) or len(a) != len(b):
        raise UsageError(
            f"get_inputs() in {baseline.path} returned different values for the same seed. "
            "Draw random values with torch (torch.randn, torch.rand, ...) or the seeded random/"
            "numpy generators, so that the benchmark can draw fresh, reproducible input sets.")


def _tensor_bytes(obj: Any) -> int:
    return tree.nbytes(obj)


def _cpu_has(tier: str) -> bool:
    try:
        from ..cpu import has_isa
    except ImportError:  # pragma: no cover - cpu.py ships with the harness
        return tier == "generic"
    return has_isa(tier)


# =========================================================================== runner


class Benchmark:
    def __init__(self, options: BenchOptions) -> None:
        self.o = options
        self.rng = random.Random(options.seed if options.seed is not None else _system_seed())
        self.result = BenchResult(options=options)
        self.baseline: Baseline | None = None
        self.kworker: WorkerProcess | None = None
        self.bworker: WorkerProcess | None = None
        # further worker pairs, for timing only (see the module docstring)
        self.kspares: list[WorkerProcess] = []
        self.bspares: list[WorkerProcess] = []
        self.kernel_info: dict[str, Any] = {}

    def _seed(self) -> int:
        return self.rng.randrange(1, 2**31 - 1)

    # ------------------------------------------------------------------ entry

    def run(self) -> BenchResult:
        o = self.o
        if o.tier not in (None, "all", *TIERS):
            raise UsageError(f"--tier {o.tier!r} is not one of generic, avx2, avx512, all.")
        if o.tier in TIERS and not _cpu_has(o.tier):
            raise UsageError(f"--tier {o.tier}: this CPU cannot run the {o.tier} tier. "
                             "Choose a tier it supports (or --tier all to sweep those).")
        if o.assert_dispatch and o.tier != "all":
            raise UsageError("--assert-dispatch compares the tiers, so it needs --tier all.")
        if o.oracle not in (None, "fp64"):
            raise UsageError(f"--oracle {o.oracle!r}: the only oracle is fp64.")
        if o.accept_if_as_accurate and o.oracle is None:
            o.oracle = "fp64"
        if o.rounds < 1 or (o.calls_per_round is not None and o.calls_per_round < 1):
            raise UsageError("--rounds and --calls must be at least 1.")
        if not 1 <= o.timing_processes <= 4:
            raise UsageError(f"--processes {o.timing_processes}: use 1 to 4 worker processes per side "
                             "(each one costs a torch import, ~2 s).")
        r = self.result
        r.widened = o.atol is not None or o.rtol is not None
        r.acceptance_rule = "widened-tolerance" if r.widened else "tolerance"
        r.threads = o.threads or torch.get_num_threads()
        pin = detect_pinning()
        r.pinned, r.pinned_detail = pin.pinned, pin.detail

        self.baseline = load_baseline(o.baseline_path)
        check_reproducible(self.baseline, self._seed())
        try:
            # spawn the kernel's worker now: its imports (torch, the kernel) overlap with
            # the parent's own work on the inputs and references
            self.kworker = self._spawn("kernel")
            sets = self._draw_correctness_sets()
            r.input_sets = [s.label for s in sets]
            self._start_kernel()
            # started once the kernel imported (two torch imports at once only slow
            # each other on a small machine); it imports while correctness runs. With
            # a cached baseline it only times the spot rounds (see _timing).
            self.bworker = self._spawn("baseline")
            self._correctness(sets)
            if r.correct:
                self._spawn_spares()
            self._trace(sets[0])
            if not r.correct:
                r.timing_skipped = "the kernel is incorrect; fix it before timing it"
                return r
            self._timing()
            self._note_load()
            if r.correct and o.tier == "all":
                self._sweep(sets)
            self._throughput(sets[0])
        finally:
            for w in (self.kworker, self.bworker, *self.kspares, *self.bspares):
                if w is not None:
                    w.close()
        return r

    # ------------------------------------------------------------------ inputs

    def _draw_correctness_sets(self) -> list[InputSet]:
        assert self.baseline is not None
        sets = []
        for i in range(self.o.correctness_seeds):
            seed = self._seed()
            sets.append(InputSet(f"get_inputs() #{i + 1} (seed {seed})", ("inputs", 0), seed,
                                 self.baseline.draw_inputs(seed)))
        seed = self._seed()
        for i, inputs in enumerate(self.baseline.draw_correctness_inputs(seed)):
            sets.append(InputSet(f"get_correctness_inputs()[{i}] {tree.describe_set(inputs)}",
                                 ("correctness", i), seed, inputs))
        return sets

    # ------------------------------------------------------------------ workers

    def _spawn(self, role: str) -> WorkerProcess:
        # the same allocator steady state for every worker (see STEADY_MALLOC_ENV)
        env = with_steady_malloc(dict(os.environ))
        # identical thread settings for both workers, for torch and for a kernel's own OpenMP
        env["OMP_NUM_THREADS"] = str(self.result.threads)
        if self.o.tier in TIERS:
            env["KERNEL_CPU_ISA"] = self.o.tier
        return WorkerProcess(role, timeout=self.o.timeout, env=env)

    def _spawn_spares(self) -> None:
        """The extra timing pairs; they import while the trace and warm-up run."""
        for _ in range(max(0, self.o.timing_processes - 1)):
            self.kspares.append(self._spawn("kernel"))
            if self.o.baseline_us is None:
                self.bspares.append(self._spawn("baseline"))

    def _load(self, worker: WorkerProcess) -> dict[str, Any]:
        return worker.request("load", f"loading the {worker.role}", role=worker.role,
                              baseline_path=str(self.o.baseline_path),
                              kernel_spec=self.o.kernel_spec, op_path=self.o.op_path,
                              threads=self.result.threads)

    def _start_kernel(self) -> None:
        assert self.kworker is not None
        self.kernel_info = self._load(self.kworker)
        self._check_tamper(self.kernel_info, "import")

    def _check_tamper(self, reply: dict[str, Any], when: str) -> None:
        if reply.get("tampered"):
            names = ", ".join(reply["tampered"])
            raise CheckFailed(
                f"The kernel package replaced the harness's clock or code ({names}) during "
                f"{when}. A kernel must not patch timers or the harness; the run is rejected.")

    def _tiers_to_check(self) -> list[str | None]:
        if self.o.tier != "all":
            return [None]
        return [None, *self._sweep_tiers()]

    def _sweep_tiers(self) -> list[str]:
        declared = self.kernel_info.get("tiers")
        if declared is None:
            raise UsageError(
                "--tier all needs the kernel package to expose available_tiers() (the generated "
                "kernels do); this one does not.")
        return [t for t in TIERS if t in declared and _cpu_has(t)]

    def _set_tier(self, tier: str | None) -> None:
        assert self.kworker is not None
        if self.o.tier in TIERS:
            return  # forced for the whole run through the environment
        self.kworker.request("set_isa", "selecting a tier", tier=tier)

    def _tier_label(self, tier: str | None) -> str:
        if self.o.tier in TIERS:
            return self.o.tier
        return tier or "dispatch"

    # ------------------------------------------------------------------ correctness

    def _correctness(self, sets: list[InputSet]) -> None:
        assert self.baseline is not None and self.kworker is not None
        r = self.result
        refs = [self.baseline.reference(tree.clone_tree(s.inputs)) for s in sets]
        pairs: dict[int, tuple[Any, Any]] = {}

        def oracle_pair(i: int) -> Callable[[], tuple[Any, Any]] | None:
            if self.o.oracle != "fp64":
                return None

            def compute() -> tuple[Any, Any]:
                assert self.baseline is not None
                if i not in pairs:
                    pairs[i] = (self.baseline.oracle(sets[i].inputs),
                                self.baseline.run_speed_baseline(tree.clone_tree(sets[i].inputs)))
                return pairs[i]
            return compute

        failed_outputs: list[tuple[InputSet, Any, Any]] = []
        for tier in self._tiers_to_check():
            self._set_tier(tier)
            label = self._tier_label(tier)
            for i, s in enumerate(sets):
                reply = self.kworker.request("check", f"the correctness call on {s.label} "
                                             f"(tier {label})", inputs=s.inputs,
                                             settle_s=self.o.settle_s)
                self._check_tamper(reply, "a correctness call")
                failed_before = len(r.failures)
                self._judge_call(reply["output"], s.inputs, reply["inputs_after"], refs[i],
                                 s.label, label, oracle_pair=oracle_pair(i),
                                 aliasing=reply["overlaps"], changed=reply["changed_after_return"])
                if len(r.failures) > failed_before:
                    failed_outputs.append((s, reply["output"], refs[i]))
        self._set_tier(None)
        r.tolerances = self._tolerance_table(refs)
        r.correct = not r.failures
        if not r.correct and self.o.oracle is None:
            r.would_pass_as_accurate = self._would_pass_as_accurate(failed_outputs)

    def _tolerance_table(self, refs: list[Any]) -> dict[str, str]:
        table = {}
        for ref in refs:
            for t in tree.tensors(ref):
                name = str(t.dtype).removeprefix("torch.")
                table[name] = corr.tolerance_for(t.dtype, atol=self.o.atol, rtol=self.o.rtol).formula()
        return table

    def _judge_call(self, output: Any, pristine: list[Any], inputs_after: list[Any],
                    reference: Any, set_label: str, tier: str, *,
                    oracle_pair: Callable[[], tuple[Any, Any]] | None = None,
                    aliasing: list[tuple[int, int]] | None = None,
                    changed: bool = False, check: str = "values") -> bool:
        """Judge one kernel call; record failures; True when it passed."""
        r = self.result
        before = len(r.failures)
        if aliasing:
            pairs = ", ".join(f"output leaf {o} / input {i}" for o, i in aliasing)
            r.failures.append(Failure("aliasing", set_label, tier,
                f"the output shares memory with an input ({pairs}); allocate a fresh output "
                "(out-parameter-api) instead of writing into or returning an input"))
        if not tree.bitwise_equal(inputs_after, pristine):
            bad = [i for i, (a, p) in enumerate(zip(tree.tensors(inputs_after), tree.tensors(pristine),
                                                  strict=False)) if not tree.bitwise_equal(a, p)]
            r.failures.append(Failure("input-modified", set_label, tier,
                f"the kernel modified its input(s) {bad}; inputs are read-only"))
        if changed:
            r.failures.append(Failure("async", set_label, tier,
                "the output changed after the call returned (asynchronous completion): the "
                "kernel must finish writing before it returns"))
        comparison = corr.compare_outputs(output, reference, atol=self.o.atol, rtol=self.o.rtol)
        if not comparison.ok:
            accepted = False
            if oracle_pair is not None:
                oracle, baseline_out = oracle_pair()
                leaves = corr.oracle_errors(output, baseline_out, oracle)
                self._record_oracle(set_label, tier, leaves)
                if self.o.accept_if_as_accurate and corr.passes_as_accurate(comparison, leaves):
                    accepted = True
                    r.acceptance_rule = "as-accurate-as-baseline"
            if not accepted:
                for f in comparison.failures:
                    msg = f"{f.path}: {f.message} -> {f.diagnosis}: {f.advice}"
                    if check == "timed-call":
                        msg = ("a timed call's output is wrong although the correctness calls "
                               f"passed (results cached across calls, or correct only for the "
                               f"first calls): {msg}")
                    r.failures.append(Failure(check, set_label, tier, msg, f.to_dict()))
        elif oracle_pair is not None and check != "timed-call":
            oracle, baseline_out = oracle_pair()
            self._record_oracle(set_label, tier, corr.oracle_errors(output, baseline_out, oracle))
        return len(r.failures) == before

    def _record_oracle(self, set_label: str, tier: str, leaves: list[corr.OracleLeaf]) -> None:
        for leaf in leaves:
            self.result.oracle.append({"input_set": set_label, "tier": tier, **leaf.to_dict()})

    def _would_pass_as_accurate(self, failed: list[tuple[InputSet, Any, Any]]) -> bool | None:
        """When only values failed, say whether --accept-if-as-accurate would accept them."""
        assert self.baseline is not None
        if any(f.check != "values" for f in self.result.failures):
            return False
        for s, output, ref in failed:
            comparison = corr.compare_outputs(output, ref, atol=self.o.atol, rtol=self.o.rtol)
            leaves = corr.oracle_errors(output,
                                        self.baseline.run_speed_baseline(tree.clone_tree(s.inputs)),
                                        self.baseline.oracle(s.inputs))
            if not corr.passes_as_accurate(comparison, leaves):
                return False
        return True

    # ------------------------------------------------------------------ delegation

    def _trace(self, s: InputSet) -> None:
        assert self.baseline is not None and self.kworker is not None
        kernel_ops = self.kworker.request("trace", "tracing the kernel call", inputs=s.inputs)["ops"]
        with torch.no_grad():
            base_ops, _ = trace.trace_ops(self.baseline.speed_function(), *tree.clone_tree(s.inputs))
        delegates = trace.is_delegation(kernel_ops, base_ops)
        self.result.aten_ops = {
            "kernel": trace.unique_in_order(kernel_ops),
            "baseline": trace.unique_in_order(base_ops),
            "kernel_calls": len(kernel_ops),
            "delegates_to_baseline": delegates,
        }
        if delegates:
            self.result.notes.append(
                "delegation: the kernel call dispatched every compute op of the baseline ("
                + ", ".join(sorted(trace.compute_ops(base_ops)))
                + "); it runs the baseline's computation instead of a kernel of its own")

    # ------------------------------------------------------------------ timing

    def _time(self, worker: WorkerProcess, source: tuple[str, int], n: int, *, keep: bool,
              warmup: int = 0, what: str) -> tuple[list[int], list[int], int]:
        seeds = [self._seed() for _ in range(n + warmup)]
        reply = worker.request("time", what, source=source, seeds=seeds, keep=keep,
                               warmup=warmup, cold=self.o.cold)
        self._check_tamper(reply, what)
        return reply["times_ns"], seeds[warmup:], reply["gen_ns"]

    def _cold_sets(self, set_bytes: int) -> int:
        llc = _last_level_cache_bytes()
        if not llc or not set_bytes:
            return 0
        wanted = math.ceil(1.5 * llc / set_bytes) + 1
        cap = max(2, min(MAX_COLD_SETS, (2 << 30) // set_bytes))
        if wanted > cap:
            self.result.notes.append(
                f"--cold: rotating {cap} input sets ({cap * set_bytes / 2**20:.0f} MiB) of the "
                f"{wanted} needed to exceed 1.5x the {llc / 2**20:.0f} MiB last-level cache; "
                "the measurement is partly warm")
        return min(wanted, cap)

    def _timing(self) -> None:
        assert self.baseline is not None and self.kworker is not None
        o, r = self.o, self.result
        source = ("inputs", 0)
        cached = o.baseline_us is not None
        kworkers = [self.kworker, *self.kspares]
        bworkers = [self.bworker, *self.bspares] if self.bworker is not None else []
        for w in self.kspares:
            self._check_tamper(self._load(w), "import")
        for w in bworkers:
            self._load(w)
        # warm-up, which also calibrates the number of calls per round
        t_call, gen = 0.0, 0.0
        for w in kworkers:
            warm, _, w_gen = self._time(w, source, 3, keep=False, warmup=2, what="the kernel's warm-up calls")
            t_call = max(t_call, stats.Measurement("k", [warm]).median_us * 1e3)
            gen = max(gen, w_gen / 5)
        for w in bworkers:
            warm, _, _ = self._time(w, source, 3, keep=False, warmup=2, what="the baseline's warm-up calls")
            if not cached:  # a cached run sizes its rounds for the kernel, as before spot rounds existed
                t_call = max(t_call, stats.Measurement("b", [warm]).median_us * 1e3)
        n = o.calls_per_round or _calibrate(t_call, gen, o.target_round_s, o.rounds,
                                              o.time_budget_s, sides=1 if cached else 2)
        if o.cold:
            n = max(n, self._cold_sets(_tensor_bytes(self.baseline.draw_inputs(self._seed()))))
        r.calls_per_round = n
        r.timing_processes = len(kworkers)
        kernel = stats.Measurement("kernel")
        base = stats.Measurement("baseline")
        spot_rounds = _spot_rounds(o.rounds) if cached else set(range(o.rounds))
        picked: list[tuple[int, tuple[Any, Any]]] = []
        # which rounds get a verified call is decided here, in the parent; the worker
        # keeps a copy of every output of every round and learns the pick only after it
        verify_rounds = set(self.rng.sample(range(o.rounds), min(o.verified_calls, o.rounds)))
        extra = max(0, o.verified_calls - o.rounds)
        for rnd in range(o.rounds):
            # round rnd runs on worker pair rnd % P; each pair sees both orders
            pair = rnd % len(kworkers)
            order = ("b", "k") if (rnd // len(kworkers)) % 2 == 0 else ("k", "b")
            for side in order:
                if side == "b" and bworkers and rnd in spot_rounds:
                    # keep=True on both sides: identical copying work and allocator state
                    times, _, _ = self._time(bworkers[pair % len(bworkers)], source, n, keep=True,
                                             what=f"baseline timing round {rnd + 1}")
                    base.add_round(times, group=pair)
                elif side == "k":
                    worker = kworkers[pair]
                    times, seeds, _ = self._time(worker, source, n, keep=True,
                                                 what=f"kernel timing round {rnd + 1}")
                    kernel.add_round(times, group=pair)
                    count = (rnd in verify_rounds) + (extra // o.rounds
                                                      + (rnd < extra % o.rounds))
                    idx = self.rng.sample(range(n), min(count, n))
                    calls = worker.request("fetch", "fetching verified outputs", indices=idx)["calls"]
                    picked.extend((seeds[i], c) for i, c in zip(idx, calls, strict=True))
        self._verify_timed(picked)
        r.kernel = kernel
        r.kernel_us = kernel.median_us
        if cached:
            r.baseline_cached = True
            r.baseline_us = float(o.baseline_us)  # type: ignore[arg-type]
            r.speedup = stats.Speedup(r.baseline_us / r.kernel_us, None, None, 0.95)
            if base.count:
                r.baseline_spot = base
                self._note_drift(r)
        else:
            r.baseline = base
            r.baseline_us = base.median_us
            r.speedup = stats.speedup(base, kernel, seed=self.rng.randrange(2**31))
        r.correct = not r.failures

    def _note_drift(self, r: BenchResult) -> None:
        """Say so when the baseline's spot rounds disagree with the cached value."""
        drift = baseline_drift(r)
        if drift is None or abs(drift) <= DRIFT_NOTE:
            return
        assert r.baseline_spot is not None
        noisy = (" The spot rounds were themselves noisy (IQR > 10 % of their median), so the drift is "
                 "uncertain too.") if r.baseline_spot.noisy else ""
        r.notes.append(
            f"baseline drift: the baseline took {r.baseline_spot.median_us:.1f} us in this run's spot rounds, "
            f"{drift * 100:+.0f} % from the cached {r.baseline_us:.1f} us (--baseline-us): the machine's speed "
            "changed since the value was cached (or the value belongs to another baseline), so this speedup "
            "is off by about as much. Compare trials measured at the same speed, or rerun without "
            "--baseline-us for a side-by-side ratio." + noisy)

    def _verify_timed(self, picked: list[tuple[int, tuple[Any, Any]]]) -> None:
        assert self.baseline is not None
        for seed, (output, inputs_after) in picked:
            pristine = self.baseline.draw_inputs(seed)
            reference = self.baseline.reference(tree.clone_tree(pristine))
            baseline = self.baseline

            def pair(p: list[Any] = pristine) -> tuple[Any, Any]:
                return baseline.oracle(p), baseline.run_speed_baseline(tree.clone_tree(p))
            self._judge_call(output, pristine, inputs_after, reference,
                             f"timed call (seed {seed})", self._tier_label(None),
                             oracle_pair=pair if self.o.accept_if_as_accurate else None,
                             check="timed-call")
            self.result.verified_calls += 1

    def _note_load(self) -> None:
        """Say so when other processes competed for the CPUs during the timing."""
        try:
            load = os.getloadavg()[0]
        except OSError:
            return
        cpus = len(os.sched_getaffinity(0)) or 1
        self.result.load_average = round(load, 2)
        if load > cpus:
            self.result.notes.append(
                f"the machine was oversubscribed while timing (load average {load:.1f} on {cpus} "
                "CPUs): timings and the speedup are unreliable; rerun when it is quiet")

    # ------------------------------------------------------------------ tier sweep

    def _sweep(self, sets: list[InputSet]) -> None:
        assert self.kworker is not None and self.baseline is not None
        o, r = self.o, self.result
        tiers = self._sweep_tiers()
        # one representative per distinct source: the headline set and each correctness set
        reps = [sets[0]] + [s for s in sets if s.source[0] == "correctness"]
        table = []
        for s in reps:
            pick = None
            if self.kernel_info.get("has_dispatch_tier"):
                pick = self.kworker.request("dispatch", f"asking dispatch_tier for {s.label}",
                                            inputs=s.inputs)["tier"]
            meas = {t: stats.Measurement(t) for t in tiers}
            t_call = 0.0
            for t in tiers:
                self._set_tier(t)
                warm, _, _ = self._time(self.kworker, s.source, 2, keep=False, warmup=1,
                                        what=f"warming tier {t} on {s.label}")
                t_call = max(t_call, stats.Measurement(t, [warm]).median_us * 1e3)
            n = max(3, min(30, int(0.01e9 / max(t_call, 1.0))))
            for rnd in range(o.sweep_rounds):
                order = tiers[rnd % len(tiers):] + tiers[:rnd % len(tiers)]
                for t in order:
                    self._set_tier(t)
                    times, _, _ = self._time(self.kworker, s.source, n, keep=False,
                                             what=f"timing tier {t} on {s.label}")
                    meas[t].rounds.append(times)
            self._set_tier(None)
            moved = self._bytes_for(s.inputs)
            rows = sorted(({"tier": t, "median_us": m.median_us, "iqr_us": m.iqr_us,
                            "gbps": (moved / (m.median_us * 1e3)) if moved else None,
                            "dispatched": t == pick} for t, m in meas.items()),
                          key=lambda row: row["median_us"])
            fastest = rows[0]
            entry: dict[str, Any] = {"input_set": s.label, "dispatch": pick, "rows": rows,
                                     "fastest": fastest["tier"]}
            chosen = next((row for row in rows if row["tier"] == pick), None)
            if chosen is not None:
                lag = chosen["median_us"] / fastest["median_us"] - 1.0
                entry["dispatch_lag_pct"] = 100 * lag
                if lag * 100 > o.dispatch_tolerance_pct:
                    r.dispatch_violations.append(
                        f"{s.label}: the dispatcher picks {pick} ({chosen['median_us']:.1f} us) but "
                        f"{fastest['tier']} is {100 * lag:.1f} % faster ({fastest['median_us']:.1f} us)")
            table.append(entry)
        r.tiers = {"swept": tiers, "by_input_set": table,
                   "tolerance_pct": o.dispatch_tolerance_pct}

    # ------------------------------------------------------------------ throughput

    def _bytes_for(self, inputs: list[Any]) -> float | None:
        assert self.baseline is not None
        value = self.baseline.amount("BYTES", inputs)
        return value

    def _throughput(self, s: InputSet) -> None:
        assert self.baseline is not None
        r = self.result
        if r.kernel_us is None:
            return
        moved = self.baseline.amount("BYTES", s.inputs)
        source_bytes = "BYTES in the baseline"
        if moved is None:
            out = self.baseline.reference(tree.clone_tree(s.inputs))
            moved = float(_tensor_bytes(s.inputs) + _tensor_bytes(out))
            source_bytes = "estimate: every input read once and every output written once"
        flops = self.baseline.amount("FLOPS", s.inputs)
        seconds = r.kernel_us * 1e-6
        info: dict[str, Any] = {
            "bytes": moved, "bytes_source": source_bytes, "flops": flops,
            "gbps": moved / seconds / 1e9 if moved else None,
            "gflops": flops / seconds / 1e9 if flops else None,
        }
        if r.baseline_us:
            info["baseline_gbps"] = moved / (r.baseline_us * 1e-6) / 1e9 if moved else None
        limits = _machine_limits(r.threads)
        info.update(limits)
        if limits.get("bandwidth_gbps") and info["gbps"]:
            info["bandwidth_fraction"] = info["gbps"] / limits["bandwidth_gbps"]
        if limits.get("peak_gflops") and info["gflops"]:
            info["peak_fraction"] = info["gflops"] / limits["peak_gflops"]
        r.throughput = info


def _calibrate(t_call_ns: float, gen_ns: float, target_round_s: float, rounds: int,
               budget_s: float, *, sides: int) -> int:
    """Calls per round: enough to fill ``target_round_s`` of op time, within the budget."""
    n = math.ceil(target_round_s * 1e9 / max(t_call_ns, 1.0))
    per_call = max(t_call_ns + gen_ns, 1.0)
    affordable = int(budget_s * 1e9 / (per_call * rounds * sides))
    return max(1, min(n, 50, affordable))


def _last_level_cache_bytes() -> int | None:
    root = "/sys/devices/system/cpu/cpu0/cache"
    best = None
    try:
        for entry in sorted(os.listdir(root)):
            if not entry.startswith("index"):
                continue
            with open(f"{root}/{entry}/type") as fh:
                if fh.read().strip() == "Instruction":
                    continue
            with open(f"{root}/{entry}/size") as fh:
                text = fh.read().strip().upper()
            mult = {"K": 1024, "M": 1024**2, "G": 1024**3}.get(text[-1:], 1)
            size = int(text.rstrip("KMG")) * mult
            best = max(best or 0, size)
    except (OSError, ValueError):
        return None
    return best


def _machine_limits(threads: int) -> dict[str, Any]:
    """The machine's measured limits, from the cached profile only (no probing mid-benchmark)."""
    try:
        from ..machine import load_cached_profile
    except ImportError:
        return {"machine_limits": "machine limits unknown (kernel_harness.machine unavailable)"}
    try:
        profile = load_cached_profile()
    except Exception:  # noqa: BLE001 - a broken cache must not break a benchmark
        profile = None
    if profile is None:
        return {"machine_limits": "machine limits unknown: no measured profile yet (run "
                                  "python -m kernel_harness.machine once)"}
    single = threads == 1
    bw = profile.bandwidth
    return {
        "machine_limits": "measured profile of " + profile.measured_at,
        "bandwidth_gbps": bw.copy_prealloc_gbs_1t if single else bw.copy_prealloc_gbs,
        "peak_gflops": profile.best_vector_fp32_gflops(threads="single" if single else "all"),
    }


def run_benchmark(options: BenchOptions) -> BenchResult:
    """Run the benchmark; raises UsageError / KernelCrashed / CheckFailed (tamper) as fitting."""
    return Benchmark(options).run()


__all__ = ["BenchOptions", "BenchResult", "Failure", "KernelCrashed", "run_benchmark"]
