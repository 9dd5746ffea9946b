"""The process that runs inside ``qemu-x86_64 -cpu <model>``: load, dispatch, check.

Everything one emulated CPU has to prove happens in this one process, because
``import torch`` alone takes ~30 s under emulation:

1. torch's own view of the CPU (``get_cpu_capability``), so the parent can
   refuse a run whose emulation is not the model it asked for;
2. the kernel loads (a directory through ``kernels.get_local_kernel``, or an
   installed package) and reports ``available_tiers()``;
3. the baseline's input sets are drawn from the parent's seed and the
   reference is computed here (the same torch, the same emulated CPU);
4. the op runs once per set with the dispatcher's choice (recording
   ``dispatch_tier`` for it) and once per set on every available tier forced
   with ``KERNEL_CPU_ISA`` (the dispatcher reads it at every call), and each
   output is judged with :func:`kernel_harness.correctness.compare_outputs`,
   the benchmark's rules.

Before every step a line goes to the progress file and faulthandler writes a
Python traceback there on SIGILL/SIGSEGV, so when the emulated CPU hits an
instruction it lacks the parent can say which step (tier, input set) did it.
The result is a JSON file; the request is one too (argv[1]).
"""

from __future__ import annotations

import faulthandler
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, TextIO

ISA_ENV = "KERNEL_CPU_ISA"


class _Progress:
    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.last = "starting Python"
        self.t0 = time.monotonic()

    def step(self, text: str) -> None:
        self.last = text
        self.stream.write(f"[{time.monotonic() - self.t0:7.1f} s] {text}\n")
        self.stream.flush()


def _describe_failure(failure: Any) -> dict[str, Any]:
    data = failure.to_dict()
    return {k: data[k] for k in ("path", "kind", "message", "mismatches", "elements",
                                 "diagnosis", "ulps") if k in data}


def _check_calls(request: dict[str, Any], progress: _Progress) -> dict[str, Any]:
    progress.step("importing torch")
    import torch

    torch.set_num_threads(1)
    result: dict[str, Any] = {"torch_capability": torch.backends.cpu.get_cpu_capability(),
                              "torch_version": torch.__version__}
    progress.step(f"torch sees CPU capability {result['torch_capability']}")

    from ..baseline import load_baseline
    from ..bench.tree import clone_tree, describe_set
    from ..correctness import compare_outputs
    from ..kernel_loader import load_kernel_module, resolve_op

    progress.step("loading the baseline")
    baseline = load_baseline(request["baseline_path"])
    progress.step("loading the kernel")
    module = load_kernel_module(request["kernel_spec"])
    fn = resolve_op(module, request["op_path"])
    op_name = request["op_path"].split(".")[-1]
    tiers_fn = getattr(module, "available_tiers", None)
    available = [str(t) for t in tiers_fn()] if callable(tiers_fn) else None
    result["available_tiers"] = available
    dispatch_fn = getattr(module, "dispatch_tier", None)
    progress.step(f"the kernel loaded; available_tiers() = {available}")

    sets: list[tuple[str, list[Any]]] = []
    seed = int(request["seed"])
    for i in range(int(request["seeds"])):
        sets.append((f"get_inputs() #{i + 1} (seed {seed + i})", baseline.draw_inputs(seed + i)))
    for i, inputs in enumerate(baseline.draw_correctness_inputs(seed)):
        sets.append((f"get_correctness_inputs()[{i}] {describe_set(inputs)}", inputs))
    progress.step(f"computing the reference on {len(sets)} input sets")
    refs = [baseline.reference(clone_tree(inputs)) for _, inputs in sets]

    dispatched: list[dict[str, Any]] = []
    checks: list[dict[str, Any]] = []
    for tier in [None, *(available or [])]:
        label = tier or "dispatch"
        if tier is None:
            os.environ.pop(ISA_ENV, None)
        else:
            os.environ[ISA_ENV] = tier
        for (set_label, inputs), ref in zip(sets, refs, strict=True):
            if tier is None and callable(dispatch_fn):
                progress.step(f"dispatch_tier({op_name!r}) on {set_label}")
                dispatched.append({"input_set": set_label,
                                   "tier": str(dispatch_fn(op_name, *inputs))})
            progress.step(f"calling {request['op_path']} (tier {label}) on {set_label}")
            check: dict[str, Any] = {"tier": label, "input_set": set_label}
            try:
                with torch.no_grad():
                    out = fn(*clone_tree(inputs))
            except Exception as exc:  # noqa: BLE001 - a raising kernel is a finding, not our crash
                check.update(correct=False, error=f"{type(exc).__name__}: {exc}")
                checks.append(check)
                continue
            comparison = compare_outputs(out, ref, atol=request.get("atol"), rtol=request.get("rtol"))
            check.update(correct=comparison.ok,
                         failures=[_describe_failure(f) for f in comparison.failures])
            checks.append(check)
    os.environ.pop(ISA_ENV, None)
    result["dispatch"] = dispatched
    result["checks"] = checks
    progress.step("done")
    return result


def main(argv: list[str]) -> int:
    request = json.loads(Path(argv[0]).read_text(encoding="utf-8"))
    with open(request["progress_path"], "a", encoding="utf-8", buffering=1) as stream:
        faulthandler.enable(file=stream, all_threads=False)
        progress = _Progress(stream)
        from ..errors import HarnessError

        try:
            result = _check_calls(request, progress)
            code = 0
        except HarnessError as exc:
            result = {"error": {"exit_code": int(exc.exit_code), "message": exc.message,
                                "step": progress.last}}
            code = int(exc.exit_code)
        result["seconds"] = round(time.monotonic() - progress.t0, 1)
        tmp = Path(request["result_path"] + ".tmp")
        tmp.write_text(json.dumps(result), encoding="utf-8")
        tmp.replace(request["result_path"])
        return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
