"""The lockstep stream reader behind the bandwidth floors (kernel_harness/stream_reader.py).

What matters about a floor's reader is that it reads every byte of its buffers
exactly once, with torch's thread count, whatever the sizes: its checksum (the
sum of the 64-bit words) is compared with numpy's. Its speed is a measurement,
reported beside torch's sum by the floors and the machine probe, never asserted.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from kernel_harness import stream_reader


@pytest.fixture(scope="module")
def reader(tmp_path_factory: pytest.TempPathFactory) -> stream_reader.StreamReader:
    found, missing = stream_reader.try_stream_reader(tmp_path_factory.mktemp("probe-cache"))
    if found is None:
        pytest.skip(missing or "no reader")
    return found


def words_sum(tensors: list[torch.Tensor]) -> int:
    total = 0
    for t in tensors:
        raw = t.reshape(-1).view(torch.uint8).numpy().tobytes()
        raw += b"\0" * (-len(raw) % 8)
        total += int(np.frombuffer(raw, dtype=np.uint64).sum(dtype=np.uint64))
    return total % 2**64


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_every_byte_is_read_exactly_once(reader: stream_reader.StreamReader, threads: int):
    """Sizes around the lockstep body's blocks (4 streams x 64 bytes per thread), the split between
    threads and the word tail; two buffers per call, as a decode-attention floor reads K and V."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        generator = torch.Generator().manual_seed(threads)
        for n in (0, 1, 7, 8, 255, 256, 257, 1023, 4097, 100_003, 1 << 20):
            tensors = [torch.randint(0, 256, (n,), dtype=torch.uint8, generator=generator),
                       torch.randint(0, 256, (n + 13,), dtype=torch.uint8, generator=generator)]
            assert reader.read(tensors) == words_sum(tensors), f"{n} bytes on {threads} threads"
    finally:
        torch.set_num_threads(previous)


def test_any_dtype_is_read_as_its_bytes(reader: stream_reader.StreamReader):
    tensors = [torch.randn(3, 1000).bfloat16(), torch.arange(777, dtype=torch.float64)]
    assert reader.read(tensors) == words_sum(tensors)
    calls = reader.calls([[tensors[0]], [tensors[1]]])
    assert [call() for call in calls] == [words_sum([tensors[0]]), words_sum([tensors[1]])]


def test_a_strided_view_is_refused_with_its_shape(reader: stream_reader.StreamReader):
    with pytest.raises(ValueError, match=r"contiguous.*\(4, 3\)"):
        reader.read([torch.zeros(3, 4).t()])


def test_a_missing_compiler_is_a_reason_not_a_crash(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("CXX", "no-such-compiler")
    monkeypatch.setenv("PATH", str(tmp_path))  # no g++ to fall back on either
    found, missing = stream_reader.try_stream_reader(tmp_path / "cache")
    assert found is None and "g++" in missing and "torch's sum alone" in missing


def test_a_compiler_that_times_out_is_a_reason_not_a_crash(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    import subprocess

    from kernel_harness import native

    real_run = subprocess.run

    def run(cmd, *args, **kwargs):
        if "-shared" in cmd:
            raise subprocess.TimeoutExpired(cmd, kwargs.get("timeout", 0))
        return real_run(cmd, *args, **kwargs)

    monkeypatch.setattr(native.subprocess, "run", run)
    found, missing = stream_reader.try_stream_reader(tmp_path / "cache")
    assert found is None and "timed out" in missing and "torch's sum alone" in missing
