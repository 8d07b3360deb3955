"""moe_prefill and moe_decode against a float64 PyTorch loop over experts: Mixtral-like routing
(top-2 of 8), unbalanced and degenerate routing (every token on one expert, experts with no
token, slots that route nowhere, an expert named twice by a token), every block size and the
kernel's choice, token counts crossing block boundaries, decode's selective and all-experts
schedules, the three gate activations, 16-bit dtypes, and the argument errors of the kernels and
of nikki.torch.moe_prefill / moe_decode; moe_decode with fp8 expert weights and their scales
(moe_decode_fp8) against the same loop on the dequantized weights."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import nikki  # noqa: E402
import nikki.kernels as K  # noqa: E402
import nikki.torch as nt  # noqa: E402

F = torch.nn.functional
ACTS = {"silu": F.silu, "gelu": F.gelu, "gelu_tanh": lambda t: F.gelu(t, approximate="tanh")}


def _want(x, ids, weights, w_gate, w_up, w_down, act="silu"):
    """The textbook loop over experts in float64."""
    x, weights = x.double(), weights.double()
    w_gate, w_up, w_down = w_gate.double(), w_up.double(), w_down.double()
    out = torch.zeros_like(x)
    ids = ids.long()
    for e in range(w_gate.shape[0]):
        for t in range(x.shape[0]):
            slots = ids[t] == e
            if not slots.any():
                continue
            h = ACTS[act](x[t] @ w_gate[e]) * (x[t] @ w_up[e])
            out[t] += weights[t][slots].sum() * (h @ w_down[e])
    return out


def _operands(t, h, i, e, k, seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(t, h, generator=g).to(dtype)
    ids = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)]).to(torch.int32)
    weights = torch.softmax(torch.randn(t, k, generator=g), -1)
    w_gate = (torch.randn(e, h, i, generator=g) / h**0.5).to(dtype)
    w_up = (torch.randn(e, h, i, generator=g) / h**0.5).to(dtype)
    w_down = (torch.randn(e, i, h, generator=g) / i**0.5).to(dtype)
    return x, ids, weights, w_gate, w_up, w_down


def _specs(t, k, e, h=16, i=32, dtype="float32"):
    """Operand specs for nikki.estimate: x, expert_ids, weights and the stacked expert weights."""
    return (nikki.spec((t, h), dtype), nikki.spec((t, k), "int32"), nikki.spec((t, k), "float32"),
            nikki.spec((e, h, i), dtype), nikki.spec((e, h, i), dtype), nikki.spec((e, i, h), dtype))


def _check(x, ids, weights, w_gate, w_up, w_down, act="silu", block_size=0, tol=(1e-4, 1e-4), experts=None):
    if experts is None:
        got = nt.moe_prefill(x, ids, weights, w_gate, w_up, w_down, activation=act, block_size=block_size)
    else:
        got = nt.moe_decode(x, ids, weights, w_gate, w_up, w_down, activation=act, experts=experts)
    assert got.dtype == x.dtype and got.shape == x.shape
    want = _want(x, ids, weights, w_gate, w_up, w_down, act)
    torch.testing.assert_close(got.double(), want, rtol=tol[0], atol=tol[1])


@pytest.mark.parametrize("t,h,i,e,k,block", [(1, 8, 16, 1, 1, 0), (130, 72, 200, 8, 2, 128), (129, 40, 130, 8, 2, 0),
                                             (300, 64, 96, 6, 3, 128), (257, 32, 64, 4, 2, 256),
                                             (200, 24, 40, 16, 8, 128), (520, 16, 32, 2, 1, 512)])
def test_matches_a_loop_over_experts(t, h, i, e, k, block):
    _check(*_operands(t, h, i, e, k, seed=t + e), block_size=block)


def test_every_token_on_one_expert_and_experts_without_tokens():
    x, ids, weights, wg, wu, wd = _operands(300, 32, 48, 8, 2, seed=1)
    ids[:, 0] = 5                               # expert 5 gets every token: three blocks of 128
    ids[:, 1] = torch.where(ids[:, 1] == 5, 6, ids[:, 1]) % 3   # experts 3, 4 and 7 get none
    _check(x, ids, weights, wg, wu, wd, block_size=128)


def test_slots_that_route_nowhere_and_an_expert_named_twice():
    x, ids, weights, wg, wu, wd = _operands(150, 24, 40, 4, 3, seed=2)
    ids[::3, 1] = -1
    ids[1::3, 2] = 4            # == E: routes nowhere
    ids[2::3, 2] = ids[2::3, 0]  # the same expert twice: its weights add
    _check(x, ids, weights, wg, wu, wd)
    x[:, :] = 0
    ids[:] = -1                  # nothing routed: zeros
    assert torch.equal(nt.moe_prefill(x, ids, weights, wg, wu, wd), torch.zeros_like(x))


@pytest.mark.parametrize("act", ["gelu", "gelu_tanh"])
def test_gelu_activations(act):
    _check(*_operands(140, 40, 72, 5, 2, seed=3), act=act)


@pytest.mark.parametrize("dtype,tol", [(torch.bfloat16, (3e-2, 5e-2)), (torch.float16, (4e-3, 6e-3))])
def test_16_bit_dtypes(dtype, tol):
    _check(*_operands(200, 64, 128, 8, 2, seed=4, dtype=dtype), tol=tol)


def test_leading_dims_and_int64_ids_through_nikki_torch():
    x, ids, weights, wg, wu, wd = _operands(96, 16, 32, 4, 2, seed=5)
    got = nt.moe_prefill(x.reshape(4, 24, 16), ids.long().reshape(4, 24, 2), weights.reshape(4, 24, 2), wg, wu, wd)
    want = _want(x, ids, weights, wg, wu, wd)
    torch.testing.assert_close(got.reshape(96, 16).double(), want, rtol=1e-4, atol=1e-4)


def test_kernel_argument_errors_name_the_argument_and_the_limit():
    x, ids, weights, wg, wu, wd = (a.numpy() for a in _operands(8, 16, 32, 4, 2, seed=6))
    with pytest.raises(nikki.KernelError, match=r"moe_prefill: expert_ids must be int32 \[T, k\]"):
        K.moe_prefill(x, ids.astype(np.float32), weights, wg, wu, wd)
    with pytest.raises(nikki.KernelError, match=r"moe_prefill: block_size is 100") as err:
        K.moe_prefill(x, ids, weights, wg, wu, wd, block_size=100)
    assert "0, 128, 256 or 512" in str(err.value)
    with pytest.raises(nikki.KernelError, match=r"moe_prefill: 'w_down' must have shape \[4, 32, 16\]"):
        K.moe_prefill(x, ids, weights, wg, wu, wd[:, :16])
    with pytest.raises(nikki.KernelError, match=r"moe_prefill: 'w_up' is float16 but x is float32"):
        K.moe_prefill(x, ids, weights, wg, wu.astype(np.float16), wd)
    with pytest.raises(nikki.KernelError, match=r"moe_prefill: expert_ids has k = 9 slots") as err:
        nikki.estimate(K.moe_prefill, *_specs(8, 9, 16))
    assert "top-k up to 8" in str(err.value)
    with pytest.raises(nikki.KernelError, match=r"moe_prefill: w_gate has 129 experts") as err:
        nikki.estimate(K.moe_prefill, *_specs(8, 2, 129))
    assert "at most 128 experts" in str(err.value)


def test_torch_wrapper_argument_errors():
    x, ids, weights, wg, wu, wd = _operands(8, 16, 32, 4, 2, seed=7)
    with pytest.raises(nikki.KernelError, match=r"nikki.torch.moe_prefill: activation"):
        nt.moe_prefill(x, ids, weights, wg, wu, wd, activation="relu")
    with pytest.raises(nikki.KernelError, match=r"nikki.torch.moe_prefill: expert_ids must be an integer tensor"):
        nt.moe_prefill(x, ids.float(), weights, wg, wu, wd)
    with pytest.raises(nikki.KernelError, match=r"nikki.torch.moe_prefill: weights"):
        nt.moe_prefill(x, ids, weights[:, :1], wg, wu, wd)


@pytest.mark.parametrize("t,h,i,e,k,experts", [(1, 8, 16, 1, 1, "auto"), (1, 72, 200, 8, 2, "auto"),
                                               (8, 64, 96, 8, 2, "auto"), (4, 40, 48, 16, 4, "selective"),
                                               (3, 130, 140, 5, 3, "all"), (128, 16, 24, 4, 2, "all"),
                                               (5, 24, 2100, 3, 2, "selective")])
def test_decode_matches_a_loop_over_experts(t, h, i, e, k, experts):
    _check(*_operands(t, h, i, e, k, seed=10 * t + e), experts=experts)


@pytest.mark.parametrize("experts", ["selective", "all"])
def test_decode_with_slots_that_route_nowhere_and_an_expert_named_twice(experts):
    x, ids, weights, wg, wu, wd = _operands(6, 24, 40, 4, 3, seed=11)
    ids[0, 1], ids[1, 2], ids[2, 2], ids[3, :] = -1, 4, ids[2, 0], -7  # token 3 routes nowhere: zeros
    _check(x, ids, weights, wg, wu, wd, experts=experts)


@pytest.mark.parametrize("dtype,tol", [(torch.bfloat16, (3e-2, 5e-2)), (torch.float16, (4e-3, 6e-3))])
@pytest.mark.parametrize("experts", ["selective", "all"])
def test_decode_16_bit_dtypes(dtype, tol, experts):
    _check(*_operands(8, 64, 128, 8, 2, seed=12, dtype=dtype), tol=tol, experts=experts)


def test_decode_reads_only_the_chosen_experts_or_each_expert_once():
    """The estimate's DMA traffic: selective reads k experts' weights for one token, all-experts
    reads each of the E experts once for eight tokens."""
    h, i, e, k = 256, 512, 8, 2
    expert_bytes = 3 * h * i * 4
    selective = nikki.estimate(K.moe_decode, *_specs(1, k, e, h, i))
    everyone = nikki.estimate(K.moe_decode, *_specs(8, k, e, h, i))
    assert k * expert_bytes <= selective.dma_bytes < 1.1 * k * expert_bytes
    assert e * expert_bytes <= everyone.dma_bytes < 1.1 * e * expert_bytes


def test_decode_argument_errors_name_the_argument_and_the_limit():
    x, ids, weights, wg, wu, wd = (a.numpy() for a in _operands(8, 16, 32, 4, 2, seed=13))
    with pytest.raises(nikki.KernelError, match=r"moe_decode: experts is 3") as err:
        K.moe_decode(x, ids, weights, wg, wu, wd, experts=3)
    assert "0 (choose), 1 (selective) or 2 (all experts)" in str(err.value)
    with pytest.raises(nikki.KernelError, match=r"moe_decode: x has 129 tokens") as err:
        nikki.estimate(K.moe_decode, *_specs(129, 2, 4))
    assert "use moe_prefill" in str(err.value)
    with pytest.raises(nikki.KernelError, match=r"moe_decode: 'w_up' is float16 but x is float32"):
        K.moe_decode(x, ids, weights, wg, wu.astype(np.float16), wd)
    xt, idt, wt, wgt, wut, wdt = _operands(2, 16, 32, 4, 2, seed=14)
    with pytest.raises(nikki.KernelError, match=r"nikki.torch.moe_decode: experts"):
        nt.moe_decode(xt, idt, wt, wgt, wut, wdt, experts="some")
    with pytest.raises(nikki.KernelError, match=r"nikki.torch.moe_decode: expert_ids must be an integer tensor"):
        nt.moe_decode(xt, idt.float(), wt, wgt, wut, wdt)


# --- moe_decode with fp8 expert weights ---------------------------------------------------------

def _quantized_experts(w, fp8):
    """Stacked expert weights [E, R, C] as fp8 values and float32 scales of each expert's columns."""
    scale = (w.abs().amax(1).double() / 240).clamp_min(1e-12).float()
    return (w.double() / scale[:, None, :].double()).to(fp8), scale


@pytest.mark.parametrize("fp8", [torch.float8_e4m3fn, torch.float8_e5m2])
@pytest.mark.parametrize("experts", ["selective", "all"])
def test_decode_with_fp8_experts_matches_the_loop_on_their_dequantized_weights(fp8, experts):
    x, ids, weights, wg, wu, wd = _operands(8, 64, 128, 8, 2, seed=21)
    q = [_quantized_experts(w, fp8) for w in (wg, wu, wd)]
    x = x.bfloat16()
    got = nt.moe_decode(x, ids, weights, *(w for w, _ in q), experts=experts, gate_scale=q[0][1],
                        up_scale=q[1][1], down_scale=q[2][1])
    dequantized = [w.double() * s.double()[:, None, :] for w, s in q]
    want = _want(x, ids, weights, *dequantized)
    assert got.dtype == torch.bfloat16 and got.shape == x.shape
    torch.testing.assert_close(got.double(), want, rtol=3e-2, atol=5e-2)  # test_decode_16_bit_dtypes' bf16 bound


def test_decode_with_fp8_experts_argument_errors_name_the_argument():
    x, ids, weights, wg, wu, wd = _operands(2, 16, 32, 4, 2, seed=22)
    q = [_quantized_experts(w, torch.float8_e4m3fn) for w in (wg, wu, wd)]
    fp8 = [w for w, _ in q]
    with pytest.raises(nikki.KernelError, match="nikki.torch.moe_decode: up_scale"):
        nt.moe_decode(x.bfloat16(), ids, weights, *fp8, gate_scale=q[0][1], down_scale=q[2][1])
    with pytest.raises(nikki.KernelError, match=r"nikki.torch.moe_decode: gate_scale.*not fp8"):
        nt.moe_decode(x, ids, weights, wg, wu, wd, gate_scale=q[0][1])
    with pytest.raises(nikki.KernelError, match=r"moe_decode_fp8: x is float32: TensorE multiplies fp8 weights"):
        nt.moe_decode(x, ids, weights, *fp8, gate_scale=q[0][1], up_scale=q[1][1], down_scale=q[2][1])
    with pytest.raises(nikki.KernelError, match=r"moe_decode_fp8: 'down_scale' must be float32 \[4, 16\], got "
                                                r"float32\[4, 32\]"):
        nt.moe_decode(x.bfloat16(), ids, weights, *fp8, gate_scale=q[0][1], up_scale=q[1][1], down_scale=q[1][1])
