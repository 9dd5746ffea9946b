"""Memory-layout jitter for timed calls: each call's inputs start at a different
offset within a 4 KiB page.

Why: a worker process repeats the same allocations every call, and glibc's
allocator settles into a steady state in which every call's inputs and outputs
get the same addresses, fixed by the process's own history (imports, warm-up,
earlier checks).  A streaming kernel whose input and output share their low 12
address bits pays for 4K aliasing (loads wait on unrelated stores), and
cache-set conflicts depend on the same bits; so one worker read an identical
build 3 % slower than another in every one of 230 rounds (mean log ratio 1.033,
standard error 0.009), and more rounds could not remove what was a property of
the process.  Padding blocks did not help: the allocator's best fit put them
elsewhere after a few calls.  So each contiguous input tensor is copied, outside
the timed region, into a fresh buffer at a seeded random 64-byte-aligned offset
(torch's own alignment) within its first page: the layout effect becomes
per-call noise that the median averages over instead of a per-process bias (the
idea of Curtsinger and Berger's "Stabilizer", 2013, at the scale of one
benchmark).  The offsets come from the call's seed, so the candidate and the
``--against`` build, which get the same seeds, see the same layouts.

No address is handed to the kernel twice in one process (correctness checks,
traces and timed calls all take their inputs from the one Relocator): a kernel that caches
results by pointer (``bk_attack_cache_ptr``) would otherwise be served a stale
result whenever a random offset repeated at the same heap address (6 of 24
calls in one test run), too few for the verification of four random timed
calls to catch every time.  A repeated address moves on by whole pages, which
keeps the page offset, and with it the layout, the seed chose.
"""

from __future__ import annotations

import random
from typing import Any

import torch

from .tree import tree_map

#: offsets are drawn in 64-byte steps (torch's CPU alignment) over one 4 KiB page
STEP_BYTES = 64
PAGE_BYTES = 4096


class Relocator:
    """Moves a call's inputs (:meth:`relocate`); remembers every address it handed out."""

    def __init__(self) -> None:
        self._used: set[int] = set()

    def relocate(self, inputs: Any, seed: int) -> Any:
        """``inputs`` with every contiguous, non-empty CPU tensor leaf copied to a new page
        offset drawn from ``seed`` (other leaves, and other objects, unchanged)."""
        rng = random.Random(seed ^ 0x5EED_1A40)
        return tree_map(lambda t: self._moved(t, STEP_BYTES * rng.randrange(PAGE_BYTES // STEP_BYTES)), inputs)

    def _moved(self, t: torch.Tensor, offset: int) -> torch.Tensor:
        if t.device.type != "cpu" or t.numel() == 0 or not t.is_contiguous() or t.requires_grad \
                or t.is_sparse or t.is_quantized:
            return t
        nbytes = t.numel() * t.element_size()
        while True:
            buffer = torch.empty(offset + nbytes, dtype=torch.uint8)
            moved = buffer[offset:].view(t.dtype).view(t.shape)
            if moved.data_ptr() not in self._used:
                break
            offset += PAGE_BYTES  # the same page offset, an address not used before
        self._used.add(moved.data_ptr())
        moved.copy_(t)
        return moved
