#!/usr/bin/env python3
"""Front-end overhead of nikki's Python API: tracing cost per instruction and the cost of a
cached kernel call, each next to reference costs measured in the same run.

    PYTHONPATH=bindings/python python bench/python/bench_frontend.py [--quick] [--profile]

Not a test: it prints tables. The machine is assumed noisy, so figures are medians of several
repetitions (tracing also shows the best one) and are given as ratios to two references measured
in the same run: a no-op Python function call and numpy's ``a + b`` on the same [128, 512] fp32
arrays.

What is measured:

* tracing: ``Kernel._trace`` (run the kernel body under a TraceContext and finish the IR; no
  verification, allocation, scheduling or code generation) on kernels that emit 1k and 10k
  instructions from Python loops, reported in microseconds per emitted instruction;
* a cached call of a small kernel (one [128, 512] add), split into: argument binding and
  cache-key lookup, the Python side of the launch (pointers, output allocation), and the
  simulated execution of the device program; an empty-ish kernel (one [1, 1] copy) shows the
  fixed per-run cost of the executor.

With --profile, the cached calls and a 10k-instruction trace are run under cProfile and the top
functions by own time are printed. (The simulated execution is one C++ call; profile it with
``perf record`` on a loop of ``Program.run``, see bench/README.md.)
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import os
import pstats
import statistics
import sys
import time

import numpy as np

try:  # an installed nikki or PYTHONPATH first, else the source tree's bindings/python
    import nikki as nki
except ImportError:
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bindings", "python"))
    import nikki as nki

import nikki.isa as nisa  # noqa: E402
import nikki.language as nl  # noqa: E402
from nikki import kernel as _kernel_mod  # noqa: E402
from nikki.dtypes import numpy_dtype  # noqa: E402

TRACE_TARGET_US = 5.0  # per instruction
CALL_TARGET_US = 20.0  # per cached call


# --- timing helpers ---------------------------------------------------------------------------

def each_call_us(fn, calls: int) -> list[float]:
    """Microseconds of each single call of fn() (for medians over many calls)."""
    out = []
    gc.disable()
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e6)
    gc.enable()
    return out


def noop():
    return None


# --- kernels ----------------------------------------------------------------------------------

P, F = 128, 512
SMALL = (32, 64)  # tile of the tracing kernels


def _trace_kernel(kind: str, n: int):
    """A kernel whose body emits about n instructions of `kind` in a Python loop."""

    def body(a):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray(a.shape, nl.float32, buffer=nl.sbuf)
        u = nl.ndarray(a.shape, nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=a)
        nisa.dma_copy(dst=u, src=a)
        if kind == "tensor_tensor":
            for _ in range(n):
                nisa.tensor_tensor(dst=t, data1=t, data2=u, op=nl.add)
        elif kind == "activation":
            for _ in range(n):
                nisa.activation(dst=t, op=nl.exp, data=u)
        elif kind == "dma_copy":
            for _ in range(n):
                nisa.dma_copy(dst=t, src=a)
        elif kind == "mixed":
            for _ in range(n // 3):
                nisa.tensor_tensor(dst=t, data1=t, data2=u, op=nl.add)
                nisa.activation(dst=u, op=nl.exp, data=t)
                nisa.dma_copy(dst=t, src=a)
        elif kind == "legacy nl.add":  # functional style: every op allocates its result tile
            x = t
            for _ in range(n):
                x = nl.add(x, u)
            t = x
        else:
            raise ValueError(kind)
        nisa.dma_copy(dst=out, src=t)
        return out

    body.__name__ = f"trace_{kind.replace(' ', '_').replace('.', '_')}_{n}"
    return nki.jit(body)


def trace_once(kernel, specs, target):
    """Traces the kernel body into IR (no compile) and returns the IR (a ``_core.Kernel``)."""
    ir, _outputs = kernel._trace(specs, target, (), ())
    return ir


def trace_setup(kernel, a):
    specs = [kernel._classify(0, a)]
    target = _kernel_mod._resolve_target(kernel.target)
    return specs, target


@nki.jit
def add_kernel(a, b):
    out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    ta = nl.ndarray(a.shape, a.dtype, buffer=nl.sbuf)
    tb = nl.ndarray(a.shape, a.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=ta, src=a)
    nisa.dma_copy(dst=tb, src=b)
    nisa.tensor_tensor(dst=ta, data1=ta, data2=tb, op=nl.add)
    nisa.dma_copy(dst=out, src=ta)
    return out


@nki.jit
def tiny_kernel(a, b):
    """Empty-ish: one [1, 1] copy HBM -> HBM (the smallest kernel that has an output)."""
    out = nl.ndarray((1, 1), a.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=a[0:1, 0:1])
    return out


class _NoRun:
    """Stands in for a compiled program whose run() does nothing (to time the Python launch)."""

    meets = False  # a single instance: no core_barrier or sendrecv

    def run(self, inputs, outputs, fill):
        return None


# --- report ---------------------------------------------------------------------------------

def fmt_row(cols, widths):
    return "  ".join(str(c).rjust(w) if i else str(c).ljust(w) for i, (c, w) in enumerate(zip(cols, widths)))


def print_table(title, header, rows):
    widths = [max(len(str(r[i])) for r in [header] + rows) for i in range(len(header))]
    print(f"\n{title}")
    print(fmt_row(header, widths))
    print(fmt_row(["-" * w for w in widths], widths))
    for r in rows:
        print(fmt_row(r, widths))


def profile_top(fn, repeat: int, limit: int, label: str):
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(repeat):
        fn()
    prof.disable()
    s = io.StringIO()
    stats = pstats.Stats(prof, stream=s)
    stats.sort_stats("tottime").print_stats(limit)
    total = stats.total_tt
    print(f"\n--- cProfile: {label} ({repeat} runs, {total * 1e3:.1f} ms profiled; sorted by own time) ---")
    print(s.getvalue().split("\n", 4)[-1].rstrip())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="1000,10000", help="instructions per traced kernel (comma-separated)")
    ap.add_argument("--trace-reps", type=int, default=7, help="repetitions of each trace")
    ap.add_argument("--calls", type=int, default=2000, help="timed cached calls (median taken)")
    ap.add_argument("--warmup", type=int, default=200, help="untimed cached calls first")
    ap.add_argument("--quick", action="store_true", help="fewer repetitions (smoke run)")
    ap.add_argument("--kinds", default="mixed,tensor_tensor,activation,dma_copy,legacy nl.add",
                    help="instruction kinds of the traced kernels")
    ap.add_argument("--profile", action="store_true", help="print cProfile hot spots of the cached call and trace")
    args = ap.parse_args(argv)
    if args.quick:
        args.trace_reps, args.calls, args.warmup = 2, 300, 50

    rng = np.random.default_rng(0)
    a = rng.standard_normal((P, F)).astype(np.float32)
    b = rng.standard_normal((P, F)).astype(np.float32)
    small = rng.standard_normal(SMALL).astype(np.float32)

    # references, measured first and again last (the drift shows how noisy the run was)
    def references():
        return (statistics.median(each_call_us(noop, args.calls * 5)),
                statistics.median(each_call_us(lambda: a + b, args.calls)))

    ref_noop, ref_np = references()

    print(f"nikki frontend benchmark  python {sys.version.split()[0]}  numpy {np.__version__}  "
          f"target {_kernel_mod._resolve_target(None)}  cpus {os.cpu_count()}")

    # --- tracing ----------------------------------------------------------------------------
    rows = []
    sizes = [int(s) for s in args.sizes.split(",") if s]
    for kind in [k.strip() for k in args.kinds.split(",") if k.strip()]:
        for n in sizes:
            k = _trace_kernel(kind, n)
            specs, target = trace_setup(k, small)
            ir = trace_once(k, specs, target)  # warm (imports, code caches)
            count = ir.num_instructions
            times = []
            for _ in range(args.trace_reps):
                gc.collect()
                t0 = time.perf_counter()
                trace_once(k, specs, target)
                times.append(time.perf_counter() - t0)
            med, best = statistics.median(times), min(times)
            us, us_best = med / count * 1e6, best / count * 1e6
            rows.append([kind, count, f"{med * 1e3:.1f}", f"{us:.2f}", f"{us_best:.2f}", f"{us / ref_noop:.0f}x",
                         "ok" if us_best <= TRACE_TARGET_US else "MISSED"])
    print_table(f"Tracing (Kernel._trace, no compile), {args.trace_reps} repetitions; "
                f"target <= {TRACE_TARGET_US:g} us/instr (judged on the best repetition)",
                ["kernel body", "instrs", "ms/trace", "us/instr", "best us/instr", "/ no-op call", "target"], rows)

    # --- cached call -----------------------------------------------------------------------
    rows = []
    parts = {}
    for label, kern in (("add [128,512]", add_kernel), ("empty-ish [1,1] copy", tiny_kernel)):
        for _ in range(args.warmup):
            kern(a, b)
        full = statistics.median(each_call_us(lambda: kern(a, b), args.calls))

        # binding + cache key + lookup: _call with the launch replaced by nothing
        kern._launch = lambda compiled, values: None
        bind = statistics.median(each_call_us(lambda: kern._call((a, b), {}), args.calls))
        del kern._launch

        key_compiled = next(iter(kern._cache.values()))
        values = (a, b)
        fake = _kernel_mod.Compiled([_NoRun()] * len(key_compiled.programs), key_compiled.output_specs,
                                    key_compiled.writable_inputs, key_compiled.results)
        launch_py = statistics.median(each_call_us(lambda: kern._launch(fake, values), args.calls))

        program = key_compiled.programs[0]
        outs_arrays = [np.empty(shape, numpy_dtype(dt)) for shape, dt in key_compiled.output_specs]
        ins = [a.__array_interface__["data"][0], b.__array_interface__["data"][0]]
        outs = [o.__array_interface__["data"][0] for o in outs_arrays]
        execute = statistics.median(each_call_us(lambda: program.run(ins, outs, True), args.calls))
        parts[label] = (full, bind, launch_py, execute)
        rows.append([label, f"{full:.1f}", f"{bind:.1f}", f"{launch_py:.1f}", f"{execute:.1f}",
                     f"{full / ref_np:.1f}x", f"{full / ref_noop:.0f}x",
                     "ok" if full <= CALL_TARGET_US else "MISSED"])
    print_table(f"Cached call (median of {args.calls} calls after {args.warmup} warmup), us; "
                f"target <= {CALL_TARGET_US:g} us/call",
                ["kernel", "full call", "bind+key", "launch (py)", "execute", "/ numpy a+b", "/ no-op call",
                 "target"], rows)
    add_full, add_bind, add_launch, add_exec = parts["add [128,512]"]
    tiny_exec = parts["empty-ish [1,1] copy"][3]
    print(f"\n  add: simulated work of the [128,512] add itself ~= {add_exec - tiny_exec:.1f} us "
          f"(execute minus the empty-ish kernel's {tiny_exec:.1f} us fixed executor cost); "
          f"Python overhead (bind+key + launch) = {add_bind + add_launch:.1f} us")

    ref_noop2, ref_np2 = references()
    print_table("References (median per call), us, at start and end of the run",
                ["reference", "start", "end"],
                [["no-op Python call", f"{ref_noop:.3f}", f"{ref_noop2:.3f}"],
                 ["numpy a + b [128,512] fp32", f"{ref_np:.2f}", f"{ref_np2:.2f}"]])

    if args.profile:
        profile_top(lambda: add_kernel(a, b), 500, 12, "cached call of add [128,512]")
        profile_top(lambda: tiny_kernel(a, b), 20000, 25, "cached call of the empty-ish kernel")
        k = _trace_kernel("mixed", 10000)
        specs, target = trace_setup(k, small)
        profile_top(lambda: trace_once(k, specs, target), 1, 30, "trace of 10k mixed instructions")
    return 0


if __name__ == "__main__":
    sys.exit(main())
