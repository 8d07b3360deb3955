"""nikki.kernels.gated_mlp and nikki.torch.gated_mlp against the same block in PyTorch: forward
for every activation, with and without biases, decode and prefill token counts, tails of every
dim; the gradients of x and of every weight and bias; torch.compile; errors at the caller's line.
fp8 weights with per-column scales (gated_mlp_fp8) against the same block on the dequantized
weights, and the HBM bytes they save.

Tolerances: fp32 results within 1e-4 of the output's scale (sums over H and I of fp32 products,
the activation in fp32, h rounded to fp32); bf16 within 2e-2 (h is rounded to bf16 before the
down projection, and the output once more). With fp8 weights the reference uses the same fp8
values (dequantized exactly in float64), so the bf16 tolerance holds: the fp8 products are exact
and sum in fp32."""

import linecache

import numpy as np
import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

import nikki  # noqa: E402
import nikki.kernels as K  # noqa: E402
import nikki.torch as nt  # noqa: E402

ACTIVATIONS = {"silu": F.silu, "gelu": F.gelu, "gelu_tanh": lambda t: F.gelu(t, approximate="tanh")}


def _operands(T, H, I, dtype, seed, bias=True):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s, scale=1.0: (torch.randn(*s, generator=g, dtype=torch.float64) * scale).to(dtype)  # noqa: E731
    x = r(T, H)
    ws = [r(H, I, scale=H ** -0.5), r(H, I, scale=H ** -0.5), r(I, H, scale=I ** -0.5)]
    bs = [r(I, scale=0.1), r(I, scale=0.1), r(H, scale=0.1)] if bias else [None, None, None]
    return x, ws, bs


def _torch_mlp(x, ws, bs, activation):
    zero = lambda n: torch.zeros(n, dtype=x.dtype)  # noqa: E731
    bg, bu, bd = (b if b is not None else zero(n) for b, n in zip(bs, (ws[0].shape[1], ws[0].shape[1], x.shape[-1])))
    return (ACTIVATIONS[activation](x @ ws[0] + bg) * (x @ ws[1] + bu)) @ ws[2] + bd


def _close(got, want, tol, what):
    scale = max(1.0, float(want.abs().max()))
    err = float((got.double() - want.double()).abs().max())
    assert err <= tol * scale, f"{what}: max error {err}, allowed {tol * scale}"


@pytest.mark.parametrize("activation", list(ACTIVATIONS))
@pytest.mark.parametrize("T,H,I,bias", [(3, 64, 96, True), (200, 130, 257, False)])
def test_forward_matches_pytorch(activation, T, H, I, bias):
    x, ws, bs = _operands(T, H, I, torch.float32, T + I)
    got = nt.gated_mlp(x, *ws, *bs, activation=activation)
    _close(got, _torch_mlp(x.double(), [w.double() for w in ws], [b if b is None else b.double() for b in bs],
                           activation), 1e-4, f"{activation} T={T}")


def test_bf16_prefill_blocks_match_pytorch():
    x, ws, bs = _operands(700, 256, 640, torch.bfloat16, 9)
    got = nt.gated_mlp(x.reshape(7, 100, 256), *ws, *bs)
    assert got.shape == (7, 100, 256) and got.dtype == torch.bfloat16
    want = _torch_mlp(x.double(), [w.double() for w in ws], [b.double() for b in bs], "silu")
    _close(got.reshape(700, 256), want, 2e-2, "bf16 SwiGLU, two token blocks")


@pytest.mark.parametrize("activation", list(ACTIVATIONS))
def test_gradients_of_x_every_weight_and_bias(activation):
    x, ws, bs = _operands(37, 72, 150, torch.float32, 4)
    leaves = [t.clone().requires_grad_() for t in [x, *ws, *bs]]
    refs = [t.double().clone().requires_grad_() for t in [x, *ws, *bs]]
    weights = torch.randn(37, 72, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    out = nt.gated_mlp(*leaves, activation=activation)
    got = torch.autograd.grad((out * weights.float()).sum(), leaves)
    want = torch.autograd.grad((_torch_mlp(refs[0], refs[1:4], refs[4:], activation) * weights).sum(), refs)
    for name, g, w in zip(["x", "w_gate", "w_up", "w_down", "b_gate", "b_up", "b_down"], got, want):
        _close(g, w, 1e-4, f"grad of {name} ({activation})")


def test_compiles_without_graph_breaks_forward_and_backward():
    x, ws, bs = _operands(16, 32, 48, torch.float32, 6)
    ws = [w.requires_grad_() for w in ws]
    fn = torch.compile(lambda x, a, b, c: nt.gated_mlp(x, a, b, c).square().sum(), fullgraph=True)
    loss = fn(x, *ws)
    loss.backward()
    ref = [w.detach().double().requires_grad_() for w in ws]
    want = _torch_mlp(x.double(), ref, [None] * 3, "silu").square().sum()
    want.backward()
    _close(loss.detach(), want.detach(), 1e-4, "loss")
    for w, r in zip(ws, ref):
        _close(w.grad, r.grad, 1e-4, "weight gradient under torch.compile")


def test_operand_errors_name_the_operand_at_the_call():
    x = np.zeros((4, 8), np.float32)
    w = np.zeros((8, 16), np.float32)
    wd = np.zeros((16, 8), np.float32)
    b, bd = np.zeros(16, np.float32), np.zeros(8, np.float32)
    with pytest.raises(nikki.KernelError, match=r"gated_mlp: 'w_down' must have shape \[16, 8\], got \[8, 16\]") as err:
        K.gated_mlp(x, w, w, w, b, b, bd)
    assert err.value.file == __file__ and "K.gated_mlp(" in linecache.getline(__file__, err.value.line)
    with pytest.raises(nikki.KernelError, match=r"gated_mlp: 'b_up' is float16 but x is float32"):
        K.gated_mlp(x, w, w, wd, b, b.astype(np.float16), bd)
    with pytest.raises(nikki.KernelError, match=r"gated_mlp: w_gate must be \[H, I\] with H = 8"):
        K.gated_mlp(x, wd, w, wd, b, b, bd)


def test_an_intermediate_size_too_large_for_sbuf_is_a_kernel_error():
    I = 400000
    x, w, wd = np.zeros((1, 8), np.float32), np.zeros((8, I), np.float32), np.zeros((I, 8), np.float32)
    with pytest.raises(nikki.KernelError, match=r"gated_mlp: x\^T and h\^T of 128 tokens .* do not fit in SBUF") as err:
        K.gated_mlp(x, w, w, wd, np.zeros(I, np.float32), np.zeros(I, np.float32), np.zeros(8, np.float32))
    assert "split I into parts" in str(err.value)


def test_torch_wrapper_rejects_an_unknown_activation():
    x, ws, _ = _operands(2, 8, 8, torch.float32, 1)
    with pytest.raises(nikki.KernelError, match="activation"):
        nt.gated_mlp(x, *ws, activation="relu")


# --- fp8 weights with per-column scales ------------------------------------------------------------

def _quantized(w, fp8):
    """w as fp8 values and float32 scales of its columns (amax / 240: inside e4m3's range)."""
    scale = (w.abs().amax(0).double() / 240).clamp_min(1e-12).float()
    return (w.double() / scale.double()).to(fp8), scale


@pytest.mark.parametrize("fp8", [torch.float8_e4m3fn, torch.float8_e5m2])
@pytest.mark.parametrize("T,H,I,activation,dtype", [(1, 64, 96, "silu", torch.bfloat16),
                                                    (8, 130, 257, "gelu", torch.float16),
                                                    (300, 200, 520, "gelu_tanh", torch.bfloat16)])
def test_fp8_weights_match_the_block_on_their_dequantized_values(fp8, T, H, I, activation, dtype):
    x, ws, bs = _operands(T, H, I, torch.float32, T + H)
    quantized = [_quantized(w, fp8) for w in ws]
    x, bs = x.to(dtype), [b.to(dtype) for b in bs]
    got = nt.gated_mlp(x, *(q for q, _ in quantized), *bs, activation=activation,
                       gate_scale=quantized[0][1], up_scale=quantized[1][1], down_scale=quantized[2][1])
    assert got.dtype == dtype and got.shape == (T, H)
    dequantized = [q.double() * s.double() for q, s in quantized]
    _close(got, _torch_mlp(x.double(), dequantized, [b.double() for b in bs], activation), 2e-2,
           f"{fp8} weights, {activation}, T={T}")


def test_fp8_weights_stream_half_the_bytes_of_bf16_ones():
    """At decode the MLP reads its weights once: 1 byte per weight in fp8, 2 in bf16."""
    t, h, i = 8, 512, 1024
    weights = 3 * h * i
    f8, bf = "float8_e4m3fn", "bfloat16"
    fp8 = nikki.estimate(K.gated_mlp_fp8, nikki.spec((t, h), bf), nikki.spec((h, i), f8), nikki.spec((h, i), f8),
                         nikki.spec((i, h), f8), nikki.spec((i,), "float32"), nikki.spec((i,), "float32"),
                         nikki.spec((h,), "float32"), nikki.spec((i,), bf), nikki.spec((i,), bf), nikki.spec((h,), bf))
    bf16 = nikki.estimate(K.gated_mlp, nikki.spec((t, h), bf), nikki.spec((h, i), bf), nikki.spec((h, i), bf),
                          nikki.spec((i, h), bf), nikki.spec((i,), bf), nikki.spec((i,), bf), nikki.spec((h,), bf))
    assert weights <= fp8.dma_bytes < 1.15 * weights
    assert 2 * weights <= bf16.dma_bytes < 1.15 * 2 * weights


def test_fp8_operand_errors_name_the_operand():
    x, ws, _ = _operands(4, 16, 32, torch.float32, 2)
    quantized = [_quantized(w, torch.float8_e4m3fn) for w in ws]
    q = [w for w, _ in quantized]
    scales = {"gate_scale": quantized[0][1], "up_scale": quantized[1][1], "down_scale": quantized[2][1]}
    with pytest.raises(nikki.KernelError, match="down_scale") as err:
        nt.gated_mlp(x.bfloat16(), *q, gate_scale=scales["gate_scale"], up_scale=scales["up_scale"])
    assert "dequantization scales" in str(err.value)
    with pytest.raises(nikki.KernelError, match=r"gate_scale.*not fp8"):
        nt.gated_mlp(x, *ws, gate_scale=scales["gate_scale"])
    with pytest.raises(nikki.KernelError, match=r"gated_mlp_fp8: x is float32: TensorE multiplies fp8 weights with "
                                                r"bfloat16 or float16") as err:
        nt.gated_mlp(x, *q, **scales)
    assert "cast x to bfloat16" in str(err.value)
    with pytest.raises(nikki.KernelError, match=r"gated_mlp_fp8: 'w_down' is float8_e5m2; the weights are fp8 of one "
                                                r"format \(w_gate is float8_e4m3fn\)"):
        nt.gated_mlp(x.bfloat16(), q[0], q[1], ws[2].to(torch.float8_e5m2), **scales)
    with pytest.raises(nikki.KernelError, match=r"kernel 'gated_mlp': input 'w_up' has dtype float8_e4m3fn") as err:
        K.gated_mlp(x.numpy(), ws[0].numpy(), q[1], ws[2].numpy(), *(np.zeros(n, np.float32) for n in (32, 32, 16)))
    assert "float32, bfloat16, float16" in err.value.limit
