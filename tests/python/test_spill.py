"""Spilling from Python: a kernel whose SBUF tensors do not fit at once runs (idle tensors go to
HBM and back, as NKI's compiler does), matches numpy exactly, agrees bit for bit across the
native and reference executors, and warns with nikki.SpillWarning; tensors placed with address=
still make an overflow an error."""

import re

import numpy as np
import pytest

import nikki as nki
import nikki.isa as nisa
import nikki.language as nl

P = 128
TILE = 12288  # 48 KiB of fp32 per partition: four fit in trn2's 212984 bytes, five do not


def five_tiles(x):
    """Five scaled copies of x, all made before they are summed."""
    out = nl.ndarray((P, TILE), nl.float32, buffer=nl.shared_hbm)
    xs = nl.ndarray((P, TILE), nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=xs, src=x)
    tiles = []
    for i in range(5):
        t = nl.ndarray((P, TILE), nl.float32, buffer=nl.sbuf)  # the spilled tiles' line
        nisa.tensor_scalar(dst=t, data=xs, op0=nl.multiply, operand0=float(i + 1), op1=nl.add, operand1=0.5 * i)
        tiles.append(t)
    acc = nl.ndarray((P, TILE), nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=acc, src=tiles[0])
    for t in tiles[1:]:
        nisa.tensor_tensor(dst=acc, data1=acc, data2=t, op=nl.add)
    nisa.dma_copy(dst=out, src=acc)
    return out


TILE_LINE = next(i for i, line in enumerate(open(__file__), 1) if "# the spilled tiles' line" in line)


def five_tiles_reference(x):
    """The kernel's float32 operations in its order: each tile rounds x * (i + 1), then + 0.5 i."""
    acc = None
    for i in range(5):
        t = (x * np.float32(i + 1)).astype(np.float32) + np.float32(0.5 * i)
        acc = t if acc is None else (acc + t).astype(np.float32)
    return acc


@pytest.fixture
def x(rng):
    return rng.standard_normal((P, TILE)).astype(np.float32)


def test_a_kernel_that_needs_spilling_runs_and_matches_numpy(x):
    with pytest.warns(nki.SpillWarning):
        out = nki.jit(five_tiles)(x)
    np.testing.assert_array_equal(out, five_tiles_reference(x))


def test_the_warning_names_the_tensors_their_line_the_bytes_and_the_fix(x):
    kernel = nki.jit(five_tiles)
    with pytest.warns(nki.SpillWarning) as caught:
        compiled = kernel.specialize(x)
    assert len(caught) == 1
    warning = caught[0]
    text = str(warning.message)
    assert warning.filename == __file__ and warning.lineno == TILE_LINE
    spills = compiled.programs[0].spills
    assert spills
    assert text.startswith("kernel 'five_tiles': the SBUF tensors live at once need more than the 212984 B per "
                           f"partition of trn2, so nikki spilled {len(spills)} tensor")
    total = sum(s["bytes"] for s in spills)
    assert f"move {total // 2**20} MiB per run" in text or f"move {total // 1024} KiB per run" in text
    for s in spills:
        assert re.search(rf"'{re.escape(s['tensor'])}' f32\[128, 12288\] 48 KiB per partition \(allocated at "
                         rf"{re.escape(__file__)}:{TILE_LINE}\): {len(s['saves'])} spills?, "
                         rf"{len(s['reloads'])} reloads?", text), text
    assert "to avoid spills, keep fewer large tiles live at once: tile the free dim" in text


def test_nikki_log_spills_prints_the_warning(x, monkeypatch, capfd):
    monkeypatch.setenv("NIKKI_LOG", "spills")
    with pytest.warns(nki.SpillWarning):
        nki.jit(five_tiles).specialize(x)
    err = capfd.readouterr().err
    assert "nikki: warning: kernel 'five_tiles': the SBUF tensors live at once need more" in err
    assert f"(allocated at {__file__}:{TILE_LINE})" in err


def test_native_and_reference_executors_agree_bit_for_bit(x, monkeypatch):
    results = {}
    for executor in ("native", "interp"):
        monkeypatch.setenv("NIKKI_EXECUTOR", executor)
        kernel = nki.jit(five_tiles)  # a new kernel object: compiled for this executor
        with pytest.warns(nki.SpillWarning):
            compiled = kernel.specialize(x)
        assert compiled.programs[0].executor == executor
        with pytest.warns(nki.SpillWarning):
            results[executor] = kernel(x)
    np.testing.assert_array_equal(results["native"], results["interp"])


def test_the_estimate_costs_spill_dmas_like_any_dma(x):
    with pytest.warns(nki.SpillWarning):
        compiled = nki.jit(five_tiles).specialize(x)
    with pytest.warns(nki.SpillWarning):
        profile = nki.estimate(nki.jit(five_tiles), x)
    spilled = sum(s["bytes"] for s in compiled.programs[0].spills)
    assert spilled > 0
    assert profile.dma_bytes == 2 * x.nbytes + spilled  # x in, the result out, and the spills


def test_a_kernel_that_fits_neither_spills_nor_warns(x, recwarn):
    def four_tiles(x):
        out = nl.ndarray((P, TILE), nl.float32, buffer=nl.shared_hbm)
        tiles = [nl.ndarray((P, TILE), nl.float32, buffer=nl.sbuf) for _ in range(4)]
        for t in tiles:
            nisa.dma_copy(dst=t, src=x)
        for t in tiles[1:]:
            nisa.tensor_tensor(dst=tiles[0], data1=tiles[0], data2=t, op=nl.add)
        nisa.dma_copy(dst=out, src=tiles[0])
        return out

    compiled = nki.jit(four_tiles).specialize(x)
    assert compiled.programs[0].spills == [] and compiled.programs[0].warnings == []
    assert not [w for w in recwarn if issubclass(w.category, nki.SpillWarning)]


def test_an_overflow_next_to_a_manually_placed_tensor_is_still_an_error(x):
    def manual(x):
        out = nl.ndarray((P, TILE), nl.float32, buffer=nl.shared_hbm)
        m = nl.ndarray((P, 37888), nl.float32, buffer=nl.sbuf, address=(0, 0))  # 148 KiB, placed by hand
        nisa.memset(dst=m, value=1.0)
        a = nl.ndarray((P, TILE), nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=a, src=x)
        b = nl.ndarray((P, TILE), nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=b, data1=a, data2=m[:, 0:TILE], op=nl.add)  # E:manual
        nisa.dma_copy(dst=out, src=b)
        return out

    with pytest.raises(nki.KernelError) as info:
        nki.jit(manual)(x)
    err = info.value
    assert err.summary.startswith("SBUF capacity exceeded: 3 live tensors need 244 KiB per partition, trn2 has "
                                  "212984 B")
    assert "f32[128, 37888] 148 KiB per partition" in err.summary
    assert err.file == __file__
    assert "# E:manual" in open(__file__).readlines()[err.line - 1]
    assert err.hint == "use smaller tiles, or end the live range of large tensors earlier (reuse buffers)"
