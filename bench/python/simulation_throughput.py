#!/usr/bin/env python3
"""Simulation speed of nikki's executors next to a numpy-eager executor of the same program.

    PYTHONPATH=bindings/python python bench/python/simulation_throughput.py            # ~7 minutes
    PYTHONPATH=bindings/python python bench/python/simulation_throughput.py --quick    # smoke run
    PYTHONPATH=bindings/python python bench/python/simulation_throughput.py --kernels softmax_chunked

Not a test: it prints a table. For each kernel (the NKI tutorial kernels of tests/python/tutorials:
tiled matmul, softmax, layernorm; the *_narrow rows run two of them on 64-element rows, where the
cost per instruction rather than per element decides) it times one simulated run, after a warm-up
run, three ways:

* nikki ``native``: the kernel called as a user calls it, compiled with NIKKI_EXECUTOR=native
  (one JIT-compiled routine per instruction template);
* nikki ``interp``: the same with NIKKI_EXECUTOR=interp (the reference interpreter, one element
  at a time). The executor is chosen when a kernel compiles, so each executor gets its own
  ``nki.jit`` object of the same function;
* ``numpy-eager``: bench/python/numpy_eager.py on the same compiled program (same instructions,
  same views), one vectorized numpy computation per instruction, the way NKI's own simulator
  executes kernels.

Before timing, each kernel's outputs are checked: native and interp must agree bit for bit, and
numpy-eager must agree with nikki within the output dtype's rounding (plus fp32
accumulation-order noise), so the three timings are of the same computation.

numpy's BLAS is limited to one thread (nikki's executors use one), unless --blas-threads says
otherwise; multithreaded BLAS on small tiles mostly measures thread wake-ups.

Targets (reported, not asserted): native >= 20x faster than interp and >= 10x faster than
numpy-eager.
"""

from __future__ import annotations

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))


def _parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="small shapes and few repetitions (smoke run)")
    p.add_argument("--kernels", nargs="*", help="subset of kernels to run (default: all)")
    p.add_argument("--repeat", type=int, default=7, help="timed runs of native and numpy-eager (median)")
    p.add_argument("--interp-repeat", type=int, default=3, help="timed runs of interp (median)")
    p.add_argument("--blas-threads", type=int, default=1, help="numpy BLAS threads (default 1)")
    return p.parse_args(argv)


ARGS = _parse_args() if __name__ == "__main__" else None
if ARGS is not None:  # before numpy is imported: BLAS reads these once
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(ARGS.blas_threads)

import gc  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

try:  # an installed nikki or PYTHONPATH first, else the source tree's bindings/python
    import nikki as nki
except ImportError:
    sys.path.insert(0, os.path.join(ROOT, "bindings", "python"))
    import nikki as nki

sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "python"))

from numpy_eager import NumpyEagerExecutor  # noqa: E402
from tutorials import test_layernorm as tut_layernorm  # noqa: E402
from tutorials import test_matmul as tut_matmul  # noqa: E402
from tutorials import test_softmax as tut_softmax  # noqa: E402
from tutorials._util import to_bf16  # noqa: E402

TARGET_VS_INTERP = 20.0
TARGET_VS_NUMPY = 10.0


# --- the kernels and their inputs -------------------------------------------------------------------

def _matmul_inputs(rng, quick):
    n = 512 if quick else 1024
    return (to_bf16(rng.standard_normal((n, n))), to_bf16(rng.standard_normal((n, n))))


def _rows_inputs(quick):
    return (256, 1024) if quick else (4096, 2048)


def _narrow_inputs(quick):
    """Many short rows: the same kernels with 64-element tiles, where per-instruction cost dominates."""
    return (1024, 64) if quick else (8192, 64)


def _softmax_inputs(rng, quick, shape=_rows_inputs):
    rows, n = shape(quick)
    return (tut_softmax._inputs(rng, rows, n, np.float32),)


def _layernorm_inputs(rng, quick, shape=_rows_inputs):
    rows, n = shape(quick)
    x, gamma, beta = tut_layernorm._inputs(rng, rows, n)
    return (x, gamma, beta, tut_layernorm.EPS)


# name -> (kernel, inputs(rng, quick), description)
KERNELS = {
    "matmul_tiled": (tut_matmul.matmul_legacy_tiled, _matmul_inputs, "tutorial tiled matmul (nl.load, psum +=)"),
    "matmul_hoisted": (tut_matmul.matmul_current_hoisted, _matmul_inputs, "matmul, hoisted loads (nisa.*)"),
    "softmax_chunked": (tut_softmax.softmax_current_chunked, _softmax_inputs, "softmax, 512-wide chunks (nisa.*)"),
    "softmax_isa": (tut_softmax.softmax_legacy_isa, _softmax_inputs, "softmax, fused activation_reduce"),
    "layernorm_bn": (tut_layernorm.layernorm_current_bn, _layernorm_inputs, "layernorm, bn_stats/bn_aggr (nisa.*)"),
    "layernorm_reduce": (tut_layernorm.layernorm_current_reduce, _layernorm_inputs,
                         "layernorm, tensor_reduce + activation"),
    "softmax_isa_narrow": (tut_softmax.softmax_legacy_isa,
                           lambda rng, quick: _softmax_inputs(rng, quick, _narrow_inputs),
                           "softmax_isa on 64-wide rows"),
    "layernorm_bn_narrow": (tut_layernorm.layernorm_current_bn,
                            lambda rng, quick: _layernorm_inputs(rng, quick, _narrow_inputs),
                            "layernorm_bn on 64-wide rows"),
}


# --- helpers ------------------------------------------------------------------------------------------

def time_ms(fn, repeat: int) -> tuple[float, float]:
    """(median, best) wall time of fn() in ms over `repeat` runs (the caller has warmed it up)."""
    times = []
    for _ in range(repeat):
        gc.collect()
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times), min(times)


def fresh_kernel(kernel):
    """A new nki.jit object of the kernel's function, with an empty specialization cache, so its
    first call compiles for the NIKKI_EXECUTOR set at that time."""
    return nki.jit(kernel.fn)


def _as_list(out):
    return list(out) if isinstance(out, tuple) else [out]


def _unit_roundoff(dtype) -> float:
    return float(np.finfo(np.float32).eps) / 2 if np.dtype(dtype) == np.float32 else \
        float(__import__("ml_dtypes").finfo(dtype).eps) / 2


def compare(got, want) -> tuple[bool, float, float]:
    """(ok, worst error / bound, share of bit-identical elements) of numpy-eager vs nikki.

    Bound per element: 4 roundings of the output dtype relative to the element, plus 2**-16 of the
    largest magnitude for fp32 sums taken in another order (numpy's BLAS and pairwise sums versus
    nikki's left-to-right fp32 accumulation)."""
    g, w = np.asarray(got).astype(np.float64), np.asarray(want).astype(np.float64)
    if g.shape != w.shape or not np.array_equal(np.isnan(g), np.isnan(w)):
        return False, float("inf"), 0.0
    finite = ~np.isnan(w)
    g, w = g[finite], w[finite]
    bound = 4 * _unit_roundoff(np.asarray(want).dtype) * np.abs(w) + 2.0**-16 * np.abs(w).max() + 1e-30
    ratio = float((np.abs(g - w) / bound).max()) if w.size else 0.0
    unsigned = {1: np.uint8, 2: np.uint16, 4: np.uint32}[np.asarray(want).dtype.itemsize]
    identical = float(np.mean(np.asarray(got).view(unsigned) == np.asarray(want).view(unsigned)))
    return ratio <= 1.0, ratio, identical


# --- the benchmark --------------------------------------------------------------------------------

def bench_one(name, kernel, make_inputs, quick, repeat, interp_repeat, rng):
    args = make_inputs(rng, quick)
    arrays = [a for a in args if isinstance(a, np.ndarray)]
    row = {"name": name}
    kernels = {}
    outputs = {}
    saved = os.environ.get("NIKKI_EXECUTOR")
    try:
        for executor in ("native", "interp"):
            os.environ["NIKKI_EXECUTOR"] = executor
            k = fresh_kernel(kernel)
            outputs[executor] = _as_list(k(*args))  # compiles (the executor is chosen here) and warms up
            kernels[executor] = k
            compiled = k.specialize(*args)
            program = compiled.programs[0]
            if program.executor != executor:
                raise RuntimeError(f"{name}: asked for {executor}, got {program.executor}")
            if executor == "native":
                row["instructions"] = program.kernel.num_instructions
                row["fallbacks"] = program.native_stats.get("fallbacks", 0)
                eager = NumpyEagerExecutor(program.kernel)
    finally:
        if saved is None:
            os.environ.pop("NIKKI_EXECUTOR", None)
        else:
            os.environ["NIKKI_EXECUTOR"] = saved

    # the three must compute the same thing before their times mean anything
    for a, b in zip(outputs["native"], outputs["interp"]):
        if a.tobytes() != b.tobytes():
            raise AssertionError(f"{name}: native and interp outputs differ")
    outputs["numpy-eager"] = eager.run(*arrays)  # also its warm-up run
    worst, identical = 0.0, 1.0
    for got, want in zip(outputs["numpy-eager"], outputs["native"]):
        ok, ratio, same = compare(got, want)
        if not ok:
            raise AssertionError(f"{name}: numpy-eager differs from nikki (worst error {ratio:.3g}x the bound)")
        worst, identical = max(worst, ratio), min(identical, same)
    row["check"] = f"{identical * 100:.1f}% bit-identical, worst {worst:.2f} of bound"

    row["native"], row["native best"] = time_ms(lambda: kernels["native"](*args), repeat)
    row["numpy-eager"], row["numpy-eager best"] = time_ms(lambda: eager.run(*arrays), repeat)
    row["interp"], row["interp best"] = time_ms(lambda: kernels["interp"](*args), interp_repeat)
    row["shapes"] = " ".join(f"{'x'.join(map(str, a.shape))}:{_short_dtype(a.dtype)}" for a in arrays[:1])
    return row


def _short_dtype(dt) -> str:
    return {"float32": "f32", "bfloat16": "bf16"}.get(np.dtype(dt).name, np.dtype(dt).name)


def fmt_row(cells, widths):
    return "  ".join(str(c).rjust(w) if i else str(c).ljust(w) for i, (c, w) in enumerate(zip(cells, widths)))


def print_table(rows):
    header = ["kernel", "input", "instrs", "native ms", "interp ms", "numpy-eager ms", "interp/native",
              "numpy/native", "targets (20x, 10x)", "numpy-eager check"]
    body = []
    for r in rows:
        vs_interp = r["interp"] / r["native"]
        vs_numpy = r["numpy-eager"] / r["native"]
        verdict = ("ok" if vs_interp >= TARGET_VS_INTERP else "MISSED") + ", " + \
                  ("ok" if vs_numpy >= TARGET_VS_NUMPY else "MISSED")
        body.append([r["name"], r["shapes"], r["instructions"], f"{r['native']:.1f}", f"{r['interp']:.1f}",
                     f"{r['numpy-eager']:.1f}", f"{vs_interp:.1f}x", f"{vs_numpy:.2f}x", verdict, r["check"]])
    widths = [max(len(str(x[i])) for x in [header] + body) for i in range(len(header))]
    print(fmt_row(header, widths))
    print(fmt_row(["-" * w for w in widths], widths))
    for b in body:
        print(fmt_row(b, widths))


def main(args) -> int:
    names = args.kernels or list(KERNELS)
    unknown = [n for n in names if n not in KERNELS]
    if unknown:
        print(f"unknown kernels {unknown}; choose from {list(KERNELS)}", file=sys.stderr)
        return 2
    repeat = 3 if args.quick else args.repeat
    interp_repeat = 1 if args.quick else args.interp_repeat
    print(f"nikki simulation throughput: median ms per run after a warm-up run; native and numpy-eager "
          f"x{repeat}, interp x{interp_repeat}; numpy {np.__version__}, BLAS threads {args.blas_threads}, "
          f"{os.cpu_count()} CPUs, target {_target()}")
    rows = []
    for name in names:
        kernel, make_inputs, what = KERNELS[name]
        rng = np.random.default_rng(1234)
        row = bench_one(name, kernel, make_inputs, args.quick, repeat, interp_repeat, rng)
        rows.append(row)
        print(f"  {name}: {what}: {row['instructions']} instructions ({row['fallbacks']} not native), "
              "ms median (best): " + ", ".join(f"{e} {row[e]:.1f} ({row[e + ' best']:.1f})"
                                                for e in ("native", "interp", "numpy-eager")),
              flush=True)
    print()
    print_table(rows)
    if any(r["fallbacks"] for r in rows):
        print("\n(instrs not native: the native executor interprets them one element at a time)")
    return 0


def _target() -> str:
    from nikki import _core

    return os.environ.get("NEURON_PLATFORM_TARGET_OVERRIDE") or _core.default_target()


if __name__ == "__main__":
    sys.exit(main(ARGS))
