"""Every op-template section of a :class:`~.signature.Signature`, generated.

The output is the same dict of sections an ``templates/ops/*.op`` file holds
(tier_decl, simd, generic_decl, generic, bridge_decl, bridge, binding,
python), still holding ``${name}``, ``${ns}`` and ``${tier}`` fields, so the
project renderer treats a generated op exactly like a catalogue one.

The agent's work is then only the bodies marked ``KERNEL_TODO``: the generic
ATen tier (in ``<ns>/<ns>.cpp``) and one SIMD body per tier (in
``<ns>/<name>_<tier>.cpp``), which receive every pointer and size unpacked.
"""

from __future__ import annotations

from .signature import SCALAR_KINDS, TENSOR_DTYPES, Output, Param, Signature


def _ctype(dtype: str) -> str:
    return TENSOR_DTYPES[dtype][0]


def _aten(dtype: str) -> str:
    return TENSOR_DTYPES[dtype][1]


def _human(dtypes: tuple[str, ...]) -> str:
    return ", ".join(TENSOR_DTYPES[d][2] for d in dtypes)


def _uses_t(sig: Signature, p: Param) -> bool:
    return sig.primary is not None and (p is sig.primary or p.follows)


def _size_names(p: Param) -> list[str]:
    if p.rank is None:
        return [f"{p.name}_rows", f"{p.name}_cols"]
    return [f"{p.name}_size{i}" for i in range(p.rank)]


def _size_values(p: Param) -> list[str]:
    if p.rank is None:
        return [f"rows_of({p.name})", f"last_dim({p.name})"]
    return [f"{p.name}.size({i})" for i in range(p.rank)]


def _shape_comment(sig: Signature, p: Param) -> str:
    dtype = "T (" + "/".join(sig.primary.dtypes) + ")" if _uses_t(sig, p) and sig.primary else "/".join(p.dtypes)
    if p.rank is None:
        return f"{p.name}: [{p.name}_rows, {p.name}_cols] {dtype}, contiguous (leading dims flattened)"
    dims = ", ".join(_size_names(p))
    return f"{p.name}: [{dims}] {dtype}, contiguous"


def _out_dtype_text(sig: Signature, o: Output) -> str:
    return f"T (dtype of {sig.primary.name})" if o.dtype is None and sig.primary else (o.dtype or "?")


def _out_shape_text(o: Output) -> str:
    if o.like:
        return f"shape of {o.like}"
    return "[" + ", ".join(_dim_text(d) for d in o.dims) + "]"


def _dim_text(ref: str) -> str:
    if ref.lstrip("-").isdigit():
        return ref
    name, _, index = ref.rpartition(".")
    return f"{name}.size({index})"


# ---------------------------------------------------------------- tier interface


def _tier_params(sig: Signature, typed: bool) -> list[str]:
    """The raw-pointer parameters: outputs, then each parameter (pointer + sizes, or the scalar)."""
    t = "T" if typed else "void"
    args = []
    for o in sig.outputs:
        args.append(f"{t}* {o.name}" if o.dtype is None else f"{_ctype(o.dtype)}* {o.name}")
    for p in sig.params:
        if p.is_tensor:
            ptr = f"const {t}* {p.name}" if _uses_t(sig, p) else f"const {_ctype(p.dtypes[0])}* {p.name}"
            args.append(ptr)
            args.extend(f"int64_t {s}" for s in _size_names(p))
        else:
            args.append(f"{SCALAR_KINDS[p.kind][0]} {p.name}")
    return args


def _arg_names(sig: Signature) -> list[str]:
    names = [o.name for o in sig.outputs]
    for p in sig.params:
        names.append(p.name)
        if p.is_tensor:
            names.extend(_size_names(p))
    return names


def _tier_decl(sig: Signature) -> str:
    lead = ["DType dt_"] if sig.primary else []
    lines = [f"// {sig.op}: {sig.describe()}"]
    lines += [f"//   {_shape_comment(sig, p)}" for p in sig.tensors]
    lines += [f"//   {o.name}: {_out_shape_text(o)}, {_out_dtype_text(sig, o)}, contiguous" for o in sig.outputs]
    lines.append(f"void {sig.op}({', '.join(lead + _tier_params(sig, typed=False))});")
    return "\n".join(lines) + "\n"


def _simd(sig: Signature) -> str:
    names = _arg_names(sig)
    voids = "\n".join(f"  (void){n};" for n in names)
    lines = [
        f"// {sig.op} (${{tier}} tier): write the compute body here. Every pointer and size is",
        "// unpacked below; the vocabulary of this unit (V, W, load, load_tail, store,",
        "// store_tail, vfmadd, hsum, vexp, ...) is defined above. Keep the arithmetic in fp32",
        "// and let store() round once to the output dtype; handle the tail (a last dimension",
        "// that is not a multiple of W) with load_tail/store_tail.",
    ]
    lines += [f"//   {_shape_comment(sig, p)}" for p in sig.tensors]
    lines += [f"//   {o.name}: {_out_shape_text(o)}, {_out_dtype_text(sig, o)}" for o in sig.outputs]
    body_params = ", ".join(_tier_params(sig, typed=True))
    if sig.primary:
        lines.append("template <typename T>")
    lines += [
        f"static void {sig.op}_body({body_params}) {{",
        voids,
        "  // Remove the (void) lines you no longer need and this marker once the body computes",
        f"  // {sig.op}. (Outside any OpenMP region: an exception must never escape one.)",
        f'  KERNEL_TODO("{sig.op}", "${{tier}}");',
        "}",
        "",
    ]
    public = ", ".join((["DType dt_"] if sig.primary else []) + _tier_params(sig, typed=False))
    if sig.primary:
        casts = []
        for o in sig.outputs:
            casts.append(f"static_cast<T*>({o.name})" if o.dtype is None else o.name)
        for p in sig.params:
            if p.is_tensor:
                casts.append(f"static_cast<const T*>({p.name})" if _uses_t(sig, p) else p.name)
                casts.extend(_size_names(p))
            else:
                casts.append(p.name)
        call = f"KERNEL_DISPATCH_DTYPE(dt_, {sig.op}_body<T>({', '.join(casts)}));"
    else:
        call = f"KERNEL_UNIT_ENTER();  // KERNEL_DISPATCH_DTYPE's first step\n  {sig.op}_body({', '.join(names)});"
    lines += [f"void {sig.op}({public}) {{", f"  {call}", "}"]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- ATen side


def _aten_params(sig: Signature, with_outputs: bool) -> list[str]:
    args = [f"at::Tensor& {o.name}" for o in sig.outputs] if with_outputs else []
    for p in sig.params:
        args.append(f"const at::Tensor& {p.name}" if p.is_tensor else f"{SCALAR_KINDS[p.kind][0]} {p.name}")
    return args


def _call_names(sig: Signature, with_outputs: bool) -> list[str]:
    return ([o.name for o in sig.outputs] if with_outputs else []) + [p.name for p in sig.params]


def _generic(sig: Signature) -> tuple[str, str]:
    params = ", ".join(_aten_params(sig, with_outputs=True))
    decl = f"void {sig.op}({params});\n"
    voids = "\n".join(f"  (void){n};" for n in _call_names(sig, with_outputs=True))
    body = (
        f"// {sig.op}: the generic tier is the package's correctness reference and the fallback for\n"
        "// small inputs: write it with ATen ops in fp32 and copy_ the result into the output(s)\n"
        "// (one rounding to their dtype), e.g. out.copy_(f(x.to(at::kFloat))).\n"
        f"void {sig.op}({params}) {{\n{voids}\n"
        f'  KERNEL_TODO("{sig.op}", "generic");\n}}\n'
    )
    return decl, body


def _result_type(sig: Signature) -> str:
    if sig.tuple_output:
        return "std::tuple<" + ", ".join("at::Tensor" for _ in sig.outputs) + ">"
    return "at::Tensor"


def _out_dtype_expr(sig: Signature, o: Output) -> str:
    return f"{sig.primary.name}.scalar_type()" if o.dtype is None and sig.primary else _aten(o.dtype or "fp32")


def _out_sizes_expr(o: Output) -> str:
    if o.like:
        return f"{o.like}.sizes()"
    return "std::vector<int64_t>{" + ", ".join(_dim_text(d) for d in o.dims) + "}"


def _bridge(sig: Signature) -> tuple[str, str]:
    op = sig.op
    in_params = ", ".join(_aten_params(sig, with_outputs=False))
    out_params = ", ".join(_aten_params(sig, with_outputs=True))
    decl = f"{_result_type(sig)} {op}({in_params});\nvoid {op}_out({out_params});\n"
    checks = []
    primary = sig.primary
    for p in sig.tensors:
        dtypes = "{" + ", ".join(_aten(d) for d in p.dtypes) + "}"
        rank = -1 if p.rank is None else p.rank
        checks.append(f'  check_arg({p.name}, op, "{p.name}", {dtypes}, "{_human(p.dtypes)}", {rank});')
    for p in sig.tensors:
        if p.follows and primary is not None:
            checks.append(f'  check_dtype_like({p.name}, {primary.name}, op, "{p.name}", "{primary.name}");')
    for a, b in sig.shared:
        an, _, ai = a.rpartition(".")
        bn, _, bi = b.rpartition(".")
        checks.append(f'  check_dim({an}, {ai}, "{an}", {bn}, {bi}, "{bn}", op);')
    first = sig.tensors[0]
    tier_args = []
    for o in sig.outputs:
        tier_args.append(f"{o.name}.data_ptr()" if o.dtype is None
                         else f"static_cast<{_qualified(o.dtype)}*>({o.name}.data_ptr())")
    for p in sig.params:
        if p.is_tensor:
            tier_args.append(f"{p.name}.data_ptr()" if _uses_t(sig, p)
                             else f"static_cast<const {_qualified(p.dtypes[0])}*>({p.name}.data_ptr())")
            tier_args.extend(_size_values(p))
        else:
            tier_args.append(p.name)
    lead = [f"${{ns}}::dtype_of({primary.name})"] if primary else []
    simd_call = ", ".join(lead + tier_args)
    problem = (f"rows_of({first.name}), last_dim({first.name})" if first.rank != 0 else "1, 1")
    out_checks = "\n".join(
        f'  check_result({o.name}, {_out_sizes_expr(o)}, {_out_dtype_expr(sig, o)}, op, "{o.name}");'
        for o in sig.outputs)
    # an out= that shares memory with an input reruns on copies of the inputs (aliased(), bridge.cpp)
    inputs = ", ".join(p.name for p in sig.tensors)
    outputs = ", ".join(o.name for o in sig.outputs)
    copies = ", ".join([o.name for o in sig.outputs]
                       + [f"{p.name}.clone()" if p.is_tensor else p.name for p in sig.params])
    alias_guard = f"  if (aliased({{{inputs}}}, {{{outputs}}})) return ::{op}_out({copies});  // see aliased()"
    empty = " && ".join(f"{o.name}.numel() == 0" for o in sig.outputs)
    names = ", ".join(_call_names(sig, with_outputs=False))
    all_names = ", ".join(_call_names(sig, with_outputs=True))
    allocs = "\n".join(
        f"  at::Tensor {o.name} = at::empty({_out_sizes_expr(o)}, "
        f"at::TensorOptions().dtype({_out_dtype_expr(sig, o)}).device(at::kCPU));" for o in sig.outputs)
    ret = ("std::make_tuple(" + ", ".join(o.name for o in sig.outputs) + ")") if sig.tuple_output else sig.outputs[0].name
    check_params = ", ".join(["const char* op"] + _aten_params(sig, with_outputs=False))
    body = f"""// {op}: the checks say which parameter is wrong and how to fix it; the shapes and
// dtypes they enforce are those of the baseline's input sets ({sig.source}).
static void {op}_check_inputs({check_params}) {{
{chr(10).join(checks)}
}}

void {op}_out({out_params}) {{
  const char* op = "${{name}}.{op}";
  {op}_check_inputs(op, {names});
{out_checks}
{alias_guard}
  if ({empty}) return;
  switch (${{ns}}::pick_tier("{op}", {problem})) {{
#if KERNEL_HAVE_AVX512
    case Tier::AVX512:
      ${{ns}}::avx512::{op}({simd_call});
      return;
#endif
#if KERNEL_HAVE_AVX2
    case Tier::AVX2:
      ${{ns}}::avx2::{op}({simd_call});
      return;
#endif
    default:
      ${{ns}}::generic::{op}({all_names});
  }}
}}

{_result_type(sig)} {op}({in_params}) {{
  {op}_check_inputs("${{name}}.{op}", {names});
{allocs}
  {op}_out({all_names});
  return {ret};
}}
"""
    return decl, body


def _qualified(dtype: str) -> str:
    ctype = _ctype(dtype)
    return f"${{ns}}::{ctype}" if ctype in ("bf16_t", "fp16_t") else ctype


def _binding(sig: Signature) -> str:
    schema_params = [f"Tensor {p.name}" if p.is_tensor else f"{SCALAR_KINDS[p.kind][1]} {p.name}" for p in sig.params]
    result = "(" + ", ".join("Tensor" for _ in sig.outputs) + ")" if sig.tuple_output else "Tensor"
    outs = [f"Tensor! {o.name}" for o in sig.outputs]
    op = sig.op
    return (
        f'  ops.def("{op}({", ".join(schema_params)}) -> {result}");\n'
        f'  ops.impl("{op}", c10::kCPU, &{op});\n'
        f'  ops.def("{op}_out({", ".join(outs + schema_params)}) -> ()");\n'
        f'  ops.impl("{op}_out", c10::kCPU, &{op}_out);\n'
    )


def _python(sig: Signature) -> str:
    py_types = {"int": "int", "float": "float", "bool": "bool"}
    params = []
    for p in sig.params:
        if p.is_tensor:
            params.append(f"{p.name}: torch.Tensor")
        else:
            params.append(f"{p.name}: {py_types[p.kind]}" + (f" = {p.default!r}" if p.has_default else ""))
    if sig.tuple_output:
        out_type = "tuple[" + ", ".join("torch.Tensor" for _ in sig.outputs) + "]"
    else:
        out_type = "torch.Tensor"
    args = ", ".join(p.name if p.is_tensor else f"{py_types[p.kind]}({p.name})" for p in sig.params)
    doc_lines = [f"    {_shape_comment(sig, p)}" for p in sig.tensors]
    doc_lines += [f"    {o.name}: {_out_shape_text(o)}, {_out_dtype_text(sig, o)}" for o in sig.outputs]
    if sig.tuple_output:
        call_out = f"        return tuple(ops.{sig.op}({args}))\n    ops.{sig.op}_out(*out, {args})\n"
    else:
        call_out = f"        return ops.{sig.op}({args})\n    ops.{sig.op}_out(out, {args})\n"
    return (
        f"def {sig.op}({', '.join(params)}, out: {out_type} | None = None) -> {out_type}:\n"
        f'    """{sig.op}, generated from {sig.source}. ``out`` (preallocated result'
        f'{"s" if sig.tuple_output else ""}) avoids the allocation.\n\n'
        + "\n".join(doc_lines) + '\n    """\n'
        "    if out is None:\n" + call_out + "    return out\n"
    )


def signature_sections(sig: Signature) -> dict[str, str]:
    """The op-template sections for ``sig`` (fields ${name}, ${ns}, ${tier} left to the renderer)."""
    generic_decl, generic = _generic(sig)
    bridge_decl, bridge = _bridge(sig)
    return {
        "tier_decl": _tier_decl(sig),
        "simd": _simd(sig),
        "generic_decl": generic_decl,
        "generic": generic,
        "bridge_decl": bridge_decl,
        "bridge": bridge,
        "binding": _binding(sig),
        "python": _python(sig),
    }
