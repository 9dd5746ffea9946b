"""Trace a baseline's reference under fake tensors and record the ATen ops it runs.

Why fake tensors: public benchmark suites ship baselines whose ``get_inputs()``
allocates tens of gigabytes.  Running ``get_inputs()`` (and the module import,
and a ``Model``'s construction) inside :class:`FakeTensorMode` makes
``torch.randn`` & co. return tensors that carry shape, dtype and strides but no
storage, so the reference can be traced in seconds whatever its size.  A
:class:`TorchDispatchMode` entered inside the fake mode sees every ATen call
first, forwards it (the fake mode computes output metadata) and records its
cost with :func:`~kernel_harness.analysis.opcost.op_cost`.

Things a fake tensor cannot do (``.item()``, ``.numpy()``, data-dependent
shapes such as ``nonzero``) make tracing fail; the caller then gets a
:class:`TraceError` with the reason and falls back to the name-based analysis.
"""

from __future__ import annotations

import contextlib
import importlib.util
import sys
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from ..baseline import persistent_positions
from ..errors import UsageError
from .opcost import OpCost, _unique_bytes, op_cost, tensor_bytes

DTYPES: dict[str, torch.dtype] = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
DTYPE_NAMES: dict[torch.dtype, str] = {v: k for k, v in DTYPES.items()} | {torch.float64: "fp64"}


class TraceError(Exception):
    """The baseline could not be traced under fake tensors (message says why)."""


@dataclass(frozen=True)
class TensorInfo:
    shape: tuple[int, ...]
    dtype: str
    bytes: int

    def to_dict(self) -> dict[str, Any]:
        return {"shape": "x".join(map(str, self.shape)) or "scalar", "dims": list(self.shape),
                "dtype": self.dtype, "bytes": self.bytes}


@dataclass
class BaselineTrace:
    path: str
    ops: list[OpCost]
    inputs: list[TensorInfo]
    outputs: list[TensorInfo]
    input_bytes: int
    output_bytes: int
    kind: str
    kind_reason: str
    seconds: float
    notes: list[str] = field(default_factory=list)
    fake: bool = True
    declared_flops: float | None = None
    declared_bytes: float | None = None
    traced_function: str = "get_reference_output"
    # the baseline's PERSISTENT_INPUTS (weights, KV caches the benchmark reads from memory)
    persistent_inputs: tuple[int, ...] = ()
    # whether the reference is a Model whose parameters are the weights (not inputs)
    model_weights: bool = False

    @property
    def flops(self) -> int:
        return sum(op.flops for op in self.ops)

    @property
    def aten_bytes(self) -> int:
        return sum(op.bytes for op in self.ops)

    @property
    def min_bytes(self) -> int:
        return self.input_bytes + self.output_bytes

    @property
    def primary_input(self) -> TensorInfo | None:
        """The largest input: its shape stands for the op's shape in reports."""
        return max(self.inputs, key=lambda t: t.bytes, default=None)

    @property
    def dtype(self) -> str | None:
        for info in sorted(self.inputs, key=lambda t: -t.bytes):
            if info.dtype in ("fp32", "bf16", "fp16", "fp64"):
                return info.dtype
        return None

    def op_summary(self) -> list[dict[str, Any]]:
        """Ops grouped by name and shapes, in first-seen order, views dropped."""
        groups: OrderedDict[tuple[str, tuple], dict[str, Any]] = OrderedDict()
        for op in self.ops:
            if op.category == "view":
                continue
            key = (op.op, op.shapes)
            entry = groups.setdefault(
                key,
                {"op": op.op, "category": op.category, "count": 0, "flops": 0, "bytes": 0, "dtype": op.dtype,
                 "shapes": ["x".join(map(str, s)) or "scalar" for s in op.shapes],
                 "out_shapes": ["x".join(map(str, s)) or "scalar" for s in op.out_shapes]},
            )
            entry["count"] += 1
            entry["flops"] += op.flops
            entry["bytes"] += op.bytes
        return list(groups.values())

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "kind": self.kind,
            "kind_reason": self.kind_reason,
            "inputs": [t.to_dict() for t in self.inputs],
            "outputs": [t.to_dict() for t in self.outputs],
            "flops": self.flops,
            "aten_bytes": self.aten_bytes,
            "min_bytes": self.min_bytes,
            "input_bytes": self.input_bytes,
            "output_bytes": self.output_bytes,
            "trace_seconds": round(self.seconds, 3),
            "traced_with": "fake tensors (nothing allocated)" if self.fake else "real tensors (small inputs)",
            "ops": self.op_summary(),
            "notes": list(self.notes),
            "traced_function": self.traced_function,
            "persistent_inputs": list(self.persistent_inputs),
            "declared_flops": self.declared_flops,
            "declared_bytes": self.declared_bytes,
        }


class _Recorder(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: list[OpCost] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        self.ops.append(op_cost(func, args, kwargs, out))
        return out


def _dtype_name(dtype: torch.dtype) -> str:
    return DTYPE_NAMES.get(dtype, str(dtype).replace("torch.", ""))


def _info(tensor: torch.Tensor) -> TensorInfo:
    return TensorInfo(tuple(int(s) for s in tensor.shape), _dtype_name(tensor.dtype), tensor_bytes(tensor))


def _import_baseline(path: Path) -> ModuleType:
    name = f"_kh_baseline_{uuid.uuid4().hex[:8]}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise UsageError(f"{path} cannot be imported as a Python module; pass a baseline.py file.")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except SyntaxError as exc:
        raise UsageError(f"Baseline file {path} has a syntax error at line {exc.lineno}: {exc.msg}. "
                         "Fix the file and rerun.") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"Baseline file {path} is unreadable: {exc}.") from exc
    finally:
        sys.modules.pop(name, None)
    return module


def _reference_callable(module: ModuleType, path: Path, dtype: torch.dtype | None) -> tuple[Any, list[torch.Tensor]]:
    """The function to trace and the parameters it reads (a Model's weights count as inputs).

    ``run_baseline`` (the speed reference, in the user's dtype) is preferred over
    ``get_reference_output``, which may compute the ground truth in float64.
    """
    if callable(getattr(module, "run_baseline", None)):
        return module.run_baseline, []
    if callable(getattr(module, "get_reference_output", None)):
        return module.get_reference_output, []
    model_cls = getattr(module, "Model", None)
    if model_cls is None:
        raise UsageError(
            f"{path} defines neither get_reference_output() nor a Model class; the procedure needs one "
            "of them as the reference. Add get_reference_output(*inputs) returning the expected output."
        )
    init = module.get_init_inputs() if callable(getattr(module, "get_init_inputs", None)) else []
    model = model_cls(*init)
    if dtype is not None and isinstance(model, torch.nn.Module):
        model = model.to(dtype)
    if isinstance(model, torch.nn.Module):
        model.eval()
        weights = list(model.parameters()) + list(model.buffers())
    else:
        weights = []
    return model, weights


def classify_trace(ops: list[OpCost]) -> tuple[str, str]:
    """Kind from the traced ops: attention > GEMM > reduction > element-wise."""
    categories = [op.category for op in ops]
    attention = [op for op in ops if op.category == "attention"]
    if attention:
        return "attention", f"the reference calls {attention[0].op} (fused attention)"
    matmuls = [op for op in ops if op.category == "matmul"]
    softmaxes = [op for op in ops if op.category == "softmax"]
    if len(matmuls) >= 2 and softmaxes:
        return "attention", (f"the reference runs {len(matmuls)} matmuls around {softmaxes[0].op} "
                             "(hand-written attention)")
    if matmuls:
        flops = sum(op.flops for op in matmuls)
        total = max(1, sum(op.flops for op in ops))
        return "gemm", (f"the reference calls {matmuls[0].op} "
                        f"({len(matmuls)} matmul op(s), {100 * flops / total:.0f}% of the FLOPs)")
    reductions = [op for op in ops if op.category in ("reduction", "softmax")]
    if reductions:
        return "reduction", f"the reference reduces with {reductions[0].op} (row statistics, then element-wise)"
    if "pointwise" in categories or "other" in categories or "data" in categories:
        return "elementwise", "the reference runs only point-wise / data-movement ops"
    return "elementwise", "the reference runs no compute op (views only)"


def _convert(obj: Any, dtype: torch.dtype | None) -> Any:
    if dtype is None:
        return obj
    if isinstance(obj, torch.Tensor):
        return obj.to(dtype) if obj.is_floating_point() else obj
    if isinstance(obj, (list, tuple)):
        return type(obj)(_convert(o, dtype) for o in obj)
    if isinstance(obj, dict):
        return {k: _convert(v, dtype) for k, v in obj.items()}
    return obj


#: A baseline that fake tensors cannot run is traced on real tensors only below this input size.
REAL_TRACE_MAX_BYTES = 256 * 1024**2


def _load_inputs(path: Path, torch_dtype: torch.dtype | None) -> tuple[ModuleType, list[Any]]:
    module = _import_baseline(path)
    if not callable(getattr(module, "get_inputs", None)):
        raise UsageError(f"{path} has no get_inputs() function; the procedure requires one.")
    inputs = module.get_inputs()
    if isinstance(inputs, torch.Tensor) or not isinstance(inputs, (list, tuple)):
        inputs = [inputs]
    return module, _convert(list(inputs), torch_dtype)


@dataclass
class _Run:
    inputs: list[Any]
    weights: list[torch.Tensor]
    recorder: _Recorder
    output: Any
    function: str
    declared: dict[str, float | None]
    persistent: tuple[int, ...]


def _declared(module: ModuleType, name: str, inputs: list[Any]) -> float | None:
    """The baseline's own ``FLOPS``/``BYTES`` (number or function of the inputs), if any."""
    value = getattr(module, name, None)
    try:
        value = value(*inputs) if callable(value) else value
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
    except Exception:  # noqa: BLE001 - optional metadata; never fail the analysis for it
        return None


def _run(path: Path, torch_dtype: torch.dtype | None, *, fake: bool) -> _Run:
    """Import the baseline, build its inputs and run the reference under the recorder."""
    context = FakeTensorMode(allow_non_fake_inputs=True) if fake else contextlib.nullcontext()
    with context:
        module, inputs = _load_inputs(path, torch_dtype)
        reference, weights = _reference_callable(module, path, torch_dtype)
        recorder = _Recorder()
        with torch.no_grad(), recorder:
            output = reference(*inputs)
        declared = {name: _declared(module, name, inputs) for name in ("FLOPS", "BYTES")}
    function = getattr(reference, "__name__", None) or type(reference).__name__ + ".forward"
    persistent = persistent_positions(getattr(module, "PERSISTENT_INPUTS", None), path)
    return _Run(inputs, weights, recorder, output, function, declared, persistent)


def _fake_input_bytes(path: Path, torch_dtype: torch.dtype | None) -> int | None:
    try:
        with FakeTensorMode(allow_non_fake_inputs=True):
            _, inputs = _load_inputs(path, torch_dtype)
    except Exception:  # noqa: BLE001 - then we cannot know the size; do not run it for real
        return None
    return _unique_bytes([t for t in tree_flatten(inputs)[0] if isinstance(t, torch.Tensor)])


def trace_baseline(path: Path, *, dtype: str | None = None) -> BaselineTrace:
    """Trace ``path`` (a baseline.py) under fake tensors; ``dtype`` re-types floating inputs."""
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"The baseline file {path} does not exist. Pass --file the path of your baseline.py.")
    torch_dtype = DTYPES[dtype] if dtype else None
    started = time.perf_counter()
    notes: list[str] = []
    fake = True
    try:
        run = _run(path, torch_dtype, fake=True)
    except UsageError:
        raise
    except Exception as exc:  # noqa: BLE001 - any failure inside user code under fake tensors
        reason = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        # Small baselines that read values (.item(), data-dependent shapes) can still be traced for
        # real: measure their inputs under fake tensors first so a huge one is never allocated.
        size = _fake_input_bytes(path, torch_dtype)
        if size is None or size > REAL_TRACE_MAX_BYTES:
            extra = "" if size is None else f"; its inputs take {size / 1024**2:.0f} MiB, too many to run for real"
            raise TraceError(reason + extra) from exc
        fake = False
        try:
            run = _run(path, torch_dtype, fake=False)
        except UsageError:
            raise
        except Exception as exc2:  # noqa: BLE001
            raise TraceError(f"{reason}; running it on real tensors failed too: {type(exc2).__name__}: {exc2}") from exc2
        notes.append(f"fake tensors could not run the reference ({reason}); its inputs are small "
                     f"({size / 1024**2:.1f} MiB), so it was traced on real tensors")
    inputs, weights, recorder, output = run.inputs, run.weights, run.recorder, run.output
    in_tensors = [t for t in tree_flatten(inputs)[0] if isinstance(t, torch.Tensor)] + weights
    out_tensors = [t for t in tree_flatten(output)[0] if isinstance(t, torch.Tensor)]
    if not out_tensors:
        notes.append("the reference returned no tensor; the output bytes are 0")
    kind, reason = classify_trace(recorder.ops)
    if any(op.category == "other" for op in recorder.ops):
        unknown = sorted({op.op for op in recorder.ops if op.category == "other"})
        notes.append(f"no FLOP formula for {', '.join(unknown)}: counted 1 FLOP per output element")
    return BaselineTrace(
        path=str(path),
        ops=recorder.ops,
        inputs=[_info(t) for t in in_tensors],
        outputs=[_info(t) for t in out_tensors],
        input_bytes=_unique_bytes(in_tensors),
        output_bytes=_unique_bytes(out_tensors),
        kind=kind,
        kind_reason=reason,
        seconds=time.perf_counter() - started,
        notes=notes,
        fake=fake,
        declared_flops=run.declared["FLOPS"],
        declared_bytes=run.declared["BYTES"],
        traced_function=run.function,
        persistent_inputs=run.persistent,
        model_weights=bool(run.weights),
    )
