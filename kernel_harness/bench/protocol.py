"""Messages between the parent and a worker: length-prefixed pickles over pipes.

Pickle copies tensors *by value* (plain ``pickle``, not
``torch.multiprocessing``'s shared-memory reduction), so a kernel in the child
can never write into the parent's pristine inputs or references.  The
parent's reads and writes take a deadline: a hung child can neither block the
parent's read nor, with a full pipe, its write.
"""

from __future__ import annotations

import os
import pickle
import select
import struct
import time
from typing import Any

_HEADER = struct.Struct("<Q")


class ChannelClosed(Exception):
    """The other side closed its end (it exited or was killed)."""


class ChannelTimeout(Exception):
    """The deadline passed before the message was complete."""


def encode(message: Any) -> bytes:
    payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return _HEADER.pack(len(payload)) + payload


def _wait(fd: int, writable: bool, deadline: float | None) -> None:
    if deadline is None:
        return
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise ChannelTimeout
    ready = select.select([], [fd], [], remaining) if writable else select.select([fd], [], [], remaining)
    if not (ready[1] if writable else ready[0]):
        raise ChannelTimeout


def send(fd: int, message: Any, deadline: float | None = None) -> None:
    data = memoryview(encode(message))
    while data:
        _wait(fd, True, deadline)
        try:
            written = os.write(fd, data[: 1 << 20])
        except BrokenPipeError as exc:
            raise ChannelClosed from exc
        except BlockingIOError:
            continue
        data = data[written:]


def _read_exact(fd: int, size: int, deadline: float | None) -> bytes:
    chunks = []
    while size:
        _wait(fd, False, deadline)
        try:
            chunk = os.read(fd, min(size, 1 << 20))
        except BlockingIOError:
            continue
        if not chunk:
            raise ChannelClosed
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def receive(fd: int, deadline: float | None = None) -> Any:
    (size,) = _HEADER.unpack(_read_exact(fd, _HEADER.size, deadline))
    return pickle.loads(_read_exact(fd, size, deadline))
