"""VirtualRegister: a sequencer register of the kernel being traced (a core value, used by views for
runtime offsets, by nki.isa's register instructions and by nki.language's dynamic loops)."""

from __future__ import annotations

from typing import Any, NoReturn

from .errors import kernel_error_at, user_frame

__all__ = ["VirtualRegister"]


class VirtualRegister:
    """A 32-bit sequencer register (nisa.register_alloc)."""

    __slots__ = ("_reg",)

    def __init__(self, reg: Any):
        self._reg = reg

    def __repr__(self) -> str:
        return f"VirtualRegister(r{self._reg.id})"

    def __bool__(self) -> NoReturn:
        raise kernel_error_at(user_frame(2), "a register's value is only known at run time",
                              hint="loop on registers with nl.fori_loop / nl.while_loop")
