"""nikki demo: the end of a decoder language model on the simulated NeuronCore, from PyTorch.

A residual stream goes through nikki's fused residual add + RMSNorm, an LM head (nikki's matmul)
and nikki's chunked cross-entropy over the vocabulary; the per-token losses are accumulated with
nikki's cumsum. The loss and every gradient are checked against the same computation in plain
PyTorch, then the cross-entropy is estimated on trn2 at a 128k vocabulary.

    python examples/lm_loss_demo.py [--tokens 64] [--hidden 128] [--vocab 5000]
"""

from __future__ import annotations

import argparse
import sys

import torch
import torch.nn.functional as F

import nikki
import nikki.kernels
import nikki.torch as nt


def forward(x, residual, weight, head, targets, fused: bool):
    """Mean cross-entropy of the tokens and their running loss, with nikki's ops or torch's."""
    if fused:
        normed, _ = nt.add_rms_norm(x, residual, weight)
        logits = nt.matmul(normed, head)
        loss = nt.cross_entropy(logits, targets, ignore_index=-100, label_smoothing=0.1)
        running = nt.cumsum(loss.unsqueeze(0), dim=-1)[0]
    else:
        h = x + residual
        logits = F.rms_norm(h, (h.shape[-1],), weight, 1e-6) @ head
        loss = F.cross_entropy(logits, targets, reduction="none", ignore_index=-100, label_smoothing=0.1)
        running = torch.cumsum(loss, -1)
    return running[-1] / (targets != -100).sum(), running


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--vocab", type=int, default=5000)
    args = parser.parse_args()
    g = torch.Generator().manual_seed(0)
    x = torch.randn(args.tokens, args.hidden, generator=g)
    residual = torch.randn(args.tokens, args.hidden, generator=g)
    weight = torch.ones(args.hidden) + 0.1 * torch.randn(args.hidden, generator=g)
    head = torch.randn(args.hidden, args.vocab, generator=g) / args.hidden ** 0.5
    targets = torch.randint(0, args.vocab, (args.tokens,), generator=g)
    targets[::9] = -100  # padding tokens

    results = []
    for fused in (True, False):
        leaves = [t.clone().requires_grad_() for t in (x, residual, weight, head)]
        loss, running = forward(*leaves, targets, fused)
        grads = torch.autograd.grad(loss, leaves)
        results.append((loss.detach(), running.detach(), grads))
    (loss, running, grads), (want, want_running, want_grads) = results
    print(f"mean loss: nikki {loss.item():.6f}, torch {want.item():.6f}")
    ok = torch.allclose(loss, want, rtol=1e-5, atol=1e-5) and torch.allclose(running, want_running, rtol=1e-5, atol=1e-4)
    for name, a, b in zip(("x", "residual", "weight", "head"), grads, want_grads):
        err = (a - b).abs().max().item()
        print(f"grad {name:8s} max |nikki - torch| = {err:.2e}")
        ok = ok and torch.allclose(a, b, rtol=1e-4, atol=1e-5)

    est = nikki.estimate(nikki.kernels.cross_entropy, nikki.spec((2048, 131072), "bfloat16"),
                         nikki.spec((2048,), "int32"))
    print(str(est).splitlines()[1])
    print("OK" if ok else "MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
