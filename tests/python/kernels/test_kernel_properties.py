"""Property-based checks of every library kernel, driven by its registration.

For each kernel of the registry: its examples and randomly drawn cases (shapes with tails and
odd sizes, grouped-query ratios, causal or not, head dims, dtypes, eps, ...; drawn by the
registration's seeded generator) run through ``nikki.kernels.<name>`` and are compared with two
independent references: the kernel's float64 reference (C++, beside the kernel) and PyTorch's own
implementation of the same operation, computed in float64 (for a backward kernel, PyTorch's
backward of the forward operation).

Cases per kernel: NIKKI_SWEEP_CASES (4 by default, so `make test` stays quick; `make sweep` runs
many more), seeds from NIKKI_SWEEP_SEED (1 by default). A failure prints the seed and the case.

Tolerance (from the registration): |got - ref| <= atol * max(1, max |ref|) + rtol * |ref|. The
kernels compute in fp32 and round each output once, so an fp32 result is within a few fp32 ulps
times the depth of its reductions (1e-5); a 16-bit result carries its store's rounding plus the
error of 16-bit intermediates feeding fp32 maths (2e-2 for bf16, 5e-3 for fp16).
"""

import math
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

from nikki import _core  # noqa: E402
from nikki.dtypes import numpy_dtype, to_dtype  # noqa: E402
from nikki.library import library_kernels  # noqa: E402

CASES = int(os.environ.get("NIKKI_SWEEP_CASES", "4"))
FIRST_SEED = int(os.environ.get("NIKKI_SWEEP_SEED", "1"))


# --- PyTorch's own implementations, in float64 ------------------------------------------------

def _scale(params, d):
    s = params.get("scale")
    return None if s is None or math.isnan(s) else s


def _window_mask(s, skv, window):
    """Sliding window (causal implied): key j visible from query i when i - window < j <= i."""
    i, j = torch.arange(s)[:, None], torch.arange(skv)[None]
    return (j <= i) & (j > i - window)


def _sdpa(q, k, v, params):
    window = int(params.get("window", 0))
    if window:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=_window_mask(q.shape[2], k.shape[2], window),
                                              scale=_scale(params, q.shape[-1]), enable_gqa=True)
    return F.scaled_dot_product_attention(q, k, v, is_causal=bool(params.get("causal", 0)),
                                          scale=_scale(params, q.shape[-1]), enable_gqa=True)


def _attention_lse(q, k, params):
    group = q.shape[1] // k.shape[1]
    scale = _scale(params, q.shape[-1]) or 1 / math.sqrt(q.shape[-1])
    s = (q @ k.repeat_interleave(group, 1).transpose(-1, -2)) * scale
    if params.get("window", 0):
        s = s.masked_fill(~_window_mask(s.shape[-2], s.shape[-1], int(params["window"])), float("-inf"))
    elif params.get("causal", 0):
        s = s.masked_fill(~torch.ones(s.shape[-2:], dtype=torch.bool).tril(), float("-inf"))
    return torch.logsumexp(s, -1)


def _attention_bwd(q, k, v, out, lse, grad_out, params):
    q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
    return list(torch.autograd.grad(_sdpa(q, k, v, params), (q, k, v), grad_out))


def _layernorm(x, gamma, beta, params):
    out, mean, rstd = torch.ops.aten.native_layer_norm(x, [x.shape[-1]], gamma, beta, params.get("eps", 1e-5))
    return [out, mean.reshape(-1), rstd.reshape(-1)]


def _layernorm_bwd(x, gamma, mean, rstd, grad_out, params):
    beta = torch.zeros_like(gamma)
    return list(torch.ops.aten.native_layer_norm_backward(grad_out, x, [x.shape[-1]], mean[:, None], rstd[:, None],
                                                          gamma, beta, [True, True, True]))


def _rmsnorm(x, gamma, params):
    eps = params.get("eps", 1e-6)
    return [F.rms_norm(x, (x.shape[-1],), gamma, eps), torch.rsqrt(x.pow(2).mean(-1) + eps)]


def _rmsnorm_bwd(x, gamma, rstd, grad_out, params):
    # The backward inputs' rstd comes from x with the forward's default eps.
    x, gamma = x.clone().requires_grad_(), gamma.clone().requires_grad_()
    return list(torch.autograd.grad(F.rms_norm(x, (x.shape[-1],), gamma, 1e-6), (x, gamma), grad_out))


def _adamw(param, grad, exp_avg, exp_avg_sq, params):
    """torch.optim.AdamW's own step, in float64, from the given state (its step counter set to the
    step before)."""
    p = torch.nn.Parameter(param.clone())
    p.grad = grad.clone()
    opt = torch.optim.AdamW([p], lr=params["lr"], betas=(params["beta1"], params["beta2"]), eps=params["eps"],
                            weight_decay=params["weight_decay"], foreach=False)
    opt.state[p] = {"step": torch.tensor(float(params["step"] - 1)), "exp_avg": exp_avg.clone(),
                    "exp_avg_sq": exp_avg_sq.clone()}
    opt.step()
    return [p.detach(), opt.state[p]["exp_avg"], opt.state[p]["exp_avg_sq"]]


def _apply_rotary_pos_emb(x, cos, sin, params):
    """Hugging Face's apply_rotary_pos_emb on the first r dims (rotate_half, or rotate-every-two
    when interleaved); the rest pass through."""
    r = cos.shape[-1]
    cos, sin = (t[:, None] if t.dim() == 3 else t for t in (cos, sin))
    xr, xp = x[..., :r], x[..., r:]
    if params.get("interleaved", 0):
        rotated = torch.stack((-xr[..., 1::2], xr[..., 0::2]), -1).flatten(-2)
    else:
        rotated = torch.cat((-xr[..., r // 2:], xr[..., :r // 2]), -1)
    return torch.cat((xr * cos + rotated * sin, xp), -1)


def _rope_bwd(cos, sin, grad_out, params):
    x = torch.zeros_like(grad_out, requires_grad=True)
    return list(torch.autograd.grad(_apply_rotary_pos_emb(x, cos, sin, params), (x,), grad_out))


def _output_projection_bwd(attn, w_o, grad_out, params):
    attn, w_o = attn.clone().requires_grad_(), w_o.clone().requires_grad_()
    bias = torch.zeros(w_o.shape[1], dtype=attn.dtype, requires_grad=True)
    residual = torch.zeros(grad_out.shape, dtype=attn.dtype, requires_grad=True)
    return list(torch.autograd.grad(attn @ w_o + bias + residual, (attn, w_o, bias, residual), grad_out))


TORCH = {
    "matmul": lambda a, b, p: [a @ b],
    "softmax": lambda x, p: [torch.softmax(x, -1)],
    "softmax_bwd": lambda out, g, p: [torch._softmax_backward_data(g, out, -1, torch.float64)],
    "layernorm": _layernorm,
    "layernorm_bwd": _layernorm_bwd,
    "rmsnorm": _rmsnorm,
    "rmsnorm_bwd": _rmsnorm_bwd,
    "flash_attention": lambda q, k, v, p: [_sdpa(q, k, v, p), _attention_lse(q, k, p)],
    "flash_attention_bwd": _attention_bwd,
    "adamw": _adamw,
    "rope": lambda x, cos, sin, p: [_apply_rotary_pos_emb(x, cos, sin, p)],
    "rope_bwd": _rope_bwd,
    "output_projection": lambda attn, w_o, bias, residual, p: [attn @ w_o + bias + residual],
    "output_projection_bwd": _output_projection_bwd,
}
# Kernels PyTorch has no implementation of, with the reason; every other kernel must be in TORCH.
NO_TORCH_EQUIVALENT: dict = {}


# --- the sweep ----------------------------------------------------------------------------------

def _cases():
    for name, kernel in sorted(library_kernels().items()):
        for index in range(len(kernel.info["examples"])):
            yield pytest.param(name, "example", index, id=f"{name}-example{index}")
        for seed in range(FIRST_SEED, FIRST_SEED + CASES):
            yield pytest.param(name, "drawn", seed, id=f"{name}-seed{seed}")


def _call_params(kernel, params):
    kinds = {p[0]: p[1] for p in kernel.info["params"]}
    return {k: (bool(v) if kinds[k] == "bool" else None if kinds[k] == "float?" and math.isnan(v) else v)
            for k, v in params.items()}


def _assert_close(got, ref, tol, what):
    rtol, atol = tol
    got, ref = np.asarray(got, dtype=np.float64), np.asarray(ref, dtype=np.float64)
    assert got.shape == ref.shape, f"{what}: shape {got.shape}, expected {ref.shape}"
    peak = max(1.0, float(np.abs(ref).max())) if ref.size else 1.0
    err = np.abs(got - ref)
    bad = ~(err <= atol * peak + rtol * np.abs(ref))
    assert not bad.any(), (f"{what}: {int(bad.sum())} of {bad.size} elements off, worst {float(np.nanmax(err))} "
                           f"(max |ref| {peak}, rtol {rtol}, atol {atol})")


def test_every_kernel_has_a_pytorch_counterpart_or_a_reason():
    names = set(library_kernels())
    missing = sorted(names - set(TORCH) - set(NO_TORCH_EQUIVALENT))
    assert not missing, f"kernels with no PyTorch comparison in this sweep (add one, or a reason): {missing}"


@pytest.mark.parametrize("name,kind,index", list(_cases()))
def test_kernel_matches_its_reference_and_pytorch(name, kind, index):
    kernel = library_kernels()[name]
    case = _core.library_case(name, kind, index)
    what = f"{name} {kind} {index} ({case['label']}; inputs {[tuple(s) for s, _ in case['inputs']]}, " \
           f"dtypes {[to_dtype(d).name for _, d in case['inputs']]}, params {case['params']})"
    arrays = [v.astype(numpy_dtype(to_dtype(d))) for v, (_, d) in zip(case["values"], case["inputs"])]
    params = _call_params(kernel, case["params"])
    defaults = {p[0]: p[2] for p in kernel.info["params"]}
    got = kernel(*arrays, **params)
    got = got if isinstance(got, tuple) else (got,)
    reference = _core.library_reference(name, case["values"], case["params"])
    pytorch = (TORCH[name](*[torch.from_numpy(v) for v in case["values"]], {**defaults, **params})
               if name in TORCH else None)
    assert len(got) == len(reference) == len(kernel.outputs)
    for i, out_name in enumerate(kernel.outputs):
        _assert_close(got[i].astype(np.float64), reference[i], case["tolerance"], f"{what} output '{out_name}' "
                      "against the float64 reference")
        if pytorch is not None:
            _assert_close(got[i].astype(np.float64), pytorch[i].detach().numpy(), case["tolerance"],
                          f"{what} output '{out_name}' against PyTorch")
