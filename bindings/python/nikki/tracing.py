"""The trace context: the kernel being built on this thread and the user's source locations."""

from __future__ import annotations

import dis
import sys
import threading

from . import _core
from .errors import _PACKAGE_DIR, KernelError, _positions, kernel_error_at, user_frame

__all__ = ["TraceContext", "current", "maybe_current", "location"]

_state = threading.local()


class TraceContext:
    """Everything the NKI API needs while one program instance of a kernel is traced."""

    def __init__(self, name: str, target: str, grid: tuple = (), program_ids: tuple = (), sanitize: bool = False):
        self.builder = _core.Builder(name, target, list(grid), list(program_ids))
        # sanitized kernels record their nl.affine_range loops for the loop-dependency check
        self.sanitize = sanitize
        self.builder.record_parallel_loops(sanitize)
        self.target = target
        self.grid = tuple(grid)
        self.program_ids = tuple(program_ids)
        self._locations: dict = {}
        self.regions: dict = {}  # storage id -> MemoryRegion, cached: the binding call is slow
        # index -> NkiTensor of fresh PSUM tiles produced by a legacy functional nc_matmul, so
        # `psum[...] += nisa.nc_matmul(...)` can accumulate in place.
        self.pending_matmul: dict = {}
        # storage id -> isa._MaskedWrite of fresh tiles written by a legacy masked instruction
        self.masked_writes: dict = {}
        # numpy arrays of nl.shared_constant tensors, in the order of their (input) storages
        self.constants: list = []
        # (region, placement, tiles) of a direct allocation -> the block tensor placed there first,
        # which later tensors given the same placement share (their memory is the same)
        self.placed: dict = {}
        # storages that more than one such tensor shares
        self.shared_placements: set = set()
        # shared storage -> the regions a '+=' sum has started in since its latest allocation
        self.started_sums: dict = {}

    def location(self, depth: int = 2) -> int:
        """Interned location of the user's line that is calling into nikki."""
        frame = sys._getframe(depth)
        while frame.f_code.co_filename.startswith(_PACKAGE_DIR) and frame.f_back is not None:
            frame = frame.f_back
        key = (frame.f_code, frame.f_lasti)
        loc = self._locations.get(key)
        if loc is None:
            code = frame.f_code
            line, column, end_column = frame.f_lineno, 0, 0
            pos = _positions(code, frame.f_lasti)
            if pos is not None:
                line, column, end_column = pos
            loc = self.builder.location(code.co_filename, line, column, end_column, code.co_name)
            self._locations[key] = loc
        return loc

    def __enter__(self):
        self._previous = getattr(_state, "ctx", None)
        _state.ctx = self
        return self

    def __exit__(self, *exc):
        _state.ctx = self._previous
        return False


_STORES = {"STORE_FAST", "STORE_NAME", "STORE_GLOBAL", "STORE_DEREF"}
_assigned_names: dict = {}


def assigned_name(frame) -> str:
    """The variable the call at `frame`'s current instruction is assigned to (``x = nl.ndarray(...)``
    gives "x"), or "" when the result is not stored straight into a name."""
    code = frame.f_code
    table = _assigned_names.get(code)
    if table is None:
        table = {}
        instructions = list(dis.get_instructions(code))
        for current_instr, following in zip(instructions, instructions[1:]):
            if current_instr.opname.startswith("CALL") and following.opname in _STORES:
                # A frame's f_lasti sits on the call or on its last inline cache entry.
                table[current_instr.offset] = following.argval
                table[following.offset - 2] = following.argval
        _assigned_names[code] = table
    return table.get(frame.f_lasti, "")


def maybe_current() -> TraceContext | None:
    """The active trace context, or None outside a kernel."""
    return getattr(_state, "ctx", None)


def current(api: str = "NKI API") -> TraceContext:
    """The active trace context; a KernelError naming the call if no kernel is being traced."""
    ctx = getattr(_state, "ctx", None)
    if ctx is None:
        raise kernel_error_at(user_frame(2), f"{api} called outside of a kernel",
                              hint="call nki.language / nki.isa functions inside a function decorated "
                                   "with @nki.jit, and call that function")
    return ctx


def location(depth: int = 3) -> int:
    """Location id of the user's line in the current trace."""
    return current().location(depth)
