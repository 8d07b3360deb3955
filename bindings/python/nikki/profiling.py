"""Estimated profiles from nikki's cycle-approximate timing model: ``nikki.estimate`` and NKI's
legacy ``nki.profile`` / ``nki.benchmark`` entry points.

Every number here is an ESTIMATE for the modelled NeuronCore (trn1 = NeuronCore-v2, trn2 =
NeuronCore-v3), computed from NKI's published per-instruction cost formulas and DMA model, never a
measurement. docs/performance-model.md explains the model and its limits.
"""

from __future__ import annotations

import functools
import math
import os
import sys

import numpy as np

from . import _core
from .arguments import check_int
from .dtypes import to_dtype
from .errors import KernelError, kernel_error_at, user_frame
from .entry import DecoratedKernel, as_kernel
from .kernel import Kernel, _for_user

__all__ = ["Profile", "Explanation", "estimate", "profile", "benchmark", "BenchmarkResult"]


class Profile:
    """The estimated profile of one kernel launch (SPMD instances run one after another on one core;
    instances that meet at core_barrier / sendrecv run in parallel, each on its own core).

    Attributes are estimates: ``total_ns`` / ``total_us``, per-engine busy time and utilization,
    DMA bytes and achieved bandwidth, TensorE FLOP utilization, per-instruction timelines.
    """

    def __init__(self, kernel_name: str, target: str, programs, profiles, concurrent: bool = False):
        self.kernel = kernel_name
        self.target = target
        self._programs = programs
        self._profiles = profiles
        # Instances that meet run in parallel, each on its own core: the launch lasts as long as
        # the longest; otherwise they run one after another on one core.
        totals = [p.total_ns for p in profiles]
        self.total_ns = float(max(totals, default=0.0) if concurrent else sum(totals))
        self._concurrent = concurrent
        self.dma_bytes = int(sum(p.dma_bytes for p in profiles))
        self.matmul_flops = int(sum(p.matmul_flops for p in profiles))
        self._peak_flops_per_ns = profiles[0].tensor_peak_flops_per_ns if profiles else 0.0
        self._peak_dma_per_ns = profiles[0].dma_peak_bytes_per_ns if profiles else 0.0

    @classmethod
    def of(cls, kernel_name: str, compiled) -> "Profile":
        """The estimated profile of a compiled launch: every SPMD instance's program, on the
        target the kernel was compiled for."""
        meets = compiled.meets
        profiles = (_core.estimate_launch(compiled.programs) if meets
                    else [_core.estimate(p) for p in compiled.programs])
        info = _core.target_info(compiled.programs[0].kernel.target)
        return cls(kernel_name, f"{info['name']} ({info['core']})", compiled.programs, profiles, concurrent=meets)

    @property
    def total_us(self) -> float:
        return self.total_ns / 1000.0

    @property
    def total_ms(self) -> float:
        return self.total_ns / 1e6

    def engines(self) -> dict:
        """{queue name: (busy ns, instructions)} summed over instances; DMA queues included."""
        out: dict = {}
        for p in self._profiles:
            for name, busy, count in p.queues:
                b, c = out.get(name, (0.0, 0))
                out[name] = (b + busy, c + count)
        return out

    def utilization(self, engine: str) -> float:
        """Busy fraction of an engine: "tensor", "vector", "scalar", "gpsimd" (or a queue name)."""
        engines = {"tensor": "qTensor", "vector": "qVector", "scalar": "qScalar", "gpsimd": "qGpSimd", "sync": "qSync"}
        name = engines.get(engine, engine)
        if name not in self.engines() and name not in engines.values():
            raise ValueError(f"utilization(): engine {engine!r} is not one of {', '.join(engines)} "
                             f"or a queue ({', '.join(self.engines())})")
        busy = self.engines().get(name, (0.0, 0))[0]
        return busy / self.total_ns if self.total_ns else 0.0

    def tensor_flop_utilization(self, flops: float | None = None) -> float:
        """Matmul FLOPs over the 16-bit TensorE peak for the whole run. ``flops=`` counts only the
        algorithm's useful FLOPs instead (e.g. half the score matrix of causal attention), which
        leaves out transposes and masked work the kernel executes."""
        work = self.matmul_flops if flops is None else flops
        return work / (self.total_ns * self._peak_flops_per_ns) if self.total_ns else 0.0

    def dma_bandwidth(self) -> float:
        """Achieved DMA bandwidth in GB/s (bytes moved over total time)."""
        return self.dma_bytes / self.total_ns if self.total_ns else 0.0

    def dma_utilization(self) -> float:
        """Achieved DMA bandwidth over the peak of the core's DMA engines."""
        return self.dma_bandwidth() / self._peak_dma_per_ns if self._peak_dma_per_ns else 0.0

    def io_bytes(self) -> int:
        """Bytes of the kernel's inputs and outputs: its compulsory HBM traffic when every input is
        read once and every output written once (summed over SPMD instances' own programs)."""
        total = 0
        for prog in self._programs:
            kernel = prog.kernel
            storages = kernel.storages()
            for sid in (*kernel.inputs, *kernel.outputs):
                s = storages[sid]
                total += math.prod(s["shape"]) * to_dtype(s["dtype"]).itemsize
        return total

    def roofline_ns(self, flops: float | None = None, io_bytes: float | None = None) -> float:
        """The shortest time the target's peaks allow: the larger of the FLOPs at the 16-bit TensorE
        peak (the matmul FLOPs executed, or ``flops=``) and ``io_bytes()`` (or ``io_bytes=``, for a
        kernel that reads only part of an input) at the DMA peak."""
        work = self.matmul_flops if flops is None else flops
        traffic = self.io_bytes() if io_bytes is None else io_bytes
        compute = work / self._peak_flops_per_ns if self._peak_flops_per_ns else 0.0
        memory = traffic / self._peak_dma_per_ns if self._peak_dma_per_ns else 0.0
        return max(compute, memory)

    def explain(self, flops: float | None = None, rows: int = 5) -> "Explanation":
        """What limits this kernel, in words and numbers: the roofline position (FLOPs and bytes
        against the target's peaks), each engine's busy time and idle time by cause (which engine
        and line it waited for), the critical path through the kernel's lines, and up to three
        changes that would help most. ``flops=`` measures the compute roofline by the algorithm's
        useful FLOPs instead of the matmul FLOPs executed. ``str()`` of the result is the report;
        SPMD launches explain each program instance."""
        rows = check_int(rows, "Profile.explain: rows", minimum=1)
        useful = 0.0 if flops is None else float(flops) / max(1, len(self._profiles))
        parts = [_core.profile_explain(p, prog, useful, rows) for prog, p in zip(self._programs, self._profiles)]
        return Explanation(parts)

    def instructions(self) -> list:
        """(queue, opcode, start ns, end ns, source) for every instruction, instance after instance
        (each shifted by the instances before it, unless they run in parallel)."""
        rows: list = []
        offset = 0.0
        for prog, p in zip(self._programs, self._profiles):
            rows.extend((q, op, s + offset, e + offset, src) for q, op, s, e, src in p.instructions(prog))
            offset += 0.0 if self._concurrent else p.total_ns
        return rows

    def summary(self, top: int = 8) -> str:
        """A text summary, labelled as an estimate."""
        top = check_int(top, "Profile.summary: top", minimum=0)
        parts = [_core.profile_summary(p, prog, top) for prog, p in zip(self._programs, self._profiles)]
        if len(parts) > 1:
            parts.insert(0, f"{len(parts)} program instances, {self.total_us:.3f} us estimated in total\n")
        return "\n".join(parts)

    def __str__(self) -> str:
        return self.summary()

    def __repr__(self) -> str:
        return f"<nikki.Profile {self.kernel} on {self.target}: {self.total_us:.3f} us (estimate)>"

    def save_trace(self, path: str) -> str:
        """Writes a Chrome / Perfetto trace JSON (one track per engine and DMA queue)."""
        traces = [_core.profile_chrome_trace(p, prog) for prog, p in zip(self._programs, self._profiles)]
        with open(path, "w") as f:
            f.write(traces[0] if len(traces) == 1 else _merge_traces(traces, self._profiles, self._concurrent))
        return path

    def save_timeline(self, path: str) -> str:
        """Draws the per-engine timeline into a PNG (matplotlib)."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        rows = self.instructions()
        queues = [q for q in self.engines() if any(r[0] == q for r in rows)]
        colors = {"qTensor": "tab:red", "qVector": "tab:blue", "qScalar": "tab:green", "qGpSimd": "tab:purple",
                  "qSync": "tab:gray"}
        fig, ax = plt.subplots(figsize=(12, 0.4 * len(queues) + 1.5))
        for y, q in enumerate(queues):
            spans = [(s / 1000.0, (e - s) / 1000.0) for qq, _, s, e, _ in rows if qq == q]
            ax.broken_barh(spans, (y - 0.4, 0.8), facecolors=colors.get(q, "tab:orange"))
        ax.set_yticks(range(len(queues)), queues)
        ax.invert_yaxis()
        ax.set_xlabel("time (us, estimated)")
        ax.set_title(f"{self.kernel} on {self.target}: {self.total_us:.3f} us ESTIMATE (not a measurement)")
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        return path


class Explanation:
    """The explanation of an estimated profile (``Profile.explain()``); every figure is an estimate.

    Attributes (of the first program instance): ``limit`` (one sentence), ``idle`` [(queue, reason,
    ns)], ``critical_path`` [(line, queue, opcode, ns, instructions)], ``suggestions`` [(text,
    ns at stake)], the roofline inputs ``flops`` / ``io_bytes`` and times ``compute_roofline_ns`` /
    ``memory_roofline_ns``. ``instances`` holds every instance's fields."""

    def __init__(self, instances: list):
        self.instances = instances
        first = instances[0]
        self.limit = first["limit"]
        self.idle = list(first["idle"])
        self.critical_path = list(first["critical_path"])
        self.suggestions = list(first["suggestions"])
        self.flops = first["flops"]
        self.io_bytes = first["io_bytes"]
        self.compute_roofline_ns = first["compute_roofline_ns"]
        self.memory_roofline_ns = first["memory_roofline_ns"]

    def __str__(self) -> str:
        if len(self.instances) == 1:
            return self.instances[0]["text"]
        return "\n".join(f"program instance {i}:\n{e['text']}" for i, e in enumerate(self.instances))

    def __repr__(self) -> str:
        return f"<nikki.Explanation: {self.limit}>"


def _merge_traces(traces, profiles, concurrent: bool = False) -> str:
    """Concatenates instance traces (one process each), shifting each by the instances before it
    unless they run in parallel."""
    import json

    merged = {"displayTimeUnit": "ns", "otherData": json.loads(traces[0])["otherData"], "traceEvents": []}
    offset_us = 0.0
    for i, (text, p) in enumerate(zip(traces, profiles)):
        for ev in json.loads(text)["traceEvents"]:
            ev["pid"] = i
            if "ts" in ev:
                ev["ts"] += offset_us
            merged["traceEvents"].append(ev)
        offset_us += 0.0 if concurrent else p.total_ns / 1000.0
    return json.dumps(merged)


def _as_kernel(kernel, target=None) -> Kernel:
    k = as_kernel(kernel)
    if target is not None:
        k = k.with_target(target)
    return k


def estimate(kernel, *args, target=None, **kwargs) -> Profile:
    """The estimated profile of ``kernel(*args)`` on the modelled NeuronCore, without computing
    any values: arrays or ``nikki.spec(shape, dtype)`` placeholders give the shapes and dtypes.
    ``target="trn1"`` / ``"trn2"`` overrides the kernel's target."""
    return _estimate(_as_kernel(kernel, target), args, kwargs)[1]


def _estimate(k: Kernel, args, kwargs):
    try:
        compiled = k.compile_for(k._bind(args, kwargs), k._grid(), for_running=False)
        return compiled, Profile.of(k.fn.__name__, compiled)
    except KernelError as err:
        # Errors of library kernels name nikki's C++ line: _for_user points them at the user's call.
        raise _for_user(err, user_frame(2)) from None


def profile(func=None, working_directory=None, save_neff_name="file.neff", save_trace_name="profile.ntff",
            additional_compile_opt=None, overwrite=False, profile_nth=1, **kwargs):
    """Legacy ``@nki.profile``: runs the kernel and writes, into `working_directory`, the device
    program (`save_neff_name`), an estimated Chrome/Perfetto trace (`save_trace_name` with .json),
    a text summary and a timeline PNG. All timings are estimates of nikki's model."""

    def wrap(fn):
        return DecoratedKernel(_as_kernel(fn), _profile)

    def _profile(k, args, kw, run):
        if not working_directory or not os.path.isabs(working_directory):
            raise kernel_error_at(user_frame(2), "nki.profile needs working_directory= as an absolute path")
        os.makedirs(working_directory, exist_ok=True)
        out = k(*args, **kw)
        prof = estimate(k, *args, **kw)
        base = os.path.splitext(save_trace_name)[0]
        files = {
            "neff": os.path.join(working_directory, save_neff_name),
            "trace": os.path.join(working_directory, base + ".json"),
            "summary": os.path.join(working_directory, base + "_summary.txt"),
            "timeline": os.path.join(working_directory, base + "_timeline.png"),
        }
        for path in files.values():
            if os.path.exists(path) and not overwrite:
                raise kernel_error_at(user_frame(2), f"nki.profile: {path} exists",
                                      hint="pass overwrite=True or use another working_directory")
        with open(files["neff"], "wb") as f:
            f.write(prof._programs[0].serialize())
        prof.save_trace(files["trace"])
        with open(files["summary"], "w") as f:
            f.write(prof.summary())
        prof.save_timeline(files["timeline"])
        run.profile = prof
        return out

    return wrap if func is None else wrap(func)


class _Latency:
    """NKI's ``benchmark_result.nc_latency``: percentiles in microseconds. The model is
    deterministic, so every percentile is the one estimated latency."""

    def __init__(self, us: float):
        self._us = us

    def get_latency_percentile(self, p) -> float:
        if p not in (0, 1, 10, 25, 50, 90, 99, 100):
            raise ValueError(f"percentile {p} is not one of 0, 1, 10, 25, 50, 90, 99, 100")
        return self._us


class BenchmarkResult:
    """The result of a ``@nki.benchmark`` call (estimate of the modelled target)."""

    def __init__(self, prof: Profile, warmup: int, iters: int):
        self.profile = prof
        self.nc_latency = _Latency(prof.total_us)
        self.warmup = warmup
        self.iters = iters

    def __repr__(self) -> str:
        return f"<BenchmarkResult {self.profile.total_us:.3f} us per run on {self.profile.target} (estimate)>"


def benchmark(kernel=None, warmup=10, iters=100, save_neff_name=None, save_trace_name=None,
              additional_compile_opt=None, **kwargs):
    """Legacy ``@nki.benchmark``: estimates the kernel's latency on the modelled NeuronCore (the
    inputs' values are not used and the outputs are undefined, as in NKI); afterwards
    ``fn.benchmark_result.nc_latency.get_latency_percentile(50)`` is the estimate in microseconds."""

    warmup = check_int(warmup, "nki.benchmark: warmup", minimum=0)
    iters = check_int(iters, "nki.benchmark: iters", minimum=1)

    def wrap(fn):
        return DecoratedKernel(_as_kernel(fn), _benchmark)

    def _benchmark(k, args, kw, run):
        compiled, prof = _estimate(k, args, kw)
        run.benchmark_result = BenchmarkResult(prof, warmup, iters)
        if save_trace_name:
            prof.save_trace(os.path.splitext(save_trace_name)[0] + ".json")
        print(f"nikki: {k.fn.__name__}: {prof.total_us:.3f} us per run (ESTIMATE for {prof.target})",
              file=sys.stderr)
        outs = [np.full(shape, np.nan if dt.is_float else 0, dtype=dt.numpy) for shape, dt in compiled.output_specs]
        return outs[0] if len(outs) == 1 else tuple(outs)

    return wrap if kernel is None else wrap(kernel)
