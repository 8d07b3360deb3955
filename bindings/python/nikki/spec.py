"""Placeholders for kernel inputs when only shapes matter (compiling or estimating without data)."""

from __future__ import annotations

from . import _core
from .arguments import check_shape
from .dtypes import to_dtype

__all__ = ["TensorSpec", "spec"]


class TensorSpec:
    """Shape and dtype of an input tensor, standing in for an array."""

    __slots__ = ("shape", "dtype")

    def __init__(self, shape, dtype):
        self.shape = check_shape(shape, "nikki.spec: shape", _core.max_rank, minimum=0)  # as empty arrays
        self.dtype = to_dtype(dtype)

    def __repr__(self) -> str:
        return f"nikki.spec({self.shape}, {self.dtype.name})"


def spec(shape, dtype) -> TensorSpec:
    """An input placeholder: ``nikki.spec((4096, 8192), nl.bfloat16)``."""
    return TensorSpec(shape, dtype)
