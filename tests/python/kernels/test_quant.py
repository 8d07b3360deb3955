"""nikki.kernels.rmsnorm_quant / rmsnorm_quant_dynamic and nikki.torch.rms_norm_quant against an
independent float64 reference: F.rms_norm in float64, the scale (static, or amax / 240 per row),
the quotient clamped to +-240 and rounded to fp8 by torch's own float64 -> float8_e4m3fn cast.

Exactness: the kernels compute in fp32, so q may differ from the float64 reference's rounding only
where the quotient lies within a few fp32 roundings (a relative ~2^-21) of a midpoint between two
fp8 values. Such values are rare (a fraction ~2^-21 * 2^4 of a uniform spread): the tests allow
at most 0.1% of the elements to differ, each by exactly one fp8 step, and everything else bit for
bit. The dequantization scales carry rstd's fp32 error: a sum of H squares (random-walk rounding
errors, ~sqrt(H) * 2^-24) and a few roundings more: 2^-24 * (8 + sqrt(H)).

nikki.kernels.fp8_matmul / nikki.torch.fp8_matmul against the float64 product of the dequantized
operands (the fp8 products are exact, the fp32 sums err by ~sqrt(K) 2^-24, then one rounding to
bf16: 2^-8 relative, or fp32: 1e-5), fed by rms_norm_quant and per-channel quantized weights.
"""

import linecache

import ml_dtypes
import numpy as np
import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

import nikki  # noqa: E402
import nikki.kernels as K  # noqa: E402
import nikki.torch as nt  # noqa: E402

E4M3_MAX = float(ml_dtypes.finfo(ml_dtypes.float8_e4m3).max)  # 240
TINY = float(np.finfo(np.float32).tiny)


def _reference(x, gamma, eps, scale=None):
    """(q as float64, scales) from float64 inputs; q rounded by torch's cast."""
    y = F.rms_norm(x.double(), (x.shape[-1],), gamma.double(), eps)
    if scale is None:
        scales = (y.abs().amax(-1) / E4M3_MAX).clamp_min(TINY)
    else:
        scales = torch.full((x.shape[0],), float(scale), dtype=torch.float64)
    q = (y / scales[:, None]).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return q, scales


def _fp8_step(v):
    """The spacing of the fp8 e4m3 grid at |v| (2^-9 below the normal range)."""
    e = np.floor(np.log2(np.maximum(np.abs(v), 2.0 ** -6)))
    return 2.0 ** (e - 3)


def _check_q(got, want):
    assert got.dtype == torch.float8_e4m3fn
    g, w = got.double().numpy(), want.double().numpy()
    assert not np.isnan(g).any() and np.abs(g).max(initial=0) <= E4M3_MAX
    differ = g != w
    assert differ.mean() <= 1e-3, f"{int(differ.sum())} of {differ.size} fp8 values differ from the reference"
    # neighbours on the grid: one step apart, the step of the smaller magnitude
    assert np.all(np.abs(g - w)[differ] <= _fp8_step(np.minimum(np.abs(g), np.abs(w)))[differ])


def _x(rows, h, dtype, seed=0, spread=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(rows, h, generator=g, dtype=torch.float64) * spread).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("rows,h", [(1, 1), (300, 77), (129, 600), (64, 4100)])
def test_dynamic_matches_the_float64_reference(dtype, rows, h):
    x, gamma = _x(rows, h, dtype), _x(1, h, dtype, seed=1)[0]
    q, scales = K.rmsnorm_quant_dynamic(x, gamma)
    q_ref, s_ref = _reference(x, gamma, 1e-6)
    _check_q(q, q_ref)
    assert scales.dtype == torch.float32
    # rstd comes from an fp32 sum of h squares: rounding errors that grow like sqrt(h).
    np.testing.assert_allclose(scales.double().numpy(), s_ref.numpy(), rtol=2.0 ** -24 * (8 + h ** 0.5))
    # Every row's largest magnitude lands on +-240.
    assert torch.all(q.float().abs().amax(-1) == E4M3_MAX)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("scale", [1 / 512, 0.02, 3.0])
def test_static_matches_the_float64_reference_and_saturates(dtype, scale):
    x, gamma = _x(300, 77, dtype), _x(1, 77, dtype, seed=1)[0]
    q, scales = K.rmsnorm_quant(x, gamma, torch.tensor([scale], dtype=torch.float32), eps=1e-5)
    q_ref, _ = _reference(x, gamma, 1e-5, scale=np.float32(scale))
    _check_q(q, q_ref)
    assert torch.all(scales == torch.tensor(scale, dtype=torch.float32))
    y = F.rms_norm(x.double(), (77,), gamma.double(), 1e-5) / float(np.float32(scale))
    beyond = y.abs() > E4M3_MAX + 8  # past the midpoint to the next e4m3fn value (256)
    assert torch.all(q.float().abs()[beyond] == E4M3_MAX)
    if scale == 1 / 512:
        assert beyond.float().mean() > 0.3  # the case saturates many values


def test_all_zero_rows_quantize_to_zero_with_the_smallest_normal_scale():
    x = _x(200, 130, torch.float32)
    x[[0, 7, 199]] = 0
    q, scales = K.rmsnorm_quant_dynamic(x, torch.ones(130))
    assert torch.all(q[[0, 7, 199]].float() == 0)
    assert torch.all(scales[[0, 7, 199]] == TINY)
    assert torch.all(scales[1:7] > TINY)
    # Tiny but nonzero rows are normalized first, so they keep their full resolution (while
    # their squares stay normal fp32 numbers).
    x[1] *= 1e-15
    q2, _ = K.rmsnorm_quant_dynamic(x, torch.ones(130), eps=0.0)
    assert q2[1].float().abs().max() == E4M3_MAX


def test_q_times_scales_approximates_the_normalized_rows():
    x, gamma = _x(256, 1024, torch.bfloat16), _x(1, 1024, torch.bfloat16, seed=2)[0]
    q, scales = K.rmsnorm_quant_dynamic(x, gamma)
    y = F.rms_norm(x.double(), (1024,), gamma.double(), 1e-6)
    # e4m3 keeps 3 mantissa bits: half a step is 2^-4 of the value, or 2^-10 * 240 * scale near 0.
    err = (q.double() * scales.double()[:, None] - y).abs()
    assert torch.all(err <= y.abs() * 2.0 ** -4 + scales.double()[:, None] * 2.0 ** -10)


def test_torch_wrapper_takes_pytorch_conventions():
    x, w = _x(6, 96, torch.bfloat16).reshape(2, 3, 96), _x(1, 96, torch.bfloat16, seed=3)[0]
    q, scales = nt.rms_norm_quant(x, w)
    assert q.shape == (2, 3, 96) and scales.shape == (2, 3) and q.dtype == torch.float8_e4m3fn
    q_ref, s_ref = _reference(x.reshape(6, 96), w, 1e-6)
    _check_q(q.reshape(6, 96), q_ref)
    q_static, s_static = nt.rms_norm_quant(x, w, scale=0.01)
    assert torch.all(s_static == torch.tensor(0.01, dtype=torch.float32))
    _check_q(q_static.reshape(6, 96), _reference(x.reshape(6, 96), w, 1e-6, scale=np.float32(0.01))[0])
    q_ones, _ = nt.rms_norm_quant(x, None, scale=torch.tensor(0.01))
    _check_q(q_ones.reshape(6, 96), _reference(x.reshape(6, 96), torch.ones(96), 1e-6, scale=np.float32(0.01))[0])


def test_argument_errors_name_the_argument_and_the_call():
    x, g = torch.zeros(4, 8), torch.ones(8)
    with pytest.raises(nikki.KernelError, match=r"rmsnorm_quant: scale must be a float32 tensor of shape \[1\], "
                                                r"got float32\[2\]") as err:
        K.rmsnorm_quant(x, g, torch.ones(2))
    assert err.value.file == __file__ and "K.rmsnorm_quant(" in linecache.getline(__file__, err.value.line)
    with pytest.raises(nikki.KernelError, match=r"scale must be a float32 tensor of shape \[1\], got bfloat16\[1\]"):
        K.rmsnorm_quant(x, g, torch.ones(1, dtype=torch.bfloat16))
    with pytest.raises(nikki.KernelError, match=r"rmsnorm_quant_dynamic: 'gamma' must have shape \[8\], got \[9\]"):
        K.rmsnorm_quant_dynamic(x, torch.ones(9))
    with pytest.raises(nikki.KernelError, match=r"rmsnorm_quant_dynamic: rows of 60000 columns do not fit in SBUF"):
        K.rmsnorm_quant_dynamic(torch.zeros(2, 60000), torch.ones(60000))
    with pytest.raises(nikki.KernelError, match=r"nikki.torch.rms_norm_quant: scale"):
        nt.rms_norm_quant(x, g, scale=torch.ones(3))


# --- fp8_matmul ---------------------------------------------------------------------------------

def _quantize_columns(w):
    """Per-output-channel fp8 weights: w [K, N] -> (w_q float8_e4m3fn, scales [N])."""
    scales = (w.double().abs().amax(0) / E4M3_MAX).clamp_min(TINY).float()
    return (w.double() / scales.double()).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn), scales


@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (130, 200, 520), (300, 1000, 77)])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
def test_fp8_matmul_of_rms_norm_quant_matches_the_dequantized_product(m, k, n, out_dtype):
    x, gamma = _x(m, k, torch.bfloat16), _x(1, k, torch.bfloat16, seed=1)[0]
    q, s = nt.rms_norm_quant(x, gamma)
    w_q, w_s = _quantize_columns(_x(k, n, torch.float32, seed=2))
    bias = _x(1, n, torch.float32, seed=3)[0]
    out = nt.fp8_matmul(q, w_q, s, w_s, bias, out_dtype=out_dtype)
    assert out.dtype == out_dtype and out.shape == (m, n)
    want = (q.double() * s.double()[:, None]) @ (w_q.double() * w_s.double()) + bias.double()
    # Exact fp8 products summed in fp32 (~sqrt(k) 2^-24 of the magnitudes), one rounding to bf16.
    rtol = 2.0 ** -8 if out_dtype == torch.bfloat16 else 1e-5
    peak = float(want.abs().max())
    assert torch.all((out.double() - want).abs() <= rtol * want.abs() + rtol * peak)
    # Against the unquantized layer: fp8's 3 mantissa bits in both operands.
    exact = F.rms_norm(x.double(), (k,), gamma.double(), 1e-6) @ _x(k, n, torch.float32, seed=2).double() + bias.double()
    assert float((out.double() - exact).abs().max()) <= 0.15 * float(exact.abs().max())


def test_fp8_matmul_takes_neurons_e4m3_and_e5m2_from_numpy():
    g = np.random.default_rng(0)
    sa, sb, bias = (g.random(3) + 0.5).astype(np.float32), (g.random(5) + 0.5).astype(np.float32), np.zeros(5, np.float32)
    for fp8 in (ml_dtypes.float8_e4m3, ml_dtypes.float8_e5m2):
        a, b = g.standard_normal((3, 40)).astype(fp8), g.standard_normal((40, 5)).astype(fp8)
        out = K.fp8_matmul(a, sa, b, sb, bias, fp32_out=True)
        want = (a.astype(np.float64) @ b.astype(np.float64)) * sa[:, None] * sb[None, :]
        np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def test_fp8_matmul_argument_errors():
    a, b = torch.zeros(4, 8, dtype=torch.float8_e4m3fn), torch.zeros(8, 3, dtype=torch.float8_e4m3fn)
    sa, sb, bias = torch.ones(4), torch.ones(3), torch.zeros(3)
    with pytest.raises(nikki.KernelError, match=r"fp8_matmul: 'a_scale' must be a float32 tensor of shape \[4\] "
                                                r"\(row of a\), got float32\[3\]") as err:
        K.fp8_matmul(a, torch.ones(3), b, sb, bias)
    assert err.value.file == __file__ and "K.fp8_matmul(" in linecache.getline(__file__, err.value.line)
    with pytest.raises(nikki.KernelError, match=r"'b_scale' must be a float32 tensor of shape \[3\]"):
        K.fp8_matmul(a, sa, b, torch.ones(3, 1), bias)
    with pytest.raises(nikki.KernelError, match=r"fp8_matmul: 'a' must be fp8 \(float8_e4m3fn, float8_e4m3 or "
                                                r"float8_e5m2\), got bfloat16"):
        K.fp8_matmul(torch.zeros(4, 8, dtype=torch.bfloat16), sa, b, sb, bias)
    with pytest.raises(nikki.KernelError, match=r"fp8_matmul: contraction sizes differ: a is \[4, 8\], b is \[9, 3\]"):
        K.fp8_matmul(a, sa, torch.zeros(9, 3, dtype=torch.float8_e4m3fn), sb, bias)
    with pytest.raises(nikki.KernelError, match=r"a is float8_e4m3fn but b is float8_e5m2"):
        K.fp8_matmul(a, sa, b.to(torch.float8_e5m2), sb, bias)
    with pytest.raises(nikki.KernelError, match=r"nikki.torch.fp8_matmul: b"):
        nt.fp8_matmul(a, torch.zeros(9, 3, dtype=torch.float8_e4m3fn), sa, sb)
    with pytest.raises(nikki.KernelError, match=r"nikki.torch.fp8_matmul: a_scale"):
        nt.fp8_matmul(a, b, torch.ones(5), sb)
