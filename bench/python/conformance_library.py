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
    """One kernel call: kernel and reference as "module:function" under nkilib_src.nkilib."""

    name: str
    kernel: str
    reference: str
    inputs: object  # () -> dict of keyword arguments
    atol: float = 1e-3
    rtol: float = 1e-3
    lnc: int = 1
    note: str = ""  # why a case is expected not to run, when it is not


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


CASES = [
    Case("cumsum", "core.cumsum.cumsum:cumsum", "core.cumsum.cumsum_torch:cumsum_torch_ref", _cumsum),
    Case("rmsnorm_tkg", "core.subkernels.rmsnorm_tkg:rmsnorm_tkg",
         "core.subkernels.rmsnorm_torch:rmsnorm_tkg_torch_ref_lnc1", _rmsnorm_tkg, atol=1e-5, rtol=2e-2),
    Case("layernorm_tkg", "core.subkernels.layernorm_tkg:layernorm_tkg",
         "core.subkernels.layernorm_torch:layernorm_tkg_torch_ref_lnc1", _layernorm_tkg, atol=1e-2, rtol=2e-2),
    Case("cascaded_max", "core.max.cascaded_max:cascaded_max", "core.max.cascaded_max_torch:cascaded_max_torch_ref",
         _cascaded_max, atol=1e-5, rtol=1e-5),
]
