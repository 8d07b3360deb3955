"""Checks of the plain values users pass to nikki's entry points: flags, integers, numbers, shapes.

One place says what each kind of value accepts, so that every entry point agrees: numpy scalars
are values of their kind (``np.True_`` is a bool, ``np.int64(3)`` an int, ``np.float32(1e-5)`` a
number), a bool is not an int or a number where a size or a count goes, and no string, None or
array is turned into a number by ``bool()`` / ``int()`` / ``float()`` on the way. A value that does
not fit raises a :class:`nikki.KernelError` located at the user's line that names the argument,
what it must be and what it was.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from .errors import KernelError, kernel_error_at, user_frame

__all__ = ["is_bool", "is_int", "is_real", "check_bool", "check_int", "check_real", "check_shape", "describe"]

# Integers a double holds exactly: the C++ side takes scalar operands and parameters as doubles.
EXACT_INT_LIMIT = 2 ** 53


def is_bool(value) -> bool:
    """True for Python and numpy bools."""
    return value is True or value is False or isinstance(value, np.bool_)


def is_int(value) -> bool:
    """True for Python and numpy integers, bools excluded."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def is_real(value) -> bool:
    """True for Python and numpy real numbers, bools excluded."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def describe(value) -> str:
    """A short description of a value for an error message: arrays and tensors by type, shape and
    dtype; other values by their repr and, when that does not make it obvious, their type."""
    kind = type(value)
    type_name = ("" if kind.__module__ == "builtins" else kind.__module__.split(".")[0] + ".") + kind.__qualname__
    shape, dtype = getattr(value, "shape", None), getattr(value, "dtype", None)
    if isinstance(shape, tuple) or type(shape).__name__ == "Size":
        layout = getattr(value, "layout", None)
        layout_text = f" {layout}" if layout is not None and "strided" not in str(layout) else ""
        return f"a{layout_text} {type_name} of shape {tuple(shape or ())} and dtype {dtype}"
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return text if kind in (bool, int, float, str, type(None)) else f"{text} (a {type_name})"


def argument_error(what: str, expected: str, value, hint: str = "", limit: str = "",
                   got: str | None = None) -> KernelError:
    """The KernelError for argument `what` (e.g. "nisa.tensor_scalar: reverse0") holding `value`
    where `expected` (e.g. "a bool") goes, located at the user's line; `got` replaces the
    description of the value."""
    return kernel_error_at(user_frame(), f"{what} must be {expected}, got {got or describe(value)}", limit=limit,
                           hint=hint)


def check_bool(value, what: str) -> bool:
    """`value` as a bool, if it is a Python or numpy bool."""
    if value is True or value is False:
        return value
    if isinstance(value, np.bool_):
        return bool(value)
    raise argument_error(what, "a bool (True or False)", value)


def check_int(value, what: str, minimum: int | None = None, maximum: int | None = None) -> int:
    """`value` as an int, if it is a Python or numpy integer (not a bool) within [minimum, maximum]."""
    if value.__class__ is not int:
        if not is_int(value):
            raise argument_error(what, "an integer", value)
        value = int(value)
    if minimum is not None and value < minimum or maximum is not None and value > maximum:
        bounds = (f"at least {minimum}" if maximum is None else f"at most {maximum}" if minimum is None
                  else f"in [{minimum}, {maximum}]")
        raise argument_error(what, f"an integer {bounds}", value)
    return value


def check_real(value, what: str, finite: bool = False) -> float:
    """`value` as a float, if it is a Python or numpy real number (NaN and infinities only when
    not `finite`)."""
    if value.__class__ is float and (not finite or math.isfinite(value)):
        return value
    if not is_real(value):
        raise argument_error(what, "a finite number" if finite else "a number", value)
    try:
        number = float(value)
    except OverflowError:
        raise argument_error(what, "a number within the float range", value) from None
    if finite and not math.isfinite(number):
        raise argument_error(what, "a finite number", value)
    return number


def check_shape(shape, what: str, max_rank: int, allow_int: bool = True, minimum: int = 1) -> tuple:
    """`shape` as a tuple of at most `max_rank` ints of at least `minimum` (an int is a 1-D shape
    when `allow_int`)."""
    if allow_int and is_int(shape):
        shape = (shape,)
    try:
        dims = tuple(shape)
    except TypeError:
        raise argument_error(what, "a tuple of integers", shape) from None
    expected = "a tuple of positive integers" if minimum == 1 else f"a tuple of integers of at least {minimum}"
    if isinstance(shape, (str, bytes)) or not all(is_int(d) for d in dims):
        raise argument_error(what, expected, shape)
    dims = tuple(int(d) for d in dims)
    if not dims or any(d < minimum for d in dims):
        raise argument_error(what, expected, shape, hint="NKI tensors have at least one dim")
    if len(dims) > max_rank:
        raise argument_error(what, f"at most {max_rank} dims", shape, limit=f"tensors have at most {max_rank} dims")
    return dims
