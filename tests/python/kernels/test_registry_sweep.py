"""Every library kernel against an independent PyTorch reference (computed in float64), over the
example cases its registry entry lists (odd sizes, tails, tiny and large shapes, each dtype), on
torch tensors through nikki.kernels.<name>.

Tolerances: the kernels compute in fp32 and round once when they store, so an fp32 result is within
a few fp32 ulps of the exact value times the depth of the reduction (1e-5 relative covers the
sizes used here); a bf16 result carries the store's rounding (2^-8 relative) plus the error of
bf16 inputs feeding fp32 math (~1e-2 relative) — hence 2e-2.
"""

import math
import zlib

import numpy as np
import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

import nikki.kernels as K  # noqa: E402
from nikki.dtypes import torch_dtype, to_dtype  # noqa: E402
from nikki.library import library_kernels  # noqa: E402

# (rtol, atol) by dtype: a few roundings of the dtype, relative to values of magnitude ~1.
TOLERANCES = {torch.float32: (1e-5, 1e-5), torch.bfloat16: (2e-2, 2e-2), torch.float16: (5e-3, 5e-3)}


def _tolerance(output, inputs):
    """The loosest tolerance of the output's dtype and the inputs' floating dtypes: a float32
    output may be computed from intermediates a kernel rounds to its inputs' precision (flash
    attention's logsumexp sums the bf16 probabilities that its P V matmul uses)."""
    dtypes = [output.dtype] + [t.dtype for t in inputs if t.dtype in TOLERANCES]
    return max((TOLERANCES[d] for d in dtypes), key=lambda tol: tol[0])


def _randn(shape, dtype, gen, scale=1.0):
    return (torch.randn(shape, generator=gen, dtype=torch.float64) * scale).to(dtype)


def _default_inputs(specs, params, gen):
    return [_randn(shape, dtype, gen) for shape, dtype in specs]


def _softmax_bwd_inputs(specs, params, gen):
    (shape, dtype), (gshape, gdtype) = specs
    out = torch.softmax(_randn(shape, torch.float64, gen), -1).to(dtype)
    return [out, _randn(gshape, gdtype, gen)]


def _layernorm_ref(x, gamma, beta, eps=1e-5):
    x = x.double()
    mean = x.mean(-1)
    rstd = 1 / torch.sqrt(x.var(-1, unbiased=False) + eps)
    return [(x - mean[:, None]) * rstd[:, None] * gamma.double() + beta.double(), mean, rstd]


def _rmsnorm_ref(x, gamma, eps=1e-6):
    x = x.double()
    rstd = 1 / torch.sqrt((x * x).mean(-1) + eps)
    return [x * rstd[:, None] * gamma.double(), rstd]


def _norm_bwd_inputs(stats):
    """Inputs of a norm backward: x, gamma, the forward's saved statistics (fp32, computed from x
    as the forward would), then grad_out."""

    def make(specs, params, gen):
        (xs, xd), (gs, gd) = specs[0], specs[1]
        x, gamma = _randn(xs, xd, gen), _randn(gs, gd, gen)
        saved = stats(x, gamma, params)
        return [x, gamma, *[t.to(torch.float32) for t in saved], _randn(specs[-1][0], specs[-1][1], gen)]

    return make


def _layernorm_bwd_ref(x, gamma, mean, rstd, grad_out, eps=1e-5):
    x, g_out, gamma = x.double(), grad_out.double(), gamma.double()
    mean, rstd = mean.double()[:, None], rstd.double()[:, None]
    xhat = (x - mean) * rstd
    g = g_out * gamma
    grad_x = rstd * (g - g.mean(-1, keepdim=True) - xhat * (g * xhat).mean(-1, keepdim=True))
    return [grad_x, (g_out * xhat).sum(0), g_out.sum(0)]


def _rmsnorm_bwd_ref(x, gamma, rstd, grad_out, eps=1e-6):
    x, g_out, gamma, rstd = x.double(), grad_out.double(), gamma.double(), rstd.double()[:, None]
    xhat = x * rstd
    g = g_out * gamma
    return [rstd * (g - xhat * (g * xhat).mean(-1, keepdim=True)), (g_out * xhat).sum(0)]


def _attention64(q, k, v, causal=False, scale=None):
    """float64 attention with grouped-query heads and torch's top-left causal mask; returns
    (out, logsumexp of the scaled, masked scores)."""
    q, k, v = q.double(), k.double(), v.double()
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = (q @ k.transpose(-1, -2)) * scale
    if causal:
        keep = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril()
        scores = scores.masked_fill(~keep, float("-inf"))
    lse = torch.logsumexp(scores, -1)
    return torch.exp(scores - lse[..., None]) @ v, lse


def _attention_ref(q, k, v, causal=False, scale=None):
    return list(_attention64(q, k, v, causal, scale))


def _attention_bwd_inputs(specs, params, gen):
    (qs, qd), (ks, kd), (vs, vd) = specs[:3]
    q, k, v = _randn(qs, qd, gen), _randn(ks, kd, gen), _randn(vs, vd, gen)
    out, lse = _attention64(q, k, v, params.get("causal", False), params.get("scale"))
    return [q, k, v, out.to(qd), lse.to(torch.float32), _randn(specs[5][0], specs[5][1], gen)]


def _attention_bwd_ref(q, k, v, out, lse, grad_out, causal=False, scale=None):
    q64, k64, v64 = (t.double().requires_grad_() for t in (q, k, v))
    o, _ = _attention64(q64, k64, v64, causal, scale)
    return list(torch.autograd.grad(o, (q64, k64, v64), grad_out.double()))


# name -> (input maker, reference returning every output as float64 tensors)
REFERENCES = {
    "flash_attention": (_default_inputs, _attention_ref),
    "flash_attention_bwd": (_attention_bwd_inputs, _attention_bwd_ref),
    "layernorm": (_default_inputs, _layernorm_ref),
    "layernorm_bwd": (_norm_bwd_inputs(lambda x, g, p: _layernorm_ref(x, g, g, p.get("eps", 1e-5))[1:]),
                      _layernorm_bwd_ref),
    "rmsnorm": (_default_inputs, _rmsnorm_ref),
    "rmsnorm_bwd": (_norm_bwd_inputs(lambda x, g, p: _rmsnorm_ref(x, g, p.get("eps", 1e-6))[1:]), _rmsnorm_bwd_ref),
    "matmul": (_default_inputs, lambda a, b: [a.double() @ b.double()]),
    "softmax": (_default_inputs, lambda x: [torch.softmax(x.double(), -1)]),
    "softmax_bwd": (_softmax_bwd_inputs,
                    lambda out, g: [out.double() * (g.double() - (g.double() * out.double()).sum(-1, keepdim=True))]),
}


def _cases():
    for name, kernel in sorted(library_kernels().items()):
        for index, (inputs, params, label) in enumerate(kernel.info["examples"]):
            yield pytest.param(name, [(tuple(s), torch_dtype(to_dtype(d))) for s, d in inputs], dict(params),
                               id=f"{name}-{index}-{label.replace(' ', '_')}")


def test_every_library_kernel_has_a_reference():
    missing = sorted(set(library_kernels()) - set(REFERENCES))
    assert not missing, f"library kernels without a reference in this sweep: {missing}"


@pytest.mark.parametrize("name,specs,params", list(_cases()))
def test_library_kernel_matches_reference(name, specs, params):
    if name not in REFERENCES:
        pytest.fail(f"no reference for {name}")
    make_inputs, reference = REFERENCES[name]
    kernel = library_kernels()[name]
    gen = torch.Generator().manual_seed(zlib.crc32(name.encode()))
    kinds = {p[0]: p[1] for p in kernel.info["params"]}
    call_params = {k: (bool(v) if kinds[k] == "bool" else None if kinds[k] == "float?" and math.isnan(v) else v)
                   for k, v in params.items()}
    inputs = make_inputs(specs, call_params, gen)
    got = kernel(*inputs, **call_params)
    got = got if isinstance(got, tuple) else (got,)
    want = reference(*inputs, **call_params)
    assert len(got) == len(want) == len(kernel.outputs)
    for out_name, g, w in zip(kernel.outputs, got, want):
        rtol, atol = _tolerance(g, inputs)
        torch.testing.assert_close(g.double(), w.double(), rtol=rtol, atol=atol,
                                   msg=lambda m, n=out_name: f"{name} output '{n}': {m}")


def test_library_kernels_accept_numpy_and_return_numpy():
    x = np.random.default_rng(0).standard_normal((130, 33)).astype(np.float32)
    y = K.softmax(x)
    assert isinstance(y, np.ndarray) and y.dtype == np.float32
    e = np.exp(x.astype(np.float64) - x.max(1, keepdims=True))
    np.testing.assert_allclose(y, e / e.sum(1, keepdims=True), rtol=1e-5, atol=1e-7)
