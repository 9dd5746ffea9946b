"""The catalogue benchmark's timing loop (kernel_harness.perf_table): side by side, order alternating."""

from __future__ import annotations

from kernel_harness.perf_table import interleaved_samples


def test_rounds_time_every_function_and_alternate_the_order():
    calls: list[str] = []
    fns = {name: (lambda name=name: calls.append(name)) for name in ("torch", "ours", "floor")}
    samples = interleaved_samples(fns, rounds=4, calls=2)
    assert {name: len(v) for name, v in samples.items()} == {"torch": 4, "ours": 4, "floor": 4}
    assert all(t >= 0.0 for v in samples.values() for t in v)
    rounds = [calls[i:i + 6:2] for i in range(0, len(calls), 6)]  # each function runs `calls` times in a row
    assert rounds == [["torch", "ours", "floor"], ["floor", "ours", "torch"]] * 2
    # so no function always runs right after the same neighbour
    predecessors = {name: {r[r.index(name) - 1] for r in rounds if r.index(name) > 0} for name in fns}
    assert predecessors["ours"] == {"torch", "floor"}
