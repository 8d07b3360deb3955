"""PyTorch integration: nikki kernels as torch.library custom operators.

``nki_op`` turns any ``@nki.jit`` kernel into a custom op that works in eager code, under
``torch.compile(fullgraph=True)`` and with autograd. Its fake (meta) implementation comes from
tracing the kernel on the input shapes, so no shape function is written by hand. Every kernel of
nikki's library is registered the same way as ``torch.ops.nikki.<name>``, with autograd wired to
its backward kernel; the functions below (:func:`matmul`, :func:`softmax`, :func:`layer_norm`,
:func:`rms_norm`, :func:`flash_attention`) take PyTorch's conventions.

Kernels run on CPU tensors, on nikki's simulated NeuronCore.
"""

from __future__ import annotations

import ast
import inspect
import math
import textwrap

import torch

from . import library as _library
from .arguments import argument_error, check_bool, check_int, check_real, check_shape
from .dtypes import from_torch, torch_dtype
from .errors import kernel_error_at, user_frame
from .kernel import Kernel
from .spec import TensorSpec

__all__ = ["nki_op", "library_op", "differentiable", "matmul", "softmax", "topk", "gated_mlp", "router_topk",
           "cumsum", "cross_entropy", "layer_norm", "rms_norm", "add_rms_norm", "rms_norm_quant", "fp8_matmul", "flash_attention",
           "apply_rotary_pos_emb", "output_projection", "decode_attention", "causal_conv1d", "conv1d", "embedding",
           "gather_rows", "scatter_add_rows", "adamw_", "max_pool2d", "avg_pool2d", "linear_recurrence",
           "selective_scan", "paged_decode_attention", "find_nonzero_indices", "moe_prefill", "moe_decode"]


# --- nki_op ---------------------------------------------------------------------------------------

def nki_op(name: str, *, mutates_args=(), schema: str | None = None):
    """Registers an ``@nki.jit`` kernel as the torch custom op `name` ("namespace::op").

    Tensor parameters are the kernel's parameters without defaults; parameters with defaults are
    scalar arguments typed by their default (bool, int, float) or by their annotation. The number
    of results is read from the kernel's ``return`` statements; pass ``schema=`` (torch's schema
    syntax, e.g. ``"(Tensor x, float eps=1e-5) -> (Tensor, Tensor)"``) when it cannot be. Inputs
    the kernel writes (``nt.mutable_tensor``) must be listed in `mutates_args` and are not returned.

    Returns torch's ``CustomOpDef``: call it like the kernel, and add a backward with
    ``op.register_autograd(backward, setup_context=...)``. ``op.kernel`` is the kernel.
    """
    if not isinstance(name, str) or name.count("::") != 1 or not all(name.split("::")):
        raise ValueError(f"nki_op: name must be 'namespace::op', got {name!r}")
    mutates = (mutates_args,) if isinstance(mutates_args, str) else tuple(mutates_args)

    def register(kernel):
        if not isinstance(kernel, Kernel):
            raise TypeError(f"nki_op({name!r}) decorates an @nki.jit kernel, got {type(kernel).__name__}; "
                            "put @nki_op(...) above @nki.jit")
        op_schema = schema or _infer_schema(kernel, mutates, name)
        positions = _tensor_positions(kernel)
        unknown = [m for m in mutates if m not in [kernel._params[i].name for i in positions]]
        if unknown:
            raise ValueError(f"nki_op({name!r}): mutates_args names {unknown[0]!r}, which is not a tensor "
                             "parameter of the kernel")

        def impl(*args):
            results = kernel(*args)
            return _op_results(kernel, args, results)

        def fake(*args):
            specs = [TensorSpec(tuple(int(s) for s in a.shape), a.dtype) if isinstance(a, torch.Tensor) else a
                     for a in args]
            output_specs, results = kernel.trace_outputs(kernel._bind(specs, {}))
            device = _one_device(name, [(kernel._param_name(i), a) for i, a in enumerate(args)])
            outs = [torch.empty(shape, dtype=torch_dtype(dt), device=device) for shape, dt in output_specs]
            returned = [outs[k] for kind, k in results if kind == "output"]
            return None if not returned else returned[0] if len(returned) == 1 else tuple(returned)

        op = torch.library.custom_op(name, impl, mutates_args=mutates, schema=op_schema)
        op.register_fake(fake)
        op.kernel = kernel  # type: ignore[attr-defined]
        return op

    return register


def _one_device(api: str, named_args) -> torch.device | None:
    """The device of the tensors among (name, value) arguments, which must be one (as for torch's
    own ops); a KernelError naming the first argument on another device."""
    device, first = None, None
    for name, value in named_args:
        if isinstance(value, torch.Tensor):
            if device is None:
                device, first = value.device, name
            elif value.device != device:
                raise kernel_error_at(user_frame(), f"{api}: argument '{name}' is on {value.device}, but '{first}' is "
                                      f"on {device}", hint="put all tensor arguments on one device")
    return device


def _op_results(kernel, args, results):
    """The op's results from the kernel's: mutated inputs the kernel returns are dropped (torch
    custom ops must not return their inputs)."""
    if not isinstance(results, tuple):
        results = (results,)
    kept = tuple(r for r in results if not any(r is a for a in args))
    return None if not kept else kept[0] if len(kept) == 1 else kept


def _tensor_positions(kernel) -> list:
    if isinstance(kernel, _library.LibraryKernel):
        return list(range(len(kernel.inputs)))
    return [i for i, p in enumerate(kernel._params) if p.default is inspect.Parameter.empty]


_SCALAR_TYPES = {bool: "bool", int: "int", float: "float", str: "str"}


def _infer_schema(kernel, mutates, name) -> str:
    if isinstance(kernel, _library.LibraryKernel):
        return _library_schema(kernel)
    args, alias = [], 0
    for p in kernel._params:
        annotation = p.annotation if p.annotation is not inspect.Parameter.empty else None
        if p.default is inspect.Parameter.empty:
            if p.name in mutates:
                args.append(f"Tensor({chr(ord('a') + alias)}!) {p.name}")
                alias += 1
            else:
                args.append(f"Tensor {p.name}")
            continue
        if annotation is None and p.default is None:
            raise ValueError(f"nki_op({name!r}): parameter '{p.name}' defaults to None, so its type is unknown; "
                             f"annotate it (e.g. '{p.name}: float | None = None') or pass schema=")
        type_name = _annotation_type(annotation) if annotation is not None else _SCALAR_TYPES.get(type(p.default))
        if type_name is None:
            raise ValueError(f"nki_op({name!r}): cannot express parameter '{p.name}' (default {p.default!r}) in a "
                             "torch schema; pass schema=")
        args.append(f"{type_name} {p.name}={_default_text(p.default)}")
    count = _result_count(kernel, mutates, name)
    returns = "()" if count == 0 else "Tensor" if count == 1 else "(" + ", ".join(["Tensor"] * count) + ")"
    return f"({', '.join(args)}) -> {returns}"


def _annotation_type(annotation) -> str | None:
    text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", repr(annotation))
    text = text.replace("typing.", "").replace(" ", "")
    optional = "None" in text or text.startswith("Optional")
    for py, name in (("bool", "bool"), ("int", "int"), ("float", "float"), ("str", "str"), ("Tensor", "Tensor")):
        if py in text:
            return name + ("?" if optional else "")
    return None


def _default_text(value) -> str:
    if value is None:
        return "None"
    if isinstance(value, str):
        return repr(value).replace("'", '"')
    return repr(value)


def _result_count(kernel, mutates, name) -> int:
    """How many tensors the op returns: the arity of the kernel's return statements, minus the
    mutated inputs it returns."""
    try:
        source = textwrap.dedent(inspect.getsource(kernel.fn))
        tree = ast.parse(source)
    except (OSError, TypeError, SyntaxError):
        tree = None
    fn_node = next((n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                    and n.name == kernel.fn.__name__), None) if tree is not None else None
    if fn_node is None:
        raise ValueError(f"nki_op({name!r}): the kernel's source is not available to count its results; "
                         "pass schema=")
    counts = set()
    for node in _returns(fn_node):
        if node.value is None:
            counts.add(0)
            continue
        elements = node.value.elts if isinstance(node.value, (ast.Tuple, ast.List)) else [node.value]
        counts.add(sum(1 for e in elements if not (isinstance(e, ast.Name) and e.id in mutates)))
    if len(counts) != 1:
        raise ValueError(f"nki_op({name!r}): the kernel's return statements return different numbers of "
                         "tensors (or none is found); pass schema=")
    return counts.pop()


def _returns(fn_node):
    stack = list(fn_node.body)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Return):
            yield node
        elif not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            stack.extend(ast.iter_child_nodes(node))


# --- library ops ----------------------------------------------------------------------------------

def _library_schema(kernel) -> str:
    updated = list(kernel.updated_inputs)
    args = [f"Tensor({chr(ord('a') + updated.index(n))}!) {n}" if n in updated else f"Tensor {n}"
            for n in kernel.inputs]
    for pname, kind, default, _doc in kernel.info["params"]:
        args.append(f"{kind} {pname}={_default_text(default)}")  # the kinds are torch schema types
    n = len(kernel.outputs)
    returns = "Tensor" if n == 1 else "(" + ", ".join(["Tensor"] * n) + ")"
    return f"({', '.join(args)}) -> {returns}"


_ops: dict = {}


def library_op(name: str):
    """The custom op torch.ops.nikki.<name> of a library kernel (every one is registered when
    nikki.torch is imported)."""
    op = _ops.get(name)
    if op is None:
        kernels = _library.library_kernels()
        if name not in kernels:
            raise ValueError(f"no library kernel named {name!r}; available: {', '.join(sorted(kernels))}")
        op = nki_op(f"nikki::{name}", mutates_args=kernels[name].updated_inputs)(kernels[name])
        _ops[name] = op
        if kernels[name].backward:
            _register_library_autograd(op, kernels[name], library_op(kernels[name].backward))
        elif name in _AUTOGRAD_RULES:
            _AUTOGRAD_RULES[name](op)
    return op


def _register_library_autograd(op, forward, backward_op) -> None:
    """Autograd for a library op through its backward kernel, wired by the registry's naming
    contract: backward inputs are forward inputs, forward outputs or grad_<output>; backward
    outputs are grad_<input>."""
    backward = backward_op.kernel
    param_names = [p[0] for p in forward.info["params"]]
    backward_params = [p[0] for p in backward.info["params"]]
    saved = set(forward.saved_outputs)

    def setup_context(ctx, inputs, output):
        outputs = output if isinstance(output, tuple) else (output,)
        tensors = dict(zip(forward.inputs, inputs))
        tensors.update(zip(forward.outputs, outputs))
        ctx.needed = [n for n in backward.inputs if not n.startswith("grad_") or n[5:] not in forward.outputs]
        ctx.save_for_backward(*[tensors[n] for n in ctx.needed])
        ctx.params = dict(zip(param_names, inputs[len(forward.inputs):]))
        ctx.mark_non_differentiable(*[outputs[i] for i, n in enumerate(forward.outputs) if n in saved])

    def backward_fn(ctx, *grads):
        tensors = dict(zip(ctx.needed, ctx.saved_tensors))
        for out_name, g in zip(forward.outputs, grads):
            if out_name in saved:
                continue
            tensors[f"grad_{out_name}"] = g if g is not None else torch.zeros_like(tensors[out_name])
        args = [tensors[n] for n in backward.inputs] + [ctx.params[p] for p in backward_params]
        results = backward_op(*args)
        results = results if isinstance(results, tuple) else (results,)
        by_name = dict(zip(backward.outputs, results))
        grads_in = [by_name.get(f"grad_{n}") if ctx.needs_input_grad[i] else None
                    for i, n in enumerate(forward.inputs)]
        return tuple(grads_in) + (None,) * len(param_names)

    op.register_autograd(backward_fn, setup_context=setup_context)


# --- PyTorch-style functions ----------------------------------------------------------------------

def _tensor(x, what: str, min_dim: int = 1) -> torch.Tensor:
    """`x` if it is a dense torch tensor of at least `min_dim` dims; else a KernelError naming the
    argument `what` (e.g. "nikki.torch.softmax: x")."""
    if not isinstance(x, torch.Tensor):
        hint = "convert it with torch.from_numpy(x)" if type(x).__module__ == "numpy" else "pass a torch.Tensor"
        raise argument_error(what, "a torch.Tensor", x, hint=hint)
    if x.layout is not torch.strided:
        raise argument_error(what, "a dense (strided) torch.Tensor", x, hint="convert it with .to_dense()")
    try:
        from_torch(x.dtype)
    except TypeError as err:
        raise argument_error(what, "a tensor of an NKI dtype", x, hint=str(err)) from None
    if x.dim() < min_dim:
        raise argument_error(what, f"a tensor of at least {min_dim} dim{'s' if min_dim > 1 else ''}", x,
                             got=f"a {x.dim()}-d tensor")
    return x


def _optional_tensor(x, what: str, shape: tuple, shape_of: str):
    """`x` when None or a tensor of exactly `shape` (which is `shape_of`, e.g. "the last dim of x");
    else a KernelError naming the argument."""
    if x is None:
        return None
    _tensor(x, what)
    if tuple(x.shape) != shape:
        raise argument_error(what, f"None or a tensor of shape {shape} ({shape_of})", x)
    return x


def matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b`` with nikki's matmul kernel: a [..., M, K] (leading dims flattened into M) and
    b [K, N]. Differentiable: the gradients run the same kernel on transposed operands."""
    _tensor(a, "nikki.torch.matmul: a")
    _tensor(b, "nikki.torch.matmul: b")
    if a.dim() < 2 or b.dim() != 2:
        raise ValueError(f"nikki.torch.matmul takes a [..., M, K] and b [K, N], got {tuple(a.shape)} and "
                         f"{tuple(b.shape)}")
    _one_device("nikki.torch.matmul", (("a", a), ("b", b)))
    if a.shape[-1] != b.shape[0]:
        raise ValueError(f"nikki.torch.matmul: inner dimensions differ: a {tuple(a.shape)}, b {tuple(b.shape)}")
    if a.numel() == 0 or b.numel() == 0:
        # Nothing for a device to compute: an empty result, or zeros (an empty sum) when K is 0.
        return torch.matmul(a, b)
    out = _mm(a.reshape(-1, a.shape[-1]), b)
    return out.reshape(*a.shape[:-1], b.shape[1])


def _mm(a, b):
    """a [M, K] @ b [K, N] through the library op."""
    return library_op("matmul")(a.contiguous(), b.contiguous())


def _register_matmul_autograd(op) -> None:
    # dA = dOut @ B^T and dB = A^T @ dOut are matmuls themselves: the op is its own backward.
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(inputs[0], inputs[1])  # then the tiling choice (rows_per_block)

    def backward(ctx, grad):
        a, b = ctx.saved_tensors
        ga = _mm(grad, b.t()) if ctx.needs_input_grad[0] else None
        gb = _mm(a.t(), grad) if ctx.needs_input_grad[1] else None
        return ga, gb, None

    op.register_autograd(backward, setup_context=setup_context)


def _register_topk_autograd(op) -> None:
    # The values are elements of x: their gradient goes back to where they came from, a scatter
    # into zeros at the indices (which are integers, without a gradient).
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(output[1])
        ctx.x_shape = inputs[0].shape

    def backward(ctx, grad_values, _grad_indices):
        (indices,) = ctx.saved_tensors
        grad_x = grad_values.new_zeros(ctx.x_shape).scatter(1, indices.long(), grad_values)
        return grad_x, None

    op.register_autograd(backward, setup_context=setup_context)


_GATE_ACTIVATIONS = ("silu", "gelu", "gelu_tanh")


def _gate_activation_and_slope(g: torch.Tensor, activation: int):
    """act(g) and act'(g) for the gated MLP's activations, in g's dtype (fp32 here)."""
    if activation == 0:
        s = torch.sigmoid(g)
        return g * s, s * (1 + g * (1 - s))
    if activation == 1:
        cdf = 0.5 * torch.erfc(-g / math.sqrt(2))
        return g * cdf, cdf + g * torch.exp(-0.5 * g * g) / math.sqrt(2 * math.pi)
    c = math.sqrt(2 / math.pi)
    t = torch.tanh(c * (g + 0.044715 * g ** 3))
    return 0.5 * g * (1 + t), 0.5 * (1 + t) + 0.5 * g * (1 - t * t) * c * (1 + 3 * 0.044715 * g * g)


def _register_gated_mlp_autograd(op) -> None:
    # The six products of the backward run on the library's matmul kernel; the gate and up
    # projections are recomputed rather than saved; the element-wise steps are torch's, in fp32.
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs[:7])
        ctx.activation = int(inputs[7])

    def backward(ctx, grad):
        x, w_gate, w_up, w_down, b_gate, b_up, b_down = ctx.saved_tensors
        dt = x.dtype
        g = _mm(x, w_gate).float() + b_gate.float()
        u = _mm(x, w_up).float() + b_up.float()
        a, slope = _gate_activation_and_slope(g, ctx.activation)
        grad = grad.contiguous()
        dh = _mm(grad, w_down.t().contiguous()).float()
        du, dg = dh * a, dh * u * slope
        h = (a * u).to(dt)
        dgt, dut = dg.to(dt), du.to(dt)
        xt = x.t().contiguous()
        grads = [
            (_mm(dgt, w_gate.t().contiguous()).float() + _mm(dut, w_up.t().contiguous()).float()).to(dt),
            _mm(xt, dgt), _mm(xt, dut), _mm(h.t().contiguous(), grad),
            dg.sum(0).to(dt), du.sum(0).to(dt), grad.float().sum(0).to(dt),
        ]
        return tuple(gr if need else None for gr, need in zip(grads, ctx.needs_input_grad)) + (None,)

    op.register_autograd(backward, setup_context=setup_context)


def _register_router_autograd(op) -> None:
    # The routing weights' gradient, from logits recomputed on the matmul kernel: the activation's
    # and the normalization's derivatives in torch (fp32), the selection a gather / scatter by the
    # expert ids (which have no gradient).
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs[:3], output[0], output[1])
        ctx.options = inputs[3:]

    def backward(ctx, grad_weights, _grad_ids):
        x, w_router, bias, weights, ids = ctx.saved_tensors
        _k, sigmoid, select_first, normalize = ctx.options
        ids = ids.long()
        logits = _mm(x, w_router).float() + bias.float()
        g = grad_weights.float()
        if select_first and not sigmoid:  # softmax over the k selected logits
            dv = weights * (g - (g * weights).sum(-1, keepdim=True))
            dlogits = torch.zeros_like(logits).scatter(1, ids, dv)
        else:
            scores = torch.sigmoid(logits) if sigmoid else torch.softmax(logits, -1)
            picked = scores.gather(1, ids)
            if normalize:  # weights = picked / sum(picked)
                g = (g - (g * weights).sum(-1, keepdim=True)) / picked.sum(-1, keepdim=True)
            if select_first:  # sigmoid of the selected logits
                dlogits = torch.zeros_like(logits).scatter(1, ids, g * picked * (1 - picked))
            else:
                dscores = torch.zeros_like(logits).scatter(1, ids, g)
                dlogits = (dscores * scores * (1 - scores) if sigmoid
                           else scores * (dscores - (dscores * scores).sum(-1, keepdim=True)))
        dl = dlogits.to(x.dtype)
        grads = (_mm(dl, w_router.t().contiguous()), _mm(x.t().contiguous(), dl), dlogits.sum(0).to(bias.dtype))
        return tuple(gr if need else None for gr, need in zip(grads, ctx.needs_input_grad)) + (None,) * 4

    op.register_autograd(backward, setup_context=setup_context)


# Kernels whose gradient is expressed with other library ops instead of a backward kernel.
_AUTOGRAD_RULES = {"matmul": _register_matmul_autograd, "topk": _register_topk_autograd,
                   "gated_mlp": _register_gated_mlp_autograd, "router_topk": _register_router_autograd}


def differentiable(name: str) -> bool:
    """Whether autograd can differentiate ``torch.ops.nikki.<name>``: the kernel has a backward
    kernel or a gradient written with other library ops (an optimizer step has neither)."""
    return bool(_library.library_kernels()[name].backward) or name in _AUTOGRAD_RULES


def softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """``torch.softmax(x, dim)`` with nikki's softmax kernel (any rank; rows along `dim`)."""
    _tensor(x, "nikki.torch.softmax: x")
    dim = check_int(dim, "nikki.torch.softmax: dim", -x.dim(), x.dim() - 1)
    moved = x.movedim(dim, -1)
    out = library_op("softmax")(moved.reshape(-1, moved.shape[-1]).contiguous())
    return out.reshape(moved.shape).movedim(-1, dim)


def topk(x: torch.Tensor, k: int, dim: int = -1):
    """``torch.topk(x, k, dim)`` (largest, sorted) with nikki's topk kernel: x of any rank, k up to
    64. Returns (values, indices) with int64 indices as torch's; equal values come in order of
    increasing index. Differentiable in x through the values."""
    _tensor(x, "nikki.torch.topk: x")
    dim = check_int(dim, "nikki.torch.topk: dim", -x.dim(), x.dim() - 1)
    k = check_int(k, "nikki.torch.topk: k", minimum=1)
    moved = x.movedim(dim, -1)
    rows = moved.reshape(-1, moved.shape[-1]).contiguous()
    values, indices = library_op("topk")(rows, k=k)
    shape = (*moved.shape[:-1], k)
    return (values.reshape(shape).movedim(-1, dim), indices.long().reshape(shape).movedim(-1, dim))


def gated_mlp(x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, w_down: torch.Tensor,
              b_gate: torch.Tensor | None = None, b_up: torch.Tensor | None = None,
              b_down: torch.Tensor | None = None, activation: str = "silu", *,
              gate_scale: torch.Tensor | None = None, up_scale: torch.Tensor | None = None,
              down_scale: torch.Tensor | None = None) -> torch.Tensor:
    """``(act(x @ w_gate + b_gate) * (x @ w_up + b_up)) @ w_down + b_down`` with nikki's gated_mlp
    kernel: x [..., H], w_gate and w_up [H, I], w_down [I, H] (torch Linear weights transposed),
    optional biases, activation "silu" (SwiGLU), "gelu" or "gelu_tanh". Differentiable in every
    tensor (the backward's products run on nikki's matmul kernel).

    fp8 weights (``torch.float8_e4m3fn`` within +-240, or ``float8_e5m2``, all three of one
    format) run the gated_mlp_fp8 kernel and need their float32 per-column dequantization scales
    (``w = w_fp8 * scale``): gate_scale and up_scale [I], down_scale [H]; each product is scaled
    before its bias. x is then bfloat16 or float16. Inference only: not differentiable."""
    what = "nikki.torch.gated_mlp"
    for name, t in (("x", x), ("w_gate", w_gate), ("w_up", w_up), ("w_down", w_down)):
        _tensor(t, f"{what}: {name}")
    if activation not in _GATE_ACTIVATIONS:
        raise argument_error(f"{what}: activation", f"one of {', '.join(map(repr, _GATE_ACTIVATIONS))}", activation)
    if w_gate.dim() != 2:
        raise argument_error(f"{what}: w_gate", "a [H, I] tensor", w_gate, got=f"shape {tuple(w_gate.shape)}")
    h, i = w_gate.shape
    b_gate = _optional_tensor(b_gate, f"{what}: b_gate", (i,), "w_gate's columns")
    b_up = _optional_tensor(b_up, f"{what}: b_up", (i,), "w_up's columns")
    b_down = _optional_tensor(b_down, f"{what}: b_down", (h,), "w_down's columns")
    scales = {"gate_scale": _optional_tensor(gate_scale, f"{what}: gate_scale", (i,), "w_gate's columns"),
              "up_scale": _optional_tensor(up_scale, f"{what}: up_scale", (i,), "w_up's columns"),
              "down_scale": _optional_tensor(down_scale, f"{what}: down_scale", (h,), "w_down's columns")}
    _one_device(what, (("x", x), ("w_gate", w_gate), ("w_up", w_up), ("w_down", w_down), ("b_gate", b_gate),
                       ("b_up", b_up), ("b_down", b_down), *scales.items()))
    fp8 = w_gate.dtype in (torch.float8_e4m3fn, torch.float8_e5m2)
    for name, scale in scales.items():
        if fp8 and scale is None:
            raise argument_error(f"{what}: {name}", "the float32 dequantization scales of fp8 weights' columns", scale)
        if not fp8 and scale is not None:
            raise argument_error(f"{what}: {name}", f"None: the weights are {w_gate.dtype}, not fp8", scale,
                                 got="a tensor")
    zeros = lambda n: torch.zeros(n, dtype=x.dtype)  # noqa: E731
    b_gate = zeros(i) if b_gate is None else b_gate
    b_up = zeros(i) if b_up is None else b_up
    b_down = zeros(h) if b_down is None else b_down
    rows, weights = x.reshape(-1, x.shape[-1]).contiguous(), (w_gate.contiguous(), w_up.contiguous(),
                                                               w_down.contiguous())
    act = _GATE_ACTIVATIONS.index(activation)
    if fp8:
        sg, su, sd = (t.to(torch.float32).contiguous() for t in scales.values())
        out = library_op("gated_mlp_fp8")(rows, *weights, sg, su, sd, b_gate, b_up, b_down, activation=act)
    else:
        out = library_op("gated_mlp")(rows, *weights, b_gate, b_up, b_down, activation=act)
    return out.reshape(*x.shape[:-1], h)


def router_topk(x: torch.Tensor, w_router: torch.Tensor, bias: torch.Tensor | None = None, k: int = 2, *,
                sigmoid: bool = False, select_first: bool = False, normalize: bool = False):
    """The MoE router with nikki's router_topk kernel: logits = x @ w_router + bias for x [..., H]
    and w_router [H, E] (torch Linear weight transposed); scores softmax (or sigmoid) of the
    logits, the top-k experts of each token (select_first: top-k of the logits, then the
    activation over the k), optionally renormalized. Returns (weights [..., k] float32,
    expert ids [..., k] int64); differentiable in x, w_router and bias through the weights."""
    what = "nikki.torch.router_topk"
    _tensor(x, f"{what}: x")
    _tensor(w_router, f"{what}: w_router")
    if w_router.dim() != 2:
        raise argument_error(f"{what}: w_router", "a [H, E] tensor", w_router, got=f"shape {tuple(w_router.shape)}")
    bias = _optional_tensor(bias, f"{what}: bias", (w_router.shape[1],), "w_router's columns")
    _one_device(what, (("x", x), ("w_router", w_router), ("bias", bias)))
    k = check_int(k, f"{what}: k", minimum=1)
    flags = {n: check_bool(v, f"{what}: {n}") for n, v in
             (("sigmoid", sigmoid), ("select_first", select_first), ("normalize", normalize))}
    bias = torch.zeros(w_router.shape[1], dtype=x.dtype) if bias is None else bias
    weights, ids = library_op("router_topk")(x.reshape(-1, x.shape[-1]).contiguous(), w_router.contiguous(), bias,
                                             k=k, **flags)
    shape = (*x.shape[:-1], k)
    return weights.reshape(shape), ids.long().reshape(shape)


def cumsum(x: torch.Tensor, dim: int = -1, reverse: bool = False) -> torch.Tensor:
    """``torch.cumsum(x, dim)`` with nikki's cumsum kernel (any rank; fp32 sums); `reverse` sums
    from the end of `dim` (``x.flip(dim).cumsum(dim).flip(dim)``). Differentiable."""
    _tensor(x, "nikki.torch.cumsum: x")
    dim = check_int(dim, "nikki.torch.cumsum: dim", -x.dim(), x.dim() - 1)
    reverse = check_bool(reverse, "nikki.torch.cumsum: reverse")
    if x.numel() == 0:
        return x.clone()
    moved = x.movedim(dim, -1)
    out = library_op("cumsum")(moved.reshape(-1, moved.shape[-1]).contiguous(), reverse=reverse)
    return out.reshape(moved.shape).movedim(-1, dim)


def linear_recurrence(a: torch.Tensor, b: torch.Tensor, h0: torch.Tensor | None = None, dim: int = -1) -> torch.Tensor:
    """The first-order linear recurrence ``h[t] = a[t] * h[t - 1] + b[t]`` along `dim` of a and b
    (any rank, one shape and dtype) with nikki's linear_recurrence kernel, the state kept in fp32.
    `h0` is the state before the first step, a's shape without `dim` (None: zeros). Returns h,
    a's shape. Differentiable in a, b and h0."""
    what = "nikki.torch.linear_recurrence"
    _tensor(a, f"{what}: a")
    _tensor(b, f"{what}: b")
    dim = check_int(dim, f"{what}: dim", -a.dim(), a.dim() - 1)
    if b.shape != a.shape:
        raise argument_error(f"{what}: b", f"a tensor of a's shape {tuple(a.shape)}", b, got=f"shape {tuple(b.shape)}")
    state_shape = tuple(a.movedim(dim, -1).shape[:-1])
    h0 = _optional_tensor(h0, f"{what}: h0", state_shape, f"a's shape without dim {dim}")
    _one_device(what, (("a", a), ("b", b), ("h0", h0)))
    if a.numel() == 0:
        return torch.empty_like(b)
    a_rows, b_rows = (t.movedim(dim, -1) for t in (a, b))
    steps = a_rows.shape[-1]
    h0 = a.new_zeros(state_shape) if h0 is None else h0
    h = library_op("linear_recurrence")(a_rows.reshape(1, -1, steps).contiguous(),
                                        b_rows.reshape(1, -1, steps).contiguous(), h0.reshape(1, -1).contiguous())
    return h.reshape(a_rows.shape).movedim(-1, dim)

def selective_scan(u: torch.Tensor, delta: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
                   D: torch.Tensor | None = None, z: torch.Tensor | None = None,
                   delta_bias: torch.Tensor | None = None, delta_softplus: bool = False,
                   return_last_state: bool = False, initial_state: torch.Tensor | None = None):
    """Mamba's selective scan (``mamba_ssm``'s ``selective_scan_fn``) with nikki's selective_scan
    kernel: u, delta, z [batch, dim, L], A [dim, N], B and C [batch, N, L] (or [batch, 1, N, L], one
    group), D and delta_bias [dim] or None, initial_state [batch, dim, N] or None (zeros).
    Returns y [batch, dim, L] in u's dtype, and the fp32 last state [batch, dim, N] too when
    `return_last_state`. Differentiable in every tensor argument (the selective_scan_bwd kernel)."""
    what = "nikki.torch.selective_scan"
    for name, t in (("u", u), ("delta", delta), ("A", A), ("B", B), ("C", C)):
        _tensor(t, f"{what}: {name}")
    if u.dim() != 3:
        raise argument_error(f"{what}: u", "a [batch, dim, L] tensor", u, got=f"shape {tuple(u.shape)}")
    batch, dim, steps = u.shape
    if A.dim() != 2 or A.shape[0] != dim:
        raise argument_error(f"{what}: A", f"a [dim, N] tensor with dim = {dim}", A, got=f"shape {tuple(A.shape)}")
    states = A.shape[1]
    squeezed = {}
    for name, t in (("B", B), ("C", C)):
        if t.dim() == 4 and t.shape[1] == 1:
            t = t[:, 0]
        if tuple(t.shape) != (batch, states, steps):
            raise argument_error(f"{what}: {name}", f"a [batch, N, L] = {(batch, states, steps)} tensor (one group)",
                                 t, got=f"shape {tuple(t.shape)}")
        squeezed[name] = t
    D = _optional_tensor(D, f"{what}: D", (dim,), "one per channel")
    delta_bias = _optional_tensor(delta_bias, f"{what}: delta_bias", (dim,), "one per channel")
    z = _optional_tensor(z, f"{what}: z", tuple(u.shape), "u's shape")
    initial_state = _optional_tensor(initial_state, f"{what}: initial_state", (batch, dim, states),
                                     "[batch, dim, N]")
    delta_softplus = check_bool(delta_softplus, f"{what}: delta_softplus")
    return_last_state = check_bool(return_last_state, f"{what}: return_last_state")
    _one_device(what, (("u", u), ("delta", delta), ("A", A), ("B", B), ("C", C), ("D", D), ("z", z),
                       ("delta_bias", delta_bias), ("initial_state", initial_state)))
    zeros = A.new_zeros(dim)
    # Without a gate the kernel reads no z: u stands in for it, so nothing is allocated.
    y, last_state = library_op("selective_scan")(
        u.contiguous(), delta.contiguous(), A.contiguous(), squeezed["B"].contiguous(), squeezed["C"].contiguous(),
        zeros if D is None else D.contiguous(), u.contiguous() if z is None else z.contiguous(),
        zeros if delta_bias is None else delta_bias.contiguous(),
        A.new_zeros(batch, dim, states) if initial_state is None else initial_state.contiguous(),
        delta_softplus=delta_softplus, gate=z is not None)
    return (y, last_state) if return_last_state else y

def cross_entropy(logits: torch.Tensor, targets: torch.Tensor, ignore_index: int = -100,
                  label_smoothing: float = 0.0) -> torch.Tensor:
    """``F.cross_entropy(logits, targets, reduction='none', ignore_index=..., label_smoothing=...)``
    with nikki's cross_entropy kernels: logits [..., V] (classes last), integer targets [...]
    (any integer dtype). Returns the per-token loss in float32, of targets' shape; differentiable
    in logits. Reduce it as torch would (``loss.sum() / (targets != ignore_index).sum()`` is
    torch's 'mean')."""
    _tensor(logits, "nikki.torch.cross_entropy: logits")
    if not isinstance(targets, torch.Tensor) or targets.dtype.is_floating_point or targets.dtype.is_complex \
            or targets.dtype == torch.bool:
        raise argument_error("nikki.torch.cross_entropy: targets", "an integer torch.Tensor", targets)
    if tuple(targets.shape) != tuple(logits.shape[:-1]):
        raise argument_error("nikki.torch.cross_entropy: targets", f"a tensor of shape {tuple(logits.shape[:-1])} "
                             "(logits' shape without the class dim)", targets, got=f"shape {tuple(targets.shape)}")
    ignore_index = check_int(ignore_index, "nikki.torch.cross_entropy: ignore_index", -2**31, 2**31 - 1)
    label_smoothing = check_real(label_smoothing, "nikki.torch.cross_entropy: label_smoothing", finite=True)
    _one_device("nikki.torch.cross_entropy", (("logits", logits), ("targets", targets)))
    if targets.numel() == 0:
        return torch.zeros(targets.shape, dtype=torch.float32)
    v = logits.shape[-1]
    loss, _lse = library_op("cross_entropy")(logits.reshape(-1, v).contiguous(),
                                             targets.reshape(-1).to(torch.int32).contiguous(),
                                             ignore_index=ignore_index, label_smoothing=label_smoothing)
    return loss.reshape(targets.shape)


def layer_norm(x: torch.Tensor, normalized_shape, weight: torch.Tensor | None = None,
               bias: torch.Tensor | None = None, eps: float = 1e-5) -> torch.Tensor:
    """``F.layer_norm`` with nikki's layernorm kernel (statistics with bn_stats / bn_aggr)."""
    _tensor(x, "nikki.torch.layer_norm: x")
    shape = check_shape(normalized_shape, "nikki.torch.layer_norm: normalized_shape", max(x.dim(), 1))
    if tuple(x.shape[len(x.shape) - len(shape):]) != shape:
        raise ValueError(f"nikki.torch.layer_norm: normalized_shape {shape} does not match the trailing "
                         f"dimensions of x {tuple(x.shape)}")
    weight = _optional_tensor(weight, "nikki.torch.layer_norm: weight", shape, "normalized_shape")
    bias = _optional_tensor(bias, "nikki.torch.layer_norm: bias", shape, "normalized_shape")
    eps = check_real(eps, "nikki.torch.layer_norm: eps", finite=True)
    _one_device("nikki.torch.layer_norm", (("x", x), ("weight", weight), ("bias", bias)))
    h = math.prod(shape)
    weight = torch.ones(h, dtype=x.dtype) if weight is None else weight.reshape(h)
    bias = torch.zeros(h, dtype=x.dtype) if bias is None else bias.reshape(h)
    out, _mean, _rstd = library_op("layernorm")(x.reshape(-1, h).contiguous(), weight, bias, eps=eps)
    return out.reshape(x.shape)


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None = None, eps: float = 1e-6) -> torch.Tensor:
    """``F.rms_norm(x, (H,), weight, eps)`` over the last dimension with nikki's rmsnorm kernel."""
    _tensor(x, "nikki.torch.rms_norm: x")
    h = x.shape[-1]
    weight = _optional_tensor(weight, "nikki.torch.rms_norm: weight", (h,), "the last dim of x")
    eps = check_real(eps, "nikki.torch.rms_norm: eps", finite=True)
    _one_device("nikki.torch.rms_norm", (("x", x), ("weight", weight)))
    weight = torch.ones(h, dtype=x.dtype) if weight is None else weight
    out, _rstd = library_op("rmsnorm")(x.reshape(-1, h).contiguous(), weight, eps=eps)
    return out.reshape(x.shape)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor | None = None,
                 eps: float = 1e-6) -> tuple:
    """``h = x + residual; (F.rms_norm(h, (H,), weight, eps), h)`` over the last dimension with
    nikki's fused add_rmsnorm kernel: returns (normed, sum), the sum being the next residual.
    Differentiable in x, residual and weight."""
    _tensor(x, "nikki.torch.add_rms_norm: x")
    _tensor(residual, "nikki.torch.add_rms_norm: residual")
    if residual.shape != x.shape or residual.dtype != x.dtype:
        raise argument_error("nikki.torch.add_rms_norm: residual", f"a {x.dtype} tensor of x's shape {tuple(x.shape)}",
                             residual, got=f"{residual.dtype} of shape {tuple(residual.shape)}")
    h = x.shape[-1]
    weight = _optional_tensor(weight, "nikki.torch.add_rms_norm: weight", (h,), "the last dim of x")
    eps = check_real(eps, "nikki.torch.add_rms_norm: eps", finite=True)
    _one_device("nikki.torch.add_rms_norm", (("x", x), ("residual", residual), ("weight", weight)))
    weight = torch.ones(h, dtype=x.dtype) if weight is None else weight
    out, total, _rstd = library_op("add_rmsnorm")(x.reshape(-1, h).contiguous(), residual.reshape(-1, h).contiguous(),
                                                  weight, eps=eps)
    return out.reshape(x.shape), total.reshape(x.shape)


def rms_norm_quant(x: torch.Tensor, weight: torch.Tensor | None = None, eps: float = 1e-6,
                   scale: torch.Tensor | float | None = None) -> tuple:
    """``F.rms_norm(x, (H,), weight, eps)`` quantized to fp8 over the last dimension with nikki's
    rmsnorm_quant kernels: returns (q, scales), q a ``torch.float8_e4m3fn`` tensor of x's shape
    saturated to +-240 (Trainium's e4m3 range, the same bits in both fp8 formats) and scales the
    float32 dequantization scale of each row (x.shape[:-1]), so that ``q.float() * scales[..., None]``
    approximates the normalized x. With `scale` (a number or a one-element tensor) the scale is
    static; without it each row gets amax / 240. Inference only: not differentiable."""
    _tensor(x, "nikki.torch.rms_norm_quant: x")
    h = x.shape[-1]
    weight = _optional_tensor(weight, "nikki.torch.rms_norm_quant: weight", (h,), "the last dim of x")
    eps = check_real(eps, "nikki.torch.rms_norm_quant: eps", finite=True)
    if scale is not None and not isinstance(scale, torch.Tensor):
        scale = torch.tensor([check_real(scale, "nikki.torch.rms_norm_quant: scale", finite=True)], dtype=torch.float32)
    if scale is not None and scale.numel() != 1:
        raise argument_error("nikki.torch.rms_norm_quant: scale", "None, a number or a one-element tensor", scale,
                             got=f"a tensor of shape {tuple(scale.shape)}")
    _one_device("nikki.torch.rms_norm_quant", (("x", x), ("weight", weight), ("scale", scale)))
    weight = torch.ones(h, dtype=x.dtype) if weight is None else weight
    rows = x.reshape(-1, h).contiguous()
    if scale is None:
        q, scales = library_op("rmsnorm_quant_dynamic")(rows, weight, eps=eps)
    else:
        q, scales = library_op("rmsnorm_quant")(rows, weight, scale.reshape(1).to(torch.float32), eps=eps)
    return q.reshape(x.shape), scales.reshape(x.shape[:-1])


def fp8_matmul(a: torch.Tensor, b: torch.Tensor, a_scale: torch.Tensor, b_scale: torch.Tensor,
               bias: torch.Tensor | None = None, out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """``(a.float() @ b.float()) * a_scale[..., None] * b_scale + bias`` with nikki's fp8_matmul
    kernel: a [..., M, K] and b [K, N] ``torch.float8_e4m3fn`` (within +-240, as
    :func:`rms_norm_quant` gives them) or both ``float8_e5m2``; a_scale of a's leading shape
    [..., M] and b_scale [N] float32 dequantization scales; bias [N] or None; the result in
    `out_dtype` (bfloat16 or float32). Inference only: not differentiable."""
    what = "nikki.torch.fp8_matmul"
    _tensor(a, f"{what}: a", 2)
    _tensor(b, f"{what}: b", 2)
    k, n = a.shape[-1], b.shape[-1]
    if b.dim() != 2 or b.shape[0] != k:
        raise argument_error(f"{what}: b", f"a 2-D tensor [K, N] with K = {k} (the last dim of a)", b,
                             got=f"a tensor of shape {tuple(b.shape)}")
    _tensor(a_scale, f"{what}: a_scale")
    if tuple(a_scale.shape) != tuple(a.shape[:-1]):
        raise argument_error(f"{what}: a_scale", f"a tensor of shape {tuple(a.shape[:-1])} (a's rows)", a_scale,
                             got=f"a tensor of shape {tuple(a_scale.shape)}")
    b_scale = _optional_tensor(b_scale, f"{what}: b_scale", (n,), "the last dim of b")
    bias = _optional_tensor(bias, f"{what}: bias", (n,), "the last dim of b")
    if out_dtype not in (torch.bfloat16, torch.float32):
        raise argument_error(f"{what}: out_dtype", "torch.bfloat16 or torch.float32", out_dtype)
    _one_device(what, (("a", a), ("b", b), ("a_scale", a_scale), ("b_scale", b_scale), ("bias", bias)))
    bias = torch.zeros(n, dtype=torch.float32) if bias is None else bias
    out = library_op("fp8_matmul")(a.reshape(-1, k).contiguous(), a_scale.reshape(-1).contiguous(), b.contiguous(),
                                   b_scale, bias, fp32_out=out_dtype == torch.float32)
    return out.reshape(*a.shape[:-1], n)


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                    scale: float | None = None, window: int = 0, sinks: torch.Tensor | None = None,
                    softcap: float = 0.0, prefix_len: int = 0) -> torch.Tensor:
    """``F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale, enable_gqa=True)``
    with nikki's flash attention kernels: q [B, H, S, D], k and v [B, H_kv, S_kv, D] with H_kv
    dividing H (grouped-query attention). `window` > 0 is a sliding window (causal implied): key
    j is visible from query i when i + prefix_len - window < j <= i + prefix_len.

    `sinks`: optional float32 [H] attention sink logits (GPT-OSS): each joins its head's softmax
    denominator but weighs no value (None: no sinks). `softcap` > 0 soft-caps the scaled scores to
    ``softcap * tanh(s / softcap)`` (Gemma 2). `prefix_len`: the first prefix_len rows of k and v
    are a cached prefix before the S active keys (prefix caching), so query i sits at key position
    i + prefix_len; it needs causal or a window. Differentiable in q, k, v and sinks."""
    what = "nikki.torch.flash_attention"
    for name, t in (("q", q), ("k", k), ("v", v)):
        _tensor(t, f"{what}: {name}")
    causal = check_bool(causal, f"{what}: causal")
    if scale is not None:
        scale = check_real(scale, f"{what}: scale", finite=True)
    window = check_int(window, f"{what}: window", minimum=0)
    softcap = check_real(softcap, f"{what}: softcap", finite=True)
    prefix_len = check_int(prefix_len, f"{what}: prefix_len", minimum=0)
    if sinks is not None:
        _tensor(sinks, f"{what}: sinks")
    _one_device(what, (("q", q), ("k", k), ("v", v), ("sinks", sinks)))
    if sinks is None:
        sinks = torch.full((q.shape[1] if q.dim() == 4 else 1,), -math.inf, dtype=torch.float32, device=q.device)
    out, _lse = library_op("flash_attention")(q.contiguous(), k.contiguous(), v.contiguous(), sinks.contiguous(),
                                              causal=causal, scale=scale, window=window, softcap=softcap,
                                              prefix_len=prefix_len)
    return out


def apply_rotary_pos_emb(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                         unsqueeze_dim: int = 1, interleaved: bool = False):
    """Hugging Face's ``apply_rotary_pos_emb(q, k, cos, sin)`` with nikki's rope kernel: q
    [B, H, S, D], k [B, H_kv, S, D], cos and sin [B, S, r] or [S, r] as the rotary embedding
    returns them (r <= D: partial rotary rotates the first r dims). `interleaved` rotates pairs
    (2i, 2i + 1) instead of the two halves. Returns (q_embed, k_embed); differentiable in q and k."""
    for name, t in (("q", q), ("k", k), ("cos", cos), ("sin", sin)):
        _tensor(t, f"nikki.torch.apply_rotary_pos_emb: {name}")
    if unsqueeze_dim != 1:
        raise ValueError("nikki.torch.apply_rotary_pos_emb: only unsqueeze_dim=1 (q and k as [B, H, S, D]) is "
                         f"supported, got {unsqueeze_dim!r}; transpose q and k to [B, H, S, D]")
    interleaved = check_bool(interleaved, "nikki.torch.apply_rotary_pos_emb: interleaved")
    _one_device("nikki.torch.apply_rotary_pos_emb", (("q", q), ("k", k), ("cos", cos), ("sin", sin)))
    op = library_op("rope")
    cos, sin = cos.contiguous(), sin.contiguous()
    return (op(q.contiguous(), cos, sin, interleaved=interleaved),
            op(k.contiguous(), cos, sin, interleaved=interleaved))


def output_projection(attn: torch.Tensor, w_o: torch.Tensor, bias: torch.Tensor | None = None,
                      residual: torch.Tensor | None = None) -> torch.Tensor:
    """``attn @ w_o + bias + residual`` with nikki's output_projection kernel: attn [B, S, K]
    (the heads concatenated), w_o [K, N] (``o_proj.weight.T``), bias [N], residual [B, S, N];
    bias and residual are optional (zeros are passed for them). Differentiable in every tensor."""
    for name, t in (("attn", attn), ("w_o", w_o)):
        _tensor(t, f"nikki.torch.output_projection: {name}")
    if attn.dim() != 3 or w_o.dim() != 2:
        raise ValueError(f"nikki.torch.output_projection takes attn [B, S, K] and w_o [K, N], got "
                         f"{tuple(attn.shape)} and {tuple(w_o.shape)}")
    n = w_o.shape[1]
    bias = _optional_tensor(bias, "nikki.torch.output_projection: bias", (n,), "w_o's last dim")
    residual = _optional_tensor(residual, "nikki.torch.output_projection: residual", (*attn.shape[:2], n),
                                "[B, S, N]")
    _one_device("nikki.torch.output_projection", (("attn", attn), ("w_o", w_o), ("bias", bias), ("residual", residual)))
    bias = torch.zeros(n, dtype=attn.dtype) if bias is None else bias
    residual = attn.new_zeros(*attn.shape[:2], n) if residual is None else residual
    return library_op("output_projection")(attn.contiguous(), w_o.contiguous(), bias.contiguous(),
                                           residual.contiguous())


_QKV_NORMS = {None: 0, "rms": 1, "layer": 2}


def qkv_projection(x: torch.Tensor, w_qkv: torch.Tensor, q_heads: int, kv_heads: int,
                   bias: torch.Tensor | None = None, *, norm: str | None = None,
                   norm_weight: torch.Tensor | None = None, norm_bias: torch.Tensor | None = None,
                   eps: float = 1e-6, cos: torch.Tensor | None = None, sin: torch.Tensor | None = None,
                   interleaved: bool = False, residual: torch.Tensor | None = None) -> tuple:
    """An attention block's q/k/v projection in one kernel (nikki's qkv / add_qkv): with
    `residual`, ``x = x + residual`` first; then ``norm(x) @ w_qkv + bias`` split into q
    [B, q_heads, S, D], k and v [B, kv_heads, S, D] (flash_attention's layout), q and k rotated
    like Hugging Face's ``apply_rotary_pos_emb`` when cos and sin are given.

    x [B, S, H]; w_qkv [H, (q_heads + 2 kv_heads) * D], the q, k and v Linear weights transposed
    side by side (``torch.cat([q_proj.weight, k_proj.weight, v_proj.weight]).T``); bias [I] or
    None. `norm`: None, "rms" (``F.rms_norm`` with norm_weight) or "layer" (``F.layer_norm`` with
    norm_weight and norm_bias); weights left None are ones and zeros. cos and sin: [S, r] shared by
    the batch or [B, S, r] per sequence (decode: each sequence's own positions), r <= D even
    (partial rotary rotates the first r dims); `interleaved` rotates pairs (2i, 2i + 1).

    Returns (q, k, v), or (q, k, v, sum) with `residual` (sum is the next residual stream).
    Differentiable in x, residual, w_qkv, bias, norm_weight and norm_bias."""
    what = "nikki.torch.qkv_projection"
    _tensor(x, f"{what}: x")
    _tensor(w_qkv, f"{what}: w_qkv")
    if x.dim() != 3:
        raise argument_error(f"{what}: x", "a [B, S, H] tensor", x, got=f"shape {tuple(x.shape)}")
    q_heads = check_int(q_heads, f"{what}: q_heads", minimum=1)
    kv_heads = check_int(kv_heads, f"{what}: kv_heads", minimum=1)
    if norm not in _QKV_NORMS:
        raise argument_error(f"{what}: norm", 'None, "rms" or "layer"', norm)
    h = x.shape[-1]
    if w_qkv.dim() != 2 or w_qkv.shape[0] != h or w_qkv.shape[1] % (q_heads + 2 * kv_heads) != 0:
        raise argument_error(f"{what}: w_qkv", f"a [H, (q_heads + 2 kv_heads) * D] tensor with H = {h} and "
                             f"q_heads + 2 kv_heads = {q_heads + 2 * kv_heads}", w_qkv,
                             got=f"shape {tuple(w_qkv.shape)}")
    width = w_qkv.shape[1]
    bias = _optional_tensor(bias, f"{what}: bias", (width,), "w_qkv's last dim")
    norm_weight = _optional_tensor(norm_weight, f"{what}: norm_weight", (h,), "the last dim of x")
    norm_bias = _optional_tensor(norm_bias, f"{what}: norm_bias", (h,), "the last dim of x")
    if norm is None and (norm_weight is not None or norm_bias is not None):
        raise argument_error(f"{what}: norm", '"rms" or "layer" when norm_weight or norm_bias is given', norm,
                             hint="pass norm= the norm those weights belong to")
    if norm == "rms" and norm_bias is not None:
        raise argument_error(f"{what}: norm_bias", 'None with norm="rms"', norm_bias, got="a tensor",
                             hint='RMSNorm has no bias; use norm="layer"')
    if (cos is None) != (sin is None):
        missing, given = ("sin", "cos") if sin is None else ("cos", "sin")
        raise argument_error(f"{what}: {missing}", f"a tensor when {given} is given (rope takes both)", None,
                             hint="pass both tables, or neither for no rope")
    b, s = x.shape[:2]
    for name, t in (("cos", cos), ("sin", sin)):
        if t is not None:
            _tensor(t, f"{what}: {name}")
            if not (t.dim() in (2, 3) and t.shape[-2] == s and (t.dim() == 2 or t.shape[0] in (1, b))):
                raise argument_error(f"{what}: {name}", f"a [S, r] or [B, S, r] tensor with B, S = {b}, {s} (x's)",
                                     t, got=f"shape {tuple(t.shape)}", hint="slice the tables to the positions of x")
    eps = check_real(eps, f"{what}: eps", finite=True)
    interleaved = check_bool(interleaved, f"{what}: interleaved")
    if residual is not None:
        _tensor(residual, f"{what}: residual")
        if residual.shape != x.shape or residual.dtype != x.dtype:
            raise argument_error(f"{what}: residual", f"a {x.dtype} tensor of x's shape {tuple(x.shape)}", residual,
                                 got=f"{residual.dtype} of shape {tuple(residual.shape)}")
    _one_device(what, (("x", x), ("w_qkv", w_qkv), ("bias", bias), ("norm_weight", norm_weight),
                       ("norm_bias", norm_bias), ("cos", cos), ("sin", sin), ("residual", residual)))
    bias = x.new_zeros(width) if bias is None else bias
    gamma = x.new_ones(h) if norm_weight is None else norm_weight
    beta = x.new_zeros(h) if norm_bias is None else norm_bias
    rope = cos is not None and sin is not None
    if cos is None or sin is None:  # placeholders the kernel does not read
        cos = sin = x.new_zeros(1, 2, dtype=torch.float32)
    options = dict(q_heads=q_heads, kv_heads=kv_heads, norm=_QKV_NORMS[norm], eps=eps, rope=rope,
                   interleaved=interleaved)
    tensors = (w_qkv.contiguous(), bias.contiguous(), gamma.contiguous(), beta.contiguous(), cos.contiguous(),
               sin.contiguous())
    if residual is None:
        q, k, v, _mean, _rstd = library_op("qkv")(x.contiguous(), *tensors, **options)
        return q, k, v
    q, k, v, total, _mean, _rstd = library_op("add_qkv")(x.contiguous(), residual.contiguous(), *tensors, **options)
    return q, k, v, total


def causal_conv1d(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                  initial_state: torch.Tensor | None = None, activation: str | None = None) -> torch.Tensor:
    """The depthwise causal conv1d of Mamba and Hyena blocks with nikki's causal_conv1d kernel:
    x [B, C, L], weight [C, K] or torch's depthwise conv1d weight [C, 1, K], bias [C] or None,
    initial_state [B, C, S] (the tokens before x, for chunked prefill; the last K - 1 are used)
    or None for zero padding; `activation` None or "silu" ("swish"). Equals
    ``F.conv1d(F.pad(x, (K - 1, 0)), weight, bias, groups=C)`` (then SiLU) when no state is
    given. Differentiable in x, weight, bias and initial_state."""
    what = "nikki.torch.causal_conv1d"
    _tensor(x, f"{what}: x")
    _tensor(weight, f"{what}: weight")
    if x.dim() != 3:
        raise argument_error(f"{what}: x", "a [B, C, L] tensor", x, got=f"shape {tuple(x.shape)}")
    if weight.dim() == 3 and weight.shape[1] == 1:
        weight = weight[:, 0]
    if weight.dim() != 2 or weight.shape[0] != x.shape[1]:
        raise argument_error(f"{what}: weight", f"a [C, K] or [C, 1, K] tensor with C = {x.shape[1]}", weight,
                             got=f"shape {tuple(weight.shape)}")
    if activation not in (None, "silu", "swish"):
        raise argument_error(f"{what}: activation", 'None, "silu" or "swish"', activation)
    bias = _optional_tensor(bias, f"{what}: bias", (x.shape[1],), "x's channels")
    if initial_state is not None:
        _tensor(initial_state, f"{what}: initial_state")
        if initial_state.dim() != 3 or tuple(initial_state.shape[:2]) != tuple(x.shape[:2]):
            raise argument_error(f"{what}: initial_state", f"None or a [B, C, S] tensor with B, C = "
                                 f"{tuple(x.shape[:2])}", initial_state, got=f"shape {tuple(initial_state.shape)}")
    _one_device(what, (("x", x), ("weight", weight), ("bias", bias), ("initial_state", initial_state)))
    bias = x.new_zeros(x.shape[1]) if bias is None else bias
    # No state is a state of zeros: one token of it stands for the zero padding.
    if initial_state is None or initial_state.shape[2] == 0:
        initial_state = x.new_zeros(x.shape[0], x.shape[1], 1)
    return library_op("causal_conv1d")(x.contiguous(), weight.contiguous(), bias.contiguous(),
                                       initial_state.contiguous(), silu=activation is not None)


def conv1d(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, stride: int = 1,
           padding: int = 0, dilation: int = 1, groups: int = 1, activation: str | None = None) -> torch.Tensor:
    """``F.conv1d(x, weight, bias, stride, padding, dilation, groups)`` with nikki's conv1d kernel,
    then `activation` (None, "silu" or "gelu", the erf form): x [B, C_in, L], weight
    [C_out, C_in / groups, K]. Differentiable in x, weight and bias (the conv1d_bwd kernel)."""
    what = "nikki.torch.conv1d"
    _tensor(x, f"{what}: x")
    _tensor(weight, f"{what}: weight")
    acts = {None: 0, "silu": 1, "gelu": 2}
    if activation not in acts:
        raise argument_error(f"{what}: activation", 'None, "silu" or "gelu"', activation)
    if weight.dim() != 3:
        raise argument_error(f"{what}: weight", "a [C_out, C_in / groups, K] tensor", weight,
                             got=f"shape {tuple(weight.shape)}")
    bias = _optional_tensor(bias, f"{what}: bias", (weight.shape[0],), "weight's output channels")
    geometry = {n: check_int(v, f"{what}: {n}") for n, v in
                (("stride", stride), ("padding", padding), ("dilation", dilation), ("groups", groups))}
    _one_device(what, (("x", x), ("weight", weight), ("bias", bias)))
    bias = x.new_zeros(weight.shape[0]) if bias is None else bias
    return library_op("conv1d")(x.contiguous(), weight.contiguous(), bias.contiguous(), **geometry,
                                activation=acts[activation])
def embedding(input: torch.Tensor, weight: torch.Tensor, padding_idx: int | None = None) -> torch.Tensor:
    """``F.embedding(input, weight, padding_idx)`` with nikki's embedding kernels: integer ids of
    any shape, weight [V, H]. Returns [*input.shape, H] in weight's dtype; differentiable in
    weight (occurrences of padding_idx contribute no gradient). An id outside [0, V) stops the
    kernel with a KernelError ("runtime offset out of bounds") where torch raises IndexError."""
    _tensor(weight, "nikki.torch.embedding: weight", min_dim=2)
    if weight.dim() != 2:
        raise argument_error("nikki.torch.embedding: weight", "a 2-D tensor [num_embeddings, embedding_dim]", weight,
                             got=f"a {weight.dim()}-d tensor")
    if not isinstance(input, torch.Tensor) or input.dtype.is_floating_point or input.dtype.is_complex \
            or input.dtype == torch.bool:
        raise argument_error("nikki.torch.embedding: input", "an integer torch.Tensor of ids", input)
    if padding_idx is not None:
        padding_idx = check_int(padding_idx, "nikki.torch.embedding: padding_idx", -weight.shape[0], weight.shape[0] - 1)
    _one_device("nikki.torch.embedding", (("input", input), ("weight", weight)))
    if input.numel() == 0:
        return weight.new_zeros((*input.shape, weight.shape[1]))
    out = library_op("embedding")(weight.contiguous(), input.reshape(-1).to(torch.int32).contiguous(),
                                  padding_idx=None if padding_idx is None else float(padding_idx))
    return out.reshape(*input.shape, weight.shape[1])


def _indices(idx, what: str) -> torch.Tensor:
    """`idx` if it is an integer torch tensor; else a KernelError naming the argument."""
    if not isinstance(idx, torch.Tensor) or idx.dtype.is_floating_point or idx.dtype.is_complex \
            or idx.dtype == torch.bool:
        raise argument_error(what, "an integer torch.Tensor of row indices", idx)
    return idx


def gather_rows(x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """``x[idx]`` with nikki's gather_rows kernel, where an index outside [0, x.shape[0]) (a
    routing buffer's padding, e.g. -1) gives a zero row: x [T, H], integer idx of any shape.
    Returns [*idx.shape, H]; differentiable in x."""
    _tensor(x, "nikki.torch.gather_rows: x", min_dim=2)
    _indices(idx, "nikki.torch.gather_rows: idx")
    _one_device("nikki.torch.gather_rows", (("x", x), ("idx", idx)))
    if idx.numel() == 0:
        return x.new_zeros((*idx.shape, x.shape[-1]))
    out = library_op("gather_rows")(x.contiguous(), idx.reshape(-1).to(torch.int32).contiguous())
    return out.reshape(*idx.shape, x.shape[-1])


def scatter_add_rows(rows: torch.Tensor, idx: torch.Tensor, num_rows: int,
                     scale: torch.Tensor | None = None) -> torch.Tensor:
    """``zeros(num_rows, H).index_add_(0, idx, scale[:, None] * rows)`` with nikki's
    scatter_add_rows kernel, where indices outside [0, num_rows) (padding) are dropped: rows
    [N, H], integer idx [N], scale [N] (None: ones). Returns [num_rows, H] in rows' dtype;
    differentiable in rows and scale."""
    _tensor(rows, "nikki.torch.scatter_add_rows: rows", min_dim=2)
    _indices(idx, "nikki.torch.scatter_add_rows: idx")
    num_rows = check_int(num_rows, "nikki.torch.scatter_add_rows: num_rows", 1)
    scale = _optional_tensor(scale, "nikki.torch.scatter_add_rows: scale", (rows.shape[0],), "one per row")
    if scale is None:
        scale = torch.ones(rows.shape[0], dtype=torch.float32, device=rows.device)
    _one_device("nikki.torch.scatter_add_rows", (("rows", rows), ("idx", idx), ("scale", scale)))
    return library_op("scatter_add_rows")(rows.contiguous(), idx.reshape(-1).to(torch.int32).contiguous(),
                                          scale.to(torch.float32).contiguous(), num_rows=num_rows)
def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor,
                     v: torch.Tensor, lengths: torch.Tensor, sinks: torch.Tensor | None = None, *,
                     scale: float | None = None, window: int = 0) -> torch.Tensor:
    """One decode step with nikki's decode_attention kernel: the new tokens' k and v
    ([B, Hkv, T, D]) are written into k_cache and v_cache ([B, Hkv, S, D]) in place at positions
    lengths[b] .. lengths[b] + T - 1, and the attention of q ([B, H, T, D]) over positions up to
    each token's own is returned. `lengths`: int32 [B]; `sinks`: optional float32 [H] attention
    sink logits (GPT-OSS); `window`: a sliding window (0 for none)."""
    if sinks is None:
        sinks = torch.full((q.shape[1],), -math.inf, dtype=torch.float32, device=q.device)
    return library_op("decode_attention")(q, k_cache, v_cache, k, v, lengths, sinks, scale, window)


def paged_decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor,
                           v: torch.Tensor, block_table: torch.Tensor, lengths: torch.Tensor,
                           sinks: torch.Tensor | None = None, *, scale: float | None = None,
                           window: int = 0) -> torch.Tensor:
    """One decode step over a paged KV cache with nikki's paged_decode_attention kernel (vLLM's
    layout): position j of sequence b is row j % block_size of block block_table[b, j // block_size]
    of k_cache and v_cache ([num_blocks, Hkv, block_size, D]). The new tokens' k and v
    ([B, Hkv, T, D]) are written into their blocks in place at positions lengths[b] ..
    lengths[b] + T - 1, and the attention of q ([B, H, T, D]) over positions up to each token's own
    is returned. `block_table`: int32 [B, max_blocks], every entry a block of the cache;
    `lengths`: int32 [B]; `sinks`: optional float32 [H] attention sink logits; `window`: a sliding
    window (0 for none)."""
    if sinks is None:
        sinks = torch.full((q.shape[1],), -math.inf, dtype=torch.float32, device=q.device)
    return library_op("paged_decode_attention")(q, k_cache, v_cache, k, v, block_table, lengths, sinks, scale, window)


@torch.no_grad()
def adamw_(param: torch.Tensor, grad: torch.Tensor, exp_avg: torch.Tensor, exp_avg_sq: torch.Tensor, step: int, *,
           lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8, weight_decay: float = 1e-2) -> None:
    """One AdamW step in place (``torch.optim.AdamW``'s update) with nikki's adamw kernel: param,
    exp_avg and exp_avg_sq are float32 tensors of any shape, grad float32 or bfloat16 of the same
    shape; `step` counts from 1."""
    tensors = (("param", param), ("grad", grad), ("exp_avg", exp_avg), ("exp_avg_sq", exp_avg_sq))
    for name, t in tensors:
        _tensor(t, f"nikki.torch.adamw_: {name}", min_dim=0)  # a scalar parameter is one element
        if name != "grad" and any(stride == 0 and n > 1 for stride, n in zip(t.stride(), t.shape)):
            raise argument_error(f"nikki.torch.adamw_: {name}", "a tensor that can be written in place", t,
                                 got="a view repeating its elements (stride 0)", hint="pass a materialized copy")
    _one_device("nikki.torch.adamw_", tensors)
    try:
        beta1, beta2 = betas
    except (TypeError, ValueError):
        raise argument_error("nikki.torch.adamw_: betas", "a pair of numbers", betas) from None
    hyper = {"lr": lr, "beta1": beta1, "beta2": beta2, "eps": eps, "weight_decay": weight_decay}
    hyper = {name: check_real(value, f"nikki.torch.adamw_: {name}", finite=True) for name, value in hyper.items()}
    step = check_int(step, "nikki.torch.adamw_: step", minimum=1)
    shapes = {tuple(t.shape) for t in (param, grad, exp_avg, exp_avg_sq)}
    if len(shapes) != 1:
        raise ValueError(f"nikki.torch.adamw_: param, grad, exp_avg and exp_avg_sq must have one shape, got "
                         f"{[tuple(t.shape) for t in (param, grad, exp_avg, exp_avg_sq)]}")
    if param.numel() == 0:
        return  # nothing to update, as for torch.optim.AdamW
    flat = [t.detach().reshape(-1).contiguous() for t in (param, grad, exp_avg, exp_avg_sq)]
    new = library_op("adamw")(*flat, **hyper, step=step)
    for target, value in zip((param, exp_avg, exp_avg_sq), new):
        target.copy_(value.reshape(target.shape))


# Every library kernel is an op as soon as nikki.torch is imported (torch.ops.nikki.<name>).
for _name in sorted(_library.library_kernels()):
    library_op(_name)


def _pool_pair(value, what: str, minimum: int) -> tuple:
    """An int or a pair of ints (torch's pooling arguments) as (height, width)."""
    if isinstance(value, (tuple, list)):
        if len(value) == 1:
            value = (value[0], value[0])
        if len(value) != 2:
            raise argument_error(what, "an int or a pair of ints", value)
        return tuple(check_int(v, what, minimum) for v in value)
    v = check_int(value, what, minimum)
    return (v, v)


def _pool_call(name: str, what: str, input, kernel_size, stride, padding, **options) -> torch.Tensor:
    """Runs the pooling kernel `name` on a [N, C, H, W] or [C, H, W] tensor with torch's int-or-pair
    window arguments (stride None or empty: the kernel size)."""
    _tensor(input, f"{what}: input", min_dim=3)
    if input.dim() not in (3, 4):
        raise argument_error(f"{what}: input", "a 3-D [C, H, W] or 4-D [N, C, H, W] tensor", input,
                             got=f"a {input.dim()}-d tensor")
    kh, kw = _pool_pair(kernel_size, f"{what}: kernel_size", 1)
    sh, sw = (kh, kw) if stride is None or (isinstance(stride, (tuple, list)) and len(stride) == 0) \
        else _pool_pair(stride, f"{what}: stride", 1)
    ph, pw = _pool_pair(padding, f"{what}: padding", 0)
    x = input.unsqueeze(0) if input.dim() == 3 else input
    out = library_op(name)(x.contiguous(), kernel_h=kh, kernel_w=kw, stride_h=sh, stride_w=sw, padding_h=ph,
                           padding_w=pw, **options)
    return out.squeeze(0) if input.dim() == 3 else out


def _pool_unsupported(what: str, argument: str, value, supported, hint: str):
    if value != supported:
        raise argument_error(f"{what}: {argument}", repr(supported), value, hint=hint,
                             limit=f"nikki's pooling kernels support only {argument}={supported!r}")


def max_pool2d(input: torch.Tensor, kernel_size, stride=None, padding=0, dilation=1, ceil_mode: bool = False,
               return_indices: bool = False) -> torch.Tensor:
    """``F.max_pool2d(input, kernel_size, stride, padding)`` with nikki's max_pool2d kernels:
    input [N, C, H, W] or [C, H, W]; kernel_size, stride (None: the kernel size) and padding an int
    or a pair. Differentiable: each window's gradient goes to its first maximum, as in torch.
    Only dilation 1, ceil_mode False and return_indices False (KernelError otherwise)."""
    what = "nikki.torch.max_pool2d"
    if _pool_pair(dilation, f"{what}: dilation", 1) != (1, 1):
        _pool_unsupported(what, "dilation", dilation, 1, "dilate the window with torch.nn.functional.max_pool2d")
    _pool_unsupported(what, "ceil_mode", bool(ceil_mode), False, "pad the input on the bottom and right instead")
    _pool_unsupported(what, "return_indices", bool(return_indices), False,
                      "use torch.nn.functional.max_pool2d for the indices")
    return _pool_call("max_pool2d", what, input, kernel_size, stride, padding)


def avg_pool2d(input: torch.Tensor, kernel_size, stride=None, padding=0, ceil_mode: bool = False,
               count_include_pad: bool = True, divisor_override=None) -> torch.Tensor:
    """``F.avg_pool2d(input, kernel_size, stride, padding, count_include_pad=...)`` with nikki's
    avg_pool2d kernels: input [N, C, H, W] or [C, H, W]; kernel_size, stride (None: the kernel
    size) and padding an int or a pair. Differentiable. Only ceil_mode False and no
    divisor_override (KernelError otherwise)."""
    what = "nikki.torch.avg_pool2d"
    _pool_unsupported(what, "ceil_mode", bool(ceil_mode), False, "pad the input on the bottom and right instead")
    _pool_unsupported(what, "divisor_override", divisor_override, None,
                      "scale the result: avg_pool2d(x, ...) * kernel area / divisor")
    return _pool_call("avg_pool2d", what, input, kernel_size, stride, padding,
                      count_include_pad=check_bool(count_include_pad, f"{what}: count_include_pad"))


# --- mixture of experts ---------------------------------------------------------------------------

def find_nonzero_indices(x: torch.Tensor, chunk_size: int = 0):
    """The rows of the nonzero entries of each column of x [T, C] with nikki's find_nonzero_indices
    kernel (nki-library's): returns (indices [C, T] int32, the rows t with x[t, c] != 0 in
    increasing order, then -1; nonzero_counts [C] int32). x: float, int32 or bool (a routing
    mask). `chunk_size`: rows compacted at a time, a multiple of 128 (0: the kernel chooses).
    Not differentiable."""
    what = "nikki.torch.find_nonzero_indices"
    if isinstance(x, torch.Tensor) and x.dtype in (torch.bool, torch.int8, torch.uint8, torch.int16, torch.int64):
        x = x.to(torch.int32)
    _tensor(x, f"{what}: x", min_dim=2)
    if x.dim() != 2:
        raise argument_error(f"{what}: x", "a 2-D tensor [T, C]", x, got=f"a {x.dim()}-d tensor")
    chunk_size = check_int(chunk_size, f"{what}: chunk_size", 0)
    return library_op("find_nonzero_indices")(x.contiguous(), chunk_size=chunk_size)


def _routed_experts_call(kernel: str, x, expert_ids, weights, w_gate, w_up, w_down, activation: str, *scales,
                         **params):
    """Checks a mixture-of-experts kernel's operands, flattens the tokens and calls the kernel."""
    what = f"nikki.torch.{kernel}"
    if isinstance(expert_ids, torch.Tensor) and expert_ids.is_floating_point():
        raise argument_error(f"{what}: expert_ids", "an integer tensor", expert_ids, got=str(expert_ids.dtype))
    if isinstance(expert_ids, torch.Tensor):
        expert_ids = expert_ids.to(torch.int32)
    for name, t in (("x", x), ("expert_ids", expert_ids), ("weights", weights), ("w_gate", w_gate), ("w_up", w_up),
                    ("w_down", w_down)):
        _tensor(t, f"{what}: {name}")
    if activation not in _GATE_ACTIVATIONS:
        raise argument_error(f"{what}: activation", f"one of {', '.join(map(repr, _GATE_ACTIVATIONS))}", activation)
    if tuple(weights.shape) != tuple(expert_ids.shape) or tuple(expert_ids.shape[:-1]) != tuple(x.shape[:-1]):
        raise argument_error(f"{what}: weights", "the shape of expert_ids, x's leading dims by k",
                             weights, got=f"weights {tuple(weights.shape)}, expert_ids {tuple(expert_ids.shape)}")
    params = {name: check_int(value, f"{what}: {name}", 0) for name, value in params.items()}
    _one_device(what, (("x", x), ("expert_ids", expert_ids), ("weights", weights), ("w_gate", w_gate),
                       ("w_up", w_up), ("w_down", w_down)))
    k = expert_ids.shape[-1]
    out = library_op(kernel)(x.reshape(-1, x.shape[-1]).contiguous(), expert_ids.reshape(-1, k).contiguous(),
                             weights.reshape(-1, k).to(torch.float32).contiguous(), w_gate.contiguous(),
                             w_up.contiguous(), w_down.contiguous(), *scales,
                             activation=_GATE_ACTIVATIONS.index(activation), **params)
    return out.reshape(x.shape)


def moe_prefill(x: torch.Tensor, expert_ids: torch.Tensor, weights: torch.Tensor, w_gate: torch.Tensor,
                w_up: torch.Tensor, w_down: torch.Tensor, activation: str = "silu", block_size: int = 0):
    """The experts of a mixture-of-experts layer with nikki's moe_prefill kernel (dropless,
    blockwise; the routing metadata is built on the device): for x [..., H], the routing of
    router_topk (expert_ids [..., k] integers, weights [..., k]) and stacked expert weights
    w_gate, w_up [E, H, I], w_down [E, I, H], returns [..., H] = the sum over the slots j of
    weights[..., j] * expert_{expert_ids[..., j]}(x). activation "silu", "gelu" or "gelu_tanh";
    block_size 128, 256 or 512 tokens (0: the kernel chooses). Forward only (no gradient)."""
    return _routed_experts_call("moe_prefill", x, expert_ids, weights, w_gate, w_up, w_down, activation,
                                block_size=block_size)


def moe_decode(x: torch.Tensor, expert_ids: torch.Tensor, weights: torch.Tensor, w_gate: torch.Tensor,
               w_up: torch.Tensor, w_down: torch.Tensor, activation: str = "silu", experts: str = "auto", *,
               gate_scale: torch.Tensor | None = None, up_scale: torch.Tensor | None = None,
               down_scale: torch.Tensor | None = None):
    """The experts of a mixture-of-experts layer at decode with nikki's moe_decode kernel: the
    result of moe_prefill for at most 128 tokens (a decode step's few), scheduled for reading the
    weights. experts "selective" reads only the experts the slots name (T k passes over one
    expert each), "all" reads each expert once (E passes over every token), "auto" picks the
    one that reads fewer bytes. Forward only (inference).

    fp8 expert weights (``torch.float8_e4m3fn`` within +-240, or ``float8_e5m2``) run the
    moe_decode_fp8 kernel and need their float32 per-column scales: gate_scale and up_scale
    [E, I], down_scale [E, H] (``w[e] = w_fp8[e] * scale[e]``); x is then bfloat16 or float16."""
    what = "nikki.torch.moe_decode"
    schedules = ("auto", "selective", "all")
    if experts not in schedules:
        raise argument_error(f"{what}: experts", f"one of {', '.join(map(repr, schedules))}", experts)
    scales = {"gate_scale": gate_scale, "up_scale": up_scale, "down_scale": down_scale}
    fp8 = isinstance(w_gate, torch.Tensor) and w_gate.dtype in (torch.float8_e4m3fn, torch.float8_e5m2)
    for name, scale in scales.items():
        if fp8 and scale is None:
            raise argument_error(f"{what}: {name}", "the float32 dequantization scales of fp8 weights' columns", scale)
        if not fp8 and scale is not None:
            raise argument_error(f"{what}: {name}", "None: the weights are not fp8", scale, got="a tensor")
        if scale is not None:
            _tensor(scale, f"{what}: {name}")
    extra = tuple(t.to(torch.float32).contiguous() for t in scales.values() if t is not None)
    return _routed_experts_call("moe_decode_fp8" if fp8 else "moe_decode", x, expert_ids, weights, w_gate, w_up,
                                w_down, activation, *extra, experts=schedules.index(experts))
