"""nikki's library of prebuilt kernels, callable on numpy arrays and torch CPU tensors.

Every kernel of the C++ registry is an attribute of this module: ``nikki.kernels.softmax(x)``,
``nikki.kernels.flash_attention(q, k, v, causal=True)``. Each is a :class:`nikki.library.LibraryKernel`:
its docstring gives dimensions, arguments, results and limits; ``nikki.estimate(nikki.kernels.matmul,
nikki.spec(...), ...)`` estimates it on the modelled NeuronCore. Backward kernels are listed too
(``softmax_bwd``, ...); ``nikki.torch`` wires them into autograd.
"""

from __future__ import annotations

from .library import LibraryKernel, library_kernels

globals().update(library_kernels())

__all__ = sorted(library_kernels())


def names() -> list:
    """The names of every library kernel, forward and backward."""
    return sorted(library_kernels())


def __getattr__(name: str):
    import difflib

    close = difflib.get_close_matches(name, library_kernels(), n=3)
    hint = f"; did you mean {', '.join(close)}?" if close else f"; available: {', '.join(names())}"
    raise AttributeError(f"nikki.kernels has no kernel '{name}'{hint}")
