"""Errors raised by nikki, and the traceback hygiene that keeps them about the user's code."""

from __future__ import annotations

import linecache
import os
import sys
import types

__all__ = ["KernelError", "KernelCallError", "NikkiInternalError", "SpillWarning"]

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


class KernelError(ValueError):
    """A kernel the hardware would reject, or a misuse of the NKI API.

    Attributes name where (``file``, ``line``, ``column``), what (``summary``, ``instruction``),
    the limit that was broken (``limit``) and how to fix it (``hint``). ``str()`` shows the user's
    source line with a caret under the offending call.
    """

    def __init__(self, summary: str, file: str = "", line: int = 0, column: int = 0,
                 end_column: int = 0, instruction: str = "", limit: str = "", hint: str = ""):
        self.summary = summary
        self.file = file
        self.line = line
        self.column = column
        self.end_column = end_column
        self.instruction = instruction
        self.limit = limit
        self.hint = hint
        super().__init__(self._render())

    def __reduce__(self):
        return (type(self), (self.summary, self.file, self.line, self.column, self.end_column,
                             self.instruction, self.limit, self.hint))

    def _render(self) -> str:
        parts = [self.summary]
        if self.file:
            parts.append(f'  File "{self.file}", line {self.line}')
            source = linecache.getline(self.file, self.line).rstrip("\n")
            if source.strip():
                stripped = source.lstrip()
                indent = len(source) - len(stripped)
                parts.append(f"    {stripped}")
                if self.end_column > self.column >= indent:
                    parts.append("    " + " " * (self.column - indent) + "^" * (self.end_column - self.column))
        if self.instruction:
            parts.append(f"  instruction: {self.instruction}")
        if self.limit:
            parts.append(f"  limit: {self.limit}")
        if self.hint:
            parts.append(f"  hint: {self.hint}")
        return "\n".join(parts)


KernelError.__module__ = "nikki"


class KernelCallError(KernelError, TypeError):
    """An NKI function called with arguments it does not take (an unknown keyword, a missing
    argument), named by its public name (``nisa.tensor_copy: got an unexpected keyword argument
    'bogus'``) and located at the user's call. A TypeError, as Python's own error for such a call."""


KernelCallError.__module__ = "nikki"


class SpillWarning(UserWarning):
    """The kernel's SBUF tensors did not fit, so nikki moved idle ones to HBM and back (as NKI's
    compiler does). Results are unchanged; the spill DMAs cost time in the estimated profile. The
    message names each spilled tensor, where it was allocated and the bytes moved."""


SpillWarning.__module__ = "nikki"


class NikkiInternalError(RuntimeError):
    """A broken invariant inside nikki: a bug in nikki, never in the user's kernel."""


class ViewError(Exception):
    """Raised by the C++ core for a bad view (slice, reshape, ...); re-raised as KernelError with
    the user's location by the tensor layer."""

    def __init__(self, what: str, limit: str = "", hint: str = ""):
        super().__init__(what)
        self.what = what
        self.limit = limit
        self.hint = hint


def is_internal_frame(filename: str) -> bool:
    """True for frames of nikki's own Python code."""
    return filename.startswith(_PACKAGE_DIR)


def user_frame(depth: int = 1):
    """The innermost frame that is not nikki's own code, starting `depth` frames up."""
    frame: types.FrameType | None = sys._getframe(depth)
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE_DIR):
        frame = frame.f_back
    return frame


def without_internal_frames(tb: types.TracebackType | None) -> types.TracebackType | None:
    """The traceback with nikki's own frames removed, so errors point at the user's code."""
    kept = []
    while tb is not None:
        if not is_internal_frame(tb.tb_frame.f_code.co_filename):
            kept.append(tb)
        tb = tb.tb_next
    result = None
    for entry in reversed(kept):
        result = types.TracebackType(result, entry.tb_frame, entry.tb_lasti, entry.tb_lineno)
    return result


def kernel_error_at(frame, summary: str, limit: str = "", hint: str = "", instruction: str = "") -> KernelError:
    """A KernelError located at the current line of `frame` (with its column range when known)."""
    code = frame.f_code
    line, column, end_column = frame.f_lineno, 0, 0
    positions = _positions(code, frame.f_lasti)
    if positions is not None:
        line, column, end_column = positions
    return KernelError(summary, code.co_filename, line, column, end_column, instruction, limit, hint)


def kernel_error_in_traceback(err: BaseException, summary: str, hint: str = "",
                              cls: type[KernelError] = KernelError) -> KernelError:
    """A KernelError located at the innermost line of the user's code in `err`'s traceback (the
    line of a kernel that made nikki raise `err`); unlocated when no such line is in it."""
    tb, user = err.__traceback__, None
    while tb is not None:
        if not is_internal_frame(tb.tb_frame.f_code.co_filename):
            user = tb
        tb = tb.tb_next
    if user is None:
        return cls(summary, hint=hint)
    code = user.tb_frame.f_code
    line, column, end_column = _positions(code, user.tb_lasti) or (user.tb_lineno, 0, 0)
    return cls(summary, code.co_filename, line, column, end_column, hint=hint)


def _positions(code, lasti: int):
    """(line, column, end_column) of the bytecode instruction at `lasti`, if available."""
    try:
        positions = list(code.co_positions())
    except AttributeError:
        return None
    index = lasti // 2
    if 0 <= index < len(positions):
        line, end_line, col, end_col = positions[index]
        if line is not None and col is not None:
            return line, col, end_col if (end_line == line and end_col is not None) else 0
    return None
