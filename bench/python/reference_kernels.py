"""Reference kernels the kernel benchmarks put beside nikki's library kernels, on the same shapes
and the same timing model:

- the four kernels of NKI's matrix multiplication tutorial (matmul_tutorial.py) with the
  latencies the tutorial published for Trn1, next to nikki's library matmul;
- kernels of AWS's public nki-library (a checkout given by path), run unmodified on nikki and
  estimated exactly as nikki's own kernel for the same operation.

Each pair maps one problem onto both kernels' argument conventions; nothing of the nki-library is
copied here, its kernels are imported from the checkout.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import sys

import ml_dtypes
import numpy as np

import nikki
from nikki.library import library_kernels

HERE = os.path.dirname(os.path.abspath(__file__))


# --- the matmul tutorial --------------------------------------------------------------------

def matmul_tutorial_rows(target: str = "trn1") -> list:
    """The tutorial's problem, [4096, 8192] @ [8192, 8192] bf16: each tutorial kernel's published
    and estimated time, and nikki's library matmul estimated on the same problem."""
    sys.path.insert(0, HERE)
    import matmul_tutorial

    M, K, N = 4096, 8192, 8192
    lhsT, rhs = nikki.spec((K, M), "bfloat16"), nikki.spec((K, N), "bfloat16")
    rows = []
    for name, kernel in matmul_tutorial.KERNELS.items():
        prof = nikki.estimate(kernel, lhsT, rhs, target=target)
        rows.append({"kernel": f"tutorial {name}", "published_ms": matmul_tutorial.PUBLISHED_MS[name],
                     "estimate_ms": prof.total_ms, "tensor_utilization": prof.tensor_flop_utilization()})
    prof = nikki.estimate(library_kernels()["matmul"], nikki.spec((M, K), "bfloat16"), nikki.spec((K, N), "bfloat16"),
                          target=target)
    rows.append({"kernel": "nikki.kernels.matmul", "published_ms": None, "estimate_ms": prof.total_ms,
                 "tensor_utilization": prof.tensor_flop_utilization()})
    return rows


# --- nki-library kernels ----------------------------------------------------------------------

@dataclasses.dataclass
class Pair:
    """One operation in both libraries. `shapes` are (label, make): make(rng) returns the
    nki-library kernel's keyword arguments and nikki's calls [(args, params)] for the same work
    (several when nikki's kernel does part of it per call, e.g. RoPE of q, then of k)."""

    library_kernel: str  # "module:function" under nkilib_src.nkilib
    nikki_kernel: str
    shapes: list
    note: str = ""  # how the two computations differ, when they do


def _normal(rng, shape, dtype):
    return rng.standard_normal(shape, dtype=np.float32).astype(dtype)


def _norm_shape(b, s, h, with_beta):
    def make(rng):
        x, gamma = _normal(rng, (b, s, h), np.float16), _normal(rng, (1, h), np.float16)
        kwargs = {"input": x, "gamma": gamma, "output": np.zeros((128, b * s, h // 128), np.float16)}
        args = [x.reshape(b * s, h), gamma.reshape(h)]
        if with_beta:
            beta = _normal(rng, (1, h), np.float16)
            kwargs["beta"] = beta
            args.append(beta.reshape(h))
        return kwargs, [(args, {})]
    return f"B={b} S={s} H={h} fp16", make


def _cumsum_shape(rows, cols):
    def make(rng):
        x = _normal(rng, (rows, cols), np.float32)
        return {"x": x}, [([x], {})]
    return f"[{rows}, {cols}] fp32", make


def _cross_entropy_shape(tokens, vocab, chunk):
    def make(rng):
        logits = _normal(rng, (tokens, vocab), np.float32)
        targets = rng.integers(0, vocab, (tokens,), dtype=np.int32)
        kwargs = {"logits_hbm": logits, "targets_hbm": targets, "positions_per_batch": tokens, "chunk_size": chunk,
                  "dtype": np.float32}
        return kwargs, [([logits, targets], {})]
    return f"T={tokens} V={vocab} fp32", make


def _rope_shape(b, heads, kv_heads, s, d):
    def make(rng):
        q, k = _normal(rng, (b, heads, s, d), np.float32), _normal(rng, (b, kv_heads, s, d), np.float32)
        cos, sin = _normal(rng, (b, s, d), np.float32), _normal(rng, (b, s, d), np.float32)
        kwargs = {"q": q, "k": k, "q_out": np.zeros_like(q), "k_out": np.zeros_like(k), "cos": cos, "sin": sin,
                  "backward": False}
        return kwargs, [([q, cos, sin], {}), ([k, cos, sin], {})]
    return f"B={b} H={heads} Hkv={kv_heads} S={s} D={d} fp32", make


def _projection_shape(b, heads, d, s, n):
    def make(rng):
        bf16 = ml_dtypes.bfloat16
        attention = _normal(rng, (b, heads, d, s), bf16)
        weight, bias = _normal(rng, (heads * d, n), bf16), _normal(rng, (1, n), bf16)
        attn = np.ascontiguousarray(attention.transpose(0, 3, 1, 2)).reshape(b, s, heads * d)
        residual = np.zeros((b, s, n), bf16)
        return {"attention": attention, "weight": weight, "bias": bias}, [([attn, weight, bias.reshape(n), residual], {})]
    return f"B={b} H={heads} D={d} S={s} N={n} bf16", make


PAIRS = [
    Pair("core.subkernels.rmsnorm_tkg:rmsnorm_tkg", "rmsnorm",
         [_norm_shape(1, 4, 1024, False), _norm_shape(4, 32, 4096, False)]),
    Pair("core.subkernels.layernorm_tkg:layernorm_tkg", "layernorm",
         [_norm_shape(1, 4, 1024, True), _norm_shape(4, 32, 4096, True)]),
    Pair("core.cumsum.cumsum:cumsum", "cumsum", [_cumsum_shape(4, 256), _cumsum_shape(2048, 4096)]),
    Pair("experimental.loss.cross_entropy:cross_entropy_forward", "cross_entropy",
         [_cross_entropy_shape(32, 1024, 1024), _cross_entropy_shape(128, 32768, 4096)]),
    Pair("core.embeddings.rope_hf:rope_hf", "rope", [_rope_shape(1, 2, 1, 128, 64), _rope_shape(1, 32, 8, 2048, 128)],
         note="nikki rotates q and k in two calls"),
    Pair("core.output_projection.output_projection_cte.output_projection_cte:output_projection_cte",
         "output_projection", [_projection_shape(1, 2, 64, 128, 512), _projection_shape(1, 16, 128, 2048, 4096)],
         note="nikki also adds a residual (zeros here): one more [B, S, N] read"),
]


def library_rows(checkout: str, target: str = "trn2", names=None) -> list:
    """Each pair whose two kernels exist, on each of its shapes: the nki-library kernel's and
    nikki's estimated time ('error' instead when a kernel does not run on nikki)."""
    from nikki import compat

    sys.path.insert(0, os.path.join(checkout, "src"))
    compat.install()  # the library's `import nki` resolves to nikki
    ours = library_kernels()
    rows = []
    for pair in PAIRS:
        if pair.nikki_kernel not in ours or (names and pair.nikki_kernel not in names):
            continue
        module, function = pair.library_kernel.split(":")
        try:
            theirs = getattr(importlib.import_module("nkilib_src.nkilib." + module), function)
        except ImportError as err:
            rows.append({"library_kernel": pair.library_kernel, "nikki_kernel": pair.nikki_kernel, "shape": "-",
                         "error": f"not importable: {err}"})
            continue
        for label, make in pair.shapes:
            kwargs, calls = make(np.random.default_rng(0))
            row = {"library_kernel": pair.library_kernel, "nikki_kernel": pair.nikki_kernel, "shape": label,
                   "note": pair.note}
            try:
                row["library_us"] = nikki.estimate(theirs, target=target, **kwargs).total_us
            except Exception as err:  # a kernel nikki cannot run yet is reported, not fatal
                row["error"] = f"{type(err).__name__}: {str(err).splitlines()[0][:160]}"
            row["nikki_us"] = sum(nikki.estimate(ours[pair.nikki_kernel], *args, target=target, **params).total_us
                                  for args, params in calls)
            rows.append(row)
    return rows
