#!/usr/bin/env python3
"""Per-instruction cost of nikki's native routines next to numpy doing the same math.

    PYTHONPATH=bindings/python python bench/python/native_vs_numpy.py             # ~1 minute
    PYTHONPATH=bindings/python python bench/python/native_vs_numpy.py --quick     # smoke run
    PYTHONPATH=bindings/python python bench/python/native_vs_numpy.py --shape 128 512 --ops exp add

Not a test: it prints a table. For each operation it builds two kernels that load their inputs
into SBUF once and then run the same instruction 1 and 1 + N times on the SBUF-resident tiles
(then store one result). The difference of their median run times, divided by N, is the cost of
one instruction: kernel launch, DMAs, output fills and Python overhead cancel out. numpy does
the same math on fp32 arrays of the same shape in the same run, into preallocated outputs
(``out=``), which is numpy's fastest form; the ratio native / numpy is what the target (<= 2x)
is about.

The three are timed in turns (short kernel, long kernel, numpy) so that a change in the machine's
load hits all three alike, and by default with this process's CPU time rather than the wall
clock: on a shared machine the wall clock also counts the time other processes hold the CPU.

Everything runs on one thread; numpy's own ufunc loops are single-threaded.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))

try:
    import nikki as nki
except ImportError:
    sys.path.insert(0, os.path.join(ROOT, "bindings", "python"))
    import nikki as nki
import nikki.isa as nisa  # noqa: E402
import nikki.language as nl  # noqa: E402

TARGET = 2.0


def _ops(P, F):
    """name -> (emit(dst, a, b, col, red): one instruction, result kind, numpy(x, y, col, out, red_out))."""
    return {
        "tensor_tensor add": (
            lambda d, a, b, c, r: nisa.tensor_tensor(dst=d, data1=a, data2=b, op=nl.add),
            "tile", lambda x, y, c, o, ro: np.add(x, y, out=o)),
        "tensor_tensor multiply": (
            lambda d, a, b, c, r: nisa.tensor_tensor(dst=d, data1=a, data2=b, op=nl.multiply),
            "tile", lambda x, y, c, o, ro: np.multiply(x, y, out=o)),
        "tensor_scalar mul-add (imm)": (
            lambda d, a, b, c, r: nisa.tensor_scalar(dst=d, data=a, op0=nl.multiply, operand0=1.5, op1=nl.add,
                                                     operand1=0.25),
            "tile", lambda x, y, c, o, ro: np.add(np.multiply(x, np.float32(1.5), out=o), np.float32(0.25), out=o)),
        "tensor_scalar sub-mul ([P,1])": (
            lambda d, a, b, c, r: nisa.tensor_scalar(dst=d, data=a, op0=nl.subtract, operand0=c, op1=nl.multiply,
                                                     operand1=c),
            "tile", lambda x, y, c, o, ro: np.multiply(np.subtract(x, c, out=o), c, out=o)),
        "tensor_copy": (
            lambda d, a, b, c, r: nisa.tensor_copy(dst=d, src=a),
            "tile", lambda x, y, c, o, ro: np.copyto(o, x)),
        "activation exp": (
            lambda d, a, b, c, r: nisa.activation(dst=d, op=nl.exp, data=a),
            "tile", lambda x, y, c, o, ro: np.exp(x, out=o)),
        "activation exp(x - max) + row sum": (
            lambda d, a, b, c, r: nisa.activation(dst=d, op=nl.exp, data=a, bias=c, reduce_op=nl.add, reduce_res=r,
                                                  reduce_cmd=nisa.reduce_cmd.reset_reduce),
            "tile", lambda x, y, c, o, ro: np.add.reduce(np.exp(np.add(x, c, out=o), out=o), axis=1, out=ro)),
        "tensor_scalar_reduce mul + row sum": (
            lambda d, a, b, c, r: nisa.tensor_scalar_reduce(dst=d, data=a, op0=nl.multiply, operand0=1.5,
                                                            reduce_op=nl.add, reduce_res=r),
            "tile", lambda x, y, c, o, ro: np.add.reduce(np.multiply(x, np.float32(1.5), out=o), axis=1, out=ro)),
        "activation tanh": (
            lambda d, a, b, c, r: nisa.activation(dst=d, op=nl.tanh, data=a),
            "tile", lambda x, y, c, o, ro: np.tanh(x, out=o)),
        "activation sigmoid": (
            lambda d, a, b, c, r: nisa.activation(dst=d, op=nl.sigmoid, data=a),
            # numpy has no sigmoid ufunc: 1 / (1 + exp(-x)) in three passes
            "tile", lambda x, y, c, o, ro: np.reciprocal(np.add(np.exp(np.negative(x, out=o), out=o), np.float32(1),
                                                                out=o), out=o)),
        "activation log": (
            lambda d, a, b, c, r: nisa.activation(dst=d, op=nl.log, data=a),
            "tile", lambda x, y, c, o, ro: np.log(x, out=o)),
        "activation rsqrt": (
            lambda d, a, b, c, r: nisa.activation(dst=d, op=nl.rsqrt, data=a),
            "tile", lambda x, y, c, o, ro: np.reciprocal(np.sqrt(x, out=o), out=o)),
        "tensor_reduce max": (
            lambda d, a, b, c, r: nisa.tensor_reduce(dst=r, op=nl.maximum, data=a, axis=1, keepdims=True),
            "col", lambda x, y, c, o, ro: np.maximum.reduce(x, axis=1, out=ro)),
        "tensor_reduce add": (
            lambda d, a, b, c, r: nisa.tensor_reduce(dst=r, op=nl.add, data=a, axis=1, keepdims=True),
            "col", lambda x, y, c, o, ro: np.add.reduce(x, axis=1, out=ro)),
        "reciprocal": (
            lambda d, a, b, c, r: nisa.reciprocal(dst=d, data=a),
            "tile", lambda x, y, c, o, ro: np.reciprocal(x, out=o)),
    }


def _kernel(emit, kind, P, F, n):
    """A kernel: x, y [P, F] and col [P, 1] into SBUF, `n` instructions, one result stored."""

    @nki.jit
    def k(x, y, col):
        a = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
        b = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
        c = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=a, src=x)
        nisa.dma_copy(dst=b, src=y)
        nisa.dma_copy(dst=c, src=col)
        d = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
        r = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
        for _ in range(n):
            emit(d, a, b, c, r)
        if kind == "tile":
            out = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.shared_hbm)
            nisa.dma_copy(dst=out, src=d)
        else:
            out = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.shared_hbm)
            nisa.dma_copy(dst=out, src=r)
        return out

    return k


def _time_us(fn, inner, clock):
    t0 = clock()
    for _ in range(inner):
        fn()
    return (clock() - t0) / inner * 1e6


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", type=int, nargs=2, default=(128, 2048), metavar=("P", "F"))
    ap.add_argument("--n", type=int, default=32, help="extra instructions in the long kernel")
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--ops", nargs="*", help="substrings selecting operations (default: all)")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--wall", action="store_true",
                    help="time with the wall clock instead of this process's CPU time")
    args = ap.parse_args(argv)
    clock = time.perf_counter if args.wall else time.process_time
    P, F = args.shape
    n, repeat = (8, 5) if args.quick else (args.n, args.repeat)
    os.environ.setdefault("NIKKI_EXECUTOR", "native")

    rng = np.random.default_rng(0)
    # positive inputs in [0.5, 4.5): every function above is defined and finite on them
    x = (rng.random((P, F)) * 4 + 0.5).astype(np.float32)
    y = (rng.random((P, F)) * 4 + 0.5).astype(np.float32)
    col = -(rng.random((P, 1)) * 4 + 0.5).astype(np.float32)
    out = np.empty_like(x)
    red_out = np.empty((P,), dtype=np.float32)

    ops = _ops(P, F)
    names = [k for k in ops if not args.ops or any(s in k for s in args.ops)]
    print(f"native routine vs numpy, [{P}, {F}] fp32 tiles, one instruction = (t(1 + {n}) - t(1)) / {n}, "
          f"medians of {repeat} interleaved samples of {'wall' if args.wall else 'process CPU'} time; "
          f"numpy {np.__version__}, executor {os.environ['NIKKI_EXECUTOR']}")
    rows = []
    for name in names:
        emit, kind, np_fn = ops[name]
        short, long_ = _kernel(emit, kind, P, F, 1), _kernel(emit, kind, P, F, 1 + n)
        want = short(x, y, col)  # compiles and warms up
        got = long_(x, y, col)
        if want.tobytes() != got.tobytes():
            raise AssertionError(f"{name}: repeating the instruction changed its result")
        np_fn(x, y, col, out, red_out)
        inner = max(1, int(2e4 / max(1.0, _time_us(lambda: np_fn(x, y, col, out, red_out), 3, clock))))
        samples = {"short": [], "long": [], "numpy": []}
        gc.collect()
        gc.disable()
        try:
            # interleaved, so a change in the machine's load affects all three alike
            for _ in range(repeat):
                samples["short"].append(_time_us(lambda: short(x, y, col), 1, clock))
                samples["long"].append(_time_us(lambda: long_(x, y, col), 1, clock))
                samples["numpy"].append(_time_us(lambda: np_fn(x, y, col, out, red_out), inner, clock))
        finally:
            gc.enable()
        t_short, t_long, t_np = (statistics.median(samples[k]) for k in ("short", "long", "numpy"))
        per = max(t_long - t_short, 0.0) / n
        rows.append((name, per, t_np, per / t_np, per * 1e3 / (P * F)))
        print(f"  {name}: native {per:.1f} us, numpy {t_np:.1f} us", flush=True)

    print()
    header = ("operation", "native us", "numpy us", "native/numpy", "ns/element", f"target <= {TARGET:g}x")
    body = [(r[0], f"{r[1]:.1f}", f"{r[2]:.1f}", f"{r[3]:.2f}x", f"{r[4]:.3f}", "ok" if r[3] <= TARGET else "MISSED")
            for r in rows]
    widths = [max(len(str(row[i])) for row in [header] + body) for i in range(len(header))]
    for row in [header, tuple("-" * w for w in widths)] + body:
        print("  ".join(str(c).rjust(w) if i else str(c).ljust(w) for i, (c, w) in enumerate(zip(row, widths))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
