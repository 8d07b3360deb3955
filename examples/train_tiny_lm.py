"""Train a tiny decoder language model with nikki's kernels, next to the same model in PyTorch.

The model is Llama-shaped: token embedding, decoder layers (RMSNorm, q/k/v projections, rotary
position embedding, causal grouped-query attention, output projection with the residual, fused
residual add + RMSNorm, SwiGLU MLP), a final RMSNorm, an LM head and the cross-entropy loss.
nikki's model runs every one of those on the simulated NeuronCore through nikki.torch ops
(embedding, rms_norm, add_rms_norm, matmul, apply_rotary_pos_emb, flash_attention,
output_projection, gated_mlp, cross_entropy) and steps with nikki's AdamW kernel; the reference
model is the same parameters in plain PyTorch with torch.optim.AdamW. Both start from the same
weights and see the same batches, so their loss curves should coincide up to float32 rounding.

The text is drawn from a fixed random bigram language, so the loss has somewhere to go: from
ln(vocab) towards the language's entropy, which is printed as the floor.

    python examples/train_tiny_lm.py [--steps 300] [--plot loss.png]
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

import nikki.torch as nt


@dataclass(frozen=True)
class Config:
    """The model's and the run's sizes."""
    vocab: int = 64
    hidden: int = 64
    heads: int = 4
    kv_heads: int = 2
    layers: int = 2
    intermediate: int = 128
    seq: int = 32
    batch: int = 4
    lr: float = 3e-3
    weight_decay: float = 0.01
    eps: float = 1e-6

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


def initial_parameters(cfg: Config, seed: int = 0) -> dict[str, torch.Tensor]:
    """The model's weights by name, as [in, out] matrices (torch Linear weights transposed)."""
    g = torch.Generator().manual_seed(seed)

    def matrix(rows: int, cols: int) -> torch.Tensor:
        return torch.randn(rows, cols, generator=g) / math.sqrt(rows)

    kv = cfg.kv_heads * cfg.head_dim
    params = {"embed": torch.randn(cfg.vocab, cfg.hidden, generator=g), "final_norm": torch.ones(cfg.hidden),
              "lm_head": matrix(cfg.hidden, cfg.vocab)}
    for i in range(cfg.layers):
        params |= {f"{i}.attn_norm": torch.ones(cfg.hidden), f"{i}.w_q": matrix(cfg.hidden, cfg.hidden),
                   f"{i}.w_k": matrix(cfg.hidden, kv), f"{i}.w_v": matrix(cfg.hidden, kv),
                   f"{i}.w_o": matrix(cfg.hidden, cfg.hidden), f"{i}.mlp_norm": torch.ones(cfg.hidden),
                   f"{i}.w_gate": matrix(cfg.hidden, cfg.intermediate),
                   f"{i}.w_up": matrix(cfg.hidden, cfg.intermediate),
                   f"{i}.w_down": matrix(cfg.intermediate, cfg.hidden)}
    return params


def rotary_tables(cfg: Config) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin [S, head_dim] of Hugging Face's rotary embedding (rotate_half layout)."""
    inv_freq = 1.0 / 10000.0 ** (torch.arange(0, cfg.head_dim, 2, dtype=torch.float64) / cfg.head_dim)
    angles = torch.outer(torch.arange(cfg.seq, dtype=torch.float64), inv_freq)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos().float(), angles.sin().float()


class NikkiOps:
    """The model's building blocks on nikki's kernels."""
    embedding = staticmethod(nt.embedding)
    rms_norm = staticmethod(nt.rms_norm)
    add_rms_norm = staticmethod(nt.add_rms_norm)
    matmul = staticmethod(nt.matmul)
    rotary = staticmethod(nt.apply_rotary_pos_emb)
    output_projection = staticmethod(nt.output_projection)
    gated_mlp = staticmethod(nt.gated_mlp)

    @staticmethod
    def causal_attention(q, k, v):
        return nt.flash_attention(q, k, v, causal=True)

    @staticmethod
    def cross_entropy(logits, targets):
        return nt.cross_entropy(logits, targets)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


class TorchOps:
    """The same building blocks in plain PyTorch."""

    @staticmethod
    def embedding(ids, weight):
        return F.embedding(ids, weight)

    @staticmethod
    def rms_norm(x, weight, eps):
        return F.rms_norm(x, (x.shape[-1],), weight, eps)

    @staticmethod
    def add_rms_norm(x, residual, weight, eps):
        h = x + residual
        return F.rms_norm(h, (h.shape[-1],), weight, eps), h

    @staticmethod
    def matmul(a, b):
        return a @ b

    @staticmethod
    def rotary(q, k, cos, sin):
        return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin

    @staticmethod
    def output_projection(attn, w_o, residual):
        return attn @ w_o + residual

    @staticmethod
    def gated_mlp(x, w_gate, w_up, w_down):
        return (F.silu(x @ w_gate) * (x @ w_up)) @ w_down

    @staticmethod
    def causal_attention(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

    @staticmethod
    def cross_entropy(logits, targets):
        return F.cross_entropy(logits, targets, reduction="none")


def loss_of(ops, params: dict[str, torch.Tensor], cfg: Config, ids: torch.Tensor, targets: torch.Tensor,
            rotary: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """The mean next-token cross-entropy of a batch of ids [B, S] against targets [B, S]."""
    b, s = ids.shape
    cos, sin = rotary
    x = ops.embedding(ids, params["embed"])
    normed = ops.rms_norm(x, params["0.attn_norm"], cfg.eps)
    for i in range(cfg.layers):
        p = lambda name: params[f"{i}.{name}"]  # noqa: E731
        heads = lambda w, n: ops.matmul(normed, w).reshape(b, s, n, cfg.head_dim).transpose(1, 2)  # noqa: E731
        q, k = ops.rotary(heads(p("w_q"), cfg.heads), heads(p("w_k"), cfg.kv_heads), cos, sin)
        attn = ops.causal_attention(q, k, heads(p("w_v"), cfg.kv_heads))
        x = ops.output_projection(attn.transpose(1, 2).reshape(b, s, cfg.hidden), p("w_o"), residual=x)
        mlp = ops.gated_mlp(ops.rms_norm(x, p("mlp_norm"), cfg.eps), p("w_gate"), p("w_up"), p("w_down"))
        # The residual add fuses with the norm in front of whatever comes next.
        next_norm = params[f"{i + 1}.attn_norm"] if i + 1 < cfg.layers else params["final_norm"]
        normed, x = ops.add_rms_norm(mlp, x, next_norm, cfg.eps)
    logits = ops.matmul(normed, params["lm_head"])
    return ops.cross_entropy(logits.reshape(b * s, cfg.vocab), targets.reshape(-1)).mean()


class BigramLanguage:
    """A fixed random bigram language over `vocab` tokens: each token has a few likely successors."""

    def __init__(self, vocab: int, seed: int = 1):
        g = torch.Generator().manual_seed(seed)
        logits = 3.0 * torch.randn(vocab, vocab, generator=g, dtype=torch.float64)
        self.transition = torch.softmax(logits, dim=-1)
        self.generator = g

    def entropy(self) -> float:
        """The language's entropy rate in nats: the loss a perfect model reaches."""
        p = self.transition
        stationary = torch.full((p.shape[0],), 1.0 / p.shape[0], dtype=torch.float64)
        for _ in range(200):
            stationary = stationary @ p
        return float(-(stationary[:, None] * p * p.log()).sum())

    def batch(self, batch: int, seq: int) -> torch.Tensor:
        """Token sequences [batch, seq + 1]."""
        tokens = torch.empty(batch, seq + 1, dtype=torch.int64)
        tokens[:, 0] = torch.randint(0, self.transition.shape[0], (batch,), generator=self.generator)
        for t in range(seq):
            tokens[:, t + 1] = torch.multinomial(self.transition[tokens[:, t]], 1, generator=self.generator)[:, 0]
        return tokens


def train(cfg: Config, steps: int, log_every: int = 0) -> tuple[list[float], list[float], float]:
    """Trains both models side by side on the same batches; returns (nikki losses, PyTorch
    losses, the language's entropy)."""
    language = BigramLanguage(cfg.vocab)
    rotary = rotary_tables(cfg)
    ours = {name: w.clone().requires_grad_() for name, w in initial_parameters(cfg).items()}
    theirs = {name: w.clone().requires_grad_() for name, w in initial_parameters(cfg).items()}
    moments = {name: (torch.zeros_like(w), torch.zeros_like(w)) for name, w in ours.items()}
    optimizer = torch.optim.AdamW(theirs.values(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    ours_curve, theirs_curve = [], []
    for step in range(1, steps + 1):
        tokens = language.batch(cfg.batch, cfg.seq)
        ids, targets = tokens[:, :-1], tokens[:, 1:]

        loss = loss_of(NikkiOps, ours, cfg, ids, targets, rotary)
        loss.backward()
        with torch.no_grad():
            for name, w in ours.items():
                exp_avg, exp_avg_sq = moments[name]
                nt.adamw_(w, w.grad, exp_avg, exp_avg_sq, step, lr=cfg.lr, weight_decay=cfg.weight_decay)
                w.grad = None
        ours_curve.append(loss.item())

        optimizer.zero_grad()
        reference = loss_of(TorchOps, theirs, cfg, ids, targets, rotary)
        reference.backward()
        optimizer.step()
        theirs_curve.append(reference.item())
        if log_every and (step % log_every == 0 or step == 1):
            print(f"step {step:4d}  loss nikki {ours_curve[-1]:.4f}  PyTorch {theirs_curve[-1]:.4f}", flush=True)
    return ours_curve, theirs_curve, language.entropy()


def largest_gap(ours: list[float], theirs: list[float]) -> float:
    """The largest |nikki - PyTorch| loss difference over the run."""
    return max(abs(a - b) for a, b in zip(ours, theirs))


def plot(ours: list[float], theirs: list[float], floor: float, path: str) -> None:
    """Both loss curves and the language's entropy, as a PNG."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    steps = range(1, len(ours) + 1)
    ax.plot(steps, theirs, label="PyTorch", linewidth=3, alpha=0.5)
    ax.plot(steps, ours, label="nikki (simulated NeuronCore)", linewidth=1)
    ax.axhline(floor, color="gray", linestyle="--", linewidth=1, label="entropy of the language")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats)")
    ax.set_title("Tiny decoder LM: nikki.torch ops vs PyTorch")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--plot", default="tiny_lm_loss.png", help="where to write the loss curves (PNG)")
    args = parser.parse_args()
    cfg = Config()
    print(f"tiny decoder LM: vocab {cfg.vocab}, hidden {cfg.hidden}, {cfg.layers} layers, {cfg.heads} heads "
          f"({cfg.kv_heads} kv), seq {cfg.seq}, batch {cfg.batch}, {args.steps} steps")
    start = time.perf_counter()
    ours, theirs, floor = train(cfg, args.steps, log_every=max(1, args.steps // 10))
    gap = largest_gap(ours, theirs)
    print(f"{time.perf_counter() - start:.0f} s; loss {ours[0]:.3f} -> {ours[-1]:.3f} (entropy of the language "
          f"{floor:.3f}); largest |nikki - PyTorch| over the run: {gap:.2e}")
    plot(ours, theirs, floor, args.plot)
    print(f"wrote {args.plot}")
    return 0 if gap < 1e-2 and ours[-1] < ours[0] - 1.0 else 1


if __name__ == "__main__":
    sys.exit(main())
