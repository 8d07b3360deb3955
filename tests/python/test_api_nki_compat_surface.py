"""The parts of NKI's API that NKI code and its test suites use around kernels: host-side helpers
(nl.static_cast of numpy arrays, nl.finfo / iinfo, dtypes as numpy dtypes), the nki.compiler,
nki.collectives and nki.isa.constants modules, NKIObject configuration classes, compiler options of
nki.jit, the legacy decorators' SPMD subscripts, in-out and reshaped outputs, and ``nikki pytest``.

References are numpy / ml_dtypes themselves (conversions are compared exactly) and hand-computed
values."""

import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass, field

import ml_dtypes
import numpy as np
import pytest

import nikki as nki
import nikki.isa as nisa
import nikki.language as nl

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))


# --- host helpers ------------------------------------------------------------------------------

def test_static_cast_converts_host_arrays_like_numpy(rng):
    x = rng.standard_normal((4, 8))  # float64, as test code makes it
    for dtype, numpy_type in ((nl.bfloat16, ml_dtypes.bfloat16), (nl.float16, np.float16),
                              (nl.float8_e4m3, ml_dtypes.float8_e4m3), (nl.int32, np.int32)):
        got = nl.static_cast(x, dtype)
        assert got.dtype == np.dtype(numpy_type)
        np.testing.assert_array_equal(got, x.astype(numpy_type))
    bf = x.astype(ml_dtypes.bfloat16)  # between ml_dtypes types goes through fp32
    np.testing.assert_array_equal(nl.static_cast(bf, nl.float8_e5m2),
                                  bf.astype(np.float32).astype(ml_dtypes.float8_e5m2))


def test_nki_dtypes_are_numpy_dtypes():
    a = np.zeros((2, 3), dtype=nl.bfloat16)
    assert a.dtype == ml_dtypes.bfloat16 and np.dtype(nl.float32) == np.float32
    assert np.ones(3).astype(nl.float16).dtype == np.float16
    assert nl.float32 == np.float32 and {nl.int8: 1}[nl.int8] == 1


def test_finfo_and_iinfo_match_numpy_and_ml_dtypes():
    for dtype, reference in ((nl.float32, np.finfo(np.float32)), (nl.float16, np.finfo(np.float16)),
                             (nl.bfloat16, ml_dtypes.finfo(ml_dtypes.bfloat16)),
                             (nl.float8_e4m3fn, ml_dtypes.finfo(ml_dtypes.float8_e4m3fn))):
        info = nl.finfo(dtype)
        assert (info.max, info.min, info.eps, info.tiny, info.bits) == (
            float(reference.max), float(reference.min), float(reference.eps), float(reference.tiny), reference.bits)
    tf32 = nl.finfo(nl.tfloat32)  # 1 sign, 8 exponent, 10 mantissa bits
    assert tf32.eps == 2.0 ** -10 and tf32.max == (2 - 2.0 ** -10) * 2.0 ** 127
    assert (nl.iinfo(nl.int16).min, nl.iinfo(nl.uint8).max) == (-32768, 255)
    with pytest.raises(TypeError, match="not a floating-point dtype"):
        nl.finfo(nl.int32)


def test_mx_dtypes_are_named_and_refused_as_tensor_dtypes():
    assert nl.float8_e4m3fn_x4 != nl.float8_e5m2_x4 and nl.float4_e2m1fn_x4.name == "float4_e2m1fn_x4"

    @nki.jit
    def kernel(a):
        t = nl.ndarray((4, 4), nl.float8_e4m3fn_x4)
        return a

    with pytest.raises(NotImplementedError, match="nl.float8_e4m3fn_x4 tensors .* not supported by nikki"):
        kernel(np.zeros((4, 4), np.float32))


# --- configuration objects and modules ---------------------------------------------------------

class TileConfig(nl.NKIObject):
    tile: int = 128
    dtype: object = None
    scale: float


@dataclass
class Shapes(nl.NKIObject):
    rows: int
    cols: int = 4
    sizes: list = field(default_factory=list)


@dataclass
class SectionState(nl.NKIObject):
    index = None  # plain class attributes: keyword fields in NKI, ignored by @dataclass
    offset = 0

    def end(self, length):
        return self.offset + length


@dataclass(frozen=True)
class Frozen(nl.NKIObject):
    size: int = 1


def test_nkiobject_subclasses_take_their_fields_as_arguments():
    c = TileConfig(scale=0.5)
    assert (c.tile, c.dtype, c.scale) == (128, None, 0.5)
    d = TileConfig(64, nl.bfloat16)
    assert (d.tile, d.dtype, d.scale) == (64, nl.bfloat16, None)  # every field optional
    with pytest.raises(TypeError, match="at most 3 positional arguments"):
        TileConfig(1, 2, 3, 4)
    # A @dataclass subclass keeps NKI's constructor: every field optional, defaults and factories kept.
    assert (Shapes(2).rows, Shapes(2).cols, Shapes(2).sizes) == (2, 4, [])
    assert Shapes().rows is None and Shapes(1, 2) == Shapes(rows=1, cols=2)
    assert Shapes().sizes is not Shapes().sizes
    state = SectionState(index=3)
    assert (state.index, state.offset, state.end(5)) == (3, 0, 5)
    assert SectionState(offset=7).end(1) == 8 and SectionState().index is None
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'end' \(its fields: index, offset\)"):
        SectionState(end=1)
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'depth' \(its fields: rows, cols, sizes\)"):
        Shapes(depth=1)
    assert Frozen(3).size == 3 and Frozen().size == 1


def test_compat_resolves_every_nki_module():
    code = textwrap.dedent("""
        import nikki.compat; nikki.compat.install()
        from nki.isa.constants import oob_mode, dge_mode
        import nki.compiler as ncc, neuronxcc.nki.compiler as legacy, nki.collectives as cc
        import nki.isa as nisa
        assert oob_mode.skip == 1 and dge_mode.none == 3 and nisa.constants.engine is nisa.engine
        assert ncc is legacy and ncc.CompileConfig(dead_code_elim=True) == ncc.CompileConfig(dead_code_elim=True)
        assert cc.rank_id() == 0
        try:
            from nki.compiler.kernel_builder import compile_kernel
        except NotImplementedError as err:
            assert "kernel_builder.compile_kernel" in str(err)
        else:
            raise AssertionError("kernel_builder should not import")
        print("ok")
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=os.path.join(ROOT, "bindings", "python")))
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_direct_allocation_places_nothing_and_wraps_blocks(rng):
    import nikki.compiler as ncc

    @ncc.enable_stack_allocator(log_level=20)
    @ncc.skip_middle_end_transformations
    @nki.jit
    def kernel(a):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        # 4 logical blocks on 2 physical tiles: block b is tile b % 2, as modular allocation places them
        blocks = nl.ndarray((4, nl.par_dim(32), 16), a.dtype, buffer=ncc.sbuf.mod_alloc(base_addr=0,
                                                                                         num_free_tiles=(2,)))
        for b in nl.affine_range(4, directives=ncc.multi_buffer(2)):
            blocks[b] = nl.load(a[:, 16 * b:16 * (b + 1)])
            nl.store(out[:, 16 * b:16 * (b + 1)], blocks[b])
        return out

    a = rng.standard_normal((32, 64), dtype=np.float32)
    np.testing.assert_array_equal(kernel(a), a)


def _overlaid_psum_kernel(second_bank: int):
    import nikki.compiler as ncc

    @nki.jit
    def kernel(a, w):
        out = nl.ndarray((128, 8 * 512), nl.float32, buffer=nl.shared_hbm)
        # Two 16 KiB PSUM tensors, used in turn within each block: both live all loop long.
        first = nl.ndarray((8, nl.par_dim(128), 512), nl.float32,
                           buffer=ncc.psum.mod_alloc(base_bank=0, num_bank_tiles=(8,)))
        second = nl.ndarray((8, nl.par_dim(128), 512), nl.float32,
                            buffer=ncc.psum.mod_alloc(base_bank=second_bank, num_bank_tiles=(8,)))
        at, wt = nl.load(a), nl.load(w)
        for b in nl.affine_range(8):
            first[b] = nisa.nc_matmul(at, wt)
            doubled = nl.multiply(first[b], 2.0)
            second[b] = nisa.nc_matmul(at, doubled)
            nl.store(out[:, b * 512:(b + 1) * 512], nl.copy(second[b]))
        return out

    return kernel


def test_tensors_placed_at_the_same_psum_banks_share_them(rng):
    """Two mod_allocs from the same bank are one memory on the device; a kernel that uses them in
    turn fits PSUM only because of that overlay, and computes what the device does."""
    a = rng.standard_normal((128, 128), dtype=np.float32)
    w = rng.standard_normal((128, 512), dtype=np.float32)
    want = a.T.astype(np.float64) @ (2 * (a.T.astype(np.float64) @ w))
    np.testing.assert_allclose(_overlaid_psum_kernel(0)(a, w), np.tile(want, 8), rtol=1e-5, atol=1e-3)
    with pytest.raises(nki.KernelError, match=r"PSUM capacity exceeded: 2 live tensors need 32 KiB"):
        _overlaid_psum_kernel(1)(a, w)  # placed apart, the two no longer fit


def test_a_sum_in_psum_reallocated_at_the_same_banks_starts_at_its_first_accumulation(rng):
    """A mod_alloc at the placement of an earlier one takes over its memory; on the device a sum
    (an accumulation group) into the new tensor starts at its first '+=' since that allocation,
    not on what the previous occupant left: a tensor allocated in a loop body sums afresh in each
    iteration, as Beta 1's fused RMSNorm + QKV kernel relies on."""
    import nikki.compiler as ncc

    @nki.jit
    def kernel(a, w):
        out = nl.ndarray((3, 128, 512), nl.float32, buffer=nl.shared_hbm)
        first = nl.ndarray((1, nl.par_dim(128), 512), nl.float32,
                           buffer=ncc.psum.mod_alloc(base_bank=0, num_bank_tiles=(1,)))
        first[0] = nisa.nc_matmul(nl.load(a[0, :, 0:128]), nl.load(w))
        nl.store(out[0], nl.copy(first[0]))
        for i in nl.affine_range(2):
            acc = nl.ndarray((1, nl.par_dim(128), 512), nl.float32,
                             buffer=ncc.psum.mod_alloc(base_bank=0, num_bank_tiles=(1,)))
            for k in nl.affine_range(3):
                acc[0] += nisa.nc_matmul(nl.load(a[1 + i, :, 128 * k:128 * (k + 1)]), nl.load(w))
            nl.store(out[1 + i], nl.copy(acc[0]))
        return out

    a = rng.standard_normal((3, 128, 384), dtype=np.float32)
    w = rng.standard_normal((128, 512), dtype=np.float32)
    got = kernel(a, w)
    np.testing.assert_allclose(got[0], a[0, :, :128].T.astype(np.float64) @ w, rtol=1e-5, atol=1e-3)
    for i in range(2):
        want = sum(a[1 + i, :, 128 * k:128 * (k + 1)].T.astype(np.float64) @ w for k in range(3))
        np.testing.assert_allclose(got[1 + i], want, rtol=1e-5, atol=1e-3)


def test_no_reorder_directive_keeps_results(rng):
    import nikki.compiler as ncc

    @nki.jit
    def kernel(a):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        acc = nl.zeros((32, 16), nl.float32, buffer=nl.sbuf)
        for b in nl.sequential_range(4, directives=ncc.no_reorder()):  # Beta 1 loop directive
            acc[...] = nl.add(acc, nl.load(a[:, 16 * b:16 * (b + 1)]))
        with ncc.no_reorder():  # ... and as a block
            for b in nl.affine_range(4):
                nl.store(out[:, 16 * b:16 * (b + 1)], acc)
        return out

    a = rng.standard_normal((32, 64), dtype=np.float32)
    total = a[:, :16] + a[:, 16:32] + a[:, 32:48] + a[:, 48:]
    np.testing.assert_allclose(kernel(a), np.tile(total, 4), rtol=1e-6, atol=1e-6)


def test_collectives_over_one_rank_copy_and_refuse_more():
    import nikki.collectives as cc

    @nki.jit
    def reduce_one(a):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        cc.all_reduce([a], [out], cc.ReplicaGroup([[0]]), op=nl.add)
        return out

    @nki.jit
    def gather_two(a):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        cc.all_gather([a], [out], cc.ReplicaGroup([[0, 1]]), collective_dim=0)
        return out

    a = np.arange(8, dtype=np.float32).reshape(2, 4)
    np.testing.assert_array_equal(reduce_one(a), a)
    with pytest.raises(NotImplementedError, match="all_gather over 2 ranks"):
        gather_two(a)


# --- kernels and their entry points -------------------------------------------------------------

def test_jit_accepts_compiler_options_and_still_rejects_misspellings():
    def k(a):
        return a

    nki.jit(debug_kernel=True, show_compiler_tb=True, experimental_flags="x")(k)
    with pytest.raises(TypeError, match="unexpected keyword argument 'debug_kernal'"):
        nki.jit(debug_kernal=True)(k)


def test_returned_parameters_are_in_out_and_outputs_may_be_reshaped(rng):
    @nki.jit
    def kernel(x, out):
        flat = nl.ndarray((x.shape[0] * x.shape[1],), x.dtype, buffer=nl.shared_hbm)
        t = nl.load(x)
        nl.store(out, nl.multiply(t, 2.0))
        nl.store(flat.reshape((x.shape[0], x.shape[1])), t)
        return out, flat.reshape((x.shape[1], x.shape[0]))

    x = rng.standard_normal((4, 6), dtype=np.float32)
    out = np.zeros_like(x)
    written, reshaped = kernel(x, out)
    assert written is out
    np.testing.assert_array_equal(out, 2 * x)
    assert reshaped.shape == (6, 4)
    np.testing.assert_array_equal(reshaped, x.reshape(6, 4))


def test_writing_a_parameter_that_is_not_returned_is_still_an_error():
    @nki.jit
    def kernel(x):
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        nl.store(x, nl.load(x))
        nl.store(out, nl.load(x))
        return out

    with pytest.raises(nki.KernelError, match="cannot write to kernel input 'x'"):
        kernel(np.zeros((4, 4), np.float32))


def test_legacy_decorators_launch_spmd_grids(monkeypatch):
    monkeypatch.setattr(nki.entry, "_said_baremetal", True)

    def kernel(a):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        i = nl.program_id(0)
        nl.store(out[i], nl.add(nl.load(a[i]), float(i)))
        return out

    a = np.zeros((3, 1, 4), np.float32)
    got = nki.simulate_kernel(nki.baremetal(kernel)[3], a)
    np.testing.assert_array_equal(got[:, 0, 0], [0, 1, 2])
    bench = nki.benchmark(warmup=1, iters=1)(kernel)
    grid = bench[3]
    grid(a)
    assert grid.benchmark_result.nc_latency.get_latency_percentile(50) > 0


def test_tensor_truth_is_true_and_comparisons_refuse_it():
    @nki.jit
    def kernel(a, bias=None):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        t = nl.load(a)
        if bias:  # an optional tensor parameter
            t = nl.add(t, nl.load(bias))
        nl.store(out, t)
        return out

    a = np.ones((4, 4), np.float32)
    np.testing.assert_array_equal(kernel(a, a), 2 * a)
    np.testing.assert_array_equal(kernel(a), a)


def test_reshape_takes_the_shape_keyword(rng):
    @nki.jit
    def kernel(a):
        out = nl.ndarray((8, 4), a.dtype, buffer=nl.shared_hbm)
        nl.store(out, nl.load(a.reshape(shape=(8, 4))))
        return out

    a = rng.standard_normal((4, 8), dtype=np.float32)
    np.testing.assert_array_equal(kernel(a), a.reshape(8, 4))


# --- nikki pytest --------------------------------------------------------------------------------

def test_nikki_pytest_runs_an_nki_suite(tmp_path):
    (tmp_path / "test_suite.py").write_text(textwrap.dedent("""
        import numpy as np
        from neuronxcc import nki
        import neuronxcc.nki.language as nl

        @nki.jit
        def double(a):
            out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
            nl.store(out, nl.multiply(nl.load(a), 2.0))
            return out

        def test_double():
            a = nl.static_cast(np.arange(8.0).reshape(2, 4), nl.float32)
            assert np.array_equal(nki.simulate_kernel(double, a), 2 * a)

        def test_instance_type_is_the_simulated_target():
            with open("/sys/devices/virtual/dmi/id/product_name") as f:
                assert f.readline().split(".")[0] == "trn2"
    """))
    done = subprocess.run([sys.executable, "-m", "nikki", "pytest", "-q", "-p", "no:cacheprovider",
                           str(tmp_path / "test_suite.py")], capture_output=True, text=True, cwd=tmp_path,
                          env=dict(os.environ, PYTHONPATH=os.path.join(ROOT, "bindings", "python"),
                                   NEURON_PLATFORM_TARGET_OVERRIDE="trn2"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 passed" in done.stdout
