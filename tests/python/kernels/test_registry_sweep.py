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

TOLERANCES = {torch.float32: (1e-5, 1e-5), torch.bfloat16: (2e-2, 2e-2), torch.float16: (5e-3, 5e-3)}


def _randn(shape, dtype, gen, scale=1.0):
    return (torch.randn(shape, generator=gen, dtype=torch.float64) * scale).to(dtype)


def _default_inputs(specs, params, gen):
    return [_randn(shape, dtype, gen) for shape, dtype in specs]


def _softmax_bwd_inputs(specs, params, gen):
    (shape, dtype), (gshape, gdtype) = specs
    out = torch.softmax(_randn(shape, torch.float64, gen), -1).to(dtype)
    return [out, _randn(gshape, gdtype, gen)]


# name -> (input maker, reference returning every output as float64 tensors)
REFERENCES = {
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
        rtol, atol = TOLERANCES[g.dtype]
        torch.testing.assert_close(g.double(), w.double(), rtol=rtol, atol=atol,
                                   msg=lambda m, n=out_name: f"{name} output '{n}': {m}")


def test_library_kernels_accept_numpy_and_return_numpy():
    x = np.random.default_rng(0).standard_normal((130, 33)).astype(np.float32)
    y = K.softmax(x)
    assert isinstance(y, np.ndarray) and y.dtype == np.float32
    np.testing.assert_allclose(y.sum(1), np.ones(130), rtol=1e-5)
