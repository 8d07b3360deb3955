"""The three kernels of NKI's fused Mamba tutorial, written for nikki in the tutorial's legacy
style, for the timing model's validation against the latencies the tutorial published.

All three compute, per batch b, channel c and state s, the selective scan
    h[t] = exp(delta[t] * A[c, s]) * h[t-1] + delta[t] * u[t] * B[s, t],   h[-1] = 0
and y[c, t] = sum_s C[s, t] * h_s[t], with channels on partitions and the sequence on the free
dim. They differ in loop order and tiling, which is what the tutorial measures:

- v1: states outside channel tiles, so delta and u are loaded again for every state;
- v2: channel tiles outside states, delta and u loaded once per channel tile and reused by every
  state; every step works on whole-sequence tiles (at long sequences these no longer fit in SBUF
  and the compiler spills);
- v3: v2 with the sequence processed in chunks of 512, the scan carrying its last column from
  chunk to chunk.

Run them on small inputs against a float64 scan with `model_validation.py --check`.
"""

from __future__ import annotations

import numpy as np

import nikki as nki
import nikki.isa as nisa
import nikki.language as nl

SEQ_CHUNK = 512


def _channel_tiles(channels: int) -> tuple[int, int]:
    size = nl.tile_size.pmax
    assert channels % size == 0, "the tutorial's kernels take channels in multiples of 128"
    return size, channels // size


def _state_step(delta_t, u_t, A_t, B_row, C_row, width, initial=0):
    """One state's contribution to one channel tile over `width` positions: the scan h and C * h."""
    rows = delta_t.shape[0]
    decay = nisa.activation(op=nl.exp, data=delta_t, scale=A_t)
    delta_u = nisa.tensor_tensor(delta_t, u_t, op=nl.multiply)
    drive = nisa.tensor_tensor(delta_u, B_row.broadcast_to((rows, width)), op=nl.multiply)
    h = nisa.tensor_tensor_scan(decay, drive, initial=initial, op0=np.multiply, op1=np.add)
    return h, nisa.tensor_tensor(h, C_row.broadcast_to((rows, width)), op=nl.multiply)


@nki.jit
def mamba_v1(delta, u, A, B, C):
    """States outside channel tiles: delta and u reloaded for every state."""
    batch, channels, L = delta.shape
    _, states = A.shape
    out = nl.ndarray((batch, channels, L), dtype=delta.dtype, buffer=nl.shared_hbm)
    size, tiles = _channel_tiles(channels)
    for b in nl.affine_range(batch):
        acc = nl.zeros((tiles, nl.par_dim(size), L), dtype=delta.dtype)
        for s in nl.affine_range(states):
            for t in nl.affine_range(tiles):
                c0 = t * size
                delta_t = nl.load(delta[b, c0:c0 + size, 0:L])
                A_t = nl.load(A[c0:c0 + size, s])
                u_t = nl.load(u[b, c0:c0 + size, 0:L])
                B_row = nl.load(B[b, s:s + 1, 0:L])
                C_row = nl.load(C[b, s:s + 1, 0:L])
                _, contribution = _state_step(delta_t, u_t, A_t, B_row, C_row, L)
                acc[t, 0:size, 0:L] += contribution
        for t in nl.affine_range(tiles):
            nl.store(out[b, t * size:(t + 1) * size, 0:L], acc[t, 0:size, 0:L])
    return out


def _channel_tiles_outside_states(delta, u, A, B, C, chunk):
    """v2 and v3: per channel tile, delta and u loaded once and shared by every state; each state
    scans the sequence in chunks of `chunk` positions (one chunk: the whole sequence, from 0)."""
    batch, channels, L = delta.shape
    _, states = A.shape
    out = nl.ndarray((batch, channels, L), dtype=delta.dtype, buffer=nl.shared_hbm)
    size, tiles = _channel_tiles(channels)
    for b in nl.affine_range(batch):
        for t in nl.affine_range(tiles):
            c0 = t * size
            acc = nl.zeros((nl.par_dim(size), L), dtype=delta.dtype)
            delta_t = nl.load(delta[b, c0:c0 + size, 0:L])
            u_t = nl.load(u[b, c0:c0 + size, 0:L])
            for s in nl.affine_range(states):
                A_t = nl.load(A[c0:c0 + size, s])
                if chunk == L:
                    _, contribution = _state_step(delta_t, u_t, A_t, nl.load(B[b, s:s + 1, 0:L]),
                                                  nl.load(C[b, s:s + 1, 0:L]), L)
                    acc[0:size, 0:L] += contribution
                    continue
                carry = nl.zeros((nl.par_dim(size), 1), dtype=delta.dtype)
                for k in nl.sequential_range(L // chunk):
                    seq = slice(k * chunk, (k + 1) * chunk)
                    h, contribution = _state_step(delta_t[0:size, seq], u_t[0:size, seq], A_t,
                                                  nl.load(B[b, s:s + 1, seq]), nl.load(C[b, s:s + 1, seq]), chunk,
                                                  initial=carry)
                    carry[0:size, 0:1] = h[0:size, chunk - 1]
                    acc[0:size, seq] += contribution
            nl.store(out[b, c0:c0 + size, 0:L], acc[0:size, 0:L])
    return out


@nki.jit
def mamba_v2(delta, u, A, B, C):
    """Channel tiles outside states: delta and u loaded once per channel tile."""
    return _channel_tiles_outside_states(delta, u, A, B, C, delta.shape[2])


@nki.jit
def mamba_v3(delta, u, A, B, C):
    """v2 with the sequence in chunks of SEQ_CHUNK; the scan's last column carries over."""
    L = delta.shape[2]
    chunk = min(SEQ_CHUNK, L)
    assert L % chunk == 0, "the tutorial's v3 takes seq_len in multiples of 512"
    return _channel_tiles_outside_states(delta, u, A, B, C, chunk)


KERNELS = {"v1": mamba_v1, "v2": mamba_v2, "v3": mamba_v3}


def inputs(rng: np.random.Generator, batch: int, channels: int, L: int, states: int) -> list[np.ndarray]:
    """Positive step sizes and negative A, so every decay exp(delta * A) is below 1."""
    return [rng.uniform(0.01, 0.2, (batch, channels, L)).astype(np.float32),
            rng.standard_normal((batch, channels, L)).astype(np.float32),
            -rng.uniform(0.5, 4.0, (channels, states)).astype(np.float32),
            rng.standard_normal((batch, states, L)).astype(np.float32),
            rng.standard_normal((batch, states, L)).astype(np.float32)]


def reference(delta, u, A, B, C) -> np.ndarray:
    """The scan in float64, one step at a time."""
    d, uu, a, bb, cc = (np.asarray(x, dtype=np.float64) for x in (delta, u, A, B, C))
    decay = np.exp(d[:, :, None, :] * a[None, :, :, None])
    drive = (d * uu)[:, :, None, :] * bb[:, None, :, :]
    h = np.zeros(drive.shape[:-1])
    y = np.zeros(d.shape)
    for t in range(d.shape[-1]):
        h = decay[..., t] * h + drive[..., t]
        y[..., t] = (cc[:, None, :, t] * h).sum(axis=2)
    return y


def check_correctness() -> None:
    """Runs the three kernels on [1, 256, 1024] with 4 states against the float64 scan."""
    args = inputs(np.random.default_rng(0), 1, 256, 1024, 4)
    want = reference(*args)
    for name, kernel in KERNELS.items():
        got = kernel(*args)
        err = float(np.max(np.abs(got - want)) / np.max(np.abs(want)))
        print(f"  mamba_{name}: max relative error {err:.2e}")
        # fp32 scan over 1024 steps with decays < 1: errors stay within a few hundred ulps
        assert err < 1e-4, name
