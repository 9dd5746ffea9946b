"""The child process that runs the kernel (or, in another child, the baseline).

Why a child: a kernel is arbitrary native code.  In its own process it can
crash or hang without taking the harness down, and whatever it digs out of
memory (``gc.get_objects()``, stack frames, freed allocations) holds no
reference output, because this process never computes one.  The parent
sends inputs or seeds, the child answers with times and with copies of the
outputs; the parent alone compares.

The timers are bound at the very top of this module, before the kernel
package (or torch) is imported, and the child reports when the kernel
package replaced any of them.

Run as ``python -m kernel_harness.bench.worker READ_FD WRITE_FD``.
"""

from __future__ import annotations

import time as _time_module

# Bound before anything else is imported: a kernel cannot hand us a fake clock.
_perf_counter_ns = _time_module.perf_counter_ns
_thread_time_ns = _time_module.thread_time_ns
_process_time_ns = _time_module.process_time_ns
_sleep = _time_module.sleep
_TIMER_NAMES = ("perf_counter", "perf_counter_ns", "monotonic", "monotonic_ns", "time",
                "time_ns", "process_time", "process_time_ns", "thread_time", "sleep")
_ORIGINAL_TIMERS = {name: getattr(_time_module, name) for name in _TIMER_NAMES}

import gc  # noqa: E402
import os  # noqa: E402
import re  # noqa: E402
import sys  # noqa: E402
import traceback  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402

from kernel_harness.baseline import Baseline, load_baseline  # noqa: E402
from kernel_harness.bench import eviction, layout, protocol, trace, tree  # noqa: E402
from kernel_harness.errors import HarnessError  # noqa: E402
from kernel_harness.kernel_loader import KERNEL_NAME_ATTR, load_kernel_module, resolve_op  # noqa: E402
from kernel_harness.scaffold.todo import todo_report  # noqa: E402

ISA_ENV_VAR = "KERNEL_CPU_ISA"


def tampered_timers() -> list[str]:
    """Names of clock functions that are no longer the ones bound at start."""
    changed = [f"time.{n}" for n, f in _ORIGINAL_TIMERS.items() if getattr(_time_module, n, None) is not f]
    if sys.modules.get("time") is not _time_module:
        changed.append("sys.modules['time']")
    for name, fn in _OWN_FUNCTIONS.items():
        if globals().get(name) is not fn or fn.__code__ is not _OWN_CODE[name]:
            changed.append(f"worker.{name}")
    return changed


class Worker:
    def __init__(self) -> None:
        self.baseline: Baseline | None = None
        self.module: Any = None
        self.op: Any = None
        self.op_name = ""
        self.kept: list[Any] = []
        self.pool = CopyPool()
        self.relocator = layout.Relocator()  # every call's inputs: a new address each
        # made at load when the baseline names PERSISTENT_INPUTS (3 x the LLC per L3)
        self.scrubber: eviction.CacheScrubber | None = None
        self.checks = 0

    # ------------------------------------------------------------------ setup

    def load(self, msg: dict[str, Any]) -> dict[str, Any]:
        torch.set_num_threads(int(msg["threads"]))
        self.baseline = load_baseline(msg["baseline_path"])
        if self.baseline.persistent_inputs:
            # made now, not in the first timed round, whose draw time sizes the rounds
            self.scrubber = eviction.CacheScrubber()
        info: dict[str, Any] = {"threads": torch.get_num_threads(), "tiers": None,
                                "has_dispatch_tier": False, "version": None,
                                "persistent_inputs": list(self.baseline.persistent_inputs)}
        if msg["role"] == "kernel":
            self.module = load_kernel_module(msg["kernel_spec"])
            op_path = msg["op_path"]
            if msg.get("own_package"):
                # --against: the same function, in whatever package the other build is
                op_path = f"{getattr(self.module, KERNEL_NAME_ATTR)}.{op_path.partition('.')[2]}"
            self.op = resolve_op(self.module, op_path)
            self.op_name = msg["op_path"].rsplit(".", 1)[-1]
            tiers = getattr(self.module, "available_tiers", None)
            if callable(tiers):
                info["tiers"] = [str(t) for t in tiers()]
            info["has_dispatch_tier"] = callable(getattr(self.module, "dispatch_tier", None))
            info["version"] = str(getattr(self.module, "__version__", "") or "") or None
            info["kernel_build"] = kernel_build(self.module)
        else:
            self.op = self.baseline.speed_function()
        info["tampered"] = tampered_timers()
        # torch and the kernel are loaded: move their objects out of the collector's
        # way, so the gc.collect() before each round costs microseconds, not 80 ms
        gc.collect()
        gc.freeze()
        return info

    def set_isa(self, msg: dict[str, Any]) -> dict[str, Any]:
        if msg["tier"] is None:
            os.environ.pop(ISA_ENV_VAR, None)
        else:
            os.environ[ISA_ENV_VAR] = msg["tier"]
        return {}

    # ------------------------------------------------------------------ calls

    def _call(self, inputs: list[Any]) -> Any:
        with torch.no_grad():
            return self.op(*inputs)

    def check(self, msg: dict[str, Any]) -> dict[str, Any]:
        """One correctness call: capture at return, then look again after a pause.

        The inputs are moved to addresses no call has seen, as the timed calls' are:
        unpickled where they arrive, they could sit where a later timed call's
        inputs land, and a kernel caching by pointer would then serve that call
        a stale result (seen once in a CI run: 1 stale call of 24, none of the
        four verified ones)."""
        self.checks += 1
        inputs = self.relocator.relocate(msg["inputs"], self.checks)
        _scribble_freed_memory(inputs)
        out = self._call(inputs)
        at_return = tree.clone_tree(out)
        aliasing = tree.overlaps(out, inputs)
        _sleep(msg["settle_s"])
        changed = not tree.bitwise_equal(out, at_return)
        return {"output": at_return, "changed_after_return": changed,
                "overlaps": aliasing, "inputs_after": inputs,
                "tampered": tampered_timers()}

    def trace(self, msg: dict[str, Any]) -> dict[str, Any]:
        # at an address the kernel has not seen: a result cached by pointer would hide the
        # ops it dispatches (bk_attack_cache_ptr's trace read "aten.clone" only)
        inputs = self.relocator.relocate(msg["inputs"], 0)
        with torch.no_grad():
            ops, _ = trace.trace_ops(self.op, *inputs)
        return {"ops": ops}

    def dispatch(self, msg: dict[str, Any]) -> dict[str, Any]:
        return {"tier": str(self.module.dispatch_tier(self.op_name, *msg["inputs"]))}

    def _draw(self, source: tuple[str, int], seed: int) -> list[Any]:
        assert self.baseline is not None
        kind, index = source
        if kind == "inputs":
            return self.baseline.draw_inputs(seed)
        return self.baseline.draw_correctness_inputs(seed)[index]

    def time(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Time one call per seed, each on freshly drawn inputs; keep outputs if asked.

        Inputs are drawn outside the timed region.  With ``cold`` all sets of the
        round are drawn first, so each set has been evicted by the later ones
        before it is used.  With ``steady`` (the tier sweep) the set is drawn once,
        from the first seed, and each call gets a copy at its own new address: the
        calls follow one another as a model's repeated layers do, instead of each
        following a draw that may write megabytes (a correctness set is drawn with
        all its siblings) and evict the code and data a call needs.  Kept outputs
        are copied right at return; which of them the parent verifies is decided
        only after the round.
        """
        source, seeds, keep = tuple(msg["source"]), msg["seeds"], msg["keep"]
        warmup = msg.get("warmup", 0)
        self.kept = []
        times: list[int] = []
        gen_ns = 0
        # CPU time of this (the calling) thread and of the whole process during the
        # timed calls: a thread that was descheduled shows less CPU than wall time
        thread_ns = process_ns = 0
        # and the time this thread spent runnable but waiting for a CPU (schedstat)
        wait_before, round_start = _run_queue_wait_ns(), _perf_counter_ns()
        gc.collect()
        gc.disable()  # a collection inside a timed call would be charged to it
        try:
            sets = drawn = None
            t0 = _perf_counter_ns()
            if msg.get("cold"):
                sets = [self._draw(source, s) for s in seeds]
            elif msg.get("steady") and seeds:
                drawn = self._draw(source, seeds[0])
            gen_ns += _perf_counter_ns() - t0
            for i, seed in enumerate(seeds):
                if sets is not None:
                    inputs = sets[i]
                    sets[i] = None
                else:
                    t0 = _perf_counter_ns()
                    inputs = self._place(drawn if drawn is not None else self._draw(source, seed), seed,
                                         from_memory=drawn is None)
                    gen_ns += _perf_counter_ns() - t0
                c0, p0 = _thread_time_ns(), _process_time_ns()
                start = _perf_counter_ns()
                out = self._call(inputs)
                stop = _perf_counter_ns()
                c1, p1 = _thread_time_ns(), _process_time_ns()
                if i >= warmup:
                    times.append(stop - start)
                    thread_ns += c1 - c0
                    process_ns += p1 - p0
                    if keep:
                        # into buffers allocated once: keeping copies must not change what
                        # the allocator hands the next timed call (fresh pages fault)
                        self.kept.append(self.pool.store(i - warmup, (out, inputs)))
                del out, inputs
        finally:
            gc.enable()
        wait_after, round_ns = _run_queue_wait_ns(), _perf_counter_ns() - round_start
        waited = wait_after - wait_before if wait_before is not None and wait_after is not None else None
        return {"times_ns": times, "gen_ns": gen_ns, "thread_cpu_ns": thread_ns,
                "process_cpu_ns": process_ns, "run_queue_wait_ns": waited, "round_ns": round_ns,
                "tampered": tampered_timers()}

    def _place(self, inputs: list[Any], seed: int, *, from_memory: bool) -> list[Any]:
        """The inputs at a new page offset each call (bench/layout.py); with ``from_memory``
        (fresh draws) the baseline's PERSISTENT_INPUTS placed, then evicted from the caches,
        before the other inputs (bench/eviction.py)."""
        assert self.baseline is not None
        if not (from_memory and self.baseline.persistent_inputs):
            return self.relocator.relocate(inputs, seed)
        assert self.scrubber is not None, "load() makes the scrubber of a baseline with PERSISTENT_INPUTS"
        return eviction.place_from_memory(
            inputs, self.baseline.persistent_inputs,
            lambda position, value: self.relocator.relocate(value, seed + 7919 * position), self.scrubber)

    def fetch(self, msg: dict[str, Any]) -> dict[str, Any]:
        picked = [self.pool.load(i, self.kept[i]) for i in msg["indices"]]
        self.kept = []
        return {"calls": picked}


def _run_queue_wait_ns() -> int | None:
    """Nanoseconds this thread has spent runnable but waiting for a CPU (the second
    field of /proc/thread-self/schedstat; None where the kernel does not provide it).
    Unlike CPU time it does not count a thread that sleeps on purpose (an OpenMP
    barrier under OMP_WAIT_POLICY=PASSIVE), only one that other tasks kept off a CPU."""
    try:
        with open("/proc/thread-self/schedstat", "rb") as fh:
            return int(fh.read().split()[1])
    except (OSError, ValueError, IndexError):
        return None


#: The op namespace and module name the harness's builder gives a build,
#: ``_<name>_cpu_<10 hex of the sources' content id>`` (kernel_harness/build/codegen.py).
_BUILD_NAME = re.compile(r"^_\w+_cpu_([0-9a-f]{10})$")


def kernel_build(module: Any) -> dict[str, Any]:
    """Which build was loaded: the op namespace (``module.ops``, a torch op namespace
    named after the extension module) and the content id at its end; for a package
    built otherwise, its module name and no id."""
    ops = getattr(module, "ops", None)
    if ops is None:
        ops = getattr(getattr(module, "_ops", None), "ops", None)
    name = getattr(ops, "name", None)
    if not isinstance(name, str) or not name:
        name = module.__name__
    match = _BUILD_NAME.match(name)
    return {"module": name, "build_id": match.group(1) if match else None}


class _Slot:
    """Where one tensor leaf was copied: byte offset, dtype, shape."""

    __slots__ = ("offset", "dtype", "shape", "nbytes")

    def __init__(self, offset: int, dtype: torch.dtype, shape: tuple[int, ...], nbytes: int) -> None:
        self.offset, self.dtype, self.shape, self.nbytes = offset, dtype, shape, nbytes


class CopyPool:
    """One reusable byte buffer per call index of a round.

    Baseline and kernel workers both copy every timed call's output and inputs
    here, so both sides do the same extra work and neither changes the
    allocator's state between timed calls.
    """

    def __init__(self) -> None:
        self.buffers: list[torch.Tensor] = []

    def store(self, index: int, obj: Any) -> Any:
        need = tree.nbytes(obj)
        while len(self.buffers) <= index:
            self.buffers.append(torch.empty(0, dtype=torch.uint8))
        if self.buffers[index].numel() < need:
            self.buffers[index] = torch.empty(need, dtype=torch.uint8)
        buf = self.buffers[index]
        offset = 0

        def copy(t: torch.Tensor) -> _Slot:
            nonlocal offset
            nb = t.numel() * t.element_size()
            slot = _Slot(offset, t.dtype, tuple(t.shape), nb)
            if nb:
                buf[offset:offset + nb].copy_(t.detach().contiguous().reshape(-1).view(torch.uint8))
            offset += nb
            return slot

        return tree.tree_map(copy, obj)

    def load(self, index: int, template: Any) -> Any:
        buf = self.buffers[index]

        def restore(slot: Any) -> Any:
            if not isinstance(slot, _Slot):
                return slot
            out = torch.empty(slot.shape, dtype=slot.dtype)
            if slot.nbytes:
                out.reshape(-1).view(torch.uint8).copy_(buf[slot.offset:slot.offset + slot.nbytes])
            return out

        return _map_slots(restore, template)


def _map_slots(fn: Any, obj: Any) -> Any:
    if isinstance(obj, _Slot):
        return fn(obj)
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*(_map_slots(fn, v) for v in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(_map_slots(fn, v) for v in obj)
    if isinstance(obj, dict):
        return {k: _map_slots(fn, v) for k, v in obj.items()}
    return obj


def _scribble_freed_memory(inputs: list[Any]) -> None:
    """Fill and free blocks the size of each input, so memory the kernel gets back
    from the allocator holds garbage (NaN bit patterns), never an earlier result."""
    sizes = {t.numel() * t.element_size() for t in tree.tensors(inputs)}
    blocks = [torch.full((max(s, 1),), 0xFF, dtype=torch.uint8) for s in sorted(sizes)[-4:]]
    del blocks


_OWN_FUNCTIONS = {"_scribble_freed_memory": _scribble_freed_memory, "_run_queue_wait_ns": _run_queue_wait_ns,
                  "kernel_build": kernel_build}
_OWN_CODE = {name: fn.__code__ for name, fn in _OWN_FUNCTIONS.items()}


def serve(read_fd: int, write_fd: int) -> None:
    worker = Worker()
    handlers = {"load": worker.load, "set_isa": worker.set_isa, "check": worker.check,
                "trace": worker.trace, "dispatch": worker.dispatch, "time": worker.time,
                "fetch": worker.fetch}
    while True:
        try:
            msg = protocol.receive(read_fd)
        except protocol.ChannelClosed:
            return
        kind = msg.get("kind")
        if kind == "exit":
            return
        try:
            reply = {"ok": True, **handlers[kind](msg)}
        except HarnessError as exc:
            reply = {"ok": False, "error": type(exc).__name__, "exit_code": int(exc.exit_code),
                     "message": exc.message}
        except Exception as exc:  # noqa: BLE001 - the kernel raised: report, keep serving
            reply = {"ok": False, "error": type(exc).__name__, "exit_code": None,
                     "message": f"{type(exc).__name__}: {exc}",
                     "traceback": "".join(traceback.format_exc(limit=6))}
            todo = todo_report(str(exc), worker.module)  # an unwritten body: exit 1, not a crash (issue 20)
            if todo is not None:
                reply = {"ok": False, "error": "KernelTodo", "exit_code": 1, "message": todo}
        try:
            protocol.encode(reply)
        except Exception as exc:  # noqa: BLE001 - e.g. the kernel returned an unpicklable object
            reply = {"ok": False, "error": "UnpicklableResult", "exit_code": None,
                     "message": f"the result could not be sent to the harness: {exc}"}
        protocol.send(write_fd, reply)


def main() -> None:
    read_fd, write_fd = int(sys.argv[1]), int(sys.argv[2])
    serve(read_fd, write_fd)


if __name__ == "__main__":
    main()
