"""nikki.autotune: the fastest configuration by estimated time, its table, its cache."""

import numpy as np
import pytest

import nikki
import nikki.isa as nisa
import nikki.language as nl
from nikki import KernelError


@nikki.jit
def scale_by_tiles(a, tile=64):
    """a * 2 moved through SBUF in column tiles of `tile`: narrow tiles mean more, smaller DMAs."""
    out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    for i in range((a.shape[1] + tile - 1) // tile):
        t = nl.ndarray((a.shape[0], tile), a.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=a[:, i * tile:(i + 1) * tile])  # a partial last tile reads out of bounds
        nisa.tensor_scalar(dst=t, data=t, op0=nl.multiply, operand0=2.0)
        nisa.dma_copy(dst=out[:, i * tile:(i + 1) * tile], src=t)
    return out


CONFIGS = [dict(tile=8), dict(tile=64), dict(tile=512)]


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("NIKKI_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("NIKKI_ALWAYS_COMPILE", raising=False)


def test_picks_the_configuration_with_the_lowest_estimate(rng):
    tuned = nikki.autotune(configs=CONFIGS, target="trn2")(scale_by_tiles)
    a = rng.standard_normal((128, 512), dtype=np.float32)
    np.testing.assert_array_equal(tuned(a), a * 2)
    table = tuned.table(a)
    # every row is the estimate nikki.estimate gives for that configuration
    for config, us, error in table:
        assert error is None
        assert us == pytest.approx(nikki.estimate(scale_by_tiles, a, target="trn2", **config).total_us)
    fastest = min(table, key=lambda row: row[1])[0]
    assert tuned.best_config(a) == fastest == dict(tile=512)  # fewer, larger transfers win here
    report = tuned.report(a)
    assert report.count("\n") == len(CONFIGS) and '-> {"tile": 512}' in report and "not measurements" in report


def test_a_configuration_the_kernel_rejects_is_reported_and_skipped(rng):
    tuned = nikki.autotune(configs=[dict(tile=48), dict(tile=64)], target="trn2")(scale_by_tiles)
    a = rng.standard_normal((128, 512), dtype=np.float32)
    (bad, bad_us, error), (good, good_us, ok) = tuned.table(a)
    assert bad == dict(tile=48) and bad_us is None and "out-of-bound access" in error
    assert good_us > 0 and ok is None
    assert tuned.best_config(a) == dict(tile=64)
    assert "rejected:" in tuned.report(a)


def test_no_configuration_that_compiles_is_an_error(rng):
    tuned = nikki.autotune(configs=[dict(tile=48), dict(tile=96)])(scale_by_tiles)
    with pytest.raises(KernelError, match="autotune scale_by_tiles: no configuration compiles"):
        tuned(rng.standard_normal((128, 512), dtype=np.float32))


def test_an_error_every_configuration_shares_is_raised_as_the_kernel_raises_it():
    """Arguments wrong whatever the tiling: the kernel's own error, at the kernel's line, not a
    list of identical rejections."""
    tuned = nikki.autotune(configs=[dict(tile=8), dict(tile=64)])(scale_by_tiles)
    with pytest.raises(KernelError) as info:
        tuned(np.ones((200, 512), dtype=np.float32))
    text = str(info.value)
    assert "number of partitions 200 of tensor 't' exceeds the architecture limit of 128" in text
    assert "test_autotune.py\", line 17" in text and "no configuration compiles" not in text


def test_the_choice_is_per_shape(rng):
    tuned = nikki.autotune(configs=[dict(tile=8), dict(tile=64)], target="trn2")(scale_by_tiles)
    wide = rng.standard_normal((128, 512), dtype=np.float32)
    narrow = rng.standard_normal((128, 8), dtype=np.float32)
    assert tuned.best_config(wide) == dict(tile=64)
    # 8 columns: tile=64 reads out of bounds, so only tile=8 compiles
    assert tuned.best_config(narrow) == dict(tile=8)
    np.testing.assert_array_equal(tuned(narrow), narrow * 2)


def test_the_choice_is_reused_from_the_disk_cache(rng, monkeypatch):
    a = rng.standard_normal((128, 512), dtype=np.float32)
    first = nikki.autotune(configs=CONFIGS, target="trn2")(scale_by_tiles)
    table = first.table(a)

    def no_estimates(*args, **kwargs):
        raise AssertionError("estimated again instead of reading the cache")

    monkeypatch.setattr(nikki.profiling, "estimate", no_estimates)
    again = nikki.autotune(configs=CONFIGS, target="trn2")(scale_by_tiles)  # a new process would start like this
    assert again.table(a) == table and again.best_config(a) == dict(tile=512)
    # other configurations are another entry: they must be estimated
    other = nikki.autotune(configs=CONFIGS[:2], target="trn2")(scale_by_tiles)
    with pytest.raises(AssertionError, match="estimated again"):
        other.best_config(a)


def test_always_compile_bypasses_the_disk_cache(rng, monkeypatch):
    monkeypatch.setenv("NIKKI_ALWAYS_COMPILE", "1")
    a = rng.standard_normal((128, 512), dtype=np.float32)
    nikki.autotune(configs=CONFIGS, target="trn2")(scale_by_tiles).best_config(a)
    calls = []
    real = nikki.profiling.estimate
    monkeypatch.setattr(nikki.profiling, "estimate", lambda *x, **k: calls.append(1) or real(*x, **k))
    nikki.autotune(configs=CONFIGS, target="trn2")(scale_by_tiles).best_config(a)
    assert len(calls) == len(CONFIGS)


def test_bad_configurations_and_calls_are_named():
    with pytest.raises(TypeError, match=r"nikki.autotune\(configs=...\): a non-empty list of dicts"):
        nikki.autotune(configs=[])
    with pytest.raises(TypeError, match=r"a non-empty list of dicts"):
        nikki.autotune(configs=[("tile", 8)])
    tuned = nikki.autotune(configs=CONFIGS)(scale_by_tiles)
    with pytest.raises(TypeError, match="autotune scale_by_tiles: tile is set by the configurations"):
        tuned(np.zeros((128, 512), np.float32), tile=8)
