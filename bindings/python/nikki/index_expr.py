"""Legacy (Beta 1) index expressions: nl.arange / nl.mgrid subscripts, mask= predicates, and
block-dimension tensors. Placeholder until the legacy front end lands."""

from __future__ import annotations

__all__ = ["arange", "mgrid", "uses_index_expr", "subscript", "apply_mask", "legacy_iota", "legacy_affine_select", "block_tensor"]


def uses_index_expr(key) -> bool:
    return False


def subscript(tensor, key):
    raise NotImplementedError("nl.arange index expressions are not supported by nikki yet")


def apply_mask(mask, *operands):
    raise NotImplementedError("mask= predicates are not supported by nikki yet")


def legacy_iota(*args, **kwargs):
    raise NotImplementedError("legacy nisa.iota(expr, dtype) is not supported by nikki yet")


def legacy_affine_select(*args, **kwargs):
    raise NotImplementedError("legacy nisa.affine_select(pred, ...) is not supported by nikki yet")


def block_tensor(shape, dtype, buffer, name):
    raise NotImplementedError("tensors with leading block dims (nl.par_dim) are not supported by nikki yet")


def arange(*args):
    raise NotImplementedError("nl.arange index expressions are not supported by nikki yet")


class _MGrid:
    def __getitem__(self, key):
        raise NotImplementedError("nl.mgrid index expressions are not supported by nikki yet")


mgrid = _MGrid()
