"""Fused Mamba selective scan, after NKI's "fused mamba" tutorial. Inputs
delta, u [batch, channels, L], A [channels, state], B, C [batch, state, L]; for each batch, channel
c and state s the recurrence
    h[t] = exp(delta[t] * A[c, s]) * h[t-1] + delta[t] * u[t] * B[s, t],   h[-1] = 0
is one nisa.tensor_tensor_scan (op0 = multiply, op1 = add) along the free dim, with channels on
partitions; the output is y[c, t] = sum_s C[s, t] * h_s[t].

Legacy style (the tutorial's v2/v3 structure): functional nisa.activation(exp, scale=A column),
nisa.tensor_tensor, nisa.tensor_tensor_scan with the sequence processed in chunks whose initial
value is the previous chunk's last column, ``acc[...] += scanC`` accumulation into an
nl.zeros tile. Current style: the same in destination-passing form, channel tiles of up to 128
(ragged allowed), B/C rows broadcast over partitions by the DMA.
"""

import numpy as np
import pytest

import nikki as nki
import nikki.isa as nisa
import nikki.language as nl

from ._util import EPS_FP32, f64

P = 128
SEQ_CHUNK = 512


# --- legacy (Beta 1) style ------------------------------------------------------------------------

@nki.jit
def mamba_legacy(delta, u, A, B, C, sbuf_broadcast=False, int_index_A=False):
    """channels a multiple of 128, L a multiple of the chunk (as in the tutorial's v3).
    sbuf_broadcast / int_index_A select the tutorial's own spellings of two steps (see the
    tests named after them)."""
    batch, channels, L = delta.shape
    _, n_state = A.shape
    out = nl.ndarray((batch, channels, L), dtype=delta.dtype, buffer=nl.shared_hbm)
    n_ct = channels // P
    n_chunks = L // SEQ_CHUNK
    for b in nl.affine_range(batch):
        for ct in nl.affine_range(n_ct):
            c0 = ct * P
            delta_i = nl.load(delta[b, c0:c0 + P, 0:L])
            u_i = nl.load(u[b, c0:c0 + P, 0:L])
            deltaU = nisa.tensor_tensor(delta_i, u_i, op=nl.multiply)  # reused by every state
            acc = nl.zeros((P, L), dtype=nl.float32, buffer=nl.sbuf)
            for s in nl.affine_range(n_state):
                if int_index_A:
                    A_i = nl.load(A[c0:c0 + P, s])  # the tutorial: a partition vector of A's column
                else:
                    A_i = nl.load(A[c0:c0 + P, s:s + 1])
                carry = nl.zeros((P, 1), dtype=nl.float32, buffer=nl.sbuf)
                for k in nl.sequential_range(n_chunks):
                    t0 = k * SEQ_CHUNK
                    seq = slice(t0, t0 + SEQ_CHUNK)
                    deltaA = nisa.activation(op=nl.exp, data=delta_i[0:P, seq], scale=A_i)
                    if sbuf_broadcast:
                        B_bc = nl.load(B[b, s:s + 1, seq]).broadcast_to((P, SEQ_CHUNK))
                        C_bc = nl.load(C[b, s:s + 1, seq]).broadcast_to((P, SEQ_CHUNK))
                    else:
                        B_bc = nl.load(B[b, s:s + 1, seq].broadcast_to((P, SEQ_CHUNK)))
                        C_bc = nl.load(C[b, s:s + 1, seq].broadcast_to((P, SEQ_CHUNK)))
                    deltaBu = nisa.tensor_tensor(deltaU[0:P, seq], B_bc, op=nl.multiply)
                    h = nisa.tensor_tensor_scan(deltaA, deltaBu, initial=carry, op0=np.multiply, op1=np.add)
                    carry[...] = h[0:P, SEQ_CHUNK - 1]
                    scanC = nisa.tensor_tensor(h, C_bc, op=nl.multiply)
                    acc[0:P, seq] += scanC
            nl.store(out[b, c0:c0 + P, 0:L], value=acc)
    return out


@nki.jit
def mamba_whole_sequence(delta, u, A, B, C):
    """The tutorial's second version (its loop order, before it tiles the sequence): per channel
    tile, delta and u are loaded once and shared by every state, and every step of a state works on
    whole-sequence tiles. At seq_len 8192 one state's tiles no longer fit in SBUF beside delta, u
    and the accumulator; NKI's compiler then spills, and so does nikki."""
    batch, channels, L = delta.shape
    _, n_state = A.shape
    out = nl.ndarray((batch, channels, L), dtype=delta.dtype, buffer=nl.shared_hbm)
    for b in nl.affine_range(batch):
        for ct in nl.affine_range(channels // P):
            c0 = ct * P
            acc = nl.zeros((P, L), dtype=nl.float32, buffer=nl.sbuf)
            delta_i = nl.load(delta[b, c0:c0 + P, 0:L])
            u_i = nl.load(u[b, c0:c0 + P, 0:L])
            for s in nl.affine_range(n_state):
                A_i = nl.load(A[c0:c0 + P, s:s + 1])
                deltaA = nisa.activation(op=nl.exp, data=delta_i, scale=A_i)
                B_bc = nl.load(B[b, s:s + 1, 0:L].broadcast_to((P, L)))
                deltaU = nisa.tensor_tensor(delta_i, u_i, op=nl.multiply)
                deltaBu = nisa.tensor_tensor(deltaU, B_bc, op=nl.multiply)
                h = nisa.tensor_tensor_scan(deltaA, deltaBu, initial=0, op0=np.multiply, op1=np.add)
                C_bc = nl.load(C[b, s:s + 1, 0:L].broadcast_to((P, L)))
                scanC = nisa.tensor_tensor(h, C_bc, op=nl.multiply)
                acc[0:P, 0:L] += scanC
            nl.store(out[b, c0:c0 + P, 0:L], value=acc)
    return out


# --- current style ----------------------------------------------------------------------------------

@nki.jit
def mamba_current(delta, u, A, B, C):
    """Any channel count (the last channel tile smaller) and any L (the last chunk shorter)."""
    batch, channels, L = delta.shape
    _, n_state = A.shape
    out = nl.ndarray((batch, channels, L), dtype=delta.dtype, buffer=nl.shared_hbm)
    for b in range(batch):
        for c0 in range(0, channels, P):
            pc = min(P, channels - c0)
            delta_i = nl.ndarray((pc, L), dtype=nl.float32, buffer=nl.sbuf)
            u_i = nl.ndarray((pc, L), dtype=nl.float32, buffer=nl.sbuf)
            nisa.dma_copy(dst=delta_i, src=delta[b, c0:c0 + pc, :])
            nisa.dma_copy(dst=u_i, src=u[b, c0:c0 + pc, :])
            A_i = nl.ndarray((pc, n_state), dtype=nl.float32, buffer=nl.sbuf)
            nisa.dma_copy(dst=A_i, src=A[c0:c0 + pc, :])
            deltaU = nl.ndarray((pc, L), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_tensor(dst=deltaU, data1=delta_i, data2=u_i, op=nl.multiply)
            acc = nl.ndarray((pc, L), dtype=nl.float32, buffer=nl.sbuf)
            nisa.memset(dst=acc, value=0.0)
            for s in range(n_state):
                h = nl.ndarray((pc, L), dtype=nl.float32, buffer=nl.sbuf)
                for t0 in range(0, L, SEQ_CHUNK):
                    tw = min(SEQ_CHUNK, L - t0)
                    deltaA = nl.ndarray((pc, SEQ_CHUNK), dtype=nl.float32, buffer=nl.sbuf)
                    nisa.activation(dst=deltaA[:, 0:tw], op=nl.exp, data=delta_i[:, t0:t0 + tw],
                                    scale=A_i[:, s:s + 1])
                    B_bc = nl.ndarray((pc, SEQ_CHUNK), dtype=nl.float32, buffer=nl.sbuf)
                    nisa.dma_copy(dst=B_bc[:, 0:tw], src=B[b, s:s + 1, t0:t0 + tw].broadcast(0, pc))
                    deltaBu = nl.ndarray((pc, SEQ_CHUNK), dtype=nl.float32, buffer=nl.sbuf)
                    nisa.tensor_tensor(dst=deltaBu[:, 0:tw], data1=deltaU[:, t0:t0 + tw], data2=B_bc[:, 0:tw],
                                       op=nl.multiply)
                    # the first chunk starts from 0, the others from the previous chunk's last h
                    initial = 0.0 if t0 == 0 else h[:, t0 - 1:t0]
                    nisa.tensor_tensor_scan(dst=h[:, t0:t0 + tw], data0=deltaA[:, 0:tw], data1=deltaBu[:, 0:tw],
                                            initial=initial, op0=nl.multiply, op1=nl.add)
                    C_bc = nl.ndarray((pc, SEQ_CHUNK), dtype=nl.float32, buffer=nl.sbuf)
                    nisa.dma_copy(dst=C_bc[:, 0:tw], src=C[b, s:s + 1, t0:t0 + tw].broadcast(0, pc))
                    scanC = nl.ndarray((pc, SEQ_CHUNK), dtype=nl.float32, buffer=nl.sbuf)
                    nisa.tensor_tensor(dst=scanC[:, 0:tw], data1=h[:, t0:t0 + tw], data2=C_bc[:, 0:tw],
                                       op=nl.multiply)
                    nisa.tensor_tensor(dst=acc[:, t0:t0 + tw], data1=acc[:, t0:t0 + tw], data2=scanC[:, 0:tw],
                                       op=nl.add)
            y = nl.ndarray((pc, L), dtype=delta.dtype, buffer=nl.sbuf)
            nisa.tensor_copy(dst=y, src=acc)
            nisa.dma_copy(dst=out[b, c0:c0 + pc, :], src=y)
    return out


# --- reference and tolerance ----------------------------------------------------------------------

def _scan(a, x):
    """h[..., t] = a[..., t] * h[..., t-1] + x[..., t] along the last axis, h[-1] = 0."""
    h = np.empty_like(x)
    prev = np.zeros(x.shape[:-1])
    for t in range(x.shape[-1]):
        prev = a[..., t] * prev + x[..., t]
        h[..., t] = prev
    return h


def _reference_and_bound(delta, u, A, B, C):
    """The recurrence in fp64 (sequentially, as the tutorial's torch reference does), and a per
    element error bound for the fp32 kernel.

    Each step of the fp32 scan rounds twice (multiply, add) and its inputs carry <= 3 roundings
    (delta*A, exp, and the delta*u*B products), so the error of h[t] grows at most linearly:
    |err h[t]| <= (5 + 2t) * u32 * H[t], where H is the same scan over |a| and |x| (a worst case:
    with decays < 1 the errors actually fade). y sums n_state products h*C in fp32: each product
    and partial sum adds another (n_state + 1) * u32 relative to sum_s |C h_s|."""
    d, uu, a_, b_, c_ = (f64(v) for v in (delta, u, A, B, C))
    decay = np.exp(d[:, :, None, :] * a_[None, :, :, None])        # [b, c, s, t]
    x = (d * uu)[:, :, None, :] * b_[:, None, :, :]                  # [b, c, s, t]
    h = _scan(decay, x)
    H = _scan(np.abs(decay), np.abs(x))
    ch = c_[:, None, :, :] * h
    ref = ch.sum(axis=2)
    L = delta.shape[-1]
    t = np.arange(L)
    n_state = A.shape[1]
    bound = ((np.abs(c_[:, None, :, :]) * (5 + 2 * t) * H).sum(axis=2) * EPS_FP32
             + (n_state + 1) * EPS_FP32 * np.abs(ch).sum(axis=2) + 1e-30)
    return ref, bound


def _check(out, delta, u, A, B, C):
    ref, bound = _reference_and_bound(delta, u, A, B, C)
    err = np.abs(f64(out) - ref)
    worst = np.unravel_index(np.argmax(err / bound), err.shape)
    assert np.all(err <= bound), (f"max err/bound {float((err / bound)[worst]):.3g} at {worst}: "
                                  f"got {f64(out)[worst]}, want {ref[worst]}")


def _inputs(rng, batch, channels, L, n_state):
    delta = rng.uniform(0.01, 0.2, (batch, channels, L)).astype(np.float32)   # positive step sizes
    u = rng.standard_normal((batch, channels, L)).astype(np.float32)
    A = -rng.uniform(0.5, 4.0, (channels, n_state)).astype(np.float32)        # negative: decays < 1
    B = rng.standard_normal((batch, n_state, L)).astype(np.float32)
    C = rng.standard_normal((batch, n_state, L)).astype(np.float32)
    return delta, u, A, B, C


def test_mamba_legacy(rng):
    args = _inputs(rng, 2, 256, 1024, 2)
    out = mamba_legacy(*args)
    assert out.shape == (2, 256, 1024) and out.dtype == np.float32
    _check(out, *args)


@pytest.mark.parametrize("dims", [(1, 256, 1024, 3), (1, 200, 700, 3)], ids=["multiples", "ragged"])
def test_mamba_current(rng, dims):
    args = _inputs(rng, *dims)
    _check(mamba_current(*args), *args)


def test_mamba_legacy_and_current_agree_bitwise(rng):
    """Same instruction sequence per element (scan, multiply by C, add in state order), so the
    two styles must produce identical bits."""
    args = _inputs(rng, 1, 128, 1024, 2)
    np.testing.assert_array_equal(mamba_legacy(*args), mamba_current(*args))


def test_mamba_legacy_tutorial_sbuf_broadcast(rng):
    args = _inputs(rng, 1, 128, 512, 2)
    _check(mamba_legacy(*args, True, False), *args)


def test_mamba_legacy_tutorial_int_index(rng):
    args = _inputs(rng, 1, 128, 512, 2)
    _check(mamba_legacy(*args, False, True), *args)


def test_mamba_whole_sequence_spills_at_8192_and_matches(rng, recwarn):
    """seq_len 8192 is where the tutorial's profile shows spill and reload DMAs; nikki spills too,
    and the result is the chunked kernel's, bit for bit (same fp32 operations per element; the
    chunked kernel fits in SBUF), and within the reference's error bound."""
    small = _inputs(rng, 1, 128, 4096, 2)
    mamba_whole_sequence.specialize(*small)  # half the length fits: no spill
    assert not [w for w in recwarn if issubclass(w.category, nki.SpillWarning)]

    args = _inputs(rng, 1, 128, 8192, 2)
    with pytest.warns(nki.SpillWarning, match="kernel 'mamba_whole_sequence': the SBUF tensors live at once"):
        out = mamba_whole_sequence(*args)
    chunked = mamba_current(*args)
    assert not [w for w in recwarn if issubclass(w.category, nki.SpillWarning) and "mamba_current" in str(w.message)]
    np.testing.assert_array_equal(out, chunked)
    _check(out, *args)
