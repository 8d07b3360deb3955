"""Entry points and I/O: numpy and torch in/out (bfloat16 and fp8 included), non-contiguous inputs,
input immutability and nt.mutable_tensor in-place writes, specialization on Python constants (the
compile cache), nki.simulate / simulate_kernel / baremetal, the NKI import aliases
(nikki.compat.install) and ``python -m nikki run``.

Every kernel here only moves data or does one fp32 operation whose numpy float32 counterpart
rounds identically, so comparisons are exact.
"""

import os
import subprocess
import sys
import textwrap

import ml_dtypes
import numpy as np
import pytest
import torch

import nikki
import nikki as nki
import nikki.entry
import nikki.isa as nisa
import nikki.language as nl
import nikki.typing as nt

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PYTHONPATH = os.path.join(REPO, "bindings", "python")


@nki.jit
def add(a, b):
    out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    nl.store(out, nl.add(nl.load(a), nl.load(b)))
    return out


@nki.jit
def roundtrip(a):
    """HBM -> SBUF -> HBM, same dtype: bit-exact."""
    t = nl.ndarray(a.shape, a.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=a)
    out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=t)
    return out


@nki.jit
def to_f32(a):
    """Any dtype -> fp32 through the DMA's conversion (exact for 16- and 8-bit floats)."""
    t = nl.ndarray(a.shape, nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=a)
    out = nl.ndarray(a.shape, nl.float32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=t)
    return out


# --- numpy and torch in, the same kind out ----------------------------------------------------

@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int32, np.int16, np.int8, np.uint8, np.uint16,
                                   np.uint32, np.bool_, ml_dtypes.bfloat16, ml_dtypes.float8_e4m3,
                                   ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2])
def test_numpy_dtypes_round_trip(rng, dtype):
    a = (rng.standard_normal((16, 24)) * 8).astype(np.float32).astype(dtype)
    out = roundtrip(a)
    assert type(out) is np.ndarray and out.dtype == np.dtype(dtype) and out.shape == a.shape
    np.testing.assert_array_equal(out.view(np.uint8), a.view(np.uint8))  # bit for bit (fp8 NaNs included)


@pytest.mark.parametrize("dtype", [ml_dtypes.bfloat16, ml_dtypes.float8_e4m3, ml_dtypes.float8_e4m3fn,
                                   ml_dtypes.float8_e5m2, np.float16])
def test_low_precision_floats_widen_exactly(rng, dtype):
    a = (rng.standard_normal((8, 16)) * 4).astype(np.float32).astype(dtype)
    np.testing.assert_array_equal(to_f32(a), a.astype(np.float32))


def test_numpy_in_numpy_out(rng):
    a, b = rng.standard_normal((2, 128, 64), dtype=np.float32)
    out = add(a, b)
    assert isinstance(out, np.ndarray)
    np.testing.assert_array_equal(out, a + b)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int32, torch.uint8])
def test_torch_in_torch_out(dtype):
    g = torch.Generator().manual_seed(0)
    a = (torch.randn(64, 32, generator=g) * 8).to(dtype)
    b = (torch.randn(64, 32, generator=g) * 8).to(dtype)
    out = add(a, b)
    assert isinstance(out, torch.Tensor) and out.dtype == dtype and out.device.type == "cpu"
    if dtype.is_floating_point:
        # the engines add in fp32 and round once to the output dtype, as torch's CPU add does
        expected = (a.float() + b.float()).to(dtype)
    else:  # fp32 sum, then a saturating conversion to the integer dtype
        info = torch.iinfo(dtype)
        expected = (a.to(torch.int64) + b.to(torch.int64)).clamp(info.min, info.max).to(dtype)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2, torch.bfloat16])
def test_torch_low_precision_round_trip(dtype):
    a = (torch.randn(16, 8, generator=torch.Generator().manual_seed(1)) * 4).to(dtype)
    out = roundtrip(a)
    assert out.dtype == dtype
    assert torch.equal(out.view(torch.uint8), a.view(torch.uint8))
    torch.testing.assert_close(to_f32(a), a.float(), rtol=0, atol=0)


def test_bfloat16_numpy_and_torch_agree(rng):
    x = rng.standard_normal((32, 32)).astype(np.float32)
    np_out = add(x.astype(ml_dtypes.bfloat16), x.astype(ml_dtypes.bfloat16))
    t = torch.from_numpy(x).to(torch.bfloat16)
    t_out = add(t, t)
    np.testing.assert_array_equal(np_out.astype(np.float32), t_out.float().numpy())


# --- non-contiguous inputs, immutability, mutable parameters ---------------------------------

def test_non_contiguous_numpy_inputs(rng):
    base = rng.standard_normal((64, 96), dtype=np.float32)
    a = base.T[::2]         # transposed and strided: (48, 64)
    b = base[:48, 10:74]    # a sliced block
    assert not a.flags.c_contiguous and not b.flags.c_contiguous
    np.testing.assert_array_equal(add(a, b), a + b)


def test_non_contiguous_torch_inputs():
    base = torch.randn(40, 30, generator=torch.Generator().manual_seed(2))
    a, b = base.t(), base[:, ::1].t() * 2
    assert not a.is_contiguous()
    torch.testing.assert_close(add(a, b), a + b, rtol=0, atol=0)


def test_inputs_are_not_modified(rng):
    a, b = rng.standard_normal((2, 32, 16), dtype=np.float32)
    a0, b0 = a.copy(), b.copy()
    add(a, b)
    np.testing.assert_array_equal(a, a0)
    np.testing.assert_array_equal(b, b0)
    ta = torch.from_numpy(a.copy())
    add(ta, ta)
    assert torch.equal(ta, torch.from_numpy(a0))


@nki.jit
def scale_rows_in_place(a: nt.mutable_tensor, factor):
    """Multiplies rows 0..1 of `a` by `factor` in place and returns a checksum output."""
    t = nl.load(a[0:2, :])
    nl.store(a[0:2, :], t * factor)
    out = nl.ndarray((1, 1), a.dtype, buffer=nl.shared_hbm)
    nl.store(out, t[0:1, 0:1])
    return out


def test_mutable_tensor_written_in_place_numpy(rng):
    a = rng.standard_normal((4, 6), dtype=np.float32)
    expected = a.copy()
    expected[:2] *= np.float32(3)
    first = scale_rows_in_place(a, 3.0)
    np.testing.assert_array_equal(a, expected)
    assert first[0, 0] == expected[0, 0] / 3


def test_mutable_tensor_non_contiguous_numpy_and_torch(rng):
    base = rng.standard_normal((6, 4), dtype=np.float32)
    a = base.T  # (4, 6), not contiguous: written back into `base`
    expected = a.copy()
    expected[:2] *= np.float32(2)
    scale_rows_in_place(a, 2.0)
    np.testing.assert_array_equal(a, expected)
    np.testing.assert_array_equal(base.T, expected)

    t = torch.from_numpy(rng.standard_normal((6, 4), dtype=np.float32)).t()
    t_expected = t.clone()
    t_expected[:2] *= 2
    scale_rows_in_place(t, 2.0)
    assert torch.equal(t, t_expected)


def test_returned_mutable_tensor_is_the_callers_array(rng):
    @nki.jit
    def fill_first_row(a: nt.mutable_tensor, b):
        nl.store(a[0:1, :], nl.load(b[0:1, :]))
        return a  # Beta 1 required returning a written mutable parameter

    a = np.zeros((3, 5), np.float32)
    b = rng.standard_normal((3, 5), dtype=np.float32)
    result = fill_first_row(a, b)
    assert result is a
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1:], 0)


# --- specialization on constants and the compile cache ----------------------------------------

def test_constants_specialize_and_cache():
    traces = []

    @nki.jit
    def k(a, scale, shape):
        traces.append((scale, shape))
        out = nl.ndarray(shape, a.dtype, buffer=nl.shared_hbm)
        nl.store(out, nl.load(a[0:shape[0], 0:shape[1]]) * scale)
        return out

    a = np.arange(24, dtype=np.float32).reshape(4, 6)
    np.testing.assert_array_equal(k(a, 2.0, (2, 3)), a[:2, :3] * 2)
    np.testing.assert_array_equal(k(a, 2.0, (2, 3)), a[:2, :3] * 2)  # hit
    np.testing.assert_array_equal(k(a, 3.0, (2, 3)), a[:2, :3] * 3)  # new constant: miss
    np.testing.assert_array_equal(k(a, 3.0, (4, 6)), a * 3)          # new tuple: miss
    np.testing.assert_array_equal(k(a, scale=3.0, shape=(4, 6)), a * 3)  # keywords bind the same: hit
    np.testing.assert_array_equal(k(a + 1, 2.0, (2, 3)), (a + 1)[:2, :3] * 2)  # new data, same shape: hit
    assert traces == [(2.0, (2, 3)), (3.0, (2, 3)), (3.0, (4, 6))]
    k(a[:3], 2.0, (2, 3))  # new input shape: miss
    k(a.astype(ml_dtypes.bfloat16), 2.0, (2, 3))  # new input dtype: miss
    assert len(traces) == 5


def test_grid_and_target_are_part_of_the_cache_key():
    traces = []

    @nki.jit
    def k(a):
        traces.append((nl.num_programs(), nl.tile_size.sbuf_fmax_bytes))
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        nl.store(out, nl.load(a))
        return out

    a = np.zeros((2, 2), np.float32)
    k(a)
    k[1](a)
    k[2](a)
    assert traces == [(1, 212984), (1, 212984), (2, 212984), (2, 212984)]
    k[2](a)  # cached
    assert len(traces) == 4


def test_jit_target_mode_and_platform_target():
    sizes = []

    def body(a):
        sizes.append(nl.tile_size.sbuf_fmax_bytes)
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        nl.store(out, nl.load(a))
        return out

    a = np.ones((2, 2), np.float32)
    nki.jit(target="trn1")(body)(a)
    nki.jit(mode="auto")(body)(a)  # mode= is accepted and ignored (NKI 0.3+)
    nki.jit(platform_target="trn1")(body)(a)
    assert sizes == [180224, 212984, 180224]
    assert "body" in repr(nki.jit(body)) and "[2, 3]" in repr(nki.jit(body)[2, 3])


def test_specialize_with_spec_placeholders():
    compiled = add.specialize(nikki.spec((128, 64), nl.float32), nikki.spec((128, 64), "float32"))
    text = compiled.text(locations=False)
    assert "tensor_tensor" in text and "dma_copy" in text
    assert compiled.output_specs == [((128, 64), nl.float32)]


# --- legacy and current entry points ----------------------------------------------------------

def test_simulate(rng):
    a, b = rng.standard_normal((2, 16, 8), dtype=np.float32)
    np.testing.assert_array_equal(nki.simulate(add)(a, b), a + b)
    np.testing.assert_array_equal(nki.simulate(add.fn)(a, b), a + b)  # an undecorated function too
    t = torch.from_numpy(a)
    assert isinstance(nki.simulate(add)(t, t), torch.Tensor)


def test_simulate_lnc2_grid(rng):
    @nki.jit
    def k(a):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        h = a.shape[0] // 2
        i = nl.program_id(0)
        nl.store(out[i * h:(i + 1) * h], nl.load(a[i * h:(i + 1) * h]) + float(i))
        return out

    a = rng.standard_normal((8, 4), dtype=np.float32)
    out = nki.simulate(k[2])(a)
    np.testing.assert_array_equal(out, np.concatenate([a[:4], a[4:] + 1]))


def test_simulate_kernel(rng):
    a, b = rng.standard_normal((2, 8, 8), dtype=np.float32)
    np.testing.assert_array_equal(nki.simulate_kernel(add, a, b), a + b)
    np.testing.assert_array_equal(nki.simulate_kernel(add.fn, a, b=b), a + b)


def test_baremetal_runs_on_the_simulator_and_says_so_once(rng, monkeypatch, capsys):
    monkeypatch.setattr(nikki.entry, "_said_baremetal", False)
    a, b = rng.standard_normal((2, 4, 4), dtype=np.float32)

    @nki.baremetal
    def k1(x, y):
        return add.fn(x, y)

    @nki.baremetal(save_neff_name="file.neff", save_trace_name="profile.ntff")
    def k2(x, y):
        return add.fn(x, y)

    np.testing.assert_array_equal(k1(a, b), a + b)
    np.testing.assert_array_equal(k2(a, b), a + b)
    np.testing.assert_array_equal(k1(a, b), a + b)
    err = capsys.readouterr().err
    assert err.count("nki.baremetal") == 1 and "simulated NeuronCore" in err


# --- NKI import compatibility -----------------------------------------------------------------

@pytest.fixture
def clean_modules():
    """Removes the NKI alias modules compat.install() adds, so other tests see a clean import state."""
    before = set(sys.modules)
    yield
    for name in set(sys.modules) - before:
        if name == "nki" or name.startswith(("nki.", "neuronxcc")):
            del sys.modules[name]


def test_compat_install_aliases_nki_modules(clean_modules):
    import nikki.compat

    nikki.compat.install()
    nikki.compat.install()  # idempotent
    import neuronxcc.nki.isa as legacy_isa
    import neuronxcc.nki.language as legacy_nl
    import nki
    import nki.isa
    import nki.language
    import nki.typing
    from neuronxcc import nki as legacy_nki

    assert nki is nikki and nki.language is nikki.language and nki.isa is nikki.isa
    assert nki.typing is nikki.typing and legacy_nki is nikki
    assert legacy_nl is nikki.language and legacy_isa is nikki.isa

    @nki.jit
    def k(a):
        out = nki.language.ndarray(a.shape, a.dtype, buffer=nki.language.shared_hbm)
        legacy_nl.store(out, legacy_isa.activation(op=legacy_nl.relu, data=legacy_nl.load(a)))
        return out

    a = np.array([[-1.0, 2.0]], np.float32)
    np.testing.assert_array_equal(k(a), [[0.0, 2.0]])


KERNELS = textwrap.dedent('''
    from neuronxcc import nki
    import neuronxcc.nki.language as nl
    import nki.isa as nisa

    @nki.jit
    def double(a):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray(a.shape, a.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=a)
        nisa.tensor_scalar(dst=t, data=t, op0=nl.multiply, operand0=2.0)
        nisa.dma_copy(dst=out, src=t)
        return out
''')

SCRIPT = textwrap.dedent('''
    import sys
    import numpy as np
    from my_kernels import double  # a module next to the script, as NKI samples do

    if __name__ == "__main__":
        n = int(sys.argv[1])
        print("argv", sys.argv[1:])
        print("result", double(np.arange(n, dtype=np.float32).reshape(1, n)).tolist())
''')


def test_python_m_nikki_run(tmp_path):
    script = tmp_path / "nki_script.py"
    script.write_text(SCRIPT)
    (tmp_path / "my_kernels.py").write_text(KERNELS)
    env = dict(os.environ, PYTHONPATH=PYTHONPATH + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-m", "nikki", "run", str(script), "3", "--flag"], env=env,
                          capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    assert "argv ['3', '--flag']" in proc.stdout
    assert "result [[0.0, 2.0, 4.0]]" in proc.stdout


def test_mutable_tensor_with_postponed_annotations(rng):
    """`from __future__ import annotations` makes nt.mutable_tensor a string; it still counts."""
    source = textwrap.dedent('''
        from __future__ import annotations
        import nikki as nki
        import nikki.language as nl
        import nikki.typing as nt

        @nki.jit
        def negate_in_place(a: nt.mutable_tensor):
            nl.store(a, nl.negative(nl.load(a)))
            return a

        @nki.jit
        def negate_unresolved(a: undefined_module.mutable_tensor):  # never evaluated
            nl.store(a, nl.negative(nl.load(a)))
            return a
    ''')
    namespace = {}
    exec(compile(source, "<postponed>", "exec"), namespace)
    for name in ("negate_in_place", "negate_unresolved"):
        a = rng.standard_normal((4, 4), dtype=np.float32)
        expected = -a
        assert namespace[name](a) is a
        np.testing.assert_array_equal(a, expected)


@nki.jit(mode="trace")
def _scaled_tile(src, scale):
    """A legacy trace-mode helper kernel: loads a tile, scales it, returns the SBUF tile."""
    tile = nl.load(src)
    return nl.multiply(tile, scale)


@nki.jit
def _kernel_calling_a_helper_kernel(a):
    out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    nl.store(out, _scaled_tile(a, 3.0))
    return out


def test_trace_mode_helper_kernel_is_inlined_into_its_caller(rng):
    a = rng.standard_normal((64, 32)).astype(np.float32)
    np.testing.assert_array_equal(_kernel_calling_a_helper_kernel(a), a * np.float32(3.0))
    # The helper alone is an ordinary kernel too: its result is an on-chip tile, which a kernel
    # cannot return.
    with pytest.raises(nikki.KernelError, match=r"kernel '_scaled_tile' returns tensor '\w+' in sbuf"):
        _scaled_tile(a, 3.0)
