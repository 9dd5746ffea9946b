"""Fill a :class:`~.signature.Signature` from a baseline file.

The parameter names and order come from ``get_reference_output`` (or
``Model.forward``); what each parameter is comes from running
``get_inputs()`` and every ``get_correctness_inputs()`` set under fake tensors
(nothing allocated, so a baseline whose inputs take gigabytes is read in
seconds) and calling the reference on each set for the result's dtypes and
shapes (``run_baseline`` when the file has one: it runs in the user's dtype,
while the ground truth may be computed in float64).

Every input set must agree on a parameter's kind; a tensor's dtypes, rank and
the dimensions it shares with earlier tensors are what holds in *all* sets.
What the generator cannot express exits 2 naming the parameter.
"""

from __future__ import annotations

import inspect
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from ..analysis.trace import DTYPE_NAMES, _import_baseline
from ..errors import UsageError
from .signature import SIMD_DTYPES, TENSOR_DTYPES, Output, Param, Signature, check_signature

SUPPORTED = ("supported parameters: a tensor (one per parameter), an int, a float or a bool; "
             "supported results: one tensor or a tuple/list of tensors")


def _dtype(t: torch.Tensor) -> str:
    return DTYPE_NAMES.get(t.dtype) or {torch.bool: "bool", torch.int64: "int64", torch.int32: "int32",
                                        torch.int16: "int16", torch.int8: "int8",
                                        torch.uint8: "uint8"}.get(t.dtype, str(t.dtype))


def _reference(module: Any, path: Path) -> tuple[Any, list[inspect.Parameter], str]:
    """(callable for the result, its parameters, its name)."""
    if callable(getattr(module, "get_reference_output", None)):
        fn = module.get_reference_output
        params = list(inspect.signature(fn).parameters.values())
        runner = module.run_baseline if callable(getattr(module, "run_baseline", None)) else fn
        return runner, params, "get_reference_output"
    model_cls = getattr(module, "Model", None)
    if isinstance(model_cls, type):
        params = list(inspect.signature(model_cls.forward).parameters.values())[1:]  # drop self
        init = module.get_init_inputs() if callable(getattr(module, "get_init_inputs", None)) else []
        model = model_cls(*init)
        if hasattr(model, "eval"):
            model.eval()
        runner = module.run_baseline if callable(getattr(module, "run_baseline", None)) else model
        return runner, params, "Model.forward"
    raise UsageError(f"{path} defines neither get_reference_output() nor a Model class; add one of them.")


def _input_sets(module: Any, path: Path) -> list[list[Any]]:
    if not callable(getattr(module, "get_inputs", None)):
        raise UsageError(f"{path} has no get_inputs() function; the procedure requires one.")
    first = module.get_inputs()
    sets = [list(first) if isinstance(first, (list, tuple)) else [first]]
    if callable(getattr(module, "get_correctness_inputs", None)):
        sets += [list(s) if isinstance(s, (list, tuple)) else [s] for s in module.get_correctness_inputs()]
    return sets


def _collect(path: Path, fake: bool) -> tuple[list[inspect.Parameter], str, list[list[Any]], list[Any], tuple[str, ...]]:
    context = FakeTensorMode(allow_non_fake_inputs=True) if fake else _null()
    with context, torch.no_grad():
        module = _import_baseline(path)
        runner, params, fname = _reference(module, path)
        sets = _input_sets(module, path)
        outputs = [runner(*inputs) for inputs in sets]
    return params, fname, sets, outputs, _model_notes(runner)


def _model_notes(runner: Any) -> tuple[str, ...]:
    """A Model's own tensors never reach the kernel function: say so."""
    if not isinstance(runner, torch.nn.Module):
        return ()
    named = [name for name, _ in list(runner.named_parameters()) + list(runner.named_buffers())]
    if not named:
        return ()
    return (f"Model holds {len(named)} tensor(s) of its own ({', '.join(named[:4])}{', ...' if len(named) > 4 else ''}) "
            "that forward() reads but the generated function does not receive; pass them as forward() "
            "parameters in the baseline if the kernel needs them.",)


class _null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def _kind(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return "tensor"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, (list, tuple)):
        return "list of tensors" if any(isinstance(v, torch.Tensor) for v in value) else "list"
    return type(value).__name__


def signature_from_baseline(path: str | Path, op: str) -> Signature:
    """Trace ``path`` and return the op's signature (exit 2 on what cannot be expressed)."""
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"--from-baseline {path}: no such file. Pass the path of your baseline.py.")
    try:
        params, fname, sets, outputs, notes = _collect(path, fake=True)
    except UsageError:
        raise
    except Exception as fake_exc:  # noqa: BLE001 - user code under fake tensors (.item(), ...)
        try:
            params, fname, sets, outputs, notes = _collect(path, fake=False)
        except UsageError:
            raise
        except Exception as exc:  # noqa: BLE001
            raise UsageError(
                f"--from-baseline {path}: running get_inputs() and the reference failed under fake tensors "
                f"({type(fake_exc).__name__}: {fake_exc}) and on real tensors ({type(exc).__name__}: {exc}). "
                "Fix the baseline, or pass --signature instead.") from exc
    source = f"{path.name}, {fname}"
    sig = _model(op, params, fname, sets, outputs, source)
    return check_signature(replace(sig, notes=notes))


def _model(op: str, params: list[inspect.Parameter], fname: str, sets: list[list[Any]],
           outputs: list[Any], source: str) -> Signature:
    for p in params:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise UsageError(f"{fname} in {source} takes *{p.name}; the generator needs named parameters "
                             f"(one per argument). {SUPPORTED}.")
    model_params: list[Param] = []
    tensor_values: dict[str, list[torch.Tensor]] = {}
    for i, p in enumerate(params):
        values = [s[i] for s in sets if i < len(s)]
        has_default = p.default is not inspect.Parameter.empty
        if len(values) < len(sets):
            if not has_default:
                raise UsageError(f"Parameter {p.name!r} of {fname} ({source}) gets no value from some input "
                                 "set and has no default; every input set must give it one.")
            values = values + [p.default] * (len(sets) - len(values))
        kinds = {_kind(v) for v in values}
        if kinds == {"int", "float"}:
            kinds = {"float"}
        if len(kinds) != 1 or next(iter(kinds)) not in ("tensor", "int", "float", "bool"):
            seen = ", ".join(sorted(kinds))
            raise UsageError(f"Parameter {p.name!r} of {fname} ({source}) is {seen} in the input sets; "
                             f"the generator cannot express that. {SUPPORTED}.")
        kind = next(iter(kinds))
        if kind == "tensor":
            tensor_values[p.name] = values
            ranks = {v.dim() for v in values}
            dtypes = tuple(dict.fromkeys(_dtype(v) for v in values))
            for d in dtypes:
                if d not in TENSOR_DTYPES:
                    raise UsageError(f"Parameter {p.name!r} of {fname} ({source}) has dtype {d}; supported "
                                     f"tensor dtypes: {', '.join(TENSOR_DTYPES)}.")
            model_params.append(Param(p.name, "tensor", dtypes, ranks.pop() if len(ranks) == 1 else None))
        else:
            default = p.default if has_default and _kind(p.default) in ("int", "float", "bool") else None
            if kind == "float" and isinstance(default, int) and not isinstance(default, bool):
                default = float(default)
            model_params.append(Param(p.name, kind, default=default, has_default=default is not None))
    if len(params) < max(len(s) for s in sets):
        raise UsageError(f"get_inputs() in {source} returns {max(len(s) for s in sets)} values but {fname} "
                         f"takes {len(params)} parameters; make them match.")
    model_params = _mark_followers(model_params, tensor_values)
    ranked = {p.name: p for p in model_params if p.is_tensor}
    shared = _shared_dims(ranked, tensor_values)
    primary = next((p for p in model_params if p.is_tensor and all(d in SIMD_DTYPES for d in p.dtypes)), None)
    outs, is_tuple = _outputs(outputs, ranked, tensor_values, primary, fname, source)
    return Signature(op, tuple(model_params), outs, is_tuple, shared, source=source)


def _mark_followers(params: list[Param], values: dict[str, list[torch.Tensor]]) -> list[Param]:
    primary = next((p for p in params if p.is_tensor and all(d in SIMD_DTYPES for d in p.dtypes)), None)
    if primary is None:
        return params
    ref = [v.dtype for v in values[primary.name]]
    marked = []
    for p in params:
        follows = (p.is_tensor and p is not primary and all(d in SIMD_DTYPES for d in p.dtypes)
                   and [v.dtype for v in values[p.name]] == ref)
        marked.append(Param(p.name, p.kind, p.dtypes, p.rank, follows, p.default, p.has_default))
    return marked


def _dim_keys(p: Param) -> list[str]:
    return [f"{p.name}.{i}" for i in range(p.rank)] if p.rank is not None else [f"{p.name}.-1"]


def _sizes(ref: str, values: dict[str, list[torch.Tensor]]) -> tuple[int, ...]:
    name, _, index = ref.rpartition(".")
    return tuple(int(v.shape[int(index)]) for v in values[name])


def _shared_dims(tensors: dict[str, Param], values: dict[str, list[torch.Tensor]]) -> tuple[tuple[str, str], ...]:
    """Each dimension equal to an earlier tensor dimension in every input set (size-1 ones skipped)."""
    seen: list[tuple[str, tuple[int, ...]]] = []
    shared = []
    for p in tensors.values():
        if p.rank == 0:
            continue
        for ref in _dim_keys(p):
            sizes = _sizes(ref, values)
            if all(s == 1 for s in sizes):
                continue
            match = next((other for other, other_sizes in seen
                          if other_sizes == sizes and other.rpartition(".")[0] != p.name), None)
            if match is not None:
                shared.append((ref, match))
            else:
                seen.append((ref, sizes))
    return tuple(shared)


def _outputs(outputs: list[Any], tensors: dict[str, Param], values: dict[str, list[torch.Tensor]],
             primary: Param | None, fname: str, source: str) -> tuple[tuple[Output, ...], bool]:
    first = outputs[0]
    is_tuple = isinstance(first, (list, tuple))
    per_set = [list(o) if isinstance(o, (list, tuple)) else [o] for o in outputs]
    for o in per_set:
        for j, item in enumerate(o):
            if not isinstance(item, torch.Tensor):
                what = f"element {j} of its result" if is_tuple else "its result"
                raise UsageError(f"{fname} ({source}) returns a {type(item).__name__} as {what}; the "
                                 f"generator cannot express a non-tensor result. {SUPPORTED}.")
    if len({len(o) for o in per_set}) != 1 or not per_set[0]:
        raise UsageError(f"{fname} ({source}) returns a different number of tensors across the input sets; "
                         f"{SUPPORTED} of a fixed length.")
    result = []
    for j in range(len(per_set[0])):
        tensors_j = [o[j] for o in per_set]
        name = f"out{j}" if is_tuple else "out"
        result.append(_output(name, tensors_j, tensors, values, primary, fname, source))
    return tuple(result), is_tuple


def _output(name: str, outs: list[torch.Tensor], tensors: dict[str, Param],
            values: dict[str, list[torch.Tensor]], primary: Param | None, fname: str, source: str) -> Output:
    dtypes = [o.dtype for o in outs]
    dtype: str | None
    if primary is not None and dtypes == [v.dtype for v in values[primary.name]]:
        dtype = None
    elif len(set(dtypes)) == 1:
        dtype = _dtype(outs[0])
        if dtype not in TENSOR_DTYPES:
            raise UsageError(f"{fname} ({source}) returns a {dtype} tensor; supported result dtypes: "
                             f"{', '.join(TENSOR_DTYPES)}.")
    else:
        raise UsageError(f"{fname} ({source}) returns {name} in dtypes {sorted({str(d) for d in dtypes})} that do "
                         f"not follow any input's dtype; {SUPPORTED}, each of one dtype or of the primary input's.")
    shapes = [tuple(o.shape) for o in outs]
    order = ([primary.name] if primary else []) + [n for n in tensors if not primary or n != primary.name]
    for pname in order:
        if [tuple(v.shape) for v in values[pname]] == shapes:
            return Output(name, dtype, like=pname)
    ranks = {len(s) for s in shapes}
    if len(ranks) != 1:
        raise UsageError(f"{fname} ({source}): the rank of {name} varies across input sets and it is shaped "
                         "like no input; give it the shape of an input, or pass --signature.")
    dims = []
    for d in range(ranks.pop()):
        sizes = tuple(s[d] for s in shapes)
        ref = next((r for pname in order for r in _dim_keys(tensors[pname])
                    if tensors[pname].rank != 0 and _sizes(r, values) == sizes), None)
        if ref is None and len(set(sizes)) == 1:
            ref = str(sizes[0])
        if ref is None:
            raise UsageError(f"{fname} ({source}): dimension {d} of {name} (sizes {list(sizes)}) matches no input "
                             "dimension and is not constant; pass --signature with the shape rule.")
        dims.append(ref)
    return Output(name, dtype, dims=tuple(dims))
