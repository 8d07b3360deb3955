"""Shared helpers of the tutorial-kernel tests: dtypes and unit roundoffs."""

import ml_dtypes
import numpy as np

bf16 = ml_dtypes.bfloat16

# Unit roundoff (half an ulp at 1.0) of the dtypes the tests use.
EPS_FP32 = float(np.finfo(np.float32).eps) / 2  # 2**-24 ~ 6e-8
EPS_BF16 = float(ml_dtypes.finfo(bf16).eps) / 2  # 2**-8  ~ 3.9e-3


def to_bf16(x: np.ndarray) -> np.ndarray:
    """x rounded to bfloat16 (round to nearest even, as ml_dtypes and NeuronCore writes do)."""
    return np.asarray(x, dtype=np.float32).astype(bf16)


def f64(x: np.ndarray) -> np.ndarray:
    """x widened to float64 (exact for fp32 and bf16), for references and error checks."""
    return np.asarray(x).astype(np.float64)
