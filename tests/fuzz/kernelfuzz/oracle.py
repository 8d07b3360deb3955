"""The oracle: runs one generated kernel module under every executor and stream order and judges
the outcome.

A valid kernel must run without error under each configuration, leave its inputs untouched, give
the same output bytes under all of them (the native executor and the reference interpreter, stream
orders latest, earliest and two random seeds), and match the numpy reference where the case has
one. An invalid kernel must raise ``nikki.KernelError`` under each configuration, with a message
matching the expected rule, located at the expected line of the kernel's file. Anything else is a
failure: another exception type, a KernelError without a location, a mismatch.

Runs in a worker process (``worker.py``), so that a crash takes down only the worker.
"""

from __future__ import annotations

import importlib.util
import os
import re
import traceback
from dataclasses import dataclass

import numpy as np

from . import reference as ref
from .case import Case, ExpectedError

# (NIKKI_EXECUTOR, NIKKI_STREAM_ORDER); the first is the reference every other is compared with.
VALID_CONFIGS = (("interp", "latest"), ("native", "latest"), ("native", "earliest"), ("native", "random:{a}"),
                 ("native", "random:{b}"), ("interp", "random:{c}"))
# Invalid kernels must be rejected cleanly by both executors.
INVALID_CONFIGS = (("interp", "latest"), ("native", "random:{a}"))


@dataclass
class Outcome:
    """The verdict on one case: ``ok`` or a failure kind with details."""

    ok: bool
    kind: str = ""  # mismatch | reference | unexpected_error | other_exception | missing_error | wrong_error | ...
    detail: str = ""
    signature: str = ""  # what identifies the same failure in a reduced kernel (exceptions: type and message)
    configs: int = 0

    def as_dict(self) -> dict:
        return {"ok": self.ok, "kind": self.kind, "detail": self.detail, "signature": self.signature,
                "configs": self.configs}


def signature(err: BaseException) -> str:
    """An exception's type and first message line, without the numbers and quoted names that
    change when a kernel is reduced."""
    text = getattr(err, "summary", "") or str(err)
    first = text.strip().split("\n")[0] if text.strip() else ""
    return f"{type(err).__name__}: " + re.sub(r"'[^']*'|\d+", "#", first)


def load_module(source: str, path: str):
    """Writes `source` to `path` (so errors can quote its lines) and imports it as a fresh module."""
    with open(path, "w") as f:
        f.write(source)
    import linecache

    linecache.checkcache(path)
    name = f"fuzzcase_{abs(hash((path, source))) & 0xFFFFFFFF:x}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _configs(configs, seed: int):
    rng = np.random.default_rng(seed ^ 0x5EED)
    a, b, c = (int(x) for x in rng.integers(1, 2 ** 31, size=3))
    return [(e, o.format(a=a, b=b, c=c)) for e, o in configs]


class _Env:
    """Sets NIKKI_EXECUTOR / NIKKI_STREAM_ORDER for one run and restores them."""

    def __init__(self, executor: str, order: str):
        self.values = {"NIKKI_EXECUTOR": executor, "NIKKI_STREAM_ORDER": order}

    def __enter__(self):
        self.saved = {k: os.environ.get(k) for k in self.values}
        os.environ.update(self.values)

    def __exit__(self, *exc):
        for k, v in self.saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _run_once(module, inputs, executor: str, order: str, alive: list):
    """Runs the kernel once under a configuration, from a fresh nki.jit object so nothing compiled
    under another configuration is reused. Returns (outputs, exception, the arguments passed).
    The kernel object is kept in `alive` until the case ends: while a program lives, nikki reuses
    its native code in memory for the next configuration instead of reloading it."""
    import nikki as nki

    original = module.kernel
    kernel = nki.jit(original.fn, target=original.target)
    alive.append(kernel)
    grid = getattr(module, "GRID", ())
    if grid:
        kernel = kernel[grid]
    args = [a.copy() for a in inputs]
    with _Env(executor, order):
        try:
            result = kernel(*args)
        except Exception as err:  # judged by the caller
            return None, err, args
    outs = list(result) if isinstance(result, (tuple, list)) else [result]
    return [np.asarray(o) for o in outs], None, args


def _describe(err: BaseException) -> str:
    tb = "".join(traceback.format_exception(type(err), err, err.__traceback__, limit=-8))
    return f"{type(err).__name__}: {err}\n{tb}"


def check_error(err: BaseException, expected: ExpectedError | None, path: str) -> tuple[bool, str]:
    """Whether `err` is the clean KernelError an invalid kernel must raise."""
    import nikki

    if not isinstance(err, nikki.KernelError):
        return False, f"raised {type(err).__name__} instead of nikki.KernelError"
    if not str(err).strip() or not err.summary.strip():
        return False, "KernelError with an empty message"
    if not err.file or err.line <= 0:
        return False, "KernelError without a source location"
    if os.path.realpath(err.file) != os.path.realpath(path):
        return False, f"KernelError located in {err.file}:{err.line}, not in the kernel's file"
    if expected is not None:
        if expected.lines and err.line not in expected.lines:
            return False, f"KernelError at line {err.line}, expected one of lines {list(expected.lines)}"
        if not re.search(expected.pattern, str(err), re.IGNORECASE | re.DOTALL):
            return False, f"KernelError does not match /{expected.pattern}/ ({expected.what})"
    return True, ""


def judge(case: Case, path: str, seed: int) -> Outcome:
    """Runs `case` (written to `path`) under every configuration and returns the verdict."""
    try:
        module = load_module(case.source, path)
        inputs = module.make_inputs()
    except Exception as err:
        return Outcome(False, "generator", f"the generated module does not load: {_describe(err)}",
                       signature(err))
    configs = _configs(VALID_CONFIGS if case.valid else INVALID_CONFIGS, seed)
    pristine = [a.copy() for a in inputs]
    results, alive = [], []
    for executor, order in configs:
        outs, err, args = _run_once(module, inputs, executor, order, alive)
        label = f"NIKKI_EXECUTOR={executor} NIKKI_STREAM_ORDER={order}"
        if not case.valid:
            if err is None:
                return Outcome(False, "missing_error", f"{label}: the kernel ran, but it breaks a hardware rule "
                               f"({case.error.what}: expected KernelError matching /{case.error.pattern}/)",
                               configs=len(results))
            good, why = check_error(err, case.error, path)
            if not good:
                kind = "wrong_error" if "KernelError" in type(err).__name__ else "other_exception"
                return Outcome(False, kind, f"{label}: {why}\n{_describe(err)}", signature(err))
            results.append(None)
            continue
        if err is not None:
            import nikki

            if isinstance(err, nikki.KernelError):
                good, why = check_error(err, None, path)
                detail = f"{label}: a valid kernel raised KernelError{'' if good else ' (' + why + ')'}:\n{err}"
                return Outcome(False, "unexpected_error", detail, signature(err))
            return Outcome(False, "other_exception", f"{label}: {_describe(err)}", signature(err))
        for i, (a, b) in enumerate(zip(args, pristine)):
            if a.tobytes() != b.tobytes():
                return Outcome(False, "input_modified", f"{label}: input {i} was modified by the kernel")
        results.append((label, outs))
    if not case.valid:
        return Outcome(True, configs=len(results))
    base_label, base = results[0]
    for label, outs in results[1:]:
        if len(outs) != len(base):
            return Outcome(False, "mismatch", f"{label} returned {len(outs)} outputs, {base_label} {len(base)}")
        for i, (x, y) in enumerate(zip(base, outs)):
            if x.dtype != y.dtype or x.shape != y.shape or x.tobytes() != y.tobytes():
                return Outcome(False, "mismatch", f"output {i} differs between {base_label} and {label}: "
                               f"{_first_difference(x, y)}")
    for i, (out, want) in enumerate(zip(base, case.expected)):
        if want is None:
            continue
        good, why = ref.compare(out, want, case.output_dtypes[i])
        if not good:
            return Outcome(False, "reference", f"output {i} ({case.output_dtypes[i]}): {why}")
    return Outcome(True, configs=len(results))


def _first_difference(x: np.ndarray, y: np.ndarray) -> str:
    if x.shape != y.shape or x.dtype != y.dtype:
        return f"{x.dtype}{x.shape} vs {y.dtype}{y.shape}"
    xb = x.reshape(-1).view(np.uint8).reshape(x.size, -1)
    yb = y.reshape(-1).view(np.uint8).reshape(y.size, -1)
    bad = np.nonzero((xb != yb).any(axis=1))[0]
    first = np.unravel_index(bad[0], x.shape)
    return (f"{len(bad)} of {x.size} elements; first at {tuple(int(i) for i in first)}: {x[first]!r} vs "
            f"{y[first]!r}")


def run_source(source: str, path: str, expected: ExpectedError | None, seed: int) -> Outcome:
    """Judges a kernel module without a numpy reference (reproducers and reduced variants)."""
    return judge(Case(seed=seed, front="python", source=source, error=expected), path, seed)

