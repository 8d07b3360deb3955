"""nikki's fused q/k/v projection (qkv, add_qkv and their backwards) against PyTorch.

The reference is the layer as a model writes it, in float64: the residual add, F.rms_norm or
F.layer_norm, three separate q/k/v projections (F.linear with the model's weights [out, in]),
the heads split to [B, heads, S, D], Hugging Face's apply_rotary_pos_emb on q and k. nikki gets
the same (rounded) values with the weights concatenated as w_qkv = cat(Wq, Wk, Wv).T.

Tolerances, relative to the largest reference value of each output (inputs at a trained layer's
scale, so every value is O(1)):
- float32: each output is a sum of H fp32 products of O(1 / sqrt(H)) terms and a few fp32
  operations of the norm and rope: within ~H^0.5 fp32 roundings, 2e-5 of the peak for H <= 4096.
- bfloat16: the kernel rounds x_norm once, the projection's sum once and rope's two products and
  their sum once (as torch in bf16): about four bf16 roundings (2^-8 each) of O(1) values, so
  2^-6 = 1.6e-2 of the peak.
Gradients sum over all B * S tokens (w_qkv, bias, the norm's weights) or over I and H (x): in
float32 1e-4 of the peak covers a few hundred tokens' fp32 sums; bfloat16 is checked in the
registry's property tests.
"""

import linecache

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

import nikki  # noqa: E402
import nikki.kernels as K  # noqa: E402
import nikki.torch as nt  # noqa: E402

TOLERANCE = {torch.float32: 2e-5, torch.bfloat16: 2.0 ** -6}
GRAD_TOLERANCE = 1e-4


def _rotate(x, interleaved):
    if interleaved:
        return torch.stack((-x[..., 1::2], x[..., 0::2]), -1).flatten(-2)
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), -1)


def _hf_rope(x, cos, sin, interleaved):
    """apply_rotary_pos_emb on the first r = cos.shape[-1] dims of x [B, H, S, D]."""
    r = cos.shape[-1]
    cos, sin = (t.unsqueeze(1) if t.dim() == 3 else t for t in (cos, sin))
    xr, xp = x[..., :r], x[..., r:]
    return torch.cat((xr * cos + _rotate(xr, interleaved) * sin, xp), -1)


def _tables(positions, rot_dim, dtype, interleaved):
    """cos, sin [*positions.shape, r] of a Llama rotary embedding at the given positions."""
    inv_freq = 1.0 / 10000.0 ** (torch.arange(0, rot_dim, 2, dtype=torch.float64) / rot_dim)
    freqs = positions.to(torch.float64)[..., None] * inv_freq
    emb = freqs.repeat_interleave(2, -1) if interleaved else torch.cat((freqs, freqs), -1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


class Layer:
    """Random weights of one attention projection at a trained layer's scale."""

    def __init__(self, hidden, q_heads, kv_heads, head_dim, dtype, *, bias=False, norm="rms", seed=0):
        g = torch.Generator().manual_seed(seed)
        self.q_heads, self.kv_heads, self.head_dim, self.norm = q_heads, kv_heads, head_dim, norm
        scale = hidden ** -0.5
        self.wq = (torch.randn(q_heads * head_dim, hidden, generator=g) * scale).to(dtype)
        self.wk = (torch.randn(kv_heads * head_dim, hidden, generator=g) * scale).to(dtype)
        self.wv = (torch.randn(kv_heads * head_dim, hidden, generator=g) * scale).to(dtype)
        self.biases = [(0.1 * torch.randn(w.shape[0], generator=g)).to(dtype) for w in (self.wq, self.wk, self.wv)] \
            if bias else None
        self.gamma = (1 + 0.2 * torch.randn(hidden, generator=g)).to(dtype) if norm else None
        self.beta = (0.1 * torch.randn(hidden, generator=g)).to(dtype) if norm == "layer" else None

    def w_qkv(self):
        return torch.cat([self.wq, self.wk, self.wv]).T.contiguous()

    def bias(self):
        return None if self.biases is None else torch.cat(self.biases)

    def nikki(self, x, cos=None, sin=None, interleaved=False, residual=None, eps=1e-6, **tensors):
        """nt.qkv_projection with this layer's weights (or the given replacements)."""
        args = dict(w_qkv=self.w_qkv(), bias=self.bias(), norm_weight=self.gamma, norm_bias=self.beta)
        args.update(tensors)
        return nt.qkv_projection(x, args["w_qkv"], self.q_heads, self.kv_heads, args["bias"], norm=self.norm,
                                 norm_weight=args["norm_weight"], norm_bias=args["norm_bias"], eps=eps, cos=cos,
                                 sin=sin, interleaved=interleaved, residual=residual)

    def torch(self, x, cos=None, sin=None, interleaved=False, residual=None, eps=1e-6, weights=None):
        """The same layer in plain PyTorch, in the dtype of its arguments; `weights` replaces
        (wq, wk, wv, biases, gamma, beta)."""
        wq, wk, wv, biases, gamma, beta = weights or (self.wq, self.wk, self.wv, self.biases, self.gamma, self.beta)
        total = x if residual is None else x + residual
        h = x.shape[-1]
        if self.norm == "rms":
            normed = F.rms_norm(total, (h,), gamma, eps)
        elif self.norm == "layer":
            normed = F.layer_norm(total, (h,), gamma, beta, eps)
        else:
            normed = total
        b, s, _ = x.shape
        heads = []
        for i, (w, n) in enumerate(((wq, self.q_heads), (wk, self.kv_heads), (wv, self.kv_heads))):
            y = F.linear(normed, w, None if biases is None else biases[i])
            heads.append(y.reshape(b, s, n, self.head_dim).transpose(1, 2))
        q, k, v = heads
        if cos is not None:
            q, k = _hf_rope(q, cos, sin, interleaved), _hf_rope(k, cos, sin, interleaved)
        return (q, k, v) if residual is None else (q, k, v, total)

    def float64(self):
        return tuple(None if t is None else [b.double() for b in t] if isinstance(t, list) else t.double()
                     for t in (self.wq, self.wk, self.wv, self.biases, self.gamma, self.beta))


def _assert_close(got, want, tol, what):
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)}, expected {tuple(want.shape)}"
    err = (got.double() - want.double()).abs().max().item()
    peak = max(1.0, want.double().abs().max().item())
    assert err <= tol * peak, f"{what}: worst error {err:.3g} > {tol:.3g} * {peak:.3g}"


def _x(b, s, h, dtype, seed):
    return torch.randn(b, s, h, generator=torch.Generator().manual_seed(seed)).to(dtype)


# (B, S, H, Hq, Hkv, D, r, bias): real models' projections at short sequences, and odd sizes with
# tails (S and H not multiples of 128, a row tile across sequences, GQA, partial rotary).
SHAPES = {
    "llama3_8b": (1, 6, 4096, 32, 8, 128, 128, False),
    "mistral_7b_two_sequences": (2, 3, 4096, 32, 8, 128, 128, False),
    "qwen2_0.5b_bias": (1, 20, 896, 14, 2, 64, 64, True),
    "phi_partial_rotary": (2, 33, 320, 4, 4, 80, 32, True),
    "odd_tails": (2, 130, 200, 6, 2, 32, 32, False),
    "mqa_long_block": (1, 515, 136, 4, 1, 64, 64, True),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("shape", list(SHAPES), ids=list(SHAPES))
def test_forward_matches_the_layer_in_float64(shape, dtype):
    b, s, h, hq, hkv, d, r, bias = SHAPES[shape]
    layer = Layer(h, hq, hkv, d, dtype, bias=bias, seed=1)
    x = _x(b, s, h, dtype, seed=2)
    cos, sin = _tables(torch.arange(s) + 7, r, dtype, False)
    got = layer.nikki(x, cos, sin)
    want = layer.torch(x.double(), cos.double(), sin.double(), weights=layer.float64())
    for name, g, w in zip("qkv", got, want):
        assert g.dtype == dtype
        _assert_close(g, w, TOLERANCE[dtype], f"{shape} {name}")


@pytest.mark.parametrize("norm", [None, "rms", "layer"], ids=["no_norm", "rmsnorm", "layernorm"])
@pytest.mark.parametrize("rope", ["none", "half_split", "interleaved", "partial_per_sequence"])
@pytest.mark.parametrize("residual", [False, True], ids=["", "residual"])
def test_every_option_matches_pytorch(norm, rope, residual):
    b, s, h, hq, hkv, d = 2, 70, 150, 4, 2, 32
    layer = Layer(h, hq, hkv, d, torch.float32, bias=True, norm=norm, seed=3)
    x = _x(b, s, h, torch.float32, seed=4)
    res = _x(b, s, h, torch.float32, seed=5) if residual else None
    tables = {}
    if rope != "none":
        interleaved = rope == "interleaved"
        positions = torch.arange(s) if rope != "partial_per_sequence" else torch.arange(s)[None] + torch.tensor([[0],
                                                                                                             [300]])
        cos, sin = _tables(positions, 16 if rope == "partial_per_sequence" else d, torch.float32, interleaved)
        tables = dict(cos=cos, sin=sin, interleaved=interleaved)
    got = layer.nikki(x, residual=res, eps=1e-5, **tables)
    want = layer.torch(x.double(), residual=None if res is None else res.double(), eps=1e-5, weights=layer.float64(),
                       **{k: v.double() if torch.is_tensor(v) else v for k, v in tables.items()})
    assert len(got) == (4 if residual else 3)
    for name, g, w in zip(["q", "k", "v", "sum"], got, want):
        _assert_close(g, w, TOLERANCE[torch.float32], name)
    if residual:
        assert torch.equal(got[3], x + res)  # the sum is one fp32 add, as torch's


def test_bf16_matches_the_layer_computed_in_bf16():
    """In bf16, torch's layer rounds at the same places as the kernel (x_norm, the projection, rope's
    products and sum): the two agree to one bf16 rounding of the largest values."""
    layer = Layer(256, 8, 2, 64, torch.bfloat16, bias=True, seed=6)
    x = _x(2, 40, 256, torch.bfloat16, seed=7)
    cos, sin = _tables(torch.arange(40), 64, torch.bfloat16, False)
    for name, g, w in zip("qkv", layer.nikki(x, cos, sin), layer.torch(x, cos, sin)):
        _assert_close(g, w, 2.0 ** -7, name)


def test_decode_rotates_each_sequence_at_its_own_position():
    """Decode: T new tokens per sequence at per-sequence positions (cos, sin [B, T, r])."""
    layer = Layer(128, 4, 2, 32, torch.float32, seed=8)
    lengths = torch.tensor([5, 0, 1000, 77])
    for t in (1, 3):
        x = _x(4, t, 128, torch.float32, seed=9 + t)
        cos, sin = _tables(lengths[:, None] + torch.arange(t), 32, torch.float32, False)
        got = layer.nikki(x, cos, sin)
        want = layer.torch(x.double(), cos.double(), sin.double(), weights=layer.float64())
        for name, g, w in zip("qkv", got, want):
            _assert_close(g, w, TOLERANCE[torch.float32], f"T={t} {name}")
        # Each sequence alone (its own [S, r] tables) gives the same bits.
        for i in range(4):
            alone = layer.nikki(x[i:i + 1], cos[i], sin[i])
            assert all(torch.equal(a[0], g[i]) for a, g in zip(alone, got))


def test_large_values_keep_their_precision():
    """Activations of magnitude 1e4 (an outlier-heavy residual stream): the norm scales them to O(1)
    and the result is as accurate as at unit scale."""
    layer = Layer(192, 2, 1, 64, torch.float32, bias=True, norm="layer", seed=10)
    x = _x(1, 50, 192, torch.float32, seed=11) * 1e4 + 3e4
    cos, sin = _tables(torch.arange(50), 64, torch.float32, False)
    for name, g, w in zip("qkv", layer.nikki(x, cos, sin),
                          layer.torch(x.double(), cos.double(), sin.double(), weights=layer.float64())):
        _assert_close(g, w, TOLERANCE[torch.float32], name)


def _gradients(layer, x, res, cos, sin, interleaved, probes):
    """Gradients of sum(output * probe) for nikki's layer and the float64 torch layer, in the order
    x, residual, w_qkv, bias, norm_weight, norm_bias (those that exist)."""
    w_qkv = layer.w_qkv().requires_grad_()
    bias = layer.bias().requires_grad_()
    gamma = None if layer.gamma is None else layer.gamma.clone().requires_grad_()
    beta = None if layer.beta is None else layer.beta.clone().requires_grad_()
    xi = x.clone().requires_grad_()
    ri = None if res is None else res.clone().requires_grad_()
    out = layer.nikki(xi, cos, sin, interleaved, residual=ri, w_qkv=w_qkv, bias=bias, norm_weight=gamma,
                      norm_bias=beta)
    sum(((o * p).sum() for o, p in zip(out, probes)), torch.zeros(())).backward()
    got = [t.grad for t in (xi, ri, w_qkv, bias, gamma, beta) if t is not None]

    wq, wk, wv, biases, g64, b64 = (None if t is None else [u.clone().requires_grad_() for u in t]
                                    if isinstance(t, list) else t.clone().requires_grad_() for t in layer.float64())
    x64 = x.double().requires_grad_()
    r64 = None if res is None else res.double().requires_grad_()
    out = layer.torch(x64, None if cos is None else cos.double(), None if sin is None else sin.double(), interleaved,
                      residual=r64, weights=(wq, wk, wv, biases, g64, b64))
    sum(((o * p.double()).sum() for o, p in zip(out, probes)), torch.zeros((), dtype=torch.float64)).backward()
    w_grad = torch.cat([wq.grad, wk.grad, wv.grad]).T
    want = [t.grad for t in (x64, r64) if t is not None] + [w_grad, torch.cat([b.grad for b in biases])]
    want += [t.grad for t in (g64, b64) if t is not None]
    return got, want


@pytest.mark.parametrize("norm,rope,residual", [
    ("rms", "half_split", False), ("layer", "interleaved", True), (None, "half_split", True),
    ("rms", "partial", True), ("layer", "none", False)])
def test_gradients_match_torch_autograd_in_float64(norm, rope, residual):
    b, s, h, hq, hkv, d = 2, 67, 136, 4, 2, 32
    layer = Layer(h, hq, hkv, d, torch.float32, bias=True, norm=norm, seed=12)
    x = _x(b, s, h, torch.float32, seed=13)
    res = _x(b, s, h, torch.float32, seed=14) if residual else None
    cos = sin = None
    if rope != "none":
        cos, sin = _tables(torch.arange(s) + 11, 16 if rope == "partial" else d, torch.float32, rope == "interleaved")
    g = torch.Generator().manual_seed(15)
    probes = [torch.randn(b, n, s, d, generator=g) for n in (hq, hkv, hkv)]
    if residual:
        probes.append(torch.randn(b, s, h, generator=g))
    got, want = _gradients(layer, x, res, cos, sin, rope == "interleaved", probes)
    names = ["x"] + (["residual"] if residual else []) + ["w_qkv", "bias"] + \
        (["norm_weight"] if norm else []) + (["norm_bias"] if norm == "layer" else [])
    assert len(got) == len(want) == len(names)
    for name, a, w in zip(names, got, want):
        _assert_close(a, w, GRAD_TOLERANCE, f"grad {name}")


def test_gradients_at_a_real_model_shape():
    """Llama-3-8B's projection (H = 4096, 32 q heads and 8 kv heads of 128) on 4 tokens."""
    layer = Layer(4096, 32, 8, 128, torch.float32, bias=True, seed=16)
    x = _x(1, 4, 4096, torch.float32, seed=17)
    cos, sin = _tables(torch.arange(4) + 100, 128, torch.float32, False)
    g = torch.Generator().manual_seed(18)
    probes = [torch.randn(1, n, 4, 128, generator=g) for n in (32, 8, 8)]
    got, want = _gradients(layer, x, None, cos, sin, False, probes)
    for name, a, w in zip(["x", "w_qkv", "bias", "norm_weight"], got, want):
        _assert_close(a, w, GRAD_TOLERANCE, f"grad {name}")


def test_torch_compile_fullgraph_matches_eager():
    layer = Layer(64, 2, 1, 32, torch.float32, bias=True, seed=19)
    x, res = _x(1, 16, 64, torch.float32, seed=20), _x(1, 16, 64, torch.float32, seed=21)
    cos, sin = _tables(torch.arange(16), 32, torch.float32, False)
    compiled = torch.compile(lambda *a: layer.nikki(*a[:3], residual=a[3]), fullgraph=True, backend="eager")
    for got, want in zip(compiled(x, cos, sin, res), layer.nikki(x, cos, sin, residual=res)):
        assert torch.equal(got, want)


@pytest.mark.parametrize("name", ["qkv", "add_qkv"])
def test_the_torch_ops_pass_opcheck(name):
    layer = Layer(48, 2, 1, 16, torch.float32, bias=True, norm="layer", seed=22)
    x = _x(1, 5, 48, torch.float32, seed=23).requires_grad_()
    cos, sin = _tables(torch.arange(5), 16, torch.float32, False)
    tensors = [layer.w_qkv().requires_grad_(), layer.bias().requires_grad_(), layer.gamma.clone().requires_grad_(),
               layer.beta.clone().requires_grad_(), cos, sin]
    if name == "add_qkv":
        tensors.insert(0, _x(1, 5, 48, torch.float32, seed=24).requires_grad_())
    options = dict(q_heads=2, kv_heads=1, norm=2, eps=1e-5, rope=True, interleaved=False)
    torch.library.opcheck(getattr(torch.ops.nikki, name).default, (x, *tensors), options)


def _raises_at_this_line(call, message):
    with pytest.raises(nikki.KernelError, match=message) as err:
        call()
    assert err.value.file == __file__, err.value.file
    return linecache.getline(__file__, err.value.line)


def test_kernel_argument_errors_name_the_argument_and_the_limit():
    layer = Layer(64, 2, 1, 32, torch.float32, bias=True, seed=25)
    x = _x(1, 8, 64, torch.float32, seed=26)
    w, bias, gamma, beta = layer.w_qkv(), layer.bias(), layer.gamma, torch.zeros(64)
    cos, sin = _tables(torch.arange(8), 32, torch.float32, False)
    opts = dict(q_heads=2, kv_heads=1)
    line = _raises_at_this_line(lambda: K.qkv(x[0], w, bias, gamma, beta, cos, sin, **opts),
                                r"qkv: x must be 3-D \[batch, seq, hidden\], got \[8, 64\]")
    assert "K.qkv(" in line
    _raises_at_this_line(lambda: K.qkv(x, w[:63], bias, gamma, beta, cos, sin, **opts),
                         r"w_qkv must be \[H, I\] with H = 64 \(x's last dim\), got \[63, 128\]")
    _raises_at_this_line(lambda: K.qkv(x, w, bias, gamma, beta, cos, sin, q_heads=3, kv_heads=1),
                         r"w_qkv's 128 columns are not q_heads \+ 2 kv_heads = 5 heads of one head_dim")
    _raises_at_this_line(lambda: K.qkv(x, w, bias, gamma, beta, cos, sin, q_heads=0, kv_heads=1),
                         r"q_heads and kv_heads must be at least 1, got 0 and 1")
    _raises_at_this_line(lambda: K.qkv(x, w.to(torch.bfloat16), bias, gamma, beta, cos, sin, **opts),
                         r"w_qkv must have x's dtype float32, got bfloat16")
    _raises_at_this_line(lambda: K.qkv(x, w, bias[:-1], gamma, beta, cos, sin, **opts),
                         r"bias must be \[128\], got \[127\]")
    _raises_at_this_line(lambda: K.qkv(x, w, bias, gamma[:-1], beta, cos, sin, **opts),
                         r"gamma must be \[64\], got \[63\]")
    _raises_at_this_line(lambda: K.qkv(x, w, bias, gamma, beta, cos, sin, norm=3, **opts),
                         r"norm must be 0 \(none\), 1 \(rmsnorm\) or 2 \(layernorm\), got 3")
    _raises_at_this_line(lambda: K.qkv(x, w, bias, gamma, beta, cos[:7], sin[:7], **opts),
                         r"cos \[7, 32\] does not match q \[1, 2, 8, 32\]")
    wide = torch.zeros(64, 4 * 640)
    _raises_at_this_line(lambda: K.qkv(x, wide, torch.zeros(4 * 640), gamma, beta, cos, sin, q_heads=2, kv_heads=1,
                                       rope=False),
                         r"head_dim 640 is larger than 512")
    res = _x(1, 8, 64, torch.float32, seed=27)
    _raises_at_this_line(lambda: K.add_qkv(x, res[:, :7], w, bias, gamma, beta, cos, sin, **opts),
                         r"add_qkv: residual must be \[1, 8, 64\], got \[1, 7, 64\]")


def test_backward_argument_errors_name_the_gradient():
    x = _x(1, 8, 64, torch.float32, seed=28)
    w, gamma, beta = torch.zeros(64, 128), torch.ones(64), torch.zeros(64)
    cos, sin = _tables(torch.arange(8), 32, torch.float32, False)
    mean, rstd = torch.zeros(8), torch.ones(8)
    gq, gkv = torch.zeros(1, 2, 8, 32), torch.zeros(1, 1, 8, 32)
    _raises_at_this_line(lambda: K.qkv_bwd(x, w, gamma, beta, cos, sin, mean, rstd, gq[:, :1], gkv, gkv, q_heads=2,
                                           kv_heads=1),
                         r"qkv_bwd: grad_q must be \[1, 2, 8, 32\], got \[1, 1, 8, 32\]")
    _raises_at_this_line(lambda: K.qkv_bwd(x, w, gamma, beta, cos, sin, mean[:4], rstd, gq, gkv, gkv, q_heads=2,
                                           kv_heads=1),
                         r"mean must be \[8\], got \[4\]")


def test_wrapper_argument_errors_name_the_argument():
    layer = Layer(64, 2, 1, 32, torch.float32, seed=29)
    x = _x(1, 8, 64, torch.float32, seed=30)
    w = layer.w_qkv()
    cos, sin = _tables(torch.arange(8), 32, torch.float32, False)
    what = r"nikki\.torch\.qkv_projection: "
    line = _raises_at_this_line(lambda: nt.qkv_projection(x, w, 2, 1, norm="batch"),
                                what + r"norm must be None, \"rms\" or \"layer\", got 'batch'")
    assert "nt.qkv_projection(" in line
    _raises_at_this_line(lambda: nt.qkv_projection(x[0], w, 2, 1), what + r"x must be a \[B, S, H\] tensor")
    _raises_at_this_line(lambda: nt.qkv_projection(x, w, 3, 1),
                         what + r"w_qkv must be a \[H, \(q_heads \+ 2 kv_heads\) \* D\] tensor with H = 64 and "
                                r"q_heads \+ 2 kv_heads = 5")
    _raises_at_this_line(lambda: nt.qkv_projection(x, w, 0, 1), what + r"q_heads must be .*at least 1")
    _raises_at_this_line(lambda: nt.qkv_projection(x, w, 2, 1, cos=cos),
                         what + r"sin must be a tensor when cos is given \(rope takes both\)")
    _raises_at_this_line(lambda: nt.qkv_projection(x, w, 2, 1, norm_weight=torch.ones(64)),
                         what + r"norm must be \"rms\" or \"layer\" when norm_weight or norm_bias is given")
    _raises_at_this_line(lambda: nt.qkv_projection(x, w, 2, 1, norm="rms", norm_bias=torch.zeros(64)),
                         what + r"norm_bias must be None with norm=\"rms\"")
    _raises_at_this_line(lambda: nt.qkv_projection(x, w, 2, 1, bias=torch.zeros(127)),
                         what + r"bias must be None or a tensor of shape \(128,\)")
    _raises_at_this_line(lambda: nt.qkv_projection(x, w, 2, 1, residual=x.half()),
                         what + r"residual must be a torch.float32 tensor of x's shape \(1, 8, 64\)")
    _raises_at_this_line(lambda: nt.qkv_projection(x, w, 2, 1, cos=cos, sin=sin, interleaved=1),
                         what + r"interleaved must be a bool")
    _raises_at_this_line(lambda: nt.qkv_projection(x, w, 2, 1, cos=cos[:5], sin=sin[:5]),
                         what + r"cos must be a \[S, r\] or \[B, S, r\] tensor with B, S = 1, 8 \(x's\), got shape "
                                r"\(5, 32\)")
