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

import numpy as np

import nikki

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
    prof = nikki.estimate(nikki.kernels.matmul, nikki.spec((M, K), "bfloat16"), nikki.spec((K, N), "bfloat16"),
                          target=target)
    rows.append({"kernel": "nikki.kernels.matmul", "published_ms": None, "estimate_ms": prof.total_ms,
                 "tensor_utilization": prof.tensor_flop_utilization()})
    return rows


# --- nki-library kernels ----------------------------------------------------------------------

@dataclasses.dataclass
class Pair:
    """One operation in both libraries. `shapes` are (label, nki-library kwargs, nikki args,
    nikki params) makers taking a numpy Generator."""

    library_kernel: str  # "module:function" under nkilib_src.nkilib
    nikki_kernel: str
    shapes: list


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
        return kwargs, args, {}
    return f"B={b} S={s} H={h} fp16", make


def _cumsum_shape(rows, cols):
    def make(rng):
        x = _normal(rng, (rows, cols), np.float32)
        return {"x": x}, [x], {}
    return f"[{rows}, {cols}] fp32", make


PAIRS = [
    Pair("core.subkernels.rmsnorm_tkg:rmsnorm_tkg", "rmsnorm",
         [_norm_shape(1, 4, 1024, False), _norm_shape(4, 32, 4096, False)]),
    Pair("core.subkernels.layernorm_tkg:layernorm_tkg", "layernorm",
         [_norm_shape(1, 4, 1024, True), _norm_shape(4, 32, 4096, True)]),
    Pair("core.cumsum.cumsum:cumsum", "cumsum", [_cumsum_shape(4, 256), _cumsum_shape(2048, 4096)]),
]


def library_rows(checkout: str, target: str = "trn2", names=None) -> list:
    """Each pair whose two kernels exist, on each of its shapes: the nki-library kernel's and
    nikki's estimated time ('error' instead when a kernel does not run on nikki)."""
    from nikki import compat
    from nikki.library import library_kernels

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
            kwargs, args, params = make(np.random.default_rng(0))
            row = {"library_kernel": pair.library_kernel, "nikki_kernel": pair.nikki_kernel, "shape": label}
            try:
                row["library_us"] = nikki.estimate(theirs, target=target, **kwargs).total_us
            except Exception as err:  # a kernel nikki cannot run yet is reported, not fatal
                row["error"] = f"{type(err).__name__}: {str(err).splitlines()[0][:160]}"
            row["nikki_us"] = nikki.estimate(ours[pair.nikki_kernel], *args, target=target, **params).total_us
            rows.append(row)
    return rows
