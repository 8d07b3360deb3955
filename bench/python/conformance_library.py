"""The nki-library kernels bench/python/conformance.py runs, each at a small shape, against the
library's own torch reference.

A case names the kernel (module and function of ``nkilib_src.nkilib``), its torch reference, and a
function making the kernel's keyword arguments (numpy arrays and constants, seeded). Like the
library's test harness, the reference is called with the same arguments as torch tensors and
returns a dict of named outputs; the kernel's outputs are taken in that order. Output buffers
that the kernel writes in place are passed as arguments (the harness's ``must_alias_input``).

The shapes were chosen by reading each kernel's own tests (their smallest single-core cases);
nothing here is copied from the library.
"""

from __future__ import annotations

import dataclasses

import numpy as np

try:
    import ml_dtypes

    BF16 = ml_dtypes.bfloat16
except ImportError:  # pragma: no cover - installed with nikki
    BF16 = np.float32


@dataclasses.dataclass
class Case:
    """One kernel call: kernel and reference as "module:function" under nkilib_src.nkilib (the kernel
    may also be a function returning the kernel to call, for kernels that write into parameters)."""

    name: str
    kernel: str
    reference: str | None  # None: the library has no torch reference module; call_reference is torch alone
    inputs: object  # () -> dict of keyword arguments
    atol: float = 1e-3
    rtol: float = 1e-3
    lnc: int = 1
    note: str = ""  # why a case is expected not to run, when it is not
    call_reference: object = None  # (reference, inputs as torch) -> outputs, when its signature differs
    # output index -> (got, expected, inputs) -> a problem or "": for outputs the element-wise
    # comparison cannot judge, such as indices of near-tied values
    own_checks: dict = dataclasses.field(default_factory=dict)


def _lib(module: str):
    """A module of the nki-library checkout (importable once the case runs)."""
    import importlib

    return importlib.import_module("nkilib_src.nkilib." + module)


def _rng(seed: int = 42):
    return np.random.default_rng(seed)


def _normal(rng, shape, dtype=np.float32):
    return rng.standard_normal(shape, dtype=np.float32).astype(dtype)


def _cumsum():
    return {"x": _normal(_rng(), (4, 256))}


def _rmsnorm_tkg():
    rng = _rng()
    b, s, h = 1, 4, 1024
    return {"input": _normal(rng, (b, s, h), np.float16), "gamma": _normal(rng, (1, h), np.float16),
            "output": np.zeros((128, b * s, h // 128), np.float16)}


def _layernorm_tkg():
    rng = _rng()
    b, s, h = 1, 4, 1024
    return {"input": _normal(rng, (b, s, h), np.float16), "gamma": _normal(rng, (1, h), np.float16),
            "output": np.zeros((128, b * s, h // 128), np.float16), "beta": _normal(rng, (1, h), np.float16)}


def _cascaded_max():
    return {"input_tensor": _normal(_rng(), (2, 3, 1024))}


def _rope():
    rng = _rng()
    d_head, b, heads, s = 64, 1, 2, 128
    return {"x_in": _normal(rng, (d_head, b, heads, s), BF16), "cos": _normal(rng, (d_head // 2, b, s), BF16),
            "sin": _normal(rng, (d_head // 2, b, s), BF16), "lnc_shard": True, "contiguous_layout": True,
            "relayout_in_sbuf": False}


def _rope_hf():
    rng = _rng()
    q = _normal(rng, (1, 2, 128, 64))
    k = _normal(rng, (1, 1, 128, 64))
    return {"q": q, "k": k, "q_out": np.zeros_like(q), "k_out": np.zeros_like(k),
            "cos": _normal(rng, (1, 128, 64)), "sin": _normal(rng, (1, 128, 64)), "backward": False}


def _output_projection_tkg():
    rng = _rng()
    d_head, b, heads, s, h = 64, 4, 2, 1, 1024
    quant = _lib("core.utils.common_types").QuantizationType
    return {"attention": _normal(rng, (d_head, b, heads, s), BF16), "weight": _normal(rng, (d_head * heads, h), BF16),
            "bias": _normal(rng, (1, h), BF16), "quantization_type": quant.NONE, "weight_scale": None,
            "input_scale": None, "TRANSPOSE_OUT": False, "OUT_IN_SB": False}


def _output_projection_cte():
    rng = _rng()
    b, heads, d_head, s, h = 1, 2, 64, 128, 512
    return {"attention": _normal(rng, (b, heads, d_head, s), BF16), "weight": _normal(rng, (heads * d_head, h), BF16),
            "bias": _normal(rng, (1, h), BF16)}


def _dynamic_add():
    rng = _rng()
    return {"input_a": _normal(rng, (256, 512), BF16), "input_b": _normal(rng, (256, 512), BF16),
            "num_m_tiles": np.array([[2]], np.int32)}


def _conv1d():
    rng = _rng()
    return {"x_in": _normal(rng, (1, 16, 20)), "filters": _normal(rng, (3, 16, 32)), "bias": _normal(rng, (32,)),
            "stride": 1, "padding": (1, 1), "dilation": 1,
            "activation_fn": _lib("core.utils.common_types").ActFnType.SiLU, "lnc_shard": False}


def _cross_entropy():
    rng = _rng()
    return {"logits_hbm": _normal(rng, (32, 1024)), "targets_hbm": rng.integers(0, 1024, (32,), dtype=np.int32),
            "positions_per_batch": 32, "chunk_size": 1024, "dtype": np.float32}


def _cross_entropy_backward():
    rng = _rng()
    logits = _normal(rng, (64, 2048))
    shifted = logits - logits.max(axis=1, keepdims=True)
    lse = (np.log(np.exp(shifted).sum(axis=1)) + logits.max(axis=1)).astype(np.float32)
    return {"logits_hbm": logits, "targets_hbm": rng.integers(0, 2048, (64,), dtype=np.int32), "lse_state_hbm": lse,
            "reduction": "mean", "positions_per_batch": 32, "chunk_size": 1024, "dtype": np.float32,
            "inplace": False}


def _depthwise_conv1d():
    rng = _rng()
    n, c, w, taps = 2, 256, 300, 7
    return {"img_ref": _normal(rng, (n, c, 1, w), BF16), "filter_ref": _normal(rng, (c, 1, 1, taps), BF16),
            "padding": ((0, 0), (3, 3)), "stride": (1, 2), "feature_group_count": c}


def _depthwise_conv1d_torch(_reference, t):
    """torch's grouped conv1d, which is what the library's test compares the kernel with."""
    import torch

    x, w = t["img_ref"].float()[:, :, 0, :], t["filter_ref"].float()[:, 0, :, :]
    (_, _), (left, right) = t["padding"]
    x = torch.nn.functional.pad(x, (left, right))
    return torch.nn.functional.conv1d(x, w, stride=t["stride"][1], groups=x.shape[1]).unsqueeze(2)


def _rotational_topk():
    import nki.language as nl

    utils = _lib("core.topk.rotational_topk_utils")
    batch, seqlen, vocab, k = 4, 5, 3999, 20
    inp = _normal(_rng(), (batch * seqlen, vocab))
    topk_config = utils.create_topk_config(inp_shape=(batch, seqlen, vocab), inp_dtype=nl.float32, k=k, sorted=True,
                                           num_programs=1)
    config = utils.create_rotational_topk_config(inp_shape=inp.shape, topk_config=topk_config)
    return {"inp": inp, "config": _lib("core.topk.rotational_topk").prepare_rotational_constants(config)}


def _qkv(seqlen: int):
    def inputs():
        types = _lib("core.utils.common_types")
        rng = _rng()
        b, h, q_heads, kv_heads, d = 1, 1024, 8, 2, 64
        shape = (b, seqlen, h)
        return {"input": _normal(rng, shape, BF16), "fused_qkv_weights": 0.05 * _normal(rng, (h, (q_heads + 2 * kv_heads) * d), BF16),
                "fused_residual_add": True, "mlp_prev": _normal(rng, shape, BF16),
                "attention_prev": _normal(rng, shape, BF16), "fused_norm_type": types.NormType.RMS_NORM,
                "gamma_norm_weights": _normal(rng, (1, h), BF16), "norm_eps": 1e-6}
    return inputs


def _qkv_reference(outputs: tuple):
    """The library's torch reference for the projection (qkv_tkg's; the maths of both paths). The
    token-generation path also returns the fused residual sum, the context-encoding path does not."""
    def call(reference, t):
        result = reference(hidden=t["input"], qkv_w=t["fused_qkv_weights"], norm_w=t["gamma_norm_weights"],
                           fused_add=True, mlp_prev=t["mlp_prev"], attn_prev=t["attention_prev"], eps=t["norm_eps"],
                           norm_type=t["fused_norm_type"])
        return [result[name] for name in outputs]
    return call


def _mlp(seqlen: int):
    def inputs():
        types = _lib("core.utils.common_types")
        rng = _rng()
        b, h, i = 1, 512, 1024
        return {"hidden_tensor": _normal(rng, (b, seqlen, h), BF16),
                "gate_proj_weights_tensor": 0.05 * _normal(rng, (h, i), BF16),
                "up_proj_weights_tensor": 0.05 * _normal(rng, (h, i), BF16),
                "down_proj_weights_tensor": 0.05 * _normal(rng, (i, h), BF16),
                "normalization_weights_tensor": _normal(rng, (1, h), BF16),
                "fused_add_tensor": _normal(rng, (b, seqlen, h), BF16), "store_fused_add_result": True,
                "activation_fn": types.ActFnType.SiLU, "normalization_type": types.NormType.RMS_NORM, "eps": 1e-6}
    return inputs


def _mlp_torch(_reference, t):
    """What mlp's docstring computes, in float32 torch: (fused sum, MLP output)."""
    import torch

    f = {name: value.float() for name, value in t.items() if isinstance(value, torch.Tensor)}
    total = f["hidden_tensor"] + f["fused_add_tensor"]
    normed = torch.nn.functional.rms_norm(total, (total.shape[-1],), f["normalization_weights_tensor"][0], t["eps"])
    gate = torch.nn.functional.silu(normed @ f["gate_proj_weights_tensor"])
    return [(gate * (normed @ f["up_proj_weights_tensor"])) @ f["down_proj_weights_tensor"], total]


def _attention_bwd():
    import torch

    rng = _rng()
    b, heads, kv_heads, d, s = 1, 2, 1, 64, 256
    q, dy = (_normal(rng, (b, heads, d, s)) for _ in range(2))
    k, v = (_normal(rng, (b, kv_heads, d, s)) for _ in range(2))
    forward = _lib("core.attention.attention_bwd_torch").compute_o_lse
    o, lse, _ = forward(torch.from_numpy(q), torch.from_numpy(k), torch.from_numpy(v), True, True)
    return {"q_ref": q, "k_ref": k, "v_ref": v, "o_ref": o.float().numpy(), "dy_ref": dy,
            "lse_ref": lse.float().numpy(), "use_causal_mask": True, "mixed_precision": True}


def _moe_routing(tokens: int, experts: int, block: int, rng, blocks_multiple: int = 2):
    """Top-1 routing metadata in the blockwise layout: each expert's tokens packed into blocks of
    `block` positions, unused positions pointing at the zero row `tokens`, one expert that gets no
    token (expert 1), and padding blocks (all positions unused, given to the last expert) up to a
    multiple of `blocks_multiple` blocks, one per core.
    Returns (affinities [(T+1)*E, 1], position -> token [N*B], block -> expert [N, 1])."""
    choice = rng.choice([e for e in range(experts) if e != 1], size=tokens)
    affinities = np.zeros((tokens + 1, experts), np.float32)
    affinities[np.arange(tokens), choice] = rng.uniform(0.2, 1.0, tokens)
    positions, owners = [], []
    for expert in range(experts):
        members = np.flatnonzero(choice == expert)
        blocks = -(-len(members) // block)
        padded = np.full(blocks * block, tokens, np.int32)
        padded[:len(members)] = members
        positions.append(padded)
        owners += [expert] * blocks
    padding = -len(owners) % blocks_multiple
    positions.append(np.full(padding * block, tokens, np.int32))
    owners += [experts - 1] * padding
    return (affinities.reshape(-1, 1), np.concatenate(positions).astype(np.int32),
            np.array(owners, np.int32).reshape(-1, 1))


def _moe_cte(implementation: str, block: int):
    def inputs():
        cte = _lib("core.moe.moe_cte.moe_cte")
        rng = _rng()
        tokens, hidden, intermediate, experts = 300, 512, 256, 4
        affinities, position_to_token, block_to_expert = _moe_routing(tokens, experts, block, rng)
        x = _normal(rng, (tokens + 1, hidden), BF16)
        x[tokens] = 0
        return {"hidden_states": x, "expert_affinities_masked": affinities.astype(BF16),
                "gate_up_proj_weight": 0.05 * _normal(rng, (experts, hidden, 2, intermediate), BF16),
                "down_proj_weight": 0.05 * _normal(rng, (experts, intermediate, hidden), BF16),
                "token_position_to_id": position_to_token, "block_to_expert": block_to_expert, "block_size": block,
                # top-1 routing: no token's rows are summed over experts, so no cross-core sum
                # (the library's own tests pass top_k != 1)
                "is_tensor_update_accumulating": False,
                "spec": cte.MoECTESpec(implementation=getattr(cte.MoECTEImplementation, implementation))}
    return inputs


def _moe_cte_reference(implementation_name: str):
    def call(reference, t):
        from test.integration.nkilib.core.moe.moe_cte.test_moe_cte_common import BWMMFunc

        arguments = {k: v for k, v in t.items() if k != "spec"}
        return reference(**arguments, bwmm_func=getattr(BWMMFunc, implementation_name), lnc_degree=2)["output"]
    return call


def _moe_tkg(all_experts: bool):
    def inputs():
        types = _lib("core.utils.common_types")
        rng = _rng()
        tokens, hidden, intermediate, experts, k = 4, 512, 256, 8, 2
        index = np.stack([rng.choice(experts, k, replace=False) for _ in range(tokens)]).astype(np.int32)
        affinities = np.zeros((tokens, experts), np.float32)
        np.put_along_axis(affinities, index, rng.uniform(0.2, 1.0, (tokens, k)), axis=1)
        scale_mode = types.ExpertAffinityScaleMode.POST_SCALE
        result = {"hidden_input": _normal(rng, (tokens, hidden), BF16),
                  "expert_gate_up_weights": 0.05 * _normal(rng, (experts, hidden, 2, intermediate), BF16),
                  "expert_down_weights": 0.05 * _normal(rng, (experts, intermediate, hidden), BF16),
                  "expert_affinities": affinities.astype(BF16), "expert_index": index, "is_all_expert": all_experts,
                  "expert_affinities_scaling_mode": scale_mode}
        if all_experts:
            result |= {"rank_id": np.zeros((1, 1), np.int32), "mask_unselected_experts": True}
        return result
    return inputs


def _sparse_columns(tokens: int, experts: int, per_expert: int, seed: int = 42):
    rng = _rng(seed)
    flat = np.zeros(tokens * experts, np.int32)
    flat[rng.permutation(tokens * experts)[:per_expert * experts]] = 1
    return flat.reshape(experts, tokens).T.copy()


def _find_nonzero_indices():
    return {"input_tensor": _sparse_columns(512, 16, 64), "chunk_size": 512}


def _indexed_flatten():
    rng = _rng()
    f_len, rows, cols = 4, 16, 128
    return {"input_tensor": rng.integers(0, 100, (rows, cols), dtype=np.int32), "f_len": f_len,
            "output_len": rows * cols, "row_offsets": (np.arange(rows, dtype=np.int32) * cols).reshape(rows, 1)}


def _router_topk_kernel():
    """A kernel around router_topk, which writes its three outputs into parameters."""
    router = _lib("core.router_topk.router_topk")

    def router_topk_kernel(x, w, w_bias, router_logits, expert_affinities, expert_index, act_fn, k, x_hbm_layout,
                           x_sb_layout):
        router.router_topk(x=x, w=w, w_bias=w_bias, router_logits=router_logits, expert_affinities=expert_affinities,
                           expert_index=expert_index, act_fn=act_fn, k=k, x_hbm_layout=x_hbm_layout,
                           x_sb_layout=x_sb_layout)
        return router_logits, expert_index, expert_affinities

    return router_topk_kernel


def _router_top_k_is_exact(got, _expected, inputs) -> str:
    """The chosen experts must be a top-k of the float64 logits, ranked, where two logits closer
    than the reference's own rounding (two bf16 ulps: it rounds x @ w, then adds the bias in bf16)
    may come in either order; the torch reference's ranking cannot tell them apart."""
    logits = inputs["x"].astype(np.float64).T @ inputs["w"].astype(np.float64) + inputs["w_bias"].astype(np.float64)
    chosen = np.take_along_axis(logits, got.astype(np.int64), axis=1)
    ranked = -np.sort(-logits, axis=1)[:, :got.shape[1]]
    slack = 2 * 2.0 ** -8 * np.abs(ranked)
    wrong = np.abs(chosen - ranked) > slack
    if wrong.any():
        token, rank = np.argwhere(wrong)[0]
        return (f"token {token}: expert {int(got[token, rank])} at rank {rank} has logit {chosen[token, rank]:.6g}, "
                f"the float64 top-{got.shape[1]} has {ranked[token, rank]:.6g} there")
    return ""


def _router_topk():
    rng = _rng()
    t, h, e, k = 4, 1024, 128, 4
    return {"x": rng.uniform(-0.1, 0.1, (h, t)).astype(BF16), "w": rng.uniform(-0.1, 0.1, (h, e)).astype(BF16),
            "w_bias": rng.uniform(-0.1, 0.1, (1, e)).astype(BF16), "router_logits": np.zeros((t, e), BF16),
            "expert_affinities": np.zeros((t, e), BF16), "expert_index": np.zeros((t, k), np.uint32),
            "act_fn": _lib("core.utils.common_types").RouterActFnType.SOFTMAX, "k": k, "x_hbm_layout": 0,
            "x_sb_layout": 0}


def _attention_cte():
    rng = _rng()
    b, s, d = 2, 256, 64
    return {"q": _normal(rng, (b, s, d), BF16), "k": _normal(rng, (b, d, s), BF16), "v": _normal(rng, (b, s, d), BF16),
            "scale": 0.125, "causal_mask": True}


def _attention_cte_gqa_window():
    rng = _rng()
    b, b_kv, s, d = 4, 2, 384, 64
    return {"q": _normal(rng, (b, s, d), BF16), "k": _normal(rng, (b_kv, d, s), BF16),
            "v": _normal(rng, (b_kv, s, d), BF16), "scale": 1.0, "causal_mask": True, "sliding_window": 128,
            "sink": _normal(rng, (b, 1), BF16)}


CASES = [
    Case("cumsum", "core.cumsum.cumsum:cumsum", "core.cumsum.cumsum_torch:cumsum_torch_ref", _cumsum),
    Case("rmsnorm_tkg", "core.subkernels.rmsnorm_tkg:rmsnorm_tkg",
         "core.subkernels.rmsnorm_torch:rmsnorm_tkg_torch_ref_lnc1", _rmsnorm_tkg, atol=1e-5, rtol=2e-2),
    Case("layernorm_tkg", "core.subkernels.layernorm_tkg:layernorm_tkg",
         "core.subkernels.layernorm_torch:layernorm_tkg_torch_ref_lnc1", _layernorm_tkg, atol=1e-2, rtol=2e-2),
    Case("cascaded_max", "core.max.cascaded_max:cascaded_max", "core.max.cascaded_max_torch:cascaded_max_torch_ref",
         _cascaded_max, atol=1e-5, rtol=1e-5),
    Case("rope", "core.embeddings.rope:RoPE", "core.embeddings.rope_torch:rope_torch_ref", _rope, atol=1e-3,
         rtol=8e-3),
    Case("rope_hf", "core.embeddings.rope_hf:rope_hf", "core.embeddings.rope_hf_torch:rope_hf_torch_ref", _rope_hf,
         atol=1e-4, rtol=1e-4),
    Case("output_projection_tkg", "core.output_projection.output_projection_tkg:output_projection_tkg",
         "core.output_projection.output_projection_tkg_torch:output_projection_tkg_torch_ref", _output_projection_tkg,
         atol=0.5, rtol=2e-2),
    Case("output_projection_cte", "core.output_projection.output_projection_cte.output_projection_cte:"
         "output_projection_cte", "core.output_projection.output_projection_cte.output_projection_cte_torch:"
         "output_projection_cte_torch_ref", _output_projection_cte, atol=0.5, rtol=2e-2),
    Case("dynamic_elementwise_add", "experimental.dynamic_shapes.dynamic_elementwise_add:dynamic_elementwise_add",
         "experimental.dynamic_shapes.dynamic_elementwise_add_torch:dynamic_elementwise_add_torch_ref", _dynamic_add,
         atol=1e-2, rtol=1e-2, call_reference=lambda ref, t: ref(t["input_a"], t["input_b"])),
    Case("conv1d", "experimental.conv.conv1d:conv1d", "experimental.conv.conv1d_torch:conv1d_torch_ref", _conv1d,
         atol=1e-3, rtol=1e-3),
    Case("cross_entropy_forward", "experimental.loss.cross_entropy:cross_entropy_forward",
         "experimental.loss.cross_entropy_torch:cross_entropy_forward_torch_ref", _cross_entropy, atol=1e-3,
         rtol=1e-3, call_reference=lambda ref, t: ref(t["logits_hbm"], t["targets_hbm"].long())),
    Case("cross_entropy_backward", "experimental.loss.cross_entropy:cross_entropy_backward",
         "experimental.loss.cross_entropy_torch:cross_entropy_backward_torch_ref", _cross_entropy_backward,
         atol=1e-6, rtol=1e-4,
         call_reference=lambda ref, t: ref(t["logits_hbm"], t["targets_hbm"].long(), t["reduction"])),
    # bf16 products summed over 7 taps in fp32, the result rounded to bf16: 2^-8 relative.
    Case("depthwise_conv1d", "experimental.conv.depthwise_conv1d:depthwise_conv1d_implicit_gemm", None,
         _depthwise_conv1d, atol=2e-2, rtol=1e-2, call_reference=_depthwise_conv1d_torch),
    # Distinct random floats have no ties: values and indices are exact.
    Case("rotational_topk", "core.topk.rotational_topk:rotational_topk", "core.topk.torch_ref:topk_torch_ref",
         _rotational_topk, atol=0, rtol=0),
    Case("qkv_tkg", "core.qkv.qkv:qkv", "core.qkv.qkv_tkg_torch:qkv_tkg_torch_ref", _qkv(4), atol=5e-2, rtol=2e-2,
         call_reference=_qkv_reference(("out", "fused_hidden"))),
    Case("qkv_cte", "core.qkv.qkv:qkv", "core.qkv.qkv_tkg_torch:qkv_tkg_torch_ref", _qkv(256), atol=5e-2,
         rtol=2e-2, call_reference=_qkv_reference(("out",))),
    Case("mlp_tkg", "core.mlp.mlp:mlp", None, _mlp(4), atol=5e-2, rtol=3e-2, call_reference=_mlp_torch),
    Case("mlp_cte", "core.mlp.mlp:mlp", None, _mlp(256), atol=5e-2, rtol=3e-2, call_reference=_mlp_torch),
    Case("attention_bwd", "core.attention.attention_bwd:attention_bwd",
         "core.attention.attention_bwd_torch:attention_bwd_torch_ref", _attention_bwd, atol=1e-3, rtol=1e-3),
    Case("moe_cte_shard_on_block", "core.moe.moe_cte.moe_cte:moe_cte", "core.moe.moe_cte.moe_cte_torch:moe_cte_torch_ref",
         _moe_cte("shard_on_block", 128), atol=5e-2, rtol=3e-2, call_reference=_moe_cte_reference("SHARD_ON_BLOCK"), lnc=2),
    Case("moe_cte_shard_on_i", "core.moe.moe_cte.moe_cte:moe_cte", "core.moe.moe_cte.moe_cte_torch:moe_cte_torch_ref",
         _moe_cte("shard_on_i", 256), atol=5e-2, rtol=3e-2, call_reference=_moe_cte_reference("SHARD_ON_INTERMEDIATE"), lnc=2),
    Case("moe_tkg_selective", "core.moe.moe_tkg.moe_tkg:moe_tkg", "core.moe.moe_tkg.moe_tkg_torch:moe_tkg_torch_ref",
         _moe_tkg(False), atol=5e-2, rtol=3e-2),
    Case("moe_tkg_all_experts", "core.moe.moe_tkg.moe_tkg:moe_tkg", "core.moe.moe_tkg.moe_tkg_torch:moe_tkg_torch_ref",
         _moe_tkg(True), atol=5e-2, rtol=3e-2),
    Case("find_nonzero_indices", "core.subkernels.find_nonzero_indices:find_nonzero_indices",
         "core.subkernels.find_nonzero_indices_torch:find_nonzero_indices_torch_ref", _find_nonzero_indices,
         atol=0, rtol=0),
    Case("indexed_flatten", "core.subkernels.indexed_flatten:indexed_flatten",
         "core.subkernels.indexed_flatten_torch:indexed_flatten_torch_ref", _indexed_flatten, atol=0, rtol=0,
         lnc=2),  # its two cores exchange their halves with sendrecv: it needs LNC=2
    # The torch reference rounds x @ w to bf16 before adding the bias (the kernel adds in fp32 PSUM
    # and rounds once): they differ by up to a bf16 ulp of |x @ w| < 0.5, i.e. 2^-9. That double
    # rounding reorders near-tied experts, so the expert indices are judged against float64 logits.
    Case("router_topk", _router_topk_kernel, "core.router_topk.router_topk_torch:router_topk_torch_ref",
         _router_topk, atol=4e-3, rtol=2e-2, own_checks={1: _router_top_k_is_exact}),
    Case("attention_cte", "core.attention.attention_cte:attention_cte",
         "core.attention.attention_cte_torch:attention_cte_torch_ref", _attention_cte, atol=2e-2, rtol=2e-2),
    Case("attention_cte_gqa_window_sink", "core.attention.attention_cte:attention_cte",
         "core.attention.attention_cte_torch:attention_cte_torch_ref", _attention_cte_gqa_window, atol=2e-2,
         rtol=2e-2),
]
