"""nikki.kernels: calling library kernels, their documentation, specialization cache, errors, and
calling one from inside an @nki.jit kernel."""

import numpy as np
import pytest

import nikki
import nikki.isa as nisa
import nikki.kernels as K
import nikki.language as nl


def _softmax(x):
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def test_every_registry_kernel_is_a_module_attribute_with_docs():
    for name in K.names():
        kernel = getattr(K, name)
        assert kernel.__name__ == name
        assert "Dimensions:" in kernel.__doc__ and "Pseudocode:" in kernel.__doc__, name
    assert "softmax" in K.__all__ and "softmax_bwd" in K.__all__


def test_calls_are_cached_per_specialization():
    x = np.ones((4, 8), np.float32)
    K.softmax(x)
    before = len(K.softmax._cache)
    K.softmax(np.zeros((4, 8), np.float32))
    assert len(K.softmax._cache) == before
    K.softmax(np.zeros((5, 8), np.float32))
    assert len(K.softmax._cache) == before + 1


def test_wrong_number_of_inputs_is_a_type_error():
    with pytest.raises(TypeError, match="softmax\\(\\): missing a required argument: 'x'"):
        K.softmax()


def test_non_array_input_is_reported():
    with pytest.raises(nikki.KernelError, match="kernel 'softmax': input 'x' must be an array or tensor, got int"):
        K.softmax(3)


def test_unknown_kernel_attribute():
    with pytest.raises(AttributeError, match="nikki.kernels has no kernel 'sofmax'; did you mean softmax"):
        K.sofmax  # noqa: B018


def test_library_kernels_have_no_launch_grid():
    with pytest.raises(nikki.KernelError, match="library kernel 'softmax' has no SPMD launch grid"):
        K.softmax[2]


def test_estimate_and_output_specs_without_data():
    spec = nikki.spec((256, 1024), nl.bfloat16)
    assert K.softmax.output_specs(spec) == [((256, 1024), nl.bfloat16)]
    profile = nikki.estimate(K.softmax, spec)
    assert profile.total_ns > 0


def test_library_kernel_called_inside_a_kernel_is_inlined():
    @nikki.jit
    def softmax_then_double(x):
        y = K.softmax(x)  # an HBM tensor of this kernel
        t = nl.ndarray(x.shape, nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=y)
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        d = nl.ndarray(x.shape, x.dtype, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=d, data=t, op0=nl.multiply, operand0=2.0)
        nisa.dma_copy(dst=out, src=d)
        return out

    x = np.random.default_rng(3).standard_normal((100, 20)).astype(np.float32)
    np.testing.assert_allclose(softmax_then_double(x), 2 * _softmax(x), rtol=1e-5, atol=1e-6)


def test_library_kernel_inside_a_kernel_needs_tensors():
    @nikki.jit
    def bad(x):
        return K.softmax(1.0)

    with pytest.raises(nikki.KernelError, match="kernel 'softmax': input 'x' must be a tensor, got float"):
        bad(np.ones((2, 2), np.float32))
