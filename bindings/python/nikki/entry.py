"""NKI's entry points besides @nki.jit: simulate (current API) and the legacy decorators."""

from __future__ import annotations

import functools
import sys

from .errors import KernelError, without_internal_frames
from .kernel import Kernel

__all__ = ["simulate", "simulate_kernel", "baremetal"]


def _as_kernel(kernel) -> Kernel:
    return kernel if isinstance(kernel, Kernel) else Kernel(kernel)


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
        k = _as_kernel(fn)

        @functools.wraps(fn)
        def run(*args, **kw):
            global _said_baremetal
            if not _said_baremetal:
                print("nikki: nki.baremetal runs on nikki's simulated NeuronCore (no Neuron device is used)",
                      file=sys.stderr)
                _said_baremetal = True
            try:
                return k(*args, **kw)
            except (KernelError, NotImplementedError) as err:  # show the user's frames and this one only
                raise err.with_traceback(without_internal_frames(err.__traceback__)) from None

        return run

    return wrap if kernel is None else wrap(kernel)
