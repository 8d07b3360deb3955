"""The operations NkiTensor and nki.isa dispatch to in the layers above them.

The front end is layered: the core (tracing, registers, memory, views) <- nki.isa <- nki.language
<- the legacy layer (index expressions, masks, block tensors). A lower layer never imports a higher
one; where one of its methods needs a higher layer's operation (``t[...] = x`` copies with an
instruction, ``a + b`` is nl.add, ``t[nl.arange(4)[:, None], ...]`` is an index expression), it
calls the slot here, which the higher layer fills in when it is imported. ``import nikki`` imports
every layer, so all slots are filled before any kernel is traced.
"""

from __future__ import annotations

from typing import Any, Callable

__all__ = ["hooks"]


def _unset(*args: Any, **kwargs: Any) -> Any:
    raise RuntimeError("a nikki front-end layer was not imported (import nikki, not its submodules alone)")


class Hooks:
    """Slots filled by nki.isa, nki.language and the legacy layer (see the module docstring)."""

    # --- nki.isa: legacy assignment and in-place updates of tiles ---
    tensor_tensor: Callable[..., Any] = _unset
    produce_in_place: Callable[..., bool] = _unset
    partition_broadcast: Callable[..., Any] = _unset
    masked_write_of: Callable[..., Any] = _unset
    assign: Callable[..., None] = _unset
    assign_scalar: Callable[..., None] = _unset
    accumulate_into: Callable[..., None] = _unset
    update_in_place: Callable[..., None] = _unset
    # --- nki.language: tile operators (a + b, -a, abs(a), ~a) and astype ---
    binary_op: Callable[..., Any] = _unset
    negative: Callable[..., Any] = _unset
    abs: Callable[..., Any] = _unset
    invert: Callable[..., Any] = _unset
    copy: Callable[..., Any] = _unset
    # --- the legacy layer: index expressions, masks, block tensors ---
    uses_index_expr: Callable[[tuple], bool] = _unset
    index_subscript: Callable[..., Any] = _unset
    overhanging_slices: Callable[..., Any] = _unset
    apply_mask: Callable[..., Any] = _unset
    apply_reduction_mask: Callable[..., Any] = _unset
    legacy_iota: Callable[..., Any] = _unset
    legacy_affine_select: Callable[..., Any] = _unset
    block_tensor: Callable[..., Any] = _unset
    arange: Callable[..., Any] = _unset
    mgrid: Any = None


hooks = Hooks()
