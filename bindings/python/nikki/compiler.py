"""nki.compiler: compiler controls, for both API generations.

Beta 1 (``neuronxcc.nki.compiler``, "direct allocation"): ``ncc.sbuf.mod_alloc(...)`` /
``ncc.psum.mod_alloc(...)`` / ``.alloc(func)`` / ``.auto_alloc()`` as the ``buffer=`` of
``nl.ndarray``, and the decorators ``enable_stack_allocator``, ``skip_middle_end_transformations``,
``force_auto_alloc``, ``multi_buffer``. nikki allocates every tensor itself (from live ranges), so
a placement is a request it does not need: the tensor lives in the allocator's memory, and block
dims beyond the allocator's physical tile count wrap onto its tiles (``num_free_tiles=(2,)`` over 8
blocks: block b is tile b % 2), as the hardware's modular allocation does. Two ``mod_alloc``
tensors with the same placement and size are one memory, as on the device (kernels overlay PSUM
tensors they use in turn this way). The decorators change nothing about what a kernel computes and
return the kernel.

NKI 2.33 (``nki.compiler``): ``CompileConfig``, ``SpecializationConfig`` and ``AddressRotation``
hold options for NKI's compiler; ``nki.jit(compile_config=...)`` accepts and ignores them.
"""

from __future__ import annotations

import contextlib
import types

from .tensor import MemoryRegion, psum as _psum, sbuf as _sbuf

__all__ = [
    "sbuf", "psum", "enable_stack_allocator", "skip_middle_end_transformations", "force_auto_alloc",
    "multi_buffer", "no_reorder", "CompileConfig", "SpecializationConfig", "AddressRotation", "Allocation",
]


class Allocation:
    """A direct-allocation request (``ncc.sbuf.mod_alloc(base_addr=...)``) used as a ``buffer=``.

    `tiles` is the physical tile count of each leading block dim (empty: one tile per block)."""

    __slots__ = ("region", "tiles", "placement")

    def __init__(self, region: MemoryRegion, tiles=(), placement=None):
        self.region = region
        self.tiles = tuple(int(t) for t in tiles)
        self.placement = placement

    def __repr__(self) -> str:
        return f"<{self.region.name} allocation tiles={self.tiles} {self.placement}>"


class _AllocatorSpace:
    """``ncc.sbuf`` / ``ncc.psum``: the allocators of one on-chip memory."""

    def __init__(self, region: MemoryRegion):
        self.region = region

    def __repr__(self) -> str:
        return f"ncc.{self.region.name}"

    def mod_alloc(self, base_addr=0, base_partition=0, num_par_tiles=(), num_free_tiles=(), base_bank=None,
                  num_bank_tiles=()):
        """Tiles placed from `base_addr` (SBUF bytes) or `base_bank` (PSUM); block indices wrap
        modulo the tile counts."""
        tiles = tuple(num_bank_tiles) or tuple(num_free_tiles) or tuple(num_par_tiles)
        return Allocation(self.region, tiles, ("mod_alloc", base_bank if base_bank is not None else base_addr,
                                               base_partition))

    def alloc(self, func):
        """Tiles placed by `func(block_index, partition_size, free_size)`."""
        return Allocation(self.region, (), ("alloc", func))

    def auto_alloc(self):
        """Tiles placed by the compiler (nikki always does)."""
        return Allocation(self.region)


sbuf = _AllocatorSpace(_sbuf)
psum = _AllocatorSpace(_psum)


def _decorator_with_options(func, **_options):
    """A decorator usable bare (``@d``) or with options (``@d(log_level=...)``) that returns the kernel."""
    if func is None:
        return lambda f: f
    return func


def enable_stack_allocator(func=None, log_level=None, **options):
    """Beta 1: allocate the kernel's tensors with the stack allocator. nikki's allocator is used."""
    return _decorator_with_options(func, log_level=log_level, **options)


def skip_middle_end_transformations(func=None, **options):
    """Beta 1: keep the kernel as written (nikki never transforms it)."""
    return _decorator_with_options(func, **options)


def force_auto_alloc(func=None, **options):
    """Beta 1: ignore the kernel's direct allocations (nikki allocates every tensor anyway)."""
    return _decorator_with_options(func, **options)


def multi_buffer(factor: int = 2):
    """Beta 1 loop directive (``nl.affine_range(n, directives=ncc.multi_buffer(2))``): a hint."""
    return ("multi_buffer", int(factor))


def no_reorder():
    """Beta 1 directive (``nl.sequential_range(n, directives=ncc.no_reorder())``, or a ``with``
    block): keep the loop's instructions in program order. nikki's streams keep program-order
    semantics whatever the directive, so it changes nothing."""
    return contextlib.nullcontext()


class _Options:
    """A bag of compiler options: keyword fields, shown by repr, compared by value."""

    def __init__(self, **options):
        self.__dict__.update(options)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in self.__dict__.items())})"

    def __eq__(self, other) -> bool:
        return type(other) is type(self) and other.__dict__ == self.__dict__

    __hash__ = None  # type: ignore[assignment]  # equal by value, so unhashable


class CompileConfig(_Options):
    """NKI compiler options (address_rotation, dead_code_elim, ...): accepted, no effect on nikki."""


class SpecializationConfig(_Options):
    """NKI specialization options: accepted, no effect on nikki."""


class AddressRotation(_Options):
    """NKI address-rotation options: accepted, no effect on nikki."""


def _kernel_builder_attribute(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    raise NotImplementedError(f"nki.compiler.kernel_builder.{name} (compiling a kernel to a NEFF file for the Neuron "
                              "runtime) is not supported by nikki (see docs/api-coverage.md)")


# ``from nki.compiler.kernel_builder import compile_kernel`` fails naming what is missing.
kernel_builder = types.ModuleType("nki.compiler.kernel_builder", "NKI's ahead-of-time kernel builder (not in nikki)")
setattr(kernel_builder, "__getattr__", _kernel_builder_attribute)  # module-level __getattr__ (PEP 562)

