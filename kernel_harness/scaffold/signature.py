"""The signature of an op outside the catalogue: one model, two ways to fill it.

A :class:`Signature` says everything the generator needs to write every layer
of a package for an op (Python function, ``ops.def`` schema, bridge checks,
raw-pointer tier interface, generic and SIMD bodies): each parameter is a
tensor (its dtypes, rank, which dimensions it shares with other tensors) or a
scalar (int, float, bool, with its default), and the result is one tensor or a
tuple of tensors, each with a dtype rule (like the *primary* tensor, or one
fixed dtype) and a shape rule (like a parameter, or built from parameters'
dimensions and constants).

It is filled either from a baseline file (:mod:`.from_baseline`, traced under
fake tensors) or from an explicit ``--signature`` string
(:func:`parse_signature`), e.g.::

    q: Tensor[bf16,fp32](T,H,D), cos: Tensor[fp32](T,D2), sin: Tensor[fp32](T,D2) -> Tensor(like q)

The *primary* tensor is the first one whose dtypes are all SIMD dtypes (fp32,
bf16, fp16): the SIMD bodies are templates over its element type ``T``, and
every tensor whose dtype follows it in every input set is a ``T*`` too.
"""

from __future__ import annotations

import keyword
import re
from dataclasses import dataclass, field

from ..errors import UsageError

#: dtype name -> (C++ element type in the tiers, ATen scalar type, torch name)
TENSOR_DTYPES: dict[str, tuple[str, str, str]] = {
    "fp32": ("float", "at::kFloat", "float32"),
    "bf16": ("bf16_t", "at::kBFloat16", "bfloat16"),
    "fp16": ("fp16_t", "at::kHalf", "float16"),
    "fp64": ("double", "at::kDouble", "float64"),
    "bool": ("bool", "at::kBool", "bool"),
    "int64": ("int64_t", "at::kLong", "int64"),
    "int32": ("int32_t", "at::kInt", "int32"),
    "int16": ("int16_t", "at::kShort", "int16"),
    "int8": ("int8_t", "at::kChar", "int8"),
    "uint8": ("uint8_t", "at::kByte", "uint8"),
}
#: dtypes the SIMD vocabulary (load/store of V) handles: the element type T.
SIMD_DTYPES: tuple[str, ...] = ("fp32", "bf16", "fp16")
SCALAR_KINDS: dict[str, tuple[str, str]] = {  # kind -> (C++ type, schema type)
    "int": ("int64_t", "int"),
    "float": ("double", "float"),
    "bool": ("bool", "bool"),
}

#: Names the generated code uses itself, or that C++ / the schema reserve.
_RESERVED = {
    "out", "op", "ops", "dt_", "T", "self", "torch", "at", "std", "int", "float", "double", "bool",
    "char", "long", "short", "auto", "class", "struct", "union", "enum", "delete", "new", "this",
    "template", "typename", "namespace", "using", "operator", "private", "public", "protected",
    "virtual", "friend", "const", "static", "volatile", "register", "extern", "inline", "signed",
    "unsigned", "void", "switch", "case", "default", "goto", "do", "sizeof", "typedef", "throw",
    "try", "catch", "export", "explicit", "mutable", "asm", "and", "or", "not", "xor", "bitand",
    "bitor", "compl", "and_eq", "or_eq", "xor_eq", "not_eq", "constexpr", "decltype", "nullptr",
    "char16_t", "char32_t", "noexcept", "static_assert", "thread_local", "alignas", "alignof",
    "concept", "requires", "co_await", "co_return", "co_yield", "consteval", "constinit", "int64_t",
    "V", "W", "Tensor", "Scalar",
}
_IDENT_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class Param:
    """One parameter, in the baseline's order."""

    name: str
    kind: str  # "tensor", "int", "float" or "bool"
    dtypes: tuple[str, ...] = ()  # tensors: every dtype it may have
    rank: int | None = None  # tensors: fixed rank, or None (any rank >= 1: rows x last dim)
    follows: bool = False  # tensors: its dtype is always the primary tensor's (a T* in the tiers)
    default: int | float | bool | None = None
    has_default: bool = False

    @property
    def is_tensor(self) -> bool:
        return self.kind == "tensor"


@dataclass(frozen=True)
class Output:
    """One result tensor: dtype rule and shape rule."""

    name: str  # "out", or "out0", "out1", ... for a tuple
    dtype: str | None  # None: like the primary tensor; else a TENSOR_DTYPES key
    like: str | None = None  # shape of this parameter
    dims: tuple[str, ...] = ()  # else: "q.0" (dimension 0 of q) or "16" (a constant), one per dim


@dataclass(frozen=True)
class Signature:
    op: str
    params: tuple[Param, ...]
    outputs: tuple[Output, ...]
    tuple_output: bool = False
    #: pairs of dimensions that must be equal: ("cos.0", "q.0") means cos.size(0) == q.size(0)
    shared: tuple[tuple[str, str], ...] = ()
    source: str = ""  # where it came from, for messages and the generated comments
    notes: tuple[str, ...] = field(default=())

    @property
    def tensors(self) -> tuple[Param, ...]:
        return tuple(p for p in self.params if p.is_tensor)

    @property
    def primary(self) -> Param | None:
        for p in self.tensors:
            if p.dtypes and all(d in SIMD_DTYPES for d in p.dtypes):
                return p
        return None

    def param(self, name: str) -> Param:
        for p in self.params:
            if p.name == name:
                return p
        raise KeyError(name)

    def describe(self) -> str:
        """Python-like one-line signature, for tables and docstrings."""
        parts = []
        for p in self.params:
            if p.is_tensor:
                rank = "" if p.rank is None else f", {p.rank}-d"
                parts.append(f"{p.name}: Tensor[{'|'.join(p.dtypes)}{rank}]")
            else:
                parts.append(f"{p.name}: {p.kind}" + (f" = {p.default!r}" if p.has_default else ""))
        outs = [_describe_output(o, self) for o in self.outputs]
        result = f"({', '.join(outs)})" if self.tuple_output else outs[0]
        return f"{self.op}({', '.join(parts)}, out=None) -> {result}"


def _describe_output(o: Output, sig: Signature) -> str:
    primary = sig.primary
    dtype = o.dtype or (f"dtype of {primary.name}" if primary else "?")
    shape = f"like {o.like}" if o.like else "[" + ", ".join(o.dims) + "]"
    return f"Tensor({shape}, {dtype})"


def check_signature(sig: Signature) -> Signature:
    """Refuse what the generator cannot express, naming the parameter (exit 2)."""
    where = f" ({sig.source})" if sig.source else ""
    names = [p.name for p in sig.params] + [o.name for o in sig.outputs]
    for name in (p.name for p in sig.params):
        if not _IDENT_RE.match(name) or keyword.iskeyword(name) or name in _RESERVED or name.startswith("out"):
            raise UsageError(
                f"Parameter {name!r} of {sig.op}{where} cannot be used as a name in the generated "
                "Python, C++ and schema code (reserved or not an identifier). Names starting with "
                "'out' are taken by the results. Rename it in the baseline (e.g. x_in) and rerun.")
    if len(set(names)) != len(names):
        raise UsageError(f"{sig.op}{where}: two parameters share a name ({', '.join(names)}).")
    if not sig.tensors:
        raise UsageError(f"{sig.op}{where} takes no tensor parameter; the generator needs at least one "
                         "(the kernel reads its data through tensors).")
    if not sig.outputs:
        raise UsageError(f"{sig.op}{where} returns no tensor; supported results: one tensor or a tuple of tensors.")
    primary = sig.primary
    for p in sig.tensors:
        if p.follows and primary is None:
            raise UsageError(f"Parameter {p.name!r} of {sig.op}{where} follows the primary dtype but no "
                             "tensor has only fp32/bf16/fp16 dtypes.")
        if not p.follows and p is not primary and len(p.dtypes) != 1:
            raise UsageError(
                f"Parameter {p.name!r} of {sig.op}{where} takes several dtypes ({', '.join(p.dtypes)}) that do "
                f"not follow the primary tensor's dtype. Supported: a tensor whose dtype is always that of "
                f"{primary.name if primary else 'the first fp32/bf16/fp16 tensor'}, or a tensor of one fixed dtype.")
        for d in p.dtypes:
            if d not in TENSOR_DTYPES:
                raise UsageError(f"Parameter {p.name!r} of {sig.op}{where} has dtype {d}; supported dtypes: "
                                 f"{', '.join(TENSOR_DTYPES)}.")
    tensor_names = {p.name: p for p in sig.tensors}
    for o in sig.outputs:
        if o.dtype is None and primary is None:
            raise UsageError(f"Output {o.name} of {sig.op}{where} has the primary tensor's dtype, but no tensor "
                             "has only fp32/bf16/fp16 dtypes; give the output a fixed dtype.")
        if o.like is not None and o.like not in tensor_names:
            raise UsageError(f"Output {o.name} of {sig.op}{where} is 'like {o.like}', which is not a tensor parameter.")
        for dim in o.dims:
            _check_dim_ref(dim, tensor_names, f"output {o.name} of {sig.op}{where}")
    for a, b in sig.shared:
        _check_dim_ref(a, tensor_names, f"{sig.op}{where}")
        _check_dim_ref(b, tensor_names, f"{sig.op}{where}")
    return sig


def _check_dim_ref(ref: str, tensors: dict[str, Param], what: str) -> None:
    if ref.lstrip("-").isdigit():
        return
    name, _, index = ref.rpartition(".")
    p = tensors.get(name)
    if p is None or not index.lstrip("-").isdigit():
        raise UsageError(f"{what}: {ref!r} is not a tensor parameter's dimension (write name.index, e.g. q.0).")
    i = int(index)
    if p.rank is None and i != -1:
        raise UsageError(f"{what}: {ref!r} names a dimension of {name}, whose rank varies; only {name}.-1 "
                         "(its last dimension) can be named.")
    if p.rank is not None and not -p.rank <= i < p.rank:
        raise UsageError(f"{what}: {ref!r} is outside {name}'s {p.rank} dimensions.")


# ---------------------------------------------------------------- --signature text

_PARAM_RE = re.compile(r"^\s*(\w+)\s*:\s*(\w+)\s*(?:\[([^\]]*)\])?\s*(?:\(([^)]*)\))?\s*(?:=\s*(\S+))?\s*$")
_OUT_RE = re.compile(r"^\s*Tensor\s*(?:\(([^)]*)\))?\s*$")


def _split_top(text: str) -> list[str]:
    """Split on commas outside brackets and parentheses."""
    parts, depth, current = [], 0, []
    for ch in text:
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
    if "".join(current).strip():
        parts.append("".join(current))
    return parts


def _scalar_default(kind: str, text: str, name: str) -> int | float | bool:
    try:
        if kind == "bool":
            if text not in ("True", "False", "true", "false"):
                raise ValueError(text)
            return text in ("True", "true")
        return int(text) if kind == "int" else float(text)
    except ValueError:
        raise UsageError(f"--signature: the default {text!r} of {name} is not a {kind}.") from None


def parse_signature(op: str, text: str, *, default_dtypes: tuple[str, ...] = SIMD_DTYPES) -> Signature:
    """Parse ``--signature`` (grammar in the module docstring; see SKILL.md).

    ``name: Tensor`` takes ``default_dtypes`` and follows the primary tensor's dtype;
    ``Tensor[fp32]`` is one fixed dtype; ``Tensor[...](A, B, C)`` fixes the rank and
    names the dimensions (one name used twice makes them shared). ``int``/``float``/
    ``bool`` parameters may have ``= default``. Results: ``Tensor`` (like the primary
    tensor), ``Tensor(like q)``, ``Tensor(like q, fp32)``, ``Tensor(A, B; fp32)``, or a
    parenthesised tuple of those.
    """
    if "->" not in text:
        raise UsageError(f"--signature {text!r} has no '->': write 'x: Tensor, w: Tensor -> Tensor(like x)'.")
    left, right = text.split("->", 1)
    params: list[Param] = []
    symbols: dict[str, str] = {}  # dimension name -> first "param.index"
    shared: list[tuple[str, str]] = []
    primary_dtypes: tuple[str, ...] | None = None
    for chunk in _split_top(left):
        m = _PARAM_RE.match(chunk)
        if not m:
            raise UsageError(f"--signature: cannot read the parameter {chunk.strip()!r}; write e.g. "
                             "'x: Tensor', 'w: Tensor[fp32](D)', 'eps: float = 1e-6'.")
        name, kind, dtypes_text, dims_text, default = m.groups()
        if kind == "Tensor":
            dtypes = tuple(d.strip() for d in (dtypes_text or "").replace("|", ",").split(",") if d.strip())
            follows = not dtypes
            dtypes = dtypes or tuple(default_dtypes)
            dims = [d.strip() for d in dims_text.split(",")] if dims_text is not None else None
            if primary_dtypes is None and all(d in SIMD_DTYPES for d in dtypes):
                primary_dtypes, follows = dtypes, False
            elif not follows and primary_dtypes is not None and len(dtypes) > 1 and dtypes == primary_dtypes:
                follows = True
            for i, sym in enumerate(dims or []):
                if sym.isdigit():
                    continue
                ref = f"{name}.{i}"
                if sym in symbols:
                    shared.append((ref, symbols[sym]))
                else:
                    symbols[sym] = ref
            params.append(Param(name, "tensor", dtypes, len(dims) if dims is not None else None, follows))
        elif kind in SCALAR_KINDS:
            value = _scalar_default(kind, default, name) if default is not None else None
            params.append(Param(name, kind, default=value, has_default=default is not None))
        else:
            raise UsageError(f"--signature: {name} has type {kind}; supported: Tensor, int, float, bool.")
    right = right.strip()
    tuple_output = right.startswith("(") and right.endswith(")") and not _OUT_RE.match(right)
    outs_text = _split_top(right[1:-1]) if tuple_output else [right]
    outputs = []
    for i, chunk in enumerate(outs_text):
        name = f"out{i}" if tuple_output else "out"
        outputs.append(_parse_output(chunk, name, params, symbols))
    sig = Signature(op, tuple(params), tuple(outputs), tuple_output, tuple(shared), source="--signature")
    return check_signature(sig)


def _parse_output(chunk: str, name: str, params: list[Param], symbols: dict[str, str]) -> Output:
    m = _OUT_RE.match(chunk)
    if not m:
        raise UsageError(f"--signature: cannot read the result {chunk.strip()!r}; write 'Tensor', "
                         "'Tensor(like x)', 'Tensor(like x, fp32)' or 'Tensor(A, B; fp32)'.")
    body = (m.group(1) or "").strip()
    shape_text, _, dtype = body.partition(";")
    dtype = dtype.strip() or None
    items = [s.strip() for s in shape_text.split(",") if s.strip()]
    if items and items[0].startswith("like "):
        if len(items) > 1:
            dtype = dtype or items[1]
        return Output(name, dtype, like=items[0][5:].strip())
    if not items:
        first = next((p.name for p in params if p.is_tensor), None)
        return Output(name, dtype, like=first)
    dims = []
    for sym in items:
        if sym.isdigit():
            dims.append(sym)
        elif sym in symbols:
            dims.append(symbols[sym])
        else:
            raise UsageError(f"--signature: the result's dimension {sym!r} is not a dimension name of any "
                             "parameter; name it in a parameter, e.g. x: Tensor(N, D).")
    return Output(name, dtype, dims=tuple(dims))
