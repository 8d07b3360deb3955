#!/usr/bin/env python3
"""Benchmarks of every library kernel over a size sweep (``make bench`` / ``nikki bench``).

For each registered kernel (kernels added later appear through the registry) and each size of its
sweep, it reports:

- the ESTIMATED device time on trn2 and trn1 (nikki's timing model, never a measurement), the
  utilization against the bound that limits the kernel (useful TensorE FLOPs over the 16-bit
  peak, or compulsory HBM bytes over the DMA peak) and the roofline time (the larger of the two
  at the target's peaks);
- the host time of simulating it: nikki's native executor against the same computation in
  PyTorch CPU eager (float32, ``nikki.torch_equivalents``) and against NKI's way of simulating
  (the instruction sequence executed one instruction at a time with numpy, numpy_eager.py), as
  ratios measured in the same run. Large sizes skip the host runs (``--host-limit``).

The sweep scales the kernel's registered benchmark shape: every dimension equal to the shape's
largest one (rows, sequence length, the square matmul's sides, the flat parameter count), or to
the size the registry names for the sweep (a fused projection's tokens and hidden size), is
multiplied by 1/32 .. 1 (``--quick``: 1/64 only, one host repetition).

    PYTHONPATH=bindings/python python bench/python/kernel_bench.py [--kernel NAME ...] [--quick]
        [--json FILE|-] [--markdown FILE] [--plots DIR]

``--markdown`` writes the tables (docs/benchmarks.md), ``--plots`` the PNG figures; ``make bench``
regenerates both in docs/.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time

import numpy as np

import nikki
from nikki import _core
from nikki.dtypes import numpy_dtype, to_dtype
from nikki.library import library_kernels

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import reference_kernels  # noqa: E402
from numpy_eager import NumpyEagerExecutor  # noqa: E402

FULL_SCALES = (1 / 32, 1 / 16, 1 / 8, 1 / 4, 1 / 2, 1)
QUICK_SCALES = (1 / 64,)
TARGETS = ("trn2", "trn1")
# Host runs above this many compulsory bytes (or a tenth of it in matmul FLOPs / 64) are skipped:
# the numpy-eager baseline alone would take minutes there.
DEFAULT_HOST_LIMIT = 16 << 20


# --- the sweep ------------------------------------------------------------------------------

def sweep(info: dict, scales) -> list:
    """(label, [(shape, dtype)], params) for each scale of the kernel's benchmark shape."""
    bench = info["benchmark"]
    specs = [(tuple(shape), dtype) for shape, dtype in bench["inputs"]]
    swept = bench.get("swept_size") or max(d for shape, _ in specs for d in shape)
    points = []
    for scale in scales:
        n = max(1, int(round(swept * scale)))
        scaled = [(tuple(n if d == swept else d for d in shape), dtype) for shape, dtype in specs]
        first, dtype = scaled[0]
        points.append((f"{list(first)} {to_dtype(dtype).name}", scaled, dict(bench["params"])))
    return points


WIDTH_SCALES = (1 / 8, 1 / 4, 1 / 2, 1, 2, 4, 8, 16)
WIDTH_ROWS = 128


def width_sweep(info: dict, scales) -> list:
    """For a kernel whose first input is [rows, cols]: 128 rows, the columns scaled by `scales`
    (every input dim equal to rows or cols follows). Time per element against the row width
    shows where a row stops fitting in SBUF and the kernel changes its plan."""
    bench = info["benchmark"]
    specs = [(tuple(shape), dtype) for shape, dtype in bench["inputs"]]
    first = specs[0][0]
    if len(first) != 2 or first[0] == first[1] or math.prod(first) < max(math.prod(shape) for shape, _ in specs):
        return []  # not a [rows, cols] kernel whose first input is its data (rope_bwd's is the cos table)
    rows, cols = first
    points = []
    for scale in scales:
        w = max(1, int(round(cols * scale)))
        scaled = [(tuple(WIDTH_ROWS if d == rows else w if d == cols else d for d in shape), dtype)
                  for shape, dtype in specs]
        points.append((f"{list(scaled[0][0])} {to_dtype(scaled[0][1]).name}", scaled, dict(bench["params"])))
    return points


def _call_params(kernel, params: dict) -> dict:
    kinds = {p[0]: p[1] for p in kernel.info["params"]}
    return {k: (bool(v) if kinds.get(k) == "bool" else
                None if kinds.get(k) == "float?" and isinstance(v, float) and math.isnan(v) else v)
            for k, v in params.items()}


# --- estimates ------------------------------------------------------------------------------

def estimate(name: str, kernel, specs, params: dict, target: str) -> dict:
    """Estimated time, utilization against the kernel's bound, and roofline on one target."""
    bound = kernel.info["benchmark"]["bound"]
    args = [nikki.spec(shape, to_dtype(dtype)) for shape, dtype in specs]
    try:
        prof = nikki.estimate(kernel, *args, target=target, **_call_params(kernel, params))
    except nikki.KernelError as err:
        # an older target without an instruction the kernel needs (moe_prefill on trn1); any
        # other error is the kernel's or the benchmark's and stops the run
        if target == TARGETS[0] or f"{target} does not have" not in str(err):
            raise
        return {"unsupported": str(err).splitlines()[0]}
    shapes = [(list(s), d) for s, d in specs]
    flops = _core.library_useful_flops(name, shapes, params) if bound == "tensor_engine" else None
    # A gather reads only the rows it names: its registration gives the compulsory bytes.
    io_bytes = _core.library_compulsory_bytes(name, shapes, params) or prof.io_bytes()
    roofline_ns = prof.roofline_ns(flops if flops else 0.0, io_bytes=io_bytes)
    utilization = (prof.tensor_flop_utilization(flops) if bound == "tensor_engine"
                   else prof.roofline_ns(0.0, io_bytes=io_bytes) / prof.total_ns)  # the HBM roofline alone
    return {"us": prof.total_us, "utilization": utilization, "roofline_us": roofline_ns / 1e3,
            "io_bytes": io_bytes, "useful_flops": flops or 0.0}


# --- host simulation time -------------------------------------------------------------------

def _median_seconds(fn, repeats: int) -> float:
    fn()  # warm-up: compiles, fills caches
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def host_times(name: str, kernel, specs, params: dict, repeats: int) -> dict:
    """Seconds per run: nikki's native executor, PyTorch CPU eager (float32) and numpy-eager."""
    import torch

    from nikki.torch_equivalents import TORCH

    values = _core.library_inputs(name, [(list(s), d) for s, d in specs], params, 0)
    arrays = [v.astype(numpy_dtype(to_dtype(d))) for v, (_, d) in zip(values, specs)]
    call = _call_params(kernel, params)
    out = {"nikki_s": _median_seconds(lambda: kernel(*arrays, **call), repeats)}
    if name in TORCH:
        defaults = {p[0]: p[2] for p in kernel.info["params"]}
        tensors = [torch.from_numpy(a.astype(np.float32)) for a in arrays]
        out["torch_s"] = _median_seconds(lambda: TORCH[name](*tensors, {**defaults, **call}), repeats)
    compiled = kernel.specialize(*arrays, **call)
    try:
        eager = NumpyEagerExecutor(compiled.programs[0].kernel)
    except NotImplementedError as err:  # outside numpy-eager's scope (runtime control flow, ...)
        out["numpy_eager_skipped"] = str(err)
    else:
        out["numpy_eager_s"] = _median_seconds(lambda: eager.run(*arrays), max(1, repeats // 3))
    return out


# --- the run --------------------------------------------------------------------------------

def _progress(done: int, total: int, what: str) -> None:
    """A one-line progress bar on stderr (a terminal redraws it; a log gets one line per step)."""
    width = 30
    filled = int(width * done / total) if total else width
    end = "\r" if sys.stderr.isatty() and done < total else "\n"
    sys.stderr.write(f"[{'#' * filled}{'.' * (width - filled)}] {done}/{total} {what}{end}")
    sys.stderr.flush()


def run(names, quick: bool, host_limit: int, progress: bool = True, sweeps=("size", "width")) -> list:
    kernels = library_kernels()
    scales = QUICK_SCALES if quick else FULL_SCALES
    repeats = 1 if quick else 5
    work = []
    for n in names:
        if "size" in sweeps:
            work += [(n, "size", p) for p in sweep(kernels[n].info, scales)]
        if "width" in sweeps and not quick:
            work += [(n, "width", p) for p in width_sweep(kernels[n].info, WIDTH_SCALES)]
    rows = []
    for step, (name, kind, (label, specs, params)) in enumerate(work, 1):
        kernel = kernels[name]
        row = {"kernel": name, "sweep": kind, "size": label, "inputs": [[list(s), to_dtype(d).name] for s, d in specs],
               "params": params, "bound": kernel.info["benchmark"]["bound"], "goal": kernel.info["benchmark"]["goal"]}
        for target in TARGETS:
            row[target] = estimate(name, kernel, specs, params, target)
        heavy = max(row["trn2"]["io_bytes"], row["trn2"]["useful_flops"] / 640)
        if kind == "size" and heavy <= host_limit:
            row["host"] = host_times(name, kernel, specs, params, repeats)
        rows.append(row)
        if progress:
            _progress(step, len(work), f"{name} {label}")
    return rows


# --- reports --------------------------------------------------------------------------------

def _ratio(a, b) -> str:
    return f"{a / b:.2f}x" if a and b else "-"


def _elements(row: dict) -> int:
    """Elements of the row's first input."""
    return math.prod(row["inputs"][0][0])


def reference_markdown(references: dict) -> list:
    """The reference-kernel tables: the matmul tutorial and nki-library pairs."""
    lines = []
    tutorial = references.get("matmul_tutorial")
    if tutorial:
        lines += ["## Reference kernels: NKI's matmul tutorial", "",
                  "[4096, 8192] @ [8192, 8192] bf16 on trn1: the tutorial's four kernels (run on nikki) with the "
                  "latencies the tutorial published for Trn1, and nikki's library matmul on the same problem.", "",
                  "| kernel | published ms | estimated ms | estimate / published | TensorE util |",
                  "|---|---:|---:|---:|---:|"]
        for r in tutorial:
            published = r["published_ms"]
            lines.append(f"| {r['kernel']} | {published if published else '-'} | {r['estimate_ms']:.2f} | "
                         f"{_ratio(r['estimate_ms'], published)} | {100 * r['tensor_utilization']:.1f}% |")
        lines.append("")
    library = references.get("nki_library")
    if library:
        lines += ["## Reference kernels: AWS's nki-library", "",
                  f"Kernels of the nki-library checkout at `{references.get('nki_library_commit', '?')}`, run "
                  "unmodified on nikki and estimated by the same model on trn2, beside nikki's kernel for the "
                  "same operation on the same problem.", "",
                  "| operation | shape | nki-library kernel | its µs | nikki kernel | nikki µs | nki-library / nikki |",
                  "|---|---|---|---:|---|---:|---:|"]
        for r in library:
            theirs = f"{r['library_us']:.1f}" if "library_us" in r else f"does not run: {r.get('error', '?')}"
            ours = f"{r['nikki_us']:.1f}" if "nikki_us" in r else "-"
            note = f" ({r['note']})" if r.get("note") else ""
            lines.append(f"| {r['nikki_kernel']} | {r['shape']} | `{r['library_kernel']}` | {theirs} | "
                         f"{r['nikki_kernel']}{note} | {ours} | {_ratio(r.get('library_us'), r.get('nikki_us'))} |")
        lines.append("")
    return lines


def markdown(rows: list, command: str, references: dict | None = None) -> str:
    lines = ["# Kernel benchmarks", "",
             "Every library kernel over a size sweep of its benchmark shape. Device times are ESTIMATES of",
             "nikki's timing model (docs/performance-model.md), not measurements. Host times were measured on",
             "a shared, noisy machine: read the ratios, taken in the same run, rather than the absolute times.",
             "", f"Regenerate: `{command}`", "",
             "- *util*: useful TensorE FLOPs over the 16-bit peak (TensorE-bound kernels) or compulsory HBM",
             "  bytes (every input read once, every output written once) over the DMA peak (HBM-bound ones),",
             "  against the estimated time; *roofline*: the shortest time those peaks allow.",
             "- *host*: one run of the simulation on this machine: nikki's native executor, PyTorch CPU eager",
             "  (float32) on the same computation, and numpy-eager (one instruction at a time with numpy, the",
             "  way NKI's own simulator works); `-` where the size is above the host limit or the kernel is",
             "  outside numpy-eager's scope.", "",
             "![estimated utilization](benchmarks/utilization.png)",
             "![estimated time against work](benchmarks/scaling.png)",
             "![host simulation time](benchmarks/host.png)", ""]
    for name in dict.fromkeys(r["kernel"] for r in rows):
        mine = [r for r in rows if r["kernel"] == name and r.get("sweep", "size") == "size"]
        wide = [r for r in rows if r["kernel"] == name and r.get("sweep") == "width"]
        first = (mine or wide)[0]
        lines += [f"## {name}", "",
                  f"Bound: {'TensorE' if first['bound'] == 'tensor_engine' else 'HBM'}"
                  + (f"; goal {100 * first['goal']:.0f}% on trn2 at the benchmark shape" if first["goal"] else ""), ""]
        if mine:
            lines += ["| size | trn2 µs | util | roofline µs | trn1 µs | util | nikki ms | torch ms | numpy-eager ms "
                      "| numpy-eager / nikki | torch / nikki |",
                      "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for r in mine:
            t2, t1, h = r["trn2"], r["trn1"], r.get("host", {})
            ms = {k: h[k] * 1e3 for k in ("nikki_s", "torch_s", "numpy_eager_s") if k in h}
            lines.append(f"| {r['size']} | {t2['us']:.1f} | {100 * t2['utilization']:.1f}% | {t2['roofline_us']:.1f} "
                         f"| {_time_and_utilization(t1)} | "
                         + " | ".join(f"{ms[k]:.2f}" if k in ms else "-" for k in ("nikki_s", "torch_s", "numpy_eager_s"))
                         + f" | {_ratio(ms.get('numpy_eager_s'), ms.get('nikki_s'))} "
                         f"| {_ratio(ms.get('torch_s'), ms.get('nikki_s'))} |")
        lines.append("")
        if wide:
            lines += [f"Row width, {WIDTH_ROWS} rows (where a row stops fitting in SBUF, the time per element "
                      "steps up):", "",
                      "| shape | trn2 µs | trn2 ns per element | util | trn1 µs | util |",
                      "|---|---:|---:|---:|---:|---:|"]
            for r in wide:
                t2, t1 = r["trn2"], r["trn1"]
                lines.append(f"| {r['size']} | {t2['us']:.1f} | {1e3 * t2['us'] / _elements(r):.3f} | "
                             f"{100 * t2['utilization']:.1f}% | {_time_and_utilization(t1)} |")
            lines.append("")
    return "\n".join(lines + reference_markdown(references or {}))


def _time_and_utilization(est: dict) -> str:
    """`µs | util` cells of one target's estimate ("not on this target" where it cannot run)."""
    if "unsupported" in est:
        return "- | not on this target"
    return f"{est['us']:.1f} | {100 * est['utilization']:.1f}%"


def plots(rows: list, folder: str) -> list:
    """utilization.png, scaling.png and host.png in `folder`; returns their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(folder, exist_ok=True)
    wide = [r for r in rows if r.get("sweep") == "width"]
    rows = [r for r in rows if r.get("sweep", "size") == "size"]
    names = list(dict.fromkeys(r["kernel"] for r in rows))
    largest = {n: [r for r in rows if r["kernel"] == n][-1] for n in names}
    paths = []

    def grouped_bars(path, labels, series, ylabel, title, log=False, goals=None):
        """One group of bars per label, one bar per (legend, values) series."""
        fig, ax = plt.subplots(figsize=(max(6, 0.7 * len(labels) + 2), 4))
        x = np.arange(len(labels))
        width = 0.8 / len(series)
        for i, (legend, values) in enumerate(series):
            ax.bar(x + (i - (len(series) - 1) / 2) * width, values, width, label=legend)
        for j, goal in enumerate(goals or []):
            if goal:
                ax.plot([j - 0.4, j + 0.4], [goal] * 2, color="black", lw=1.5)
        if log:
            ax.set_yscale("log")
        ax.set_xticks(x, labels, rotation=40, ha="right")
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.legend()
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        plt.close(fig)
        paths.append(path)

    grouped_bars(os.path.join(folder, "utilization.png"), names,
                 [(t, [100 * largest[n][t].get("utilization", 0.0) for n in names]) for t in TARGETS],
                 "% of the bound (estimate)", "Estimated utilization at the largest swept size (black: goal)",
                 goals=[100 * largest[n]["goal"] for n in names])

    fig, axes = plt.subplots(1, 3 if wide else 2, figsize=(18 if wide else 12, 4.5))
    for ax, bound, unit in ((axes[0], "hbm", "compulsory HBM bytes"), (axes[1], "tensor_engine", "useful FLOPs")):
        for n in names:
            mine = [r for r in rows if r["kernel"] == n and r["bound"] == bound]
            if mine:
                work = [r["trn2"]["io_bytes"] if bound == "hbm" else r["trn2"]["useful_flops"] for r in mine]
                ax.loglog(work, [r["trn2"]["us"] for r in mine], marker="o", label=n)
        ax.set_xlabel(unit)
        ax.set_ylabel("estimated µs on trn2")
        ax.set_title(f"{'HBM' if bound == 'hbm' else 'TensorE'}-bound kernels: time against work")
        ax.grid(True, which="both", alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    if wide:
        ax = axes[2]
        for n in dict.fromkeys(r["kernel"] for r in wide):
            mine = [r for r in wide if r["kernel"] == n]
            ax.semilogx([r["inputs"][0][0][1] for r in mine], [1e3 * r["trn2"]["us"] / _elements(r) for r in mine],
                        marker="o", label=n)
        ax.set_yscale("log")
        ax.set_xlabel(f"row width (elements; {WIDTH_ROWS} rows)")
        ax.set_ylabel("estimated ns per element on trn2")
        ax.set_title("Row kernels: where rows stop fitting in SBUF")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(folder, "scaling.png"), dpi=100)
    plt.close(fig)
    paths.append(os.path.join(folder, "scaling.png"))

    hosted = {n: [r for r in rows if r["kernel"] == n and "host" in r] for n in names}
    hosted = {n: rs[-1]["host"] for n, rs in hosted.items() if rs}
    grouped_bars(os.path.join(folder, "host.png"), list(hosted),
                 [(label, [1e3 * h.get(key, float("nan")) for h in hosted.values()])
                  for key, label in (("nikki_s", "nikki native"), ("torch_s", "PyTorch CPU eager"),
                                     ("numpy_eager_s", "numpy-eager"))],
                 "host ms per run (largest size run on the host)", "Host simulation time", log=True)
    return paths


def text_table(rows: list) -> str:
    out = [f"{'kernel':<22} {'size':<26} {'trn2 us':>10} {'util':>7} {'trn1 us':>10} {'util':>7} "
           f"{'nikki ms':>9} {'torch ms':>9} {'np-eager ms':>11}"]
    for r in rows:
        h = r.get("host", {})
        cell = lambda k: f"{1e3 * h[k]:.2f}" if k in h else "-"  # noqa: E731
        out.append(f"{r['kernel']:<22} {r['size'] + (' (width)' if r.get('sweep') == 'width' else ''):<26} {r['trn2']['us']:>10.1f} {100 * r['trn2']['utilization']:>6.1f}% "
                   + (f"{'-':>10} {'-':>7} " if "unsupported" in r["trn1"] else
                      f"{r['trn1']['us']:>10.1f} {100 * r['trn1']['utilization']:>6.1f}% ")
                   + f"{cell('nikki_s'):>9} "
                   f"{cell('torch_s'):>9} {cell('numpy_eager_s'):>11}")
    return "\n".join(out)


def _git_head(path: str) -> str:
    import subprocess

    done = subprocess.run(["git", "-C", path, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return done.stdout.strip() or "unknown commit"


def main(argv=None, prog=None) -> int:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    parser.add_argument("--kernel", action="append", help="a kernel to run (repeatable; default: every kernel)")
    parser.add_argument("--quick", action="store_true", help="one small size, one host repetition")
    parser.add_argument("--json", metavar="FILE", help="write the results as JSON ('-': stdout)")
    parser.add_argument("--markdown", metavar="FILE", help="write the tables as markdown")
    parser.add_argument("--plots", metavar="DIR", help="write utilization.png, scaling.png and host.png")
    parser.add_argument("--nki-library", metavar="PATH", default=os.environ.get("NIKKI_NKI_LIBRARY"),
                        help="a checkout of aws-neuron/nki-library: estimate its kernels beside nikki's "
                             "(default: $NIKKI_NKI_LIBRARY)")
    parser.add_argument("--no-tutorial", action="store_true",
                        help="skip the matmul tutorial's reference kernels (skipped by --quick anyway)")
    parser.add_argument("--from-json", metavar="FILE",
                        help="re-render the markdown and plots of a run saved with --json, measuring nothing")
    parser.add_argument("--sweep", choices=("size", "width", "both"), default="both",
                        help="scale the benchmark shape's largest dim (size), the row width of 2-D kernels at "
                             f"{WIDTH_ROWS} rows (width; not with --quick), or both")
    parser.add_argument("--host-limit", type=int, default=DEFAULT_HOST_LIMIT,
                        help="skip host runs above this many compulsory bytes (default %(default)s)")
    args = parser.parse_args(argv)
    kernels = library_kernels()
    names = args.kernel or sorted(n for n, k in kernels.items() if k.info["benchmark"] is not None)
    unknown = [n for n in names if n not in kernels]
    if unknown:
        parser.error(f"unknown kernel(s) {', '.join(unknown)}; the library has {', '.join(sorted(kernels))}")
    no_shape = [n for n in names if kernels[n].info["benchmark"] is None]
    if no_shape:
        parser.error(f"kernel(s) {', '.join(no_shape)} register no benchmark shape")
    if args.from_json:
        with open(args.from_json) as f:
            saved = json.load(f)
        rows, references = saved["kernels"], saved["references"]
    else:
        rows = run(names, args.quick, args.host_limit,
                   sweeps=("size", "width") if args.sweep == "both" else (args.sweep,))
        references = {}
        if not args.quick and not args.no_tutorial and "matmul" in names:
            references["matmul_tutorial"] = reference_kernels.matmul_tutorial_rows()
        if args.nki_library:
            references["nki_library"] = reference_kernels.library_rows(args.nki_library, names=names)
            references["nki_library_commit"] = _git_head(args.nki_library)
    if args.json == "-":
        print(json.dumps({"kernels": rows, "references": references}, indent=1))
    else:
        print(text_table(rows))
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"kernels": rows, "references": references}, f, indent=1)
    if args.markdown:
        command = "python bench/python/kernel_bench.py --quick" if args.quick else \
            "make bench NKI_LIBRARY=<an aws-neuron/nki-library checkout>" if references.get("nki_library") else "make bench"
        with open(args.markdown, "w") as f:
            f.write(markdown(rows, command, references) + "\n")
    if args.plots:
        plots(rows, args.plots)
    return 0


if __name__ == "__main__":
    sys.exit(main())
