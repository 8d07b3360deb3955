"""nikki: an NKI-compatible kernel language and simulator for AWS NeuronCore.

``import nikki as nki`` (with ``nikki.language as nl`` and ``nikki.isa as nisa``) runs NKI
kernels on numpy arrays or torch CPU tensors, on a simulated NeuronCore with NKI's numerics.
"""

from __future__ import annotations

from . import _core
from .errors import KernelError, SpillWarning, ViewError

_core._set_error_classes(KernelError, ViewError)

from . import isa, language  # noqa: E402
from . import index_expr  # noqa: E402,F401  (the legacy layer: fills the hooks of the core, isa and language)
from . import collectives, compiler, typing  # noqa: E402
from .dtypes import dtype  # noqa: E402
from .entry import FrameworkKernel, baremetal, simulate, simulate_kernel  # noqa: E402
from .profiling import Explanation, Profile, benchmark, estimate, profile  # noqa: E402
from .autotune import autotune  # noqa: E402
from .kernel import Kernel, jit  # noqa: E402
from .spec import TensorSpec, spec  # noqa: E402
from .specialization_cache import cache_info, clear_cache, set_cache_limit  # noqa: E402
from .tensor import NkiTensor  # noqa: E402

tensor = NkiTensor  # Beta 1's nki.tensor class (isinstance checks); the module stays nikki.tensor in sys.modules

__version__ = "0.1.0"

__all__ = [
    "jit", "simulate", "simulate_kernel", "baremetal", "benchmark", "profile", "estimate", "Profile", "Explanation",
    "autotune", "Kernel", "KernelError",
    "SpillWarning", "spec", "TensorSpec", "dtype", "language", "isa", "typing", "compiler", "collectives", "__version__",
    "set_cache_limit", "clear_cache", "cache_info",
]
