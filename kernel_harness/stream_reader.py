"""The fastest streaming read we know, for bandwidth floors: several streams per thread.

A bandwidth floor ("the weight's bytes over the read bandwidth") must come from
the fastest way of reading those bytes, or every ratio to it flatters the
kernel. torch's ``sum`` reads one sequential stream per thread; on a Zen 4
EPYC VM it read 0.71-0.92x what four lockstep streams per thread read (shuffled
rounds, 24-53 GB/s by the sum), and decode GEMVs that read a few rows at once
timed below "the floor". ``probe/stream_read.cpp`` is that four-stream reader
(OpenMP threads, torch's count at each call). Neither reader wins everywhere
(the sum won 3 of 55 floors in five runs there, by up to 6 %), so the floors
time both and keep the faster (see
:mod:`kernel_harness.bench.stream_floor` and :func:`kernel_harness.machine.measure_bandwidth`).
"""

from __future__ import annotations

import ctypes
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .native import PROBE_DIRECTORY, build_probe_library

SOURCE = PROBE_DIRECTORY / "stream_read.cpp"
#: The names the floors report for their two readers.
TORCH_SUM = "torch sum"
LOCKSTEP = "lockstep read"


@dataclass(frozen=True)
class StreamReader:
    """``read(tensors)`` reads every byte of each (contiguous) tensor once with torch's
    current thread count and returns the sum mod 2**64 of their little-endian 64-bit words
    (a last partial word zero-padded): the check that nothing was skipped or read twice."""

    library: Any
    streams_per_thread: int

    def read(self, tensors: Sequence[Any]) -> int:
        import torch

        for t in tensors:
            if not t.is_contiguous():
                raise ValueError(f"the lockstep reader reads contiguous buffers; got one of shape {tuple(t.shape)} "
                                 f"with strides {t.stride()}")
        count = len(tensors)
        ptrs = (ctypes.c_void_p * count)(*[t.data_ptr() for t in tensors])
        sizes = (ctypes.c_int64 * count)(*[t.numel() * t.element_size() for t in tensors])
        return int(self.library.kh_stream_read(ptrs, sizes, count, torch.get_num_threads()))

    def calls(self, reads: Sequence[Sequence[Any]]) -> list[Callable[[], object]]:
        """One call per set of tensors (a floor's copies), each reading its set once."""
        return [lambda tensors=tuple(tensors): self.read(tensors) for tensors in reads]


def load_stream_reader(directory: Path) -> StreamReader:
    """The reader, its library compiled into ``directory`` on first use.
    Raises FileNotFoundError (no compiler), RuntimeError (compile error), subprocess.SubprocessError
    (the compiler timed out) or OSError (load).

    torch is imported first: the library's libgomp.so.1 then resolves to the copy torch loaded,
    so the reader shares the OpenMP thread pool of torch and the kernels (stream_read.cpp)."""
    import torch  # noqa: F401  (before the library: see above)

    library = ctypes.CDLL(str(build_probe_library(SOURCE, directory, ("-fopenmp",))))
    library.kh_stream_read.restype = ctypes.c_uint64
    library.kh_stream_read.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
    library.kh_stream_read_streams.restype = ctypes.c_int
    return StreamReader(library, int(library.kh_stream_read_streams()))


def try_stream_reader(directory: Path) -> tuple[StreamReader | None, str | None]:
    """The reader, or None and the reason it is missing (the floors then time torch's sum alone)."""
    try:
        return load_stream_reader(directory), None
    except (OSError, RuntimeError, FileNotFoundError, subprocess.SubprocessError) as exc:
        return None, f"the lockstep stream reader is unavailable ({exc}); floors use torch's sum alone"
