"""Bad inputs at nikki's Python entry points: each either works with numpy / PyTorch semantics
(checked against numpy or torch) or raises an error that names the argument and the problem.
Never a silently wrong result, an unhelpful error (AttributeError, IndexError, a pybind dump) or a
crash. One test per defect found by feeding nikki such inputs; tests/fuzz/test_bad_inputs.py draws
many more at random."""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

import nikki as nki
import nikki.isa as nisa
import nikki.kernels as nk
import nikki.language as nl
import nikki.torch as ntorch
import nikki.typing as nt

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def message(excinfo) -> str:
    """What an error says, without the user's source line a KernelError quotes (which would hold
    the very fragments a test looks for when the failing call is written in a parametrize list)."""
    err = excinfo.value
    if isinstance(err, nki.KernelError):
        return "\n".join([err.summary, err.limit, err.hint])
    return str(err)


@nki.jit
def plus_one(a):
    """a + 1 through SBUF."""
    out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    nl.store(out, nl.add(nl.load(a), 1))
    return out


@nki.jit
def write_b_plus_one_into_a(a: nt.mutable_tensor, b):
    """a[...] = b + 1, in place."""
    nl.store(a, nl.add(nl.load(b), 1))
    return a


# --- silent wrong results -------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [">f4", ">i4", ">f2", "<f4"])
def test_non_native_byte_order_inputs_are_read_as_numbers(dtype):
    x = np.arange(-8, 8).reshape(2, 8).astype(dtype)
    out = plus_one(x)
    np.testing.assert_array_equal(out, x.astype(x.dtype.newbyteorder("=")) + 1)  # exact: small integers


def test_unaligned_input_is_read_as_numbers():
    raw = np.zeros(4 * 16 + 1, np.uint8)
    x = np.frombuffer(raw.data, dtype=np.float32, count=16, offset=1).reshape(2, 8)
    assert not x.flags.aligned
    np.testing.assert_array_equal(plus_one(x), np.ones((2, 8), np.float32))


def test_written_big_endian_argument_keeps_its_byte_order():
    a = np.zeros((2, 8), ">f4")
    b = np.arange(16, dtype=np.float32).reshape(2, 8)
    write_b_plus_one_into_a(a, b)
    assert a.dtype == np.dtype(">f4")
    np.testing.assert_array_equal(a, b + 1)


@pytest.mark.parametrize("order", ["earliest", "latest"])
def test_written_argument_sharing_memory_with_an_input_reads_its_old_values(monkeypatch, order):
    # Inputs are distinct tensors in the kernel's model: what b reads cannot depend on the order
    # the executor walks its streams in.
    monkeypatch.setenv("NIKKI_STREAM_ORDER", order)

    @nki.jit
    def swap_rows_plus_one(a: nt.mutable_tensor, b):
        nl.store(a[0:1, :], nl.add(nl.load(b[1:2, :]), 1))
        nl.store(a[1:2, :], nl.add(nl.load(b[0:1, :]), 1))  # reads row 0 after row 0 of a is written
        return a

    x = np.arange(16, dtype=np.float32).reshape(2, 8)
    expected = x[::-1] + 1
    swap_rows_plus_one(x, x)
    np.testing.assert_array_equal(x, expected)


def test_two_written_arguments_sharing_memory_are_an_error():
    @nki.jit
    def write_both(a: nt.mutable_tensor, b: nt.mutable_tensor):
        nl.store(a, nl.add(nl.load(b), 1))
        nl.store(b, nl.add(nl.load(a), 1))
        return a, b

    x = np.zeros((2, 8), np.float32)
    with pytest.raises(nki.KernelError) as info:
        write_both(x, x[:, :])
    assert "arguments 'a' and 'b' share memory" in message(info)


def k_tensor_scalar(a, op0, operand0):
    out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    t = nl.load(a)
    d = nl.ndarray(t.shape, t.dtype)
    nisa.tensor_scalar(dst=d, data=t, op0=op0, operand0=operand0)
    nl.store(out, d)
    return out


def test_tensor_scalar_rejects_a_missing_operand_of_a_binary_operator():
    with pytest.raises(nki.KernelError) as info:
        nki.jit(k_tensor_scalar)(np.ones((2, 8), np.float32), nl.multiply, None)
    assert "nisa.tensor_scalar: operand0 is None, but op0=multiply takes an operand" in message(info)
    assert info.value.file == __file__


def test_tensor_scalar_unary_operator_needs_no_operand():
    x = np.linspace(-3, 3, 16, dtype=np.float32).reshape(2, 8)
    np.testing.assert_array_equal(nki.jit(k_tensor_scalar)(x, nl.abs, None), np.abs(x))


def _instruction_with_none(name):
    def body(t, d):
        if name == "scalar_tensor_tensor":
            nisa.scalar_tensor_tensor(dst=d, data=t, op0=nl.add, operand0=None, op1=nl.add, operand1=t)
        elif name == "tensor_scalar_reduce":
            r = nl.ndarray((t.shape[0], 1), nl.float32)
            nisa.tensor_scalar_reduce(dst=d, data=t, op0=nl.add, operand0=None, reduce_op=nl.add, reduce_res=r)
        elif name == "activation":
            nisa.activation(dst=d, op=nl.exp, data=t, scale=None)
        elif name == "memset":
            nisa.memset(dst=d, value=None)
        elif name == "tensor_tensor_scan":
            nisa.tensor_tensor_scan(d, t, t, None, nl.multiply, nl.add)
        elif name == "affine_select":
            nisa.affine_select(d, [[1, 8]], 1, t, None)
        elif name == "select_reduce":
            nisa.select_reduce(dst=d, predicate=t, on_true=t, on_false=None)
        elif name == "tensor_copy_predicated":
            nisa.tensor_copy_predicated(dst=d, src=None, predicate=t)

    def kernel(a):
        t = nl.load(a)
        d = nl.ndarray(t.shape, t.dtype)
        body(t, d)
        return a

    return kernel


@pytest.mark.parametrize("name, argument", [
    ("scalar_tensor_tensor", "operand0"), ("tensor_scalar_reduce", "operand0"), ("activation", "scale"),
    ("memset", "value"), ("tensor_tensor_scan", "initial"), ("affine_select", "on_false_value"),
    ("select_reduce", "on_false"), ("tensor_copy_predicated", "src"),
])
def test_instructions_reject_none_for_a_required_operand(name, argument):
    with pytest.raises(nki.KernelError) as info:
        nki.jit(_instruction_with_none(name))(np.ones((2, 8), np.float32))
    text = message(info)
    assert name in text and argument in text and "None" in text
    assert "internal error" not in text


q = torch.randn(1, 2, 16, 8, generator=torch.Generator().manual_seed(0))


def test_torch_flash_attention_causal_must_be_a_bool():
    with pytest.raises(nki.KernelError) as info:
        ntorch.flash_attention(q, q, q, causal="no")
    assert "flash_attention: causal must be a bool" in message(info) and "'no'" in message(info)


def test_numpy_scalars_are_values_of_their_kind():
    expected = torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
    torch.testing.assert_close(ntorch.flash_attention(q, q, q, causal=np.True_), expected, atol=1e-5, rtol=1e-5)
    x = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
    gamma = np.ones(8, np.float32)
    out_np_eps, _ = nk.rmsnorm(x, gamma, eps=np.float32(1e-5))
    out_float_eps, _ = nk.rmsnorm(x, gamma, eps=float(np.float32(1e-5)))
    np.testing.assert_array_equal(out_np_eps, out_float_eps)
    reference = x / np.sqrt((x.astype(np.float64) ** 2).mean(-1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(out_np_eps, reference, rtol=1e-5, atol=1e-6)  # fp32 maths


@pytest.mark.parametrize("call, fragment", [
    (lambda: nk.rmsnorm(np.ones((4, 8), np.float32), np.ones(8, np.float32), eps="1e-5"),
     "parameter 'eps' must be a finite number, got '1e-5'"),
    (lambda: nk.flash_attention(q.numpy(), q.numpy(), q.numpy(), np.full(2, -np.inf, np.float32), causal=1),
     "parameter 'causal' must be a bool"),
    (lambda: ntorch.rms_norm(torch.ones(2, 8), eps="1e-6"), "rms_norm: eps must be a finite number"),
    (lambda: ntorch.layer_norm(torch.ones(2, 8), 8, eps=None), "layer_norm: eps must be a finite number"),
    (lambda: ntorch.flash_attention(q, q, q, scale="0.5"), "flash_attention: scale must be a finite number"),
    (lambda: ntorch.flash_attention(q, q, q, scale=float("nan")), "flash_attention: scale must be a finite number"),
])
def test_scalar_parameters_are_checked_by_type(call, fragment):
    with pytest.raises(nki.KernelError) as info:
        call()
    assert fragment in message(info)


def test_mutable_tensor_rejects_read_only_arrays():
    read_only = np.zeros((2, 8), np.float32)
    read_only.flags.writeable = False
    frozen = np.frombuffer(bytes(64), dtype=np.float32).reshape(2, 8)
    for array in (read_only, frozen, np.broadcast_to(np.zeros(8, np.float32), (2, 8))):
        with pytest.raises(nki.KernelError) as info:
            write_b_plus_one_into_a(array, np.ones((2, 8), np.float32))
        assert "argument 'a' is a read-only numpy array; the kernel writes it" in message(info)
        assert not array.any()


def test_mutable_tensor_rejects_a_leaf_requiring_grad_unless_grad_is_off():
    leaf = torch.zeros(2, 8, requires_grad=True)
    with pytest.raises(nki.KernelError) as info:
        write_b_plus_one_into_a(leaf, torch.ones(2, 8))
    assert "argument 'a' requires grad" in message(info)
    assert not leaf.detach().any()
    with torch.no_grad():  # as an optimizer updates parameters
        write_b_plus_one_into_a(leaf, torch.ones(2, 8))
    torch.testing.assert_close(leaf.detach(), torch.full((2, 8), 2.0), atol=0, rtol=0)


def test_mutable_tensor_rejects_an_expanded_torch_view():
    with pytest.raises(nki.KernelError) as info:
        write_b_plus_one_into_a(torch.zeros(8).expand(2, 8), torch.ones(2, 8))
    assert "argument 'a' repeats its elements" in message(info)


# --- crash ------------------------------------------------------------------------------------------

def test_tensor_on_another_device_after_a_cached_cpu_call_is_an_error_not_a_crash():
    script = textwrap.dedent("""
        import torch, nikki as nki, nikki.language as nl
        @nki.jit
        def plus_one(a):
            out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
            nl.store(out, nl.add(nl.load(a), 1))
            return out
        plus_one(torch.ones(2, 8))
        try:
            plus_one(torch.ones(2, 8, device="meta"))
        except nki.KernelError as err:
            print("ERROR:", err.summary)
    """)
    env = dict(os.environ, PYTHONPATH=os.path.join(REPO, "bindings", "python"))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "ERROR: argument 'a' is a torch tensor on meta; nikki runs on CPU tensors" in done.stdout


def test_sparse_tensor_is_named_at_every_launch():
    plus_one(torch.ones(4, 4))
    with pytest.raises(nki.KernelError) as info:
        plus_one(torch.eye(4).to_sparse())
    assert "argument 'a' is a torch.sparse_coo torch tensor" in message(info)


# --- errors that name the problem ------------------------------------------------------------------

@pytest.mark.parametrize("fn", [ntorch.softmax, ntorch.rms_norm, lambda x: ntorch.layer_norm(x, 4),
                                lambda x: ntorch.matmul(x, torch.ones(4, 4)),
                                lambda x: ntorch.flash_attention(x, q, q)])
@pytest.mark.parametrize("bad, fragment", [
    (None, "must be a torch.Tensor, got None"),
    (np.ones((4, 4), np.float32), "must be a torch.Tensor, got a numpy.ndarray of shape (4, 4)"),
    (torch.eye(4).to_sparse(), "must be a dense (strided) torch.Tensor"),
])
def test_torch_functions_name_a_bad_tensor_argument(fn, bad, fragment):
    with pytest.raises(nki.KernelError) as info:
        fn(bad)
    assert fragment in message(info) and "nikki.torch." in message(info)


@pytest.mark.parametrize("fn, name", [(ntorch.softmax, "softmax"), (ntorch.rms_norm, "rms_norm"),
                                      (lambda x: ntorch.layer_norm(x, ()), "layer_norm"),
                                      (lambda x: ntorch.matmul(x, torch.ones(1, 1)), "matmul"),
                                      (lambda x: ntorch.flash_attention(x, x, x), "flash_attention")])
def test_torch_functions_reject_zero_dim_tensors_by_name(fn, name):
    with pytest.raises((nki.KernelError, ValueError)) as info:
        fn(torch.tensor(1.0))
    assert f"nikki.torch.{name}:" in message(info)
    assert "0-d" in message(info) or "normalized_shape" in message(info)


def test_torch_softmax_dim_out_of_range_is_named():
    with pytest.raises(nki.KernelError) as info:
        ntorch.softmax(torch.ones(2, 4), dim=2)
    assert "softmax: dim must be an integer in [-2, 1], got 2" in message(info)


def test_reverse_slice_of_a_tile_says_the_step_is_negative():
    @nki.jit
    def reverse(a):
        out = nl.ndarray((32, 2), a.dtype, buffer=nl.shared_hbm)
        t = nl.load(a)
        nl.store(out, t[0:32, 9:7:-1])
        return out

    with pytest.raises(nki.KernelError) as info:
        reverse(np.ones((32, 16), np.float32))
    assert "slice step must be positive, got -1 in [9:7:-1]" in message(info)
    assert "reverse iteration" in message(info)


def test_rank_above_the_limit_is_a_kernel_error_naming_it():
    @nki.jit
    def rank_nine(a):
        nl.ndarray((1,) * 9, nl.float32)
        return a

    limit = f"at most {nki._core.max_rank} dims"
    with pytest.raises(nki.KernelError) as info:
        rank_nine(np.ones((2, 2), np.float32))
    assert "has 9 dims" in message(info) and limit in message(info)
    with pytest.raises(nki.KernelError) as info:
        plus_one(np.ones((1,) * 9, np.float32))
    assert "argument 'a' has 9 dims" in message(info) and limit in message(info)
    with pytest.raises(nki.KernelError) as info:
        nk.softmax(np.ones((1,) * 9, np.float32))
    assert "argument 'x' has 9 dims" in message(info)


@pytest.mark.parametrize("value, accepted", [("random:abc", False), ("random:", False), ("random:-1", False),
                                             ("random:18446744073709551616", False), ("sideways", False),
                                             ("random:42", True), ("earliest", True)])
def test_stream_order_variable_is_parsed_strictly(monkeypatch, value, accepted):
    monkeypatch.setenv("NIKKI_STREAM_ORDER", value)
    x = np.arange(16, dtype=np.float32).reshape(2, 8)
    kernel = nki.jit(plus_one.fn)  # a new kernel: its executor reads the variable on first run
    if accepted:
        np.testing.assert_array_equal(kernel(x), x + 1)
        return
    with pytest.raises(nki.KernelError) as info:
        kernel(x)
    assert f"NIKKI_STREAM_ORDER={value}" in message(info)
    assert "random:<seed>" in message(info) and "earliest" in message(info)


# --- more inputs found by the fuzzer ---------------------------------------------------------------

def _traced(body):
    def kernel(a):
        t = nl.load(a)
        d = nl.ndarray(t.shape, t.dtype)
        body(t, d)
        return a

    return nki.jit(kernel)


@pytest.mark.parametrize("body, fragment", [
    (lambda t, d: nisa.tensor_copy(d, nl.add(t, "1")), "nl.add: y must be a number, got '1'"),
    (lambda t, d: nisa.tensor_copy(d, t + None), "nl.add: y must be a number, got None"),
    (lambda t, d: nisa.tensor_scalar(d, t, nl.subtract, 1.0, reverse0="no"),
     "nisa.tensor_scalar: reverse0 must be a bool (True or False), got 'no'"),
    (lambda t, d: nisa.tensor_scalar(d, t, nl.add, np.ones(3)), "operand0 must be a number, got a numpy.ndarray"),
    (lambda t, d: nisa.tensor_copy(d[0:2, 0:2], t[0:2, nl.ds(0, -2)]), "nl.ds: size must be an integer in [1, "),
    (lambda t, d: nl.ndarray((4.5, 8), nl.float32), "shape (4.5, 8) is not a tuple of integers"),
    (lambda t, d: nl.ndarray((True, 8), nl.float32), "shape (True, 8) is not a tuple of integers"),
    (lambda t, d: nl.ndarray((2, 8), None), "None is not a dtype"),
    (lambda t, d: nisa.tensor_copy(d, t[0:2 ** 70]), "slice stop 1180591620717411303424 does not fit"),
    (lambda t, d: nl.sum(t, axis=None), "nl.sum: axis must be an integer"),
    (lambda t, d: nl.exp(None), "x must be a tensor, got NoneType"),
    (lambda t, d: nisa.iota(d, [[1, 8]], offset=None), "nisa.iota: offset must be an integer, got None"),
    (lambda t, d: nisa.tensor_tensor(d, t, None, nl.add), "data2 must be a tensor, got NoneType"),
    (lambda t, d: nisa.nc_matmul(nl.ndarray((8, 8), nl.float32, buffer=nl.psum), t, None),
     "moving must be a tensor, got NoneType"),
    (lambda t, d: nisa.tensor_copy(d, t, bogus=1), "nisa.tensor_copy: got an unexpected keyword argument 'bogus'"),
    (lambda t, d: t.expand_dims(None), "expand_dims(): axis must be an integer, got None"),
    (lambda t, d: t.permute(None), "permute(): dims must be a sequence of dim indices, got None"),
    (lambda t, d: nisa.memset(d, "x"), "nisa.memset: value must be a number, got 'x'"),
    (lambda t, d: nl.full(t.shape, float("nan"), nl.int32), "cannot store nan in tensor"),
])
def test_bad_values_inside_a_kernel_are_named(body, fragment):
    with pytest.raises(nki.KernelError) as info:
        _traced(body)(np.ones((4, 8), np.float32))
    assert fragment in message(info)
    assert info.value.file == __file__  # located at the user's line


@pytest.mark.parametrize("bad, fragment", [
    (None, "argument 'a' is None, but the kernel uses it as a tensor (.shape)"),
    ("abc", "argument 'a' is 'abc', but the kernel uses it as a tensor (.shape)"),
    (np.zeros((), np.float32), "argument 'a' is 0-dimensional"),
    (nki.spec((2, 4), np.float32), "is nikki.spec((2, 4), float32), a placeholder without data"),
])
def test_bad_kernel_arguments_are_named(bad, fragment):
    with pytest.raises(nki.KernelError) as info:
        plus_one(bad)
    assert fragment in message(info)


def test_launch_grid_and_spec_take_integers():
    assert plus_one[np.int64(2)].grid == (2,)
    with pytest.raises(nki.KernelError):
        plus_one[True]
    with pytest.raises(nki.KernelError) as info:
        nki.spec((2.5, 4), np.float32)
    assert "nikki.spec: shape must be a tuple of integers of at least 0, got (2.5, 4)" in message(info)
    assert nki.spec((0, 4), np.float32).shape == (0, 4)  # as an empty array
    with pytest.raises(nki.KernelError):
        nki.spec((-1, 4), np.float32)
    with pytest.raises(TypeError) as info:
        nki.estimate(None)
    assert "a kernel is a Python function, got None" in message(info)


@pytest.mark.parametrize("body, fragment", [
    (lambda t, d: nisa.memset(d, 10 ** 400), "nisa.memset: value must be a number within the float range"),
    (lambda t, d: nisa.activation(d, nl.copy, t, bias=10 ** 400), "nisa.activation: bias must be a number within"),
    (lambda t, d: nisa.iota(d, [[1, 8]], offset=2 ** 40), "nisa.iota: offset 1099511627776 does not fit in int32"),
    (lambda t, d: nisa.tensor_copy(d, t[:, 0:8:2 ** 70]), "slice step 1180591620717411303424 does not fit"),
    (lambda t, d: nisa.tensor_copy(d, nl.multiply("a", 2)), "nl.multiply: x or y must be a tensor, got 'a' and 2"),
])
def test_out_of_range_scalars_inside_a_kernel_are_named(body, fragment):
    with pytest.raises(nki.KernelError) as info:
        _traced(body)(np.ones((4, 8), np.float32))
    assert fragment in message(info)


def test_bool_bias_is_the_number_one_and_an_int_shape_is_one_dim():
    def body(t, d):
        nisa.activation(d, nl.copy, t, bias=True)
        nl.ndarray(8, nl.float32, buffer=nl.hbm)

    x = np.arange(32, dtype=np.float32).reshape(4, 8)

    @nki.jit
    def kernel(a):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        t = nl.load(a)
        d = nl.ndarray(t.shape, t.dtype)
        body(t, d)
        nl.store(out, d)
        return out

    np.testing.assert_array_equal(kernel(x), x + 1)


def test_library_kernel_errors_name_the_input_they_are_about():
    with pytest.raises(nki.KernelError) as info:
        nk.softmax_bwd(np.ones(4, np.float32), np.ones((4, 8), np.float32))
    assert "argument 'out' (float32[4])" in message(info)


def test_torch_functions_name_the_argument_on_another_device_or_of_another_dtype():
    with pytest.raises(nki.KernelError) as info:
        ntorch.rms_norm(torch.ones(2, 8), torch.ones(8, device="meta"))
    assert "rms_norm: argument 'weight' is on meta, but 'x' is on cpu" in message(info)
    with pytest.raises(nki.KernelError) as info:
        ntorch.library_op("softmax_bwd")(torch.ones(2, 8), torch.ones(2, 8, device="meta"))
    assert "argument 'grad_out' is on meta, but 'out' is on cpu" in message(info)
    with pytest.raises(nki.KernelError) as info:
        ntorch.layer_norm(torch.ones(2, 8), 8, bias=torch.ones(8, dtype=torch.float64))
    assert "layer_norm: bias must be a tensor of an NKI dtype" in message(info)
    out = ntorch.library_op("softmax")(torch.ones(2, 8, device="meta"))  # all on meta: shapes only, as in torch
    assert out.device.type == "meta" and out.shape == (2, 8)


def test_launch_grid_size_is_bounded():
    with pytest.raises(nki.KernelError) as info:
        plus_one[10 ** 6, 10 ** 6]
    assert "program instances" in message(info) and "at most" in message(info)


def test_masked_array_is_rejected_at_every_launch():
    x = np.ones((2, 8), np.float32)
    plus_one(x)  # cached for this shape and dtype
    masked = np.ma.masked_array(x, mask=np.eye(2, 8, dtype=bool))
    with pytest.raises(nki.KernelError) as info:
        plus_one(masked)
    assert "argument 'a' is a numpy masked array" in message(info)


@pytest.mark.parametrize("value", ["abc", "-2", "0", "100000"])
def test_logical_core_variable_is_parsed_strictly(monkeypatch, value):
    monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", value)
    with pytest.raises(nki.KernelError) as info:
        nki.jit(plus_one.fn)(np.ones((2, 8), np.float32))
    expected = "program instances" if value.isdigit() and int(value) else "is not a number of logical cores"
    assert expected in message(info) and (value in message(info) or "100000" in message(info))


@pytest.mark.parametrize("value", ["abc", "0", "-5", "1e4"])
def test_grid_limit_variable_is_parsed_strictly(monkeypatch, value):
    monkeypatch.setenv("NIKKI_MAX_GRID_PROGRAMS", value)
    with pytest.raises(nki.KernelError) as info:
        plus_one[2]
    assert f"NIKKI_MAX_GRID_PROGRAMS={value} is not a number of program instances" in message(info)
    assert "positive decimal integer" in message(info)
    monkeypatch.setenv("NIKKI_MAX_GRID_PROGRAMS", "3")  # a valid value is the limit
    assert plus_one[3].grid == (3,)
    with pytest.raises(nki.KernelError, match="4 program instances"):
        plus_one[4]


def test_entry_point_options_are_checked():
    with pytest.raises(ValueError, match="nki_op: name must be 'namespace::op', got 'plain'"):
        ntorch.nki_op("plain")(plus_one)
    profile = nki.estimate(plus_one, nki.spec((2, 8), np.float32))
    with pytest.raises(ValueError, match="engine 'tensr' is not one of tensor, vector"):
        profile.utilization("tensr")
    with pytest.raises(nki.KernelError, match="Profile.summary: top must be an integer"):
        profile.summary(top="8")
    with pytest.raises(nki.KernelError, match="nki.benchmark: iters must be an integer at least 1, got 0"):
        nki.benchmark(plus_one, iters=0)


def test_index_grid_of_more_axes_than_a_view_has_dims_is_a_kernel_error():
    @nki.jit
    def nine_axes(a):
        i = nl.mgrid[0:1, 0:1, 0:1, 0:1, 0:1, 0:1, 0:1, 0:1, 0:2]
        nl.load(a[i.p, i.x])
        return a

    with pytest.raises(nki.KernelError) as info:
        nine_axes(np.ones((2, 2), np.float32))
    assert "index expression: ap(): pattern needs 1 to 8" in message(info)


def _adamw_step_of_torch(param: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    """param after one torch.optim.AdamW step with nikki.torch.adamw_'s defaults."""
    reference = torch.nn.Parameter(param.detach().clone())
    optimizer = torch.optim.AdamW([reference], lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2)
    reference.grad = grad.clone()
    optimizer.step()
    return reference.detach()


@pytest.mark.parametrize("shape", [(), (5,), (3, 4)])
def test_adamw_takes_what_torch_optim_takes(shape):
    torch.manual_seed(0)
    param = torch.nn.Parameter(torch.randn(shape))  # requires grad, as every optimizer's parameter
    grad = torch.randn(shape)
    expected = _adamw_step_of_torch(param, grad)
    exp_avg, exp_avg_sq = torch.zeros(shape), torch.zeros(shape)
    ntorch.adamw_(param, grad, exp_avg, exp_avg_sq, np.int64(1))
    # one fp32 step: the kernel's order of the same fp32 operations differs from torch's by ulps
    torch.testing.assert_close(param.detach(), expected, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(exp_avg, 0.1 * grad, rtol=1e-6, atol=0)


def test_adamw_of_an_empty_parameter_does_nothing_and_a_broadcast_one_is_named():
    empty = torch.zeros(0)
    ntorch.adamw_(empty, empty, empty, empty, 1)  # torch.optim.AdamW steps over empty parameters too
    assert empty.shape == (0,)
    grad = torch.ones(4)
    with pytest.raises(nki.KernelError) as info:
        ntorch.adamw_(torch.ones(1).expand(4), grad, torch.zeros(4), torch.zeros(4), 1)
    assert "nikki.torch.adamw_: param must be a tensor that can be written in place, got a view repeating" \
        in message(info)
    with pytest.raises(nki.KernelError) as info:
        ntorch.adamw_(torch.ones(4), grad, torch.zeros(1).expand(4), torch.zeros(4), 1)
    assert "nikki.torch.adamw_: exp_avg must be a tensor that can be written in place" in message(info)


def test_a_library_input_of_a_dtype_no_input_takes_is_named():
    with pytest.raises(nki.KernelError) as info:
        ntorch.matmul(torch.ones(4, 8, dtype=torch.int32), torch.ones(8, 4, dtype=torch.int32))
    assert "kernel 'matmul': input 'a' has dtype int32" in message(info)
    assert "matmul takes float32, bfloat16, float16" in message(info)
    with pytest.raises(nki.KernelError) as info:
        nk.softmax(np.ones((4, 8), np.int8))
    assert "kernel 'softmax': input 'x' has dtype int8" in message(info)
