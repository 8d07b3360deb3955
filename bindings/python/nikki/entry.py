"""NKI's entry points besides @nki.jit: simulate (current API) and the legacy decorators."""

from __future__ import annotations

import functools
import sys

from .errors import KernelError, without_internal_frames
from .kernel import Kernel

__all__ = ["simulate", "simulate_kernel", "baremetal", "DecoratedKernel", "as_kernel", "FrameworkKernel"]


class DecoratedKernel:
    """A kernel under a legacy decorator (``baremetal``, ``benchmark``, ``profile``): calling it runs
    the decorator's `action(kernel, args, kwargs, self)`; ``decorated[g0, g1]`` is the same decorator
    over the SPMD launch ``kernel[g0, g1]`` (results such as ``benchmark_result`` are set on the
    object called)."""

    def __init__(self, kernel: Kernel, action):
        functools.update_wrapper(self, kernel.fn)
        self.kernel = kernel
        self._action = action

    def __call__(self, *args, **kwargs):
        try:
            return self._action(self.kernel, args, kwargs, self)
        except (KernelError, NotImplementedError) as err:  # show the user's frames and this one only
            raise err.with_traceback(without_internal_frames(err.__traceback__)) from None

    def __getitem__(self, grid) -> "DecoratedKernel":
        return DecoratedKernel(self.kernel[grid], self._action)

    def __repr__(self) -> str:
        return f"<nikki {self._action.__name__.strip('_')} of {self.kernel!r}>"


def as_kernel(kernel) -> Kernel:
    """The Kernel of a function, a Kernel, or a legacy-decorated kernel (its launch grid kept)."""
    if isinstance(kernel, DecoratedKernel):
        return kernel.kernel
    return kernel if isinstance(kernel, Kernel) else Kernel(kernel)


_as_kernel = as_kernel


def simulate(kernel):
    """``nki.simulate(kernel)(*args)``: runs the kernel on the simulated NeuronCore with numpy arrays
    or torch tensors (nikki always simulates, so this is the kernel itself)."""
    return _as_kernel(kernel)


def simulate_kernel(kernel, *args, **kwargs):
    """Legacy ``nki.simulate_kernel(kernel, *args)``: runs the kernel once and returns its outputs."""
    k = _as_kernel(kernel)
    try:
        return k(*args, **kwargs)
    except (KernelError, NotImplementedError) as err:  # show the user's frames and this one only
        raise err.with_traceback(without_internal_frames(err.__traceback__)) from None


_said_baremetal = False


def baremetal(kernel=None, **kwargs):
    """Legacy ``@nki.baremetal``: there is no device here, so the kernel runs on the simulated
    NeuronCore (said once on stderr). save_neff_name / save_trace_name and friends are ignored."""

    def wrap(fn):
        return DecoratedKernel(as_kernel(fn), _baremetal)

    return wrap if kernel is None else wrap(kernel)


def _baremetal(k: Kernel, args, kwargs, _decorated):
    global _said_baremetal
    if not _said_baremetal:
        print("nikki: nki.baremetal runs on nikki's simulated NeuronCore (no Neuron device is used)", file=sys.stderr)
        _said_baremetal = True
    return k(*args, **kwargs)


class FrameworkKernel:
    """Beta 1's base class for plugging NKI kernels into a framework as XLA custom calls (not part of
    nikki, which runs kernels on numpy arrays and torch CPU tensors directly)."""

    def __init__(self, *args, **kwargs):
        raise NotImplementedError("nki.FrameworkKernel (framework custom-call integration) is not supported by "
                                  "nikki; call the @nki.jit kernel on numpy arrays or torch CPU tensors, or wrap it "
                                  "with nikki.torch.nki_op (see docs/api-coverage.md)")
