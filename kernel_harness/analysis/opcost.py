"""FLOPs and bytes of one ATen op, from the shapes and dtypes of its arguments.

Conventions (documented in ``docs/analysis.md``):

* A multiply-add counts 2 FLOPs (``mm`` of MxK by KxN is 2*M*N*K).
* Element-wise arithmetic counts 1 FLOP per output element.  Transcendental
  functions count what a vectorised polynomial evaluation costs (``exp`` ~ 10,
  ``tanh``/``erf`` ~ 20, see :data:`POINTWISE_COST`), because that is what the
  AVX512 kernel will execute; the numbers are estimates, not hardware counts.
* Reductions count their cost per *input* element (``sum`` 1, ``var`` 3,
  ``_softmax`` ~ 13: max, subtract, exp, sum, scale).
* Bytes are the op's tensor inputs (each storage once) plus its outputs, at
  their dtype sizes: the traffic of running the op unfused.  Views cost
  nothing.  The whole-op *minimum* bytes (what a fused kernel must move) is
  computed by the tracer from the reference's own inputs and outputs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._pytree import tree_flatten

#: Ops that only create a view or metadata: no FLOPs, no traffic.
VIEW_OPS: frozenset[str] = frozenset(
    {
        "view", "_unsafe_view", "reshape", "t", "transpose", "permute", "expand", "unsqueeze",
        "squeeze", "slice", "select", "as_strided", "alias", "detach", "unbind", "split",
        "split_with_sizes", "chunk", "narrow", "view_as", "expand_as", "flatten", "unflatten",
        "movedim", "lift_fresh", "diagonal", "_reshape_alias", "view_as_real", "view_as_complex",
        "sym_size", "sym_stride", "sym_numel", "sym_storage_offset", "dim", "size", "stride",
        "is_contiguous", "device", "_to_copy_meta",
    }
)

#: Ops that only produce (or move) data: bytes but no FLOPs.
DATA_OPS: frozenset[str] = frozenset(
    {
        "clone", "copy_", "copy", "_to_copy", "contiguous", "to", "cat", "stack", "index",
        "index_select", "gather", "scatter", "scatter_", "index_put", "index_put_", "embedding",
        "fill_", "fill", "zero_", "zeros", "zeros_like", "ones", "ones_like", "full", "full_like",
        "empty", "empty_like", "empty_strided", "new_empty", "new_zeros", "new_full", "new_ones",
        "arange", "randn", "rand", "randint", "normal_", "uniform_", "masked_fill", "masked_fill_",
        "repeat", "roll", "flip", "constant_pad_nd", "pad", "tril", "triu", "where_self_copy",
        "_fused_moe_routing_placeholder",
    }
)

#: FLOPs per output element of point-wise ops (estimates for SIMD evaluation).
POINTWISE_COST: dict[str, float] = {
    "add": 1, "sub": 1, "mul": 1, "div": 1, "neg": 1, "abs": 1, "maximum": 1, "minimum": 1,
    "clamp": 2, "clamp_min": 1, "clamp_max": 1, "relu": 1, "threshold": 1, "where": 1,
    "reciprocal": 1, "sqrt": 1, "rsqrt": 1, "square": 1, "pow": 1, "fmod": 2, "remainder": 2,
    "floor": 1, "ceil": 1, "round": 1, "trunc": 1, "sign": 1, "eq": 1, "ne": 1, "lt": 1, "le": 1,
    "gt": 1, "ge": 1, "logical_and": 1, "logical_not": 1, "logical_or": 1, "bitwise_and": 1,
    "addcmul": 2, "addcdiv": 2, "lerp": 3, "hardtanh": 2, "leaky_relu": 2, "hardswish": 4,
    "hardsigmoid": 3,
    "exp": 10, "exp2": 10, "expm1": 12, "log": 12, "log1p": 14, "log2": 12, "sigmoid": 12,
    "silu": 13, "tanh": 20, "erf": 20, "erfc": 20, "gelu": 24, "softplus": 24, "mish": 36,
    "sin": 16, "cos": 16, "elu": 12, "selu": 12, "celu": 12, "logit": 14,
}

#: FLOPs per input element of reductions and row-wise composite ops.
REDUCTION_COST: dict[str, float] = {
    "sum": 1, "mean": 1, "amax": 1, "amin": 1, "max": 1, "min": 1, "prod": 1, "argmax": 1,
    "argmin": 1, "any": 1, "all": 1, "var": 3, "std": 3, "var_mean": 3, "std_mean": 3,
    "linalg_vector_norm": 2, "norm": 2, "logsumexp": 13, "cumsum": 1, "cumprod": 1,
    "_softmax": 13, "softmax": 13, "_log_softmax": 24, "log_softmax": 24,
    "native_layer_norm": 8, "layer_norm": 8, "_fused_rms_norm": 5, "rms_norm": 5,
    "native_group_norm": 8, "native_batch_norm": 8, "_native_batch_norm_legit": 8,
    "_native_batch_norm_legit_no_training": 4, "topk": 2, "sort": 10, "median": 10,
}

MATMUL_OPS: frozenset[str] = frozenset({"mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "addbmm",
                                         "_addmm_activation", "dot", "mv", "addmv", "vdot", "einsum",
                                         "_int_mm", "_weight_int8pack_mm", "_weight_int4pack_mm",
                                         "_weight_int4pack_mm_for_cpu", "_scaled_mm", "convolution",
                                         "_convolution", "conv2d", "conv1d", "_grouped_mm"})
ATTENTION_OPS: frozenset[str] = frozenset({
    "scaled_dot_product_attention", "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_attention_math", "_scaled_dot_product_fused_attention_overrideable",
    "_scaled_dot_product_cudnn_attention", "_flash_attention_forward", "_efficient_attention_forward",
})
SOFTMAX_OPS: frozenset[str] = frozenset({"_softmax", "softmax", "_log_softmax", "log_softmax", "_safe_softmax"})


@dataclass(frozen=True)
class OpCost:
    """Cost of one traced ATen call; ``category`` is one of view/data/pointwise/reduction/matmul/attention/other."""

    op: str  # e.g. "aten.mm.default"
    base: str  # e.g. "mm"
    category: str
    flops: int
    bytes_read: int
    bytes_written: int
    shapes: tuple[tuple[int, ...], ...]  # shapes of the tensor arguments
    out_shapes: tuple[tuple[int, ...], ...]
    dtype: str

    @property
    def bytes(self) -> int:
        return self.bytes_read + self.bytes_written


def _tensors(obj: Any) -> list[torch.Tensor]:
    leaves, _ = tree_flatten(obj)
    return [leaf for leaf in leaves if isinstance(leaf, torch.Tensor)]


def tensor_bytes(tensor: torch.Tensor) -> int:
    return int(tensor.numel()) * tensor.element_size()


def _unique_bytes(tensors: list[torch.Tensor]) -> int:
    """Bytes of distinct tensors: the same view passed twice counts once, a slice counts its own size."""
    seen: dict[Any, int] = {}
    for tensor in tensors:
        try:
            storage: Any = tensor.untyped_storage()._cdata  # shared by all views of one buffer
        except Exception:  # noqa: BLE001 - fake/meta storages may refuse; fall back to identity
            storage = id(tensor)
        key = (storage, tensor.storage_offset(), tuple(tensor.shape), tuple(tensor.stride()))
        seen[key] = tensor_bytes(tensor)
    return sum(seen.values())


def base_name(func: Any) -> str:
    """``aten.add.Tensor`` -> ``add``; ``aten.add_.Tensor`` -> ``add_``."""
    packet = getattr(func, "overloadpacket", None)
    name = getattr(packet, "__name__", None) or str(func).split(".")[1 if str(func).count(".") else 0]
    return name


def _matmul_flops(base: str, tensors: list[torch.Tensor], outs: list[torch.Tensor]) -> int:
    if not outs:
        return 0
    out = outs[0]
    if base in ("convolution", "_convolution", "conv1d", "conv2d"):
        weight = tensors[1]
        per_out = int(math.prod(weight.shape[1:]))  # (Cin / groups) * kernel size
        return 2 * int(out.numel()) * per_out
    if base in ("dot", "vdot"):
        return 2 * int(tensors[0].numel())
    if base in ("mv", "addmv"):
        matrix = tensors[1] if base == "addmv" else tensors[0]
        return 2 * int(matrix.numel())
    # mm / addmm / bmm / baddbmm / matmul / linear / int-pack mms: 2 * out elements * K,
    # with K the reduction dimension = last dim of the activation operand.
    activation = tensors[1] if base in ("addmm", "baddbmm", "addbmm", "_addmm_activation") else tensors[0]
    k = int(activation.shape[-1]) if activation.dim() else 1
    flops = 2 * int(out.numel()) * k
    if base in ("addmm", "baddbmm", "addbmm", "_addmm_activation"):
        flops += int(out.numel())  # the bias/accumulator add
    return flops


def _attention_flops(tensors: list[torch.Tensor]) -> int:
    """Q[..., L, E] K[..., S, E] V[..., S, Ev]: QK^T and PV matmuls plus the softmax over L x S."""
    if len(tensors) < 3:
        return 0
    q, k, v = tensors[:3]
    batch = int(math.prod(q.shape[:-2])) if q.dim() > 2 else 1
    length, e = int(q.shape[-2]), int(q.shape[-1])
    source, ev = int(k.shape[-2]), int(v.shape[-1])
    scores = batch * length * source
    return 2 * scores * e + 2 * scores * ev + REDUCTION_COST["_softmax"] * scores


def op_cost(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> OpCost:
    base = base_name(func)
    stripped = base.rstrip("_") if base not in ("copy_",) else "copy"
    ins = _tensors((args, kwargs))
    outs = _tensors(out)
    in_place = base.endswith("_") and not base.startswith("_")
    dtype = str((outs or ins)[0].dtype).replace("torch.", "") if (outs or ins) else "none"
    shapes = tuple(tuple(int(s) for s in t.shape) for t in ins)
    out_shapes = tuple(tuple(int(s) for s in t.shape) for t in outs)

    def make(category: str, flops: float, read: int, written: int) -> OpCost:
        return OpCost(str(func), base, category, int(flops), int(read), int(written), shapes, out_shapes, dtype)

    if stripped in VIEW_OPS or base in VIEW_OPS or str(func).startswith("prim."):
        return make("view", 0, 0, 0)
    read = _unique_bytes(ins)
    written = 0 if in_place else _unique_bytes(outs)
    if in_place:
        written = _unique_bytes(ins[:1])
    if base in ATTENTION_OPS:
        return make("attention", _attention_flops(ins), read, written)
    if base in MATMUL_OPS:
        return make("matmul", _matmul_flops(base, ins, outs), read, written)
    if stripped in REDUCTION_COST:
        n_in = int(ins[0].numel()) if ins else 0
        category = "softmax" if stripped in SOFTMAX_OPS else "reduction"
        return make(category, REDUCTION_COST[stripped] * n_in, read, written)
    if stripped in POINTWISE_COST:
        n_out = int(outs[0].numel()) if outs else (int(ins[0].numel()) if ins else 0)
        return make("pointwise", POINTWISE_COST[stripped] * n_out, read, written)
    if stripped in DATA_OPS or base in DATA_OPS:
        factory = not ins
        return make("data", 0, 0 if factory else read, written)
    # Unknown op: count its traffic and one FLOP per output element, say so via category.
    n_out = int(outs[0].numel()) if outs else 0
    return make("other", n_out, read, written)
