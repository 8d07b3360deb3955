"""A Mixtral-style mixture-of-experts block from nikki.torch ops, checked against the same block in
plain PyTorch (a loop over experts) and trained for a few steps side by side.

The block: RMSNorm, a router (softmax over the experts, top-2, renormalized), experts that are
SwiGLU MLPs, the experts' outputs combined with the routing weights, and the residual. nikki's
block runs rms_norm, router_topk and gated_mlp on the simulated NeuronCore; the combine is dense
(every expert on every token, weighted by its routing weight, zero when not selected), which keeps
the graph free of data-dependent shapes for torch.compile(fullgraph=True).

    python examples/mixtral_moe_block.py
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

import nikki.torch as nt


class MoEParameters(torch.nn.Module):
    """The block's parameters, shared by both implementations: norm weight [H], router [H, E],
    experts' w_gate and w_up [E, H, I] and w_down [E, I, H] (Linear weights transposed)."""

    def __init__(self, hidden: int, intermediate: int, experts: int, top_k: int = 2, seed: int = 0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        init = lambda *shape, fan_in: torch.nn.Parameter(torch.randn(*shape, generator=g) / fan_in ** 0.5)  # noqa: E731
        self.top_k = top_k
        self.norm_weight = torch.nn.Parameter(1 + 0.1 * torch.randn(hidden, generator=g))
        self.w_router = init(hidden, experts, fan_in=hidden)
        self.w_gate = init(experts, hidden, intermediate, fan_in=hidden)
        self.w_up = init(experts, hidden, intermediate, fan_in=hidden)
        self.w_down = init(experts, intermediate, hidden, fan_in=intermediate)


class NikkiMoEBlock(MoEParameters):
    """The block on nikki's kernels."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = nt.rms_norm(x, self.norm_weight, eps=1e-6)
        weights, ids = nt.router_topk(h, self.w_router, k=self.top_k, normalize=True)
        out = x
        for e in range(self.w_gate.shape[0]):
            gate = (weights * (ids == e)).sum(-1, keepdim=True).to(x.dtype)  # 0 where e is not chosen
            out = out + gate * nt.gated_mlp(h, self.w_gate[e], self.w_up[e], self.w_down[e])
        return out


class TorchMoEBlock(MoEParameters):
    """The same block in plain PyTorch, as MoE models write it: each expert runs on its tokens."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.rms_norm(x, (x.shape[-1],), self.norm_weight, 1e-6)
        flat = h.reshape(-1, h.shape[-1])
        probs = torch.softmax(flat @ self.w_router, -1)
        weights, ids = torch.topk(probs, self.top_k, dim=-1)
        weights = weights / weights.sum(-1, keepdim=True)
        out = torch.zeros_like(flat)
        for e in range(self.w_gate.shape[0]):
            token, slot = torch.where(ids == e)
            if token.numel() == 0:
                continue
            t = flat[token]
            y = (F.silu(t @ self.w_gate[e]) * (t @ self.w_up[e])) @ self.w_down[e]
            out = out.index_add(0, token, y * weights[token, slot, None])
        return x + out.reshape(x.shape)


def train(block: torch.nn.Module, inputs: torch.Tensor, targets: torch.Tensor, steps: int, lr: float = 1e-2):
    """Losses of `steps` Adam steps on the mean squared error."""
    opt = torch.optim.Adam(block.parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = F.mse_loss(block(inputs), targets)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def main() -> int:
    hidden, intermediate, experts = 64, 128, 4
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 24, hidden, generator=g)
    target = torch.randn(2, 24, hidden, generator=g)
    ours, theirs = NikkiMoEBlock(hidden, intermediate, experts), TorchMoEBlock(hidden, intermediate, experts)
    err = (ours(x) - theirs(x)).abs().max().item()
    print(f"Mixtral-style MoE block, {experts} experts, top-2: max |nikki - PyTorch| = {err:.2e}")
    la, lb = train(ours, x, target, 5), train(theirs, x, target, 5)
    print("losses (nikki):  ", " ".join(f"{v:.4f}" for v in la))
    print("losses (PyTorch):", " ".join(f"{v:.4f}" for v in lb))
    return 0 if err < 1e-4 and abs(la[-1] - lb[-1]) < 1e-3 * max(1.0, lb[-1]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
