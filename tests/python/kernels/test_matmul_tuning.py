"""nikki.kernels.matmul picks its rows per block by estimated time (nikki.autotune over the
registry's candidates), per shape; explicit values pass through unchanged."""

import ml_dtypes
import numpy as np
import pytest
import torch

import nikki
import nikki.kernels as K
import nikki.torch as nt
from nikki import KernelError, profiling
from nikki.library import LibraryKernel

# Products whose fastest rows per block differ on trn2 (nikki.kernels.matmul.autotune_report):
# (shape of a, shape of b, dtype). In fp32 the Tensor engine is four times slower per row, so
# smaller blocks whose transposes overlap more of it win; in bf16 the largest blocks, which
# stream b the fewest times, win.
CASES = [((640, 256), (256, 4096), np.float32), ((512, 2048), (2048, 512), np.float32),
         ((512, 2048), (2048, 512), ml_dtypes.bfloat16)]


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("NIKKI_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("NIKKI_ALWAYS_COMPILE", raising=False)


def fresh_matmul() -> LibraryKernel:
    """A matmul kernel with no in-memory choices (the module-level one keeps them per process)."""
    return LibraryKernel(K.matmul.info)


def test_the_registry_lists_the_tuned_parameter_and_its_candidates():
    assert K.matmul.tuning == {"rows_per_block": [2, 3, 4]}
    assert "rows_per_block" in K.matmul.__doc__


def operands(case, rng):
    a_shape, b_shape, dtype = case
    return rng.standard_normal(a_shape).astype(dtype), rng.standard_normal(b_shape).astype(dtype)


@pytest.mark.parametrize("case", CASES[1:])
def test_the_choice_is_the_lowest_estimate_and_runs_the_same_bits(case, rng):
    matmul = fresh_matmul()
    a, b = operands(case, rng)
    table = matmul.autotune_table(a, b)
    assert [config for config, _, _ in table] == [dict(rows_per_block=r) for r in (2, 3, 4)]
    for config, us, error in table:  # every row is nikki.estimate's figure for that choice
        assert error is None
        assert us == pytest.approx(nikki.estimate(matmul, a, b, **config).total_us)
    fastest = min(table, key=lambda row: row[1])[0]
    got = matmul(a, b)
    np.testing.assert_array_equal(got, matmul(a, b, **fastest))
    # products of the inputs are exact in fp32 PSUM for bf16, so both dtypes accumulate K fp32
    # roundings of partial sums of magnitude ~sqrt(K), before the output's own rounding
    want = a.astype(np.float64) @ b.astype(np.float64)
    out_eps = 2.0 ** -8 if a.dtype == ml_dtypes.bfloat16 else 0.0
    k = a.shape[1]
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=out_eps, atol=1e-6 * k + out_eps * np.sqrt(k))
    report = matmul.autotune_report(a, b)
    assert f"-> {{\"rows_per_block\": {fastest['rows_per_block']}}}" in report and "not measurements" in report


def test_the_fastest_rows_per_block_depends_on_the_shape_and_dtype():
    matmul = fresh_matmul()
    chosen = []
    for a_shape, b_shape, dtype in CASES:
        a, b = nikki.spec(a_shape, np.dtype(dtype).name), nikki.spec(b_shape, np.dtype(dtype).name)
        table = matmul.autotune_table(a, b)
        chosen.append(min(table, key=lambda row: row[1])[0]["rows_per_block"])
    assert len(set(chosen)) > 1, chosen  # one fixed choice would be slower for some of them


def test_an_explicit_choice_is_not_estimated(rng, monkeypatch):
    def no_estimates(*args, **kwargs):
        raise AssertionError("estimated a choice the call made")

    monkeypatch.setattr(profiling, "estimate", no_estimates)
    a = rng.standard_normal((130, 200), dtype=np.float32)
    b = rng.standard_normal((200, 70), dtype=np.float32)
    np.testing.assert_allclose(fresh_matmul()(a, b, rows_per_block=2), a.astype(np.float64) @ b, atol=1e-4)


def test_the_choice_is_reused_from_the_disk_cache(rng, monkeypatch):
    a, b = operands(CASES[1], rng)
    first = fresh_matmul().autotune_table(a, b)

    def no_estimates(*args, **kwargs):
        raise AssertionError("estimated again although the disk cache holds the choice")

    monkeypatch.setattr(profiling, "estimate", no_estimates)
    assert fresh_matmul().autotune_table(a, b) == first


def test_the_choice_is_made_under_torch_too(rng):
    a, b = (torch.from_numpy(t) for t in operands(CASES[1], rng))
    got = nt.matmul(a, b)
    fastest = min(K.matmul.autotune_table(a.numpy(), b.numpy()), key=lambda row: row[1])[0]
    assert torch.equal(got, torch.from_numpy(K.matmul(a.numpy(), b.numpy(), **fastest)))


def test_bad_rows_per_block_and_reports_without_a_choice_are_named(rng):
    a = np.ones((4, 4), np.float32)
    with pytest.raises(KernelError, match=r"rows_per_block is 5, not 0 \(default\) or 1-4"):
        K.matmul(a, a, rows_per_block=5)
    with pytest.raises(KernelError, match="every tuned parameter \\(rows_per_block\\) is set in this call"):
        K.matmul.autotune_report(a, a, rows_per_block=1)
    with pytest.raises(KernelError, match="kernel 'softmax' has no tuned parameters"):
        K.softmax.autotune_table(a)
