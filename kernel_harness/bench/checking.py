"""Correctness that cannot be fooled: input sets, the correctness calls, the
verification of randomly chosen timed calls, and the delegation trace.

The parent (this module) draws every input set, keeps pristine copies,
computes the reference outputs (and the float64 oracle) and does every
comparison; the kernel worker only runs the kernel and copies its outputs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from .. import correctness as corr
from ..baseline import Baseline
from ..errors import UsageError
from . import trace, tree
from .options import Failure, InputSet
from .session import Session


def check_reproducible(baseline: Baseline, seed: int) -> list[Any]:
    """Timed calls draw inputs from seeds in the worker and the parent redraws them to
    verify: that only works when get_inputs() draws from the seeded generators. Returns
    the draw, for checks of its own on the inputs."""
    a, b = baseline.draw_inputs(seed), baseline.draw_inputs(seed)
    if not tree.bitwise_equal(a, b) or len(a) != len(b):
        raise UsageError(
            f"get_inputs() in {baseline.path} returned different values for the same seed. "
            "Draw random values with torch (torch.randn, torch.rand, ...) or the seeded random/"
            "numpy generators, so that the benchmark can draw fresh, reproducible input sets.")
    return a


class Checker:
    """Judges kernel outputs against the baseline's reference; records failures."""

    def __init__(self, session: Session) -> None:
        self.s = session
        # where failures go: the candidate's (result.failures) unless redirected
        self.sink: list[Failure] | None = None

    @property
    def failures(self) -> list[Failure]:
        return self.s.result.failures if self.sink is None else self.sink

    @contextmanager
    def into(self, sink: list[Failure]) -> Iterator[None]:
        """Judge into ``sink`` (the --against build's own failures) for a while."""
        saved, self.sink = self.sink, sink
        try:
            yield
        finally:
            self.sink = saved

    @property
    def baseline(self) -> Baseline:
        assert self.s.baseline is not None
        return self.s.baseline

    # ------------------------------------------------------------------ inputs

    def draw_correctness_sets(self) -> list[InputSet]:
        sets = []
        for i in range(self.s.o.correctness_seeds):
            seed = self.s.seed()
            sets.append(InputSet(f"get_inputs() #{i + 1} (seed {seed})", ("inputs", 0), seed,
                                 self.baseline.draw_inputs(seed)))
        seed = self.s.seed()
        for i, inputs in enumerate(self.baseline.draw_correctness_inputs(seed)):
            sets.append(InputSet(f"get_correctness_inputs()[{i}] {tree.describe_set(inputs)}",
                                 ("correctness", i), seed, inputs))
        return sets

    # ------------------------------------------------------------------ correctness calls

    def correctness(self, sets: list[InputSet]) -> None:
        s, r, o = self.s, self.s.result, self.s.o
        assert s.kworker is not None
        refs = [self.baseline.reference(tree.clone_tree(x.inputs)) for x in sets]
        pairs: dict[int, tuple[Any, Any]] = {}

        def oracle_pair(i: int) -> Callable[[], tuple[Any, Any]] | None:
            if o.oracle != "fp64":
                return None

            def compute() -> tuple[Any, Any]:
                if i not in pairs:
                    pairs[i] = (self.baseline.oracle(sets[i].inputs),
                                self.baseline.run_speed_baseline(tree.clone_tree(sets[i].inputs)))
                return pairs[i]
            return compute

        failed_outputs: list[tuple[InputSet, Any, Any]] = []
        for tier in s.tiers_to_check():
            s.set_tier(tier)
            label = s.tier_label(tier)
            for i, x in enumerate(sets):
                reply = s.kworker.request("check", f"the correctness call on {x.label} "
                                          f"(tier {label})", inputs=x.inputs, settle_s=o.settle_s)
                s.check_tamper(reply, "a correctness call")
                failed_before = len(r.failures)
                self.judge_call(reply["output"], x.inputs, reply["inputs_after"], refs[i],
                                x.label, label, oracle_pair=oracle_pair(i),
                                aliasing=reply["overlaps"], changed=reply["changed_after_return"])
                if len(r.failures) > failed_before:
                    failed_outputs.append((x, reply["output"], refs[i]))
        s.set_tier(None)
        r.tolerances = self._tolerance_table(refs)
        r.correct = not r.failures
        if not r.correct and o.oracle is None:
            r.would_pass_as_accurate = self._would_pass_as_accurate(failed_outputs)

    def _tolerance_table(self, refs: list[Any]) -> dict[str, str]:
        table = {}
        for ref in refs:
            for t in tree.tensors(ref):
                name = str(t.dtype).removeprefix("torch.")
                table[name] = corr.tolerance_for(t.dtype, atol=self.s.o.atol, rtol=self.s.o.rtol).formula()
        return table

    def judge_call(self, output: Any, pristine: list[Any], inputs_after: list[Any],
                   reference: Any, set_label: str, tier: str, *,
                   oracle_pair: Callable[[], tuple[Any, Any]] | None = None,
                   aliasing: list[tuple[int, int]] | None = None,
                   changed: bool = False, check: str = "values") -> bool:
        """Judge one kernel call; record failures; True when it passed."""
        r, o = self.s.result, self.s.o
        failures = self.failures
        before = len(failures)
        if aliasing:
            pairs = ", ".join(f"output leaf {a} / input {i}" for a, i in aliasing)
            failures.append(Failure("aliasing", set_label, tier,
                f"the output shares memory with an input ({pairs}); allocate a fresh output "
                "(out-parameter-api) instead of writing into or returning an input"))
        if not tree.bitwise_equal(inputs_after, pristine):
            bad = [i for i, (a, p) in enumerate(zip(tree.tensors(inputs_after), tree.tensors(pristine),
                                                  strict=False)) if not tree.bitwise_equal(a, p)]
            failures.append(Failure("input-modified", set_label, tier,
                f"the kernel modified its input(s) {bad}; inputs are read-only"))
        if changed:
            failures.append(Failure("async", set_label, tier,
                "the output changed after the call returned (asynchronous completion): the "
                "kernel must finish writing before it returns"))
        comparison = corr.compare_outputs(output, reference, atol=o.atol, rtol=o.rtol)
        if not comparison.ok:
            accepted = False
            if oracle_pair is not None:
                oracle, baseline_out = oracle_pair()
                leaves = corr.oracle_errors(output, baseline_out, oracle)
                self._record_oracle(set_label, tier, leaves)
                if o.accept_if_as_accurate and corr.passes_as_accurate(comparison, leaves):
                    accepted = True
                    if self.sink is None:  # the candidate's rule, not the --against build's
                        r.acceptance_rule = "as-accurate-as-baseline"
            if not accepted:
                for f in comparison.failures:
                    msg = f"{f.path}: {f.message} -> {f.diagnosis}: {f.advice}"
                    if check == "timed-call":
                        msg = ("a timed call's output is wrong although the correctness calls "
                               f"passed (results cached across calls, or correct only for the "
                               f"first calls): {msg}")
                    failures.append(Failure(check, set_label, tier, msg, f.to_dict()))
        elif oracle_pair is not None and check != "timed-call":
            oracle, baseline_out = oracle_pair()
            self._record_oracle(set_label, tier, corr.oracle_errors(output, baseline_out, oracle))
        return len(failures) == before

    def _record_oracle(self, set_label: str, tier: str, leaves: list[corr.OracleLeaf]) -> None:
        for leaf in leaves:
            self.s.result.oracle.append({"input_set": set_label, "tier": tier, **leaf.to_dict()})

    def _would_pass_as_accurate(self, failed: list[tuple[InputSet, Any, Any]]) -> bool | None:
        """When only values failed, say whether --accept-if-as-accurate would accept them."""
        if any(f.check != "values" for f in self.s.result.failures):
            return False
        for x, output, ref in failed:
            comparison = corr.compare_outputs(output, ref, atol=self.s.o.atol, rtol=self.s.o.rtol)
            leaves = corr.oracle_errors(output,
                                        self.baseline.run_speed_baseline(tree.clone_tree(x.inputs)),
                                        self.baseline.oracle(x.inputs))
            if not corr.passes_as_accurate(comparison, leaves):
                return False
        return True

    def check_build(self, worker: Any, sets: list[InputSet], who: str) -> None:
        """The same correctness calls, judged the same way, for another build
        (--against); its failures go to ``result.against_failures``."""
        s = self.s
        with self.into(s.result.against_failures):
            for x in sets:
                reply = worker.request("check", f"the --against build's correctness call on {x.label}",
                                       inputs=x.inputs, settle_s=s.o.settle_s)
                s.check_tamper(reply, "a correctness call of the --against build")
                reference = self.baseline.reference(tree.clone_tree(x.inputs))

                def pair(p: list[Any] = x.inputs) -> tuple[Any, Any]:
                    return self.baseline.oracle(p), self.baseline.run_speed_baseline(tree.clone_tree(p))
                self.judge_call(reply["output"], x.inputs, reply["inputs_after"], reference,
                                f"{who}{x.label}", "dispatch",
                                oracle_pair=pair if s.o.accept_if_as_accurate else None,
                                aliasing=reply["overlaps"], changed=reply["changed_after_return"])

    # ------------------------------------------------------------------ timed calls

    def verify_timed(self, picked: list[tuple[int, tuple[Any, Any]]], *, tier: str | None = None,
                     who: str = "") -> None:
        """Judge timed calls picked after their round: redraw the inputs from the seed,
        compute the reference, compare (``who`` names a second kernel build, --against)."""
        baseline = self.baseline
        label = tier or self.s.tier_label(None)
        for seed, (output, inputs_after) in picked:
            pristine = baseline.draw_inputs(seed)
            reference = baseline.reference(tree.clone_tree(pristine))

            def pair(p: list[Any] = pristine) -> tuple[Any, Any]:
                return baseline.oracle(p), baseline.run_speed_baseline(tree.clone_tree(p))
            self.judge_call(output, pristine, inputs_after, reference,
                            f"{who}timed call (seed {seed})", label,
                            oracle_pair=pair if self.s.o.accept_if_as_accurate else None,
                            check="timed-call")
            if not who:
                self.s.result.verified_calls += 1

    # ------------------------------------------------------------------ delegation

    def trace(self, x: InputSet) -> None:
        s = self.s
        assert s.kworker is not None
        kernel_ops = s.kworker.request("trace", "tracing the kernel call", inputs=x.inputs)["ops"]
        with torch.no_grad():
            base_ops, _ = trace.trace_ops(self.baseline.speed_function(), *tree.clone_tree(x.inputs))
        delegates = trace.is_delegation(kernel_ops, base_ops)
        s.result.aten_ops = {
            "kernel": trace.unique_in_order(kernel_ops),
            "baseline": trace.unique_in_order(base_ops),
            "kernel_calls": len(kernel_ops),
            "delegates_to_baseline": delegates,
        }
        if delegates:
            s.result.notes.append(
                "delegation: the kernel call dispatched every compute op of the baseline ("
                + ", ".join(sorted(trace.compute_ops(base_ops)))
                + "); it runs the baseline's computation instead of a kernel of its own")
