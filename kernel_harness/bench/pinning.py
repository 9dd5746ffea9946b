"""Is this run pinned with ``numactl --cpunodebind=N --membind=N`` (procedure step 8)?

On a one-node machine ``--cpunodebind=0`` leaves the CPU mask unchanged, so
the affinity alone cannot tell; the memory policy can: ``--membind`` sets
``MPOL_BIND`` for the process and its children.  We ask the kernel with the
``get_mempolicy`` system call and compare the CPU affinity with the node's
CPU list.  Pinned means: memory bound to exactly one node and every allowed
CPU belongs to that node.
"""

from __future__ import annotations

import ctypes
import os
import platform
from dataclasses import dataclass
from pathlib import Path

_MPOL_BIND = 2
_SYS_GET_MEMPOLICY = {"x86_64": 239, "aarch64": 236}
NODE_ROOT = Path("/sys/devices/system/node")


@dataclass(frozen=True)
class Pinning:
    pinned: bool
    detail: str


def _memory_policy() -> tuple[int, list[int]] | None:
    number = _SYS_GET_MEMPOLICY.get(platform.machine())
    if number is None:
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        mode = ctypes.c_int(-1)
        mask = (ctypes.c_ulong * 16)()
        if libc.syscall(number, ctypes.byref(mode), mask, ctypes.c_ulong(16 * 64), None, ctypes.c_ulong(0)) != 0:
            return None
    except (OSError, AttributeError):
        return None
    nodes = [w * 64 + b for w in range(16) for b in range(64) if mask[w] >> b & 1]
    return mode.value, nodes


def parse_cpu_list(text: str) -> set[int]:
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def detect_pinning() -> Pinning:
    policy = _memory_policy()
    if policy is None:
        return Pinning(False, "memory policy unknown (get_mempolicy unavailable)")
    mode, nodes = policy
    if mode != _MPOL_BIND or len(nodes) != 1:
        return Pinning(False, "not pinned: run under numactl --cpunodebind=0 --membind=0")
    node = nodes[0]
    try:
        node_cpus = parse_cpu_list((NODE_ROOT / f"node{node}" / "cpulist").read_text())
    except OSError:
        node_cpus = set()
    allowed = os.sched_getaffinity(0)
    if node_cpus and not allowed <= node_cpus:
        return Pinning(False, f"memory bound to node {node} but CPUs {sorted(allowed)} are not "
                              "all on it; add --cpunodebind")
    return Pinning(True, f"memory bound to node {node}, CPUs {','.join(map(str, sorted(allowed)))}")
