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
    reference: str
    inputs: object  # () -> dict of keyword arguments
    atol: float = 1e-3
    rtol: float = 1e-3
    lnc: int = 1
    note: str = ""  # why a case is expected not to run, when it is not
    call_reference: object = None  # (reference, inputs as torch) -> outputs, when its signature differs


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


def _router_topk():
    rng = _rng()
    t, h, e, k = 4, 1024, 128, 4
    return {"x": rng.uniform(-0.1, 0.1, (h, t)).astype(BF16), "w": rng.uniform(-0.1, 0.1, (h, e)).astype(BF16),
            "w_bias": rng.uniform(-0.1, 0.1, (1, e)).astype(BF16), "router_logits": np.zeros((t, e), BF16),
            "expert_affinities": np.zeros((t, e), BF16), "expert_index": np.zeros((t, k), np.uint32),
            "act_fn": _lib("core.utils.common_types").RouterActFnType.SOFTMAX, "k": k, "x_hbm_layout": 0,
            "x_sb_layout": 0}


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
    Case("find_nonzero_indices", "core.subkernels.find_nonzero_indices:find_nonzero_indices",
         "core.subkernels.find_nonzero_indices_torch:find_nonzero_indices_torch_ref", _find_nonzero_indices,
         atol=0, rtol=0),
    Case("indexed_flatten", "core.subkernels.indexed_flatten:indexed_flatten",
         "core.subkernels.indexed_flatten_torch:indexed_flatten_torch_ref", _indexed_flatten, atol=0, rtol=0),
    # The torch reference rounds x @ w to bf16 before adding the bias (the kernel adds in fp32 PSUM
    # and rounds once): they differ by up to a bf16 ulp of |x @ w| < 0.5, i.e. 2^-9.
    Case("router_topk", _router_topk_kernel, "core.router_topk.router_topk_torch:router_topk_torch_ref",
         _router_topk, atol=4e-3, rtol=2e-2),
]
