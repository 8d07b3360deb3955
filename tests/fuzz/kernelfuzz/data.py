"""Input data of generated kernels, drawn from a seed so that a reproducer rebuilds it exactly."""

from __future__ import annotations

import numpy as np

from . import reference as ref

# Values that exercise the special cases of every format (signed zeros, infinities, NaN, values
# near the fp8/fp16 overflow thresholds, fp32 subnormals).
_SPECIAL = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-40, -1e-40, 65504.0, 250.0, 460.0, 6e4, 1e30,
                     -3.5, 0.5, 1.0, -1.0], dtype=np.float32)


def draw(seed: int, shape, dtype: str, domain: str = "int") -> np.ndarray:
    """A host array of nikki dtype `dtype`.

    Domains: ``int`` small integers (every sum and product the generator builds from them is exact
    in fp32), ``real`` normal floats, ``special`` reals mixed with the special values, ``index:N``
    integers in [0, N), ``perm:N`` distinct integers in [0, N) (scatter targets), ``const:V`` every
    element V."""
    rng = np.random.default_rng(seed)
    shape = tuple(shape)
    if domain.startswith("const:"):
        values = np.full(shape, float(domain[6:]))
    elif domain.startswith("index:"):
        values = rng.integers(0, int(domain[6:]), size=shape).astype(np.float64)
    elif domain.startswith("perm:"):
        n = int(np.prod(shape))
        values = rng.permutation(int(domain[5:]))[:n].reshape(shape).astype(np.float64)
    elif dtype == "bool_":
        values = rng.integers(0, 2, size=shape).astype(np.float64)
    elif not ref.is_float(dtype):
        lo, hi = ref.int_range(dtype)
        values = rng.integers(max(lo, -8), min(hi, 15) + 1, size=shape).astype(np.float64)
    elif domain == "int":
        values = rng.integers(-4, 5, size=shape).astype(np.float64)
    elif domain == "real":
        values = rng.standard_normal(shape)
    elif domain == "special":
        values = rng.standard_normal(shape) * 4
        pick = rng.random(shape) < 0.3
        values = np.where(pick, rng.choice(_SPECIAL, size=shape), values)
    else:
        raise ValueError(f"unknown data domain {domain!r}")
    return ref.to_array(ref.store(values.astype(np.float32), dtype), dtype) if ref.is_float(dtype) else \
        ref.to_array(values, dtype)
