"""nikki demo: flash attention on the simulated NeuronCore, called from PyTorch.

Runs nikki's flash attention kernel (causal, grouped-query heads) on torch CPU tensors, checks the
output and its gradients against PyTorch's scaled_dot_product_attention, then estimates the
kernel on the modelled NeuronCore and writes a Perfetto trace.

    make demo                                   (or: python examples/flash_attention_demo.py [--trace PATH])
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch
import torch.nn.functional as F

import nikki
import nikki.kernels
import nikki.torch as nt


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", default="flash_attention_trace.json", help="where to write the Perfetto trace")
    parser.add_argument("--seq", type=int, default=512, help="sequence length (queries and keys)")
    args = parser.parse_args()

    batch, heads, kv_heads, seq, dim = 1, 4, 2, args.seq, 128
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(batch, heads, seq, dim, generator=gen).to(torch.bfloat16).requires_grad_()
    k = torch.randn(batch, kv_heads, seq, dim, generator=gen).to(torch.bfloat16).requires_grad_()
    v = torch.randn(batch, kv_heads, seq, dim, generator=gen).to(torch.bfloat16).requires_grad_()
    print(f"flash attention, causal, bf16: q [{batch}, {heads}, {seq}, {dim}], k/v [{batch}, {kv_heads}, {seq}, {dim}] "
          f"(grouped-query heads)")

    start = time.perf_counter()
    out = nt.flash_attention(q, k, v, causal=True)
    grad = torch.randn(out.shape, generator=gen).to(torch.bfloat16)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), grad)
    host_s = time.perf_counter() - start

    # The reference: PyTorch in fp32 on the same bf16 inputs.
    q32, k32, v32 = (t.detach().float().requires_grad_() for t in (q, k, v))
    ref = F.scaled_dot_product_attention(q32, k32, v32, is_causal=True, enable_gqa=True)
    rq, rk, rv = torch.autograd.grad(ref, (q32, k32, v32), grad.float())
    ok = True
    # bf16 results: one rounding of an fp32 computation, checked at 2e-2 (bf16 has 8 mantissa bits).
    for name, got, want in (("out", out, ref), ("grad q", dq, rq), ("grad k", dk, rk), ("grad v", dv, rv)):
        err = (got.float() - want).abs().max().item()
        tol = 2e-2 * max(1.0, want.abs().max().item())
        ok &= err <= tol
        print(f"  {name:7s} max abs error vs PyTorch {err:.2e} (tolerance {tol:.1e}): {'PASS' if err <= tol else 'FAIL'}")
    print(f"  forward + backward on the simulated NeuronCore: {host_s:.2f} s host time "
          f"(first call includes compiling)\n")

    spec_q = nikki.spec(q.shape, "bfloat16")
    spec_kv = nikki.spec(k.shape, "bfloat16")
    spec_sinks = nikki.spec((heads,), "float32")  # attention sinks (-inf: none); they do not change the timing
    profile = nikki.estimate(nikki.kernels.flash_attention, spec_q, spec_kv, spec_kv, spec_sinks, causal=True)
    print(profile.summary())
    flops = 4 * batch * heads * seq * seq * dim / 2  # causal: half the score matrix
    print(f"useful TensorE utilization (causal FLOPs / peak): {profile.tensor_flop_utilization(flops):.1%} "
          "(estimate)")
    path = profile.save_trace(os.path.abspath(args.trace))
    print(f"Perfetto trace: {path} (open it in https://ui.perfetto.dev)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
