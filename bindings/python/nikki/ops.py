"""Operator names: how nl.add, np.add, nl.exp and friends map to ALU operators and activation
functions of the engines."""

from __future__ import annotations

import numpy as np

from . import _core
from .errors import kernel_error_at, user_frame

__all__ = ["alu_op", "act_func", "register_op", "op_name"]

# Filled by nikki.language: each nl function object -> (AluOp or None, ActFunc or None).
_NL_OPS: dict = {}

_NUMPY_ALU = {
    np.add: "add", np.subtract: "subtract", np.multiply: "multiply", np.divide: "divide",
    np.true_divide: "divide", np.maximum: "maximum", np.minimum: "minimum", np.fmax: "maximum",
    np.fmin: "minimum", np.max: "maximum", np.amax: "maximum", np.min: "minimum", np.amin: "minimum",
    np.power: "power", np.equal: "equal", np.not_equal: "not_equal", np.greater: "greater",
    np.greater_equal: "greater_equal", np.less: "less", np.less_equal: "less_equal",
    np.logical_and: "logical_and", np.logical_or: "logical_or", np.logical_xor: "logical_xor",
    np.bitwise_and: "bitwise_and", np.bitwise_or: "bitwise_or", np.bitwise_xor: "bitwise_xor",
    np.invert: "invert", np.left_shift: "left_shift", np.right_shift: "right_shift",
    np.abs: "abs", np.absolute: "abs", np.square: "square", np.reciprocal: "reciprocal",
    np.negative: "negate", np.sum: "add", np.prod: "multiply", np.mod: "mod", np.fmod: "fmod",
}
_NUMPY_ACT = {
    np.exp: "exp", np.log: "log", np.tanh: "tanh", np.sqrt: "sqrt", np.sin: "sin", np.arctan: "arctan",
    np.square: "square", np.abs: "abs", np.absolute: "abs", np.sign: "sign", np.reciprocal: "reciprocal",
}


def register_op(fn, alu: str | None = None, act: str | None = None) -> None:
    """Declares that nl function `fn` names ALU operator `alu` and/or activation `act`."""
    _NL_OPS[fn] = (getattr(_core.AluOp, alu) if alu else None, getattr(_core.ActFunc, act) if act else None)


def op_name(op) -> str:
    """A readable name for an operator argument."""
    for table in (_NUMPY_ALU, _NUMPY_ACT):
        if op in table:
            return f"np.{getattr(op, '__name__', table[op])}"
    name = getattr(op, "__name__", None) or getattr(op, "name", None) or repr(op)
    return f"nl.{name}" if op in _NL_OPS else str(name)


def _lookup(op):
    if isinstance(op, _core.AluOp):
        return op, None
    if isinstance(op, _core.ActFunc):
        return None, op
    try:
        if op in _NL_OPS:
            return _NL_OPS[op]
    except TypeError:
        pass
    alu = _NUMPY_ALU.get(op) if _hashable(op) else None
    act = _NUMPY_ACT.get(op) if _hashable(op) else None
    return (getattr(_core.AluOp, alu) if alu else None, getattr(_core.ActFunc, act) if act else None)


def _hashable(x) -> bool:
    try:
        hash(x)
        return True
    except TypeError:
        return False


# op -> AluOp / ActFunc of ops already resolved: every traced instruction resolves its operator,
# and the general lookup below costs several isinstance tests and dict probes.
_ALU_RESOLVED: dict = {}
_ACT_RESOLVED: dict = {}


def _remember(table: dict, op, value):
    if _hashable(op):
        table[op] = value
    return value


def alu_op(op, param: str = "op") -> _core.AluOp:
    """The ALU operator named by `op`, or a KernelError naming the parameter."""
    try:
        return _ALU_RESOLVED[op]
    except (KeyError, TypeError):
        pass
    alu, act = _lookup(op)
    if alu is None:
        what = "an activation function, not an ALU operator" if act is not None else "not an ALU operator"
        raise kernel_error_at(user_frame(2), f"{param}={op_name(op)} is {what}",
                              hint="pass an ALU operator such as nl.add, nl.multiply, nl.maximum (or np.add)")
    return _remember(_ALU_RESOLVED, op, alu)


def act_func(op, param: str = "op") -> _core.ActFunc:
    """The activation function named by `op`, or a KernelError naming the parameter."""
    try:
        return _ACT_RESOLVED[op]
    except (KeyError, TypeError):
        pass
    alu, act = _lookup(op)
    if act is None:
        what = "an ALU operator, not an activation function" if alu is not None else "not an activation function"
        raise kernel_error_at(user_frame(2), f"{param}={op_name(op)} is {what}",
                              hint="pass an activation function such as nl.exp, nl.copy, nl.gelu, nl.tanh")
    return _remember(_ACT_RESOLVED, op, act)
