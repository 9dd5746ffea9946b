"""Inputs a model keeps in memory between calls (weights, KV caches) come to a
timed call from memory, not from the cache the draw just left them in.

A timed call gets freshly drawn inputs, copied to a new address just before
it (``layout.Relocator``).  For an activation that is right: a model's layer
reads the output the layer before it has just written.  For a weight it is
not: a model reads each layer's weight once per token, after every other
layer has streamed its own, so the weight comes from memory.  Copied just
before the call, a 32 MiB bf16 weight sits in a 32 MiB L3, dirty, and which
GEMM wins depends on it: on a Zen 4 EPYC (2026-12-04, bf16 N = K = 4096) our
VDPBF16PS tiles read 1.03-1.09x oneDNN's time at M = 128 and 1.19-1.61x at
M = 32 with the weight fresh from the copy, 0.98x and 0.88x with it evicted
(96 MB written elsewhere after the draw), and 0.98x and 0.89x with the
weights rotated as a model holds them; ``--assert-dispatch`` failed on the
first regime only.

So a baseline names the positions of such inputs (``PERSISTENT_INPUTS``),
and before each call the worker copies them to their new address first,
then reads a buffer several times the last-level cache (:class:`CacheScrubber`,
which writes the dirty weight back and leaves it only in memory), then
copies the remaining inputs, which stay in the cache, dirty, as a previous
layer's output would.  The buffer is read, not written: its lines are clean,
so the timed call does not pay for writing back the scrubber's data.  It
costs ~3 ms per call (96 MiB at ~30 GB/s), outside the timed region.

Only fresh draws are placed so: the tier sweep's steady regime (sets that fit
in an L2, one draw per round) models a model's repeated small layers, and
``--cold`` draws a round's sets first, so each is evicted by the later ones.

A loop that calls the op back to back (the profiler's child) cannot scrub
between calls without the scrub showing in its samples; it rotates instead
through copies of the persistent inputs that together exceed the scrub size
(:func:`rotated_sets`), as a model's layers rotate through their weights.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ..machine import ASSUMED_LLC_BYTES, last_level_cache_bytes, last_level_cache_domains
from . import tree

#: The buffer read between the draw and the call, as a multiple of the last-level
#: cache: a pseudo-LRU cache keeps some lines through one cache-sized pass, and a
#: victim L3 (AMD's) is filled by the L2s of every core the read runs on.
SCRUB_LLC_MULTIPLE = 3
#: At most this many separate last-level caches are counted (memory and time per call).
MAX_LLC_DOMAINS = 8
#: At most this many copies of the persistent inputs in rotation (a tiny input would
#: otherwise need millions of copies to fill the scrub size).
MAX_ROTATED_COPIES = 256


def scrub_bytes(llc_bytes: int | None = None, domains: int | None = None) -> int:
    """The size of the buffer read between the draw and the call on this machine: a multiple
    of the last-level cache for each separate one the process's CPUs share (the threads split
    the read, so each cache sees its share of it)."""
    llc = llc_bytes or last_level_cache_bytes() or ASSUMED_LLC_BYTES
    count = domains if domains is not None else last_level_cache_domains()
    return SCRUB_LLC_MULTIPLE * llc * min(max(1, count), MAX_LLC_DOMAINS)


def inputs_from_memory(persistent: tuple[int, ...]) -> dict[str, Any] | None:
    """What a report says of the regime: the positions evicted and the bytes read to do it."""
    return {"positions": list(persistent), "scrub_bytes": scrub_bytes()} if persistent else None


class CacheScrubber:
    """A buffer of ``SCRUB_LLC_MULTIPLE`` x the last-level cache, written once, read on demand."""

    def __init__(self, llc_bytes: int | None = None, domains: int | None = None) -> None:
        self.nbytes = scrub_bytes(llc_bytes, domains)
        # written once: untouched pages all map the kernel's one zero page, and reading
        # them would evict nothing
        self._buffer = torch.ones(self.nbytes // 8, dtype=torch.int64)

    def scrub(self) -> None:
        """Read the whole buffer (all threads), evicting whatever the caches held."""
        self._buffer.sum()


def place_from_memory(inputs: Sequence[Any], persistent: tuple[int, ...], move: Callable[[int, Any], Any],
                      scrubber: CacheScrubber) -> list[Any]:
    """``inputs`` with each ``move(position, input)``d: the ``persistent`` positions first,
    then the caches scrubbed, then the rest, so only the rest is in the cache at the call."""
    out = list(inputs)
    for p in persistent:
        if p < len(out):  # a shorter set (an optional argument left out) has no such input
            out[p] = move(p, out[p])
    scrubber.scrub()
    for i, value in enumerate(out):
        if i not in persistent:
            out[i] = move(i, value)
            for before, after in zip(tree.tensors(value), tree.tensors(out[i])):
                if after is before:  # one the move leaves in place (non-contiguous, ...): read it back in
                    _read_into_cache(after)
    return out


def _read_into_cache(t: torch.Tensor) -> None:
    if t.layout == torch.strided and not t.is_quantized and t.numel():
        t.detach().sum()


def rotated_sets(inputs: Sequence[Any], persistent: tuple[int, ...], llc_bytes: int | None = None,
                 domains: int | None = None) -> list[list[Any]]:
    """Input lists sharing the other inputs, each with its own copy of the ``persistent`` ones,
    enough copies (at least two, at most MAX_ROTATED_COPIES) that a loop over them reads those
    from memory; just ``[inputs]`` without persistent inputs."""
    present = [p for p in persistent if p < len(inputs)]
    nbytes = sum(tree.nbytes(inputs[p]) for p in present)
    if not nbytes:
        return [list(inputs)]
    copies = min(MAX_ROTATED_COPIES, max(2, math.ceil(scrub_bytes(llc_bytes, domains) / nbytes)))
    sets = []
    for _ in range(copies):
        copy = list(inputs)
        for p in present:
            copy[p] = tree.clone_tree(inputs[p])
        sets.append(copy)
    return sets

