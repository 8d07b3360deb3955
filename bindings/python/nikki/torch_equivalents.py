"""PyTorch's own implementation of each library kernel's operation.

``TORCH[name](*inputs, params)`` computes what ``nikki.kernels.<name>`` computes, from torch
tensors of the kernel's inputs and its parameters (defaults filled in), and returns the outputs
in the kernel's order. The property tests compare every kernel against it in float64; the kernel
benchmarks (``nikki bench``) time it as the PyTorch CPU eager reference. A kernel PyTorch has no
implementation of is in ``NO_TORCH_EQUIVALENT`` with the reason.
"""

from __future__ import annotations

import math
from typing import Callable

import ml_dtypes
import torch
import torch.nn.functional as F


def _scale(params, d):
    s = params.get("scale")
    return None if s is None or math.isnan(s) else s


def _visible_keys(s, skv, params):
    """flash_attention's mask: None without one, else where query i (at key position
    i + prefix_len) sees key j: j <= i + prefix_len (causal), and j > i + prefix_len - window."""
    window, prefix = int(params.get("window", 0)), int(params.get("prefix_len", 0))
    if not (params.get("causal", 0) or window):
        return None
    i, j = torch.arange(s)[:, None] + prefix, torch.arange(skv)[None]
    return (j <= i) & (j > i - window) if window else j <= i


def _attention_logits(q, k, sinks, params):
    """Scaled, soft-capped, masked scores [B, H, S, Skv] with each head's sink logit as a last
    column: the softmax over it is flash_attention's."""
    scale = _scale(params, q.shape[-1]) or 1 / math.sqrt(q.shape[-1])
    s = (q @ k.repeat_interleave(q.shape[1] // k.shape[1], 1).transpose(-1, -2)) * scale
    cap = params.get("softcap", 0)
    if cap:
        s = cap * torch.tanh(s / cap)
    visible = _visible_keys(s.shape[-2], s.shape[-1], params)
    if visible is not None:
        s = s.masked_fill(~visible, float("-inf"))
    return torch.cat([s, sinks.to(s.dtype)[None, :, None, None].expand(*s.shape[:-1], 1)], -1)


def _flash_attention(q, k, v, sinks, params):
    """[out, lse]: PyTorch's fused SDPA when the call has no sink and no soft-cap (what the
    benchmarks time), else a softmax over the scores and the sink column."""
    if params.get("softcap", 0) == 0 and bool(torch.isneginf(sinks).all()):
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=_visible_keys(q.shape[2], k.shape[2], params),
                                             scale=_scale(params, q.shape[-1]), enable_gqa=True)
    else:
        p = torch.softmax(_attention_logits(q, k, sinks, params), -1)[..., :-1]
        out = p @ v.repeat_interleave(q.shape[1] // k.shape[1], 1)
    return [out, torch.logsumexp(_attention_logits(q, k, sinks, params), -1)]


def _attention_bwd(q, k, v, sinks, out, lse, grad_out, params):
    q, k, v, sinks = (t.clone().requires_grad_() for t in (q, k, v, sinks))
    return list(torch.autograd.grad(_flash_attention(q, k, v, sinks, params)[0], (q, k, v, sinks), grad_out,
                                    allow_unused=True, materialize_grads=True))


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


def _topk(x, params):
    """torch.topk's values; the indices of torch's stable descending sort, which orders equal
    values by index as the kernel does (torch.topk itself leaves the order of ties unspecified)."""
    k = int(params["k"])
    values, order = torch.sort(x, dim=-1, descending=True, stable=True)
    return [values[:, :k], order[:, :k]]


def _gelu_tanh(t):
    return F.gelu(t, approximate="tanh")


_GATE_ACTIVATIONS: list[Callable] = [F.silu, F.gelu, _gelu_tanh]


def _gated_mlp(x, w_gate, w_up, w_down, b_gate, b_up, b_down, params):
    act = _GATE_ACTIVATIONS[int(params["activation"])]
    return [(act(x @ w_gate + b_gate) * (x @ w_up + b_up)) @ w_down + b_down]


def _gated_mlp_fp8(x, w_gate, w_up, w_down, s_gate, s_up, s_down, b_gate, b_up, b_down, params):
    act = _GATE_ACTIVATIONS[int(params["activation"])]
    h = act((x @ w_gate) * s_gate + b_gate) * ((x @ w_up) * s_up + b_up)
    return [(h @ w_down) * s_down + b_down]


def _router_topk(x, w_router, bias, params):
    """A router as MoE models write it: scores, the top k (ties by the stable sort's order), the
    optional activation over the selected and renormalization."""
    k, sigmoid = int(params["k"]), bool(params["sigmoid"])
    act = torch.sigmoid if sigmoid else (lambda t: torch.softmax(t, -1))
    logits = x @ w_router + bias
    scores = logits if params["select_first"] else act(logits)
    _, order = torch.sort(scores, dim=-1, descending=True, stable=True)
    ids = order[:, :k]
    weights = scores.gather(1, ids)
    if params["select_first"]:
        weights = act(weights)
    if params["normalize"] and not (params["select_first"] and not sigmoid):
        weights = weights / weights.sum(-1, keepdim=True)
    return [weights, ids]


def _cumsum(x, params):
    if params.get("reverse", 0):
        return torch.flip(torch.cumsum(torch.flip(x, [-1]), -1), [-1])
    return torch.cumsum(x, -1)


def _cumsum_bwd(grad_out, params):
    x = torch.zeros_like(grad_out, requires_grad=True)
    return list(torch.autograd.grad(_cumsum(x, params), x, grad_out))


def _cross_entropy_loss(logits, targets, params):
    return F.cross_entropy(logits, targets.long(), reduction="none", ignore_index=int(params["ignore_index"]),
                           label_smoothing=params["label_smoothing"])


def _cross_entropy_bwd(logits, targets, lse, grad_loss, params):
    logits = logits.clone().requires_grad_()
    return list(torch.autograd.grad(_cross_entropy_loss(logits, targets, params), logits, grad_loss))


def _add_rmsnorm(x, residual, gamma, params):
    normed, rstd = _rmsnorm(x + residual, gamma, params)
    return [normed, x + residual, rstd]


def _add_rmsnorm_bwd(total, gamma, rstd, grad_out, grad_sum, params):
    grad_x, grad_gamma = _rmsnorm_bwd(total, gamma, rstd, grad_out, params)
    return [grad_x + grad_sum, grad_x + grad_sum, grad_gamma]


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


def _causal_conv1d(x, weight, bias, initial_state, params):
    """F.conv1d with groups=C on x left-padded with the state's last K - 1 tokens (zeros before a
    shorter state), then SiLU."""
    history = weight.shape[1] - 1
    padded = F.pad(initial_state, (max(0, history - initial_state.shape[2]), 0))
    z = F.conv1d(torch.cat((padded[..., padded.shape[2] - history:], x), -1), weight[:, None, :], bias,
                 groups=x.shape[1])
    return F.silu(z) if params.get("silu", 0) else z


def _causal_conv1d_bwd(x, weight, bias, initial_state, grad_out, params):
    x, weight, bias, initial_state = leaves = [t.clone().requires_grad_() for t in (x, weight, bias, initial_state)]
    grads = torch.autograd.grad(_causal_conv1d(x, weight, bias, initial_state, params), leaves, grad_out,
                                allow_unused=True)
    return [torch.zeros_like(t) if g is None else g for g, t in zip(grads, leaves)]


def _conv1d(x, weight, bias, params):
    out = F.conv1d(x, weight, bias, stride=int(params.get("stride", 1)), padding=int(params.get("padding", 0)),
                   dilation=int(params.get("dilation", 1)), groups=int(params.get("groups", 1)))
    activation = int(params.get("activation", 0))
    return F.silu(out) if activation == 1 else F.gelu(out) if activation == 2 else out


def _conv1d_bwd(x, weight, bias, grad_out, params):
    x, weight, bias = leaves = [t.clone().requires_grad_() for t in (x, weight, bias)]
    return list(torch.autograd.grad(_conv1d(x, weight, bias, params), leaves, grad_out))


def _pool_window(params):
    """(kernel_size, stride, padding) of a pooling kernel's parameters (stride 0: the kernel)."""
    kernel = (int(params.get("kernel_h", 2)), int(params.get("kernel_w", 2)))
    stride = tuple(int(params.get(n, 0)) or k for n, k in (("stride_h", kernel[0]), ("stride_w", kernel[1])))
    return kernel, stride, (int(params.get("padding_h", 0)), int(params.get("padding_w", 0)))


def _max_pool2d(x, params):
    return F.max_pool2d(x, *_pool_window(params))


def _avg_pool2d(x, params):
    kernel, stride, padding = _pool_window(params)
    return F.avg_pool2d(x, kernel, stride, padding, count_include_pad=bool(params.get("count_include_pad", 1)))


def _pool_grad(pool, x, grad_out, params):
    x = x.clone().requires_grad_()
    return list(torch.autograd.grad(pool(x, params), x, grad_out))


def _padding(params):
    pad = params.get("padding_idx")
    return None if pad is None or math.isnan(pad) else int(pad)


def _embedding_bwd(weight, ids, grad_out, params):
    weight = weight.clone().requires_grad_()
    return list(torch.autograd.grad(F.embedding(ids.long(), weight, padding_idx=_padding(params)), weight, grad_out))


def _gather_rows(x, idx, params):
    """x[idx] with zero rows where idx is outside [0, rows)."""
    valid = (idx >= 0) & (idx < x.shape[0])
    return torch.where(valid[:, None], x[idx.long().clamp(0, x.shape[0] - 1)], torch.zeros((), dtype=x.dtype))


def _gather_rows_bwd(x, idx, grad_out, params):
    x = x.clone().requires_grad_()
    return list(torch.autograd.grad(_gather_rows(x, idx, params), x, grad_out))


def _scatter_add_rows(rows, idx, scale, params):
    """index_add_ of the scaled rows whose index lies in [0, num_rows)."""
    valid = (idx >= 0) & (idx < params["num_rows"])
    out = torch.zeros(int(params["num_rows"]), rows.shape[1], dtype=torch.promote_types(rows.dtype, scale.dtype))
    return out.index_add(0, idx[valid].long(), (scale[:, None] * rows)[valid]).to(rows.dtype)


def _scatter_add_rows_bwd(rows, idx, scale, grad_out, params):
    rows, scale = rows.clone().requires_grad_(), scale.clone().requires_grad_()
    return list(torch.autograd.grad(_scatter_add_rows(rows, idx, scale, params), (rows, scale), grad_out))


def _decode_attention(q, k_cache, v_cache, k, v, lengths, sinks, params):
    """A decode step as a model does it: the new keys and values into (copies of) the caches at
    each sequence's length, then attention of the new tokens over positions up to their own, each
    head's sink logit joining the softmax (GPT-OSS: softmax over [scores, sink], the sink's column
    dropped)."""
    k_cache, v_cache = k_cache.clone(), v_cache.clone()
    _b, h, t, d = q.shape
    group, window = h // k_cache.shape[1], int(params["window"])
    scale = _scale(params, None)
    scale = 1 / math.sqrt(d) if scale is None else scale
    out = torch.empty_like(q)
    for b, length in enumerate(int(x) for x in lengths):
        k_cache[b, :, length:length + t] = k[b]
        v_cache[b, :, length:length + t] = v[b]
        n = length + t
        position = torch.arange(length, n)[:, None]
        visible = torch.arange(n)[None] <= position
        if window > 0:
            visible &= torch.arange(n)[None] > position - window
        keys = k_cache[b, :, :n].repeat_interleave(group, 0)
        values = v_cache[b, :, :n].repeat_interleave(group, 0)
        scores = (scale * q[b] @ keys.transpose(-1, -2)).masked_fill(~visible, -math.inf)
        sink = sinks.to(scores.dtype)[:, None, None].expand(h, t, 1)
        p = torch.softmax(torch.cat([scores, sink], -1), -1)[..., :n]
        out[b] = p @ values
    return [out, k_cache, v_cache]


def _linear_recurrence(a, b, h0, params):
    """h_t = a_t * h_{t-1} + b_t along the last dim, one step at a time (unbound first: indexing
    step by step would make autograd add a full-size gradient per step)."""
    state, steps = h0, []
    for a_t, b_t in zip(a.unbind(-1), b.unbind(-1)):
        state = a_t * state + b_t
        steps.append(state)
    return torch.stack(steps, -1)


def _linear_recurrence_bwd(a, h0, h, grad_h, params):
    """Autograd through the step loop, with the b that gives the forward's h from a and h0."""
    h_prev = torch.cat((h0[..., None], h[..., :-1]), -1)
    a, b, h0 = leaves = [t.clone().requires_grad_() for t in (a, h - a * h_prev, h0)]
    return list(torch.autograd.grad(_linear_recurrence(a, b, h0, params), leaves, grad_h))


def _selective_scan(u, delta, A, Bm, Cm, Dskip, z, delta_bias, h0, params):
    """Mamba's selective scan one step at a time: the state [B, D, N] updated per token."""
    dt = delta + delta_bias[:, None]
    if params.get("delta_softplus", 0):
        dt = F.softplus(dt)
    state, ys = h0, []
    for t in range(u.shape[-1]):
        decay = torch.exp(dt[..., t, None] * A)
        state = decay * state + (dt[..., t] * u[..., t])[..., None] * Bm[:, None, :, t]
        ys.append((state * Cm[:, None, :, t]).sum(-1) + Dskip * u[..., t])
    y = torch.stack(ys, -1)
    if params.get("gate", 0):
        y = y * F.silu(z)
    return [y, state]



def _selective_scan_bwd(u, delta, A, Bm, Cm, Dskip, z, delta_bias, h0, grad_y, grad_last_state, params):
    leaves = [t.clone().requires_grad_() for t in (u, delta, A, Bm, Cm, Dskip, z, delta_bias, h0)]
    u, delta, A, Bm, Cm, Dskip, z, delta_bias, h0 = leaves
    y, last_state = _selective_scan(u, delta, A, Bm, Cm, Dskip, z, delta_bias, h0, params)
    grads = torch.autograd.grad((y, last_state), leaves, (grad_y, grad_last_state), allow_unused=True)
    return [torch.zeros_like(t) if g is None else g for g, t in zip(grads, leaves)]


def _paged_decode_attention(q, k_cache, v_cache, k, v, block_table, lengths, sinks, params):
    """vLLM's paged cache: position j of sequence b is row j % block_size of block
    block_table[b, j // block_size]. The decode step over each sequence's blocks gathered in table
    order, the new rows written back into their blocks (of copies of the caches)."""
    block_size, table = k_cache.shape[2], block_table.long()

    def gathered(cache):  # [B, Hkv, max_blocks * block_size, D]
        return cache[table].transpose(1, 2).flatten(2, 3)

    out, k_rows, v_rows = _decode_attention(q, gathered(k_cache), gathered(v_cache), k, v, lengths, sinks, params)
    k_cache, v_cache = k_cache.clone(), v_cache.clone()
    for b, length in enumerate(int(x) for x in lengths):
        for j in range(length, length + q.shape[2]):
            block, row = table[b, j // block_size], j % block_size
            k_cache[block, :, row] = k_rows[b, :, j]
            v_cache[block, :, row] = v_rows[b, :, j]
    return [out, k_cache, v_cache]


# Neuron's float8_e4m3 saturation bound (240): the quant kernels' range. torch has only OCP's
# float8_e4m3fn, whose encoding of every value within +-240 is the same.
_E4M3_MAX = float(ml_dtypes.finfo(ml_dtypes.float8_e4m3).max)


def _to_fp8_grid(v):
    return v.to(torch.float8_e4m3fn).to(v.dtype)


def _rmsnorm_quant(x, gamma, scale, params):
    y = F.rms_norm(x, (x.shape[-1],), gamma, params.get("eps", 1e-6))
    scales = scale.expand(x.shape[0])
    return [_to_fp8_grid((y / scales[:, None]).clamp(-_E4M3_MAX, _E4M3_MAX)), scales]


def _rmsnorm_quant_dynamic(x, gamma, params):
    y = F.rms_norm(x, (x.shape[-1],), gamma, params.get("eps", 1e-6))
    scales = (y.abs().amax(-1) / _E4M3_MAX).clamp_min(torch.finfo(torch.float32).tiny)
    return [_to_fp8_grid((y / scales[:, None]).clamp(-_E4M3_MAX, _E4M3_MAX)), scales]


def _qkv_norm(x, gamma, beta, params):
    """(x_norm, mean, rstd) of the rows of x [B, S, H] as the qkv kernels define them: norm 0 passes
    x through (mean 0, rstd 1), 1 is F.rms_norm (mean 0), 2 is F.layer_norm."""
    rows, norm, eps = x.reshape(-1, x.shape[-1]), int(params["norm"]), params["eps"]
    zeros, ones = rows.new_zeros(rows.shape[0]), rows.new_ones(rows.shape[0])
    if norm == 0:
        return x, zeros, ones
    if norm == 1:
        return F.rms_norm(x, (x.shape[-1],), gamma, eps), zeros, torch.rsqrt(rows.pow(2).mean(-1) + eps)
    return (F.layer_norm(x, (x.shape[-1],), gamma, beta, eps), rows.mean(-1),
            torch.rsqrt(rows.var(-1, unbiased=False) + eps))


def _qkv_heads(x, w_qkv, bias, gamma, beta, cos, sin, params):
    """[q, k, v, mean, rstd]: F.linear on the normalized x, the heads split to [B, heads, S, D], q
    and k rotated by Hugging Face's apply_rotary_pos_emb."""
    hq, hkv = int(params["q_heads"]), int(params["kv_heads"])
    b, s, _ = x.shape
    normed, mean, rstd = _qkv_norm(x, gamma, beta, params)
    d = w_qkv.shape[1] // (hq + 2 * hkv)
    heads = F.linear(normed, w_qkv.T, bias).reshape(b, s, hq + 2 * hkv, d).transpose(1, 2)
    q, k, v = heads.split([hq, hkv, hkv], dim=1)
    if params["rope"]:
        q, k = (_apply_rotary_pos_emb(t, cos, sin, params) for t in (q, k))
    return [q, k, v, mean, rstd]


def _add_qkv(x, residual, w_qkv, bias, gamma, beta, cos, sin, params):
    total = x + residual
    q, k, v, mean, rstd = _qkv_heads(total, w_qkv, bias, gamma, beta, cos, sin, params)
    return [q, k, v, total, mean, rstd]


def _qkv_bwd(x, w_qkv, gamma, beta, cos, sin, mean, rstd, grad_q, grad_k, grad_v, params, grad_sum=None):
    """torch's autograd of _qkv_heads (bias zeros: its gradient does not depend on it); with
    grad_sum (add_qkv's backward) the gradient reaching x is also grad_residual's."""
    x, w_qkv, gamma, beta = (t.clone().requires_grad_() for t in (x, w_qkv, gamma, beta))
    bias = x.new_zeros(w_qkv.shape[1], requires_grad=True)
    q, k, v = _qkv_heads(x, w_qkv, bias, gamma, beta, cos, sin, params)[:3]
    used = torch.autograd.grad((q, k, v), (x, w_qkv, bias, gamma, beta), (grad_q, grad_k, grad_v),
                               allow_unused=True)
    grads = [torch.zeros_like(t) if g is None else g for g, t in zip(used, (x, w_qkv, bias, gamma, beta))]
    if grad_sum is None:
        return grads
    return [grads[0] + grad_sum, grads[0] + grad_sum, *grads[1:]]


# --- mixture of experts ---------------------------------------------------------------------------

def _find_nonzero_indices(x, params):
    """Per column of x [T, C], torch.nonzero's rows, then -1; and their count."""
    T, C = x.shape
    indices = torch.full((C, T), -1, dtype=torch.int64)
    counts = torch.zeros(C, dtype=torch.int64)
    for c in range(C):
        rows = torch.nonzero(x[:, c] != 0).reshape(-1)
        indices[c, :rows.numel()] = rows
        counts[c] = rows.numel()
    return [indices, counts]


def _routed_experts(x, expert_ids, weights, w_gate, w_up, w_down, params):
    """The loop over experts: each expert's gated MLP on the tokens routed to it, scaled by the
    sum of the weights of the slots that name it (ids outside [0, E) route nowhere)."""
    act = _GATE_ACTIVATIONS[int(params["activation"])]
    num_experts = w_gate.shape[0]
    ids = expert_ids.long()
    out = torch.zeros_like(x)
    for e in range(num_experts):
        affinity = (weights * (ids == e)).sum(-1)
        routed = (ids == e).any(-1)
        if not routed.any():
            continue
        xe = x[routed]
        y = (act(xe @ w_gate[e]) * (xe @ w_up[e])) @ w_down[e]
        out[routed] += affinity[routed, None].to(y.dtype) * y
    return [out]


def _routed_experts_fp8(x, expert_ids, weights, w_gate, w_up, w_down, s_gate, s_up, s_down, params):
    """_routed_experts on the dequantized expert weights (each column times its scale)."""
    return _routed_experts(x, expert_ids, weights, w_gate * s_gate[:, None, :], w_up * s_up[:, None, :],
                           w_down * s_down[:, None, :], params)


TORCH = {
    "matmul": lambda a, b, p: [a @ b],
    "softmax": lambda x, p: [torch.softmax(x, -1)],
    "softmax_bwd": lambda out, g, p: [torch._softmax_backward_data(g, out, -1, g.dtype)],
    "layernorm": _layernorm,
    "layernorm_bwd": _layernorm_bwd,
    "rmsnorm": _rmsnorm,
    "rmsnorm_bwd": _rmsnorm_bwd,
    "flash_attention": _flash_attention,
    "flash_attention_bwd": _attention_bwd,
    "adamw": _adamw,
    "topk": _topk,
    "gated_mlp": _gated_mlp,
    "gated_mlp_fp8": _gated_mlp_fp8,
    "router_topk": _router_topk,
    "cumsum": lambda x, p: [_cumsum(x, p)],
    "cumsum_bwd": _cumsum_bwd,
    "cross_entropy": lambda logits, targets, p: [_cross_entropy_loss(logits, targets, p), torch.logsumexp(logits, -1)],
    "cross_entropy_bwd": _cross_entropy_bwd,
    "add_rmsnorm": _add_rmsnorm,
    "add_rmsnorm_bwd": _add_rmsnorm_bwd,
    "rope": lambda x, cos, sin, p: [_apply_rotary_pos_emb(x, cos, sin, p)],
    "rope_bwd": _rope_bwd,
    "output_projection": lambda attn, w_o, bias, residual, p: [attn @ w_o + bias + residual],
    "output_projection_bwd": _output_projection_bwd,
    "causal_conv1d": lambda x, weight, bias, initial_state, p: [_causal_conv1d(x, weight, bias, initial_state, p)],
    "causal_conv1d_bwd": _causal_conv1d_bwd,
    "conv1d": lambda x, weight, bias, p: [_conv1d(x, weight, bias, p)],
    "conv1d_bwd": _conv1d_bwd,
    "embedding": lambda weight, ids, p: [F.embedding(ids.long(), weight, padding_idx=_padding(p))],
    "embedding_bwd": _embedding_bwd,
    "gather_rows": lambda x, idx, p: [_gather_rows(x, idx, p)],
    "gather_rows_bwd": _gather_rows_bwd,
    "scatter_add_rows": lambda rows, idx, scale, p: [_scatter_add_rows(rows, idx, scale, p)],
    "scatter_add_rows_bwd": _scatter_add_rows_bwd,
    "decode_attention": _decode_attention,
    "max_pool2d": lambda x, p: [_max_pool2d(x, p)],
    "max_pool2d_bwd": lambda x, out, grad_out, p: _pool_grad(_max_pool2d, x, grad_out, p),
    "avg_pool2d": lambda x, p: [_avg_pool2d(x, p)],
    "avg_pool2d_bwd": lambda x, grad_out, p: _pool_grad(_avg_pool2d, x, grad_out, p),
    "linear_recurrence": lambda a, b, h0, p: [_linear_recurrence(a, b, h0, p)],
    "linear_recurrence_bwd": _linear_recurrence_bwd,
    "selective_scan": _selective_scan,
    "selective_scan_bwd": _selective_scan_bwd,
    "paged_decode_attention": _paged_decode_attention,
    "rmsnorm_quant": _rmsnorm_quant,
    "rmsnorm_quant_dynamic": _rmsnorm_quant_dynamic,
    "fp8_matmul": lambda a, a_scale, b, b_scale, bias, p: [(a @ b) * a_scale[:, None] * b_scale[None, :] + bias],
    "qkv": _qkv_heads,
    "qkv_bwd": _qkv_bwd,
    "add_qkv": _add_qkv,
    "add_qkv_bwd": lambda total, w, gamma, beta, cos, sin, mean, rstd, gq, gk, gv, grad_sum, p: _qkv_bwd(
        total, w, gamma, beta, cos, sin, mean, rstd, gq, gk, gv, p, grad_sum),
    # mixture of experts
    "find_nonzero_indices": _find_nonzero_indices,
    "moe_prefill": _routed_experts,
    "moe_decode": _routed_experts,
    "moe_decode_fp8": _routed_experts_fp8,
}
# Kernels PyTorch has no implementation of, with the reason; every other kernel must be in TORCH.
NO_TORCH_EQUIVALENT: dict = {}
