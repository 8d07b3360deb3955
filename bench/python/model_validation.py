"""The timing model against every published NKI latency nikki has a kernel for.

Each row is a figure AWS published for a tutorial kernel (its shapes, dtype and NeuronCore), the
estimate of nikki's implementation of that kernel, and their ratio. The rows are split in two:
the model's uncertain parameters may be chosen to fit the `calibrate` rows only; the `check` rows
say whether that generalizes. Both halves are reported, with the published rankings (v1 slower
than v2 ...) and whether the estimates keep them.

    python bench/python/model_validation.py              # the whole table (about a minute)
    python bench/python/model_validation.py --quick      # the small rows only
    python bench/python/model_validation.py --markdown   # the table for docs/performance-model.md
    python bench/python/model_validation.py --check      # first run every tutorial kernel on small
                                                         # inputs against numpy
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import layernorm_tutorial  # noqa: E402
import matmul_tutorial  # noqa: E402
import mamba_tutorial  # noqa: E402

import nikki as nki  # noqa: E402
import nikki.language as nl  # noqa: E402

MATMUL_SOURCE = "NKI matmul tutorial (Neuron SDK 2.26 docs), nki.benchmark on Trn1"
MAMBA_SOURCE = "NKI fused Mamba tutorial (Neuron SDK docs), neuron-profile"
LAYERNORM_SOURCE = "NKI LayerNorm tutorial (Neuron SDK 2.20-2.26 docs), nki.benchmark p50 on Trn1"
TOLERANCE = 0.25  # the target: every estimate within 25% of the published figure


@dataclass
class Row:
    """One published figure and how to estimate it."""

    name: str
    published_ms: float
    split: str                   # "calibrate" or "check"
    source: str
    estimate: Callable[[], float] = field(repr=False)
    small: bool = False          # cheap enough for --quick
    estimate_ms: float = math.nan
    host_s: float = math.nan

    @property
    def ratio(self) -> float:
        return self.estimate_ms / self.published_ms


def _matmul(kernel_name: str) -> Callable[[], float]:
    def run() -> float:
        M, K, N = 4096, 8192, 8192
        args = (nki.spec((K, M), nl.bfloat16), nki.spec((K, N), nl.bfloat16))
        return nki.estimate(matmul_tutorial.KERNELS[kernel_name], *args, target="trn1").total_ms
    return run


def _mamba(version: str, channels: int, seq_len: int) -> Callable[[], float]:
    def run() -> float:
        batch, states = 1, 16
        f32 = nl.float32
        args = (nki.spec((batch, channels, seq_len), f32), nki.spec((batch, channels, seq_len), f32),
                nki.spec((channels, states), f32), nki.spec((batch, states, seq_len), f32),
                nki.spec((batch, states, seq_len), f32))
        return nki.estimate(mamba_tutorial.KERNELS[version], *args, target="trn1").total_ms
    return run


def _layernorm(version: str) -> Callable[[], float]:
    def run() -> float:
        # The page names (300, 1000) but its latencies fit the script's default shape, 4096 x 8192
        # (256 MiB of fp32 in and out in about 2 ms); (300, 1000) would take microseconds.
        rows, cols = 4096, 8192
        args = (nki.spec((rows, cols), nl.float32), 1e-5, nki.spec((cols,), nl.float32),
                nki.spec((cols,), nl.float32))
        return nki.estimate(layernorm_tutorial.KERNELS[version], *args, target="trn1").total_ms
    return run


# The mamba tutorial's scaling table: seq_len -> (v2 ms, v3 ms) at batch 1, 4096 channels, 16 states.
MAMBA_SCALING = {1024: (4.4, 3.3), 2048: (8.9, 6.6), 3072: (13.1, 10.1), 4096: (17.6, 13.3),
                 5120: (23.7, 17.3), 6144: (27.5, 19.6), 7168: (41.3, 24.2), 8192: (52.2, 27.8)}

# Half of each family calibrates, the other half checks: the matmul versions alternate; for
# Mamba the model may look at v2 (half the lengths) and v1 at toy size only; LayerNorm only checks.
CALIBRATE_SCALING_LENGTHS = (1024, 3072, 5120, 7168)


def rows() -> list[Row]:
    table = [
        Row("matmul tiled, bf16 [4096,8192]x[8192,8192]", 51.80, "calibrate", MATMUL_SOURCE, _matmul("tiled")),
        Row("matmul hoisted loads", 42.96, "check", MATMUL_SOURCE, _matmul("hoisted")),
        Row("matmul blocked free dims", 22.07, "calibrate", MATMUL_SOURCE, _matmul("blocked_free")),
        Row("matmul fully optimized (M16 N2 K8)", 6.97, "check", MATMUL_SOURCE, _matmul("fully_optimized")),
        Row("layernorm v1, fp32 [4096, 8192]", 2.311, "check", LAYERNORM_SOURCE, _layernorm("v1"), small=True),
        Row("layernorm v2 (bn_stats)", 1.969, "check", LAYERNORM_SOURCE, _layernorm("v2"), small=True),
        Row("mamba v1, fp32 C=256 L=512", 0.17293, "calibrate", MAMBA_SOURCE, _mamba("v1", 256, 512), small=True),
        Row("mamba v1, C=4096 L=512", 2.34, "check", MAMBA_SOURCE, _mamba("v1", 4096, 512), small=True),
        Row("mamba v2, C=4096 L=512", 1.61, "calibrate", MAMBA_SOURCE, _mamba("v2", 4096, 512), small=True),
    ]
    for length, (v2_ms, v3_ms) in MAMBA_SCALING.items():
        split = "calibrate" if length in CALIBRATE_SCALING_LENGTHS else "check"
        table.append(Row(f"mamba v2, C=4096 L={length}", v2_ms, split, MAMBA_SOURCE, _mamba("v2", 4096, length)))
        table.append(Row(f"mamba v3, C=4096 L={length}", v3_ms, "check", MAMBA_SOURCE, _mamba("v3", 4096, length)))
    return table


# Published orderings: (slower, faster) by row name.
RANKINGS = [
    ("matmul tiled, bf16 [4096,8192]x[8192,8192]", "matmul hoisted loads"),
    ("matmul hoisted loads", "matmul blocked free dims"),
    ("matmul blocked free dims", "matmul fully optimized (M16 N2 K8)"),
    ("layernorm v1, fp32 [4096, 8192]", "layernorm v2 (bn_stats)"),
    ("mamba v1, C=4096 L=512", "mamba v2, C=4096 L=512"),
] + [(f"mamba v2, C=4096 L={n}", f"mamba v3, C=4096 L={n}") for n in MAMBA_SCALING]


def summary(table: list[Row]) -> list[str]:
    lines = []
    for split in ("calibrate", "check"):
        done = [r for r in table if r.split == split and not math.isnan(r.estimate_ms)]
        if not done:
            continue
        within = sum(abs(r.ratio - 1) <= TOLERANCE for r in done)
        worst = max(done, key=lambda r: abs(math.log(r.ratio)))
        geo = math.exp(sum(abs(math.log(r.ratio)) for r in done) / len(done)) - 1
        lines.append(f"{split}: {within}/{len(done)} rows within ±{TOLERANCE:.0%}; mean |error| {geo:.1%} "
                     f"(geometric); worst {worst.ratio - 1:+.1%} ({worst.name})")
    by_name = {r.name: r for r in table}
    kept, broken = 0, []
    for slower, faster in RANKINGS:
        a, b = by_name.get(slower), by_name.get(faster)
        if a is None or b is None or math.isnan(a.estimate_ms) or math.isnan(b.estimate_ms):
            continue
        if a.estimate_ms > b.estimate_ms:
            kept += 1
        else:
            broken.append(f"{slower} > {faster}")
    lines.append(f"published rankings kept: {kept}/{kept + len(broken)}"
                 + (f"; broken: {', '.join(broken)}" if broken else ""))
    return lines


def render(table: list[Row], markdown: bool) -> str:
    if markdown:
        out = ["| figure | split | published (ms) | estimate (ms) | estimate / published |",
               "|---|---|---:|---:|---:|"]
        for r in table:
            if not math.isnan(r.estimate_ms):
                out.append(f"| {r.name} | {r.split} | {r.published_ms:g} | {r.estimate_ms:.3g} | {r.ratio:.2f} |")
        return "\n".join(out + [""] + [f"- {line}" for line in summary(table)])
    out = [f"{'figure':<44} {'split':<9} {'published ms':>12} {'estimate ms':>12} {'ratio':>6} {'host s':>6}"]
    for r in table:
        if not math.isnan(r.estimate_ms):
            out.append(f"{r.name:<44} {r.split:<9} {r.published_ms:>12.4g} {r.estimate_ms:>12.4g} "
                       f"{r.ratio:>6.2f} {r.host_s:>6.1f}")
    return "\n".join(out + [""] + summary(table))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="only the rows that estimate in well under a second")
    parser.add_argument("--markdown", action="store_true", help="print the table as markdown")
    parser.add_argument("--check", action="store_true", help="run every tutorial kernel on small inputs first")
    args = parser.parse_args()
    if args.check:
        for module in (matmul_tutorial, layernorm_tutorial, mamba_tutorial):
            module.check_correctness()
    table = [r for r in rows() if r.small or not args.quick]
    for r in table:
        start = time.perf_counter()
        r.estimate_ms = r.estimate()
        r.host_s = time.perf_counter() - start
        print(f"  {r.name}: {r.estimate_ms:.4g} ms", file=sys.stderr)
    print("estimates are nikki's timing model for trn1; published figures are measurements on hardware")
    print(render(table, args.markdown))


if __name__ == "__main__":
    main()
