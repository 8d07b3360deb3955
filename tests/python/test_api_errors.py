"""User-facing errors of the Python layer and representative verifier errors surfaced through it.

Each error must be a nikki.KernelError (a ValueError) whose message names the problem, the user's
file and line, shows that source line with a caret under the offending call, and whose traceback
holds none of nikki's own frames except the jit entry frame that re-raised it. NotImplementedError
for an unsupported API names the API. The line each kernel fails on is marked with ``# E:<name>``.
"""

import inspect
import linecache
import os
import traceback

import numpy as np
import pytest
import torch

import nikki as nki
import nikki.isa as nisa
import nikki.language as nl

NIKKI_DIR = os.path.dirname(os.path.abspath(nki.__file__))
A = np.zeros((4, 8), np.float32)


def line_of(tag: str) -> int:
    """Line number of the source line marked ``# E:<tag>`` in this file."""
    with open(__file__) as f:
        for number, text in enumerate(f, 1):
            if text.rstrip().endswith(f"# E:{tag}"):
                return number
    raise AssertionError(f"no line tagged {tag}")


def nikki_frames(err) -> list:
    return [f.name for f in traceback.extract_tb(err.__traceback__) if f.filename.startswith(NIKKI_DIR)]


def check_error(err, tag, *fragments, caret=True, entry=("__call__",)):
    """err is a located KernelError for the line tagged `tag`, mentioning every fragment."""
    assert isinstance(err, nki.KernelError) and isinstance(err, ValueError)
    text = str(err)
    for fragment in fragments:
        assert fragment in text, f"{fragment!r} not in:\n{text}"
    assert err.file == __file__ and err.line == line_of(tag), (err.file, err.line)
    assert f'File "{__file__}", line {err.line}' in text
    source = linecache.getline(__file__, err.line).strip()
    assert source in text  # the user's line is shown...
    if caret:  # ...with a caret under the call
        caret_line = text.splitlines()[text.splitlines().index("    " + source) + 1]
        assert caret_line.strip() and set(caret_line.strip()) == {"^"}
    assert set(nikki_frames(err)) <= set(entry), nikki_frames(err)


def store(t):
    out = nl.ndarray(t.shape, t.dtype, buffer=nl.shared_hbm)
    nl.store(out, t)
    return out


def raises(kernel_fn, *args, exc=nki.KernelError, **jit_kwargs):
    with pytest.raises(exc) as info:
        nki.jit(kernel_fn, **jit_kwargs)(*(args or (A,)))
    return info.value


# --- kernels with one mistake each (the failing line is tagged) ------------------------------

def k_register_truth(a):
    r = nisa.register_alloc(1)
    if r:  # E:register_truth
        pass


def k_bad_operand(a):
    t = nl.load(a)
    nisa.tensor_scalar(dst=t, data=t, op0=nl.add, operand0="one")  # E:bad_operand


def k_bad_engine(a):
    t = nl.load(a)
    nisa.tensor_copy(dst=t, src=t, engine=42)  # E:bad_engine


def k_not_a_tensor(a):
    nisa.tensor_copy(dst=3, src=nl.load(a))  # E:not_a_tensor


def k_op1_without_operand1(a):
    t = nl.load(a)
    nisa.tensor_scalar(dst=t, data=t, op0=nl.add, operand0=1.0, op1=nl.multiply)  # E:op1_alone


def k_reduce_res_without_op(a):
    t = nl.load(a)
    r = nl.ndarray((4, 1), nl.float32)
    nisa.activation(dst=t, op=nl.exp, data=t, reduce_res=r)  # E:reduce_res_alone


def k_bad_reduce_cmd(a):
    t = nl.load(a)
    nisa.activation(dst=t, op=nl.exp, data=t, reduce_cmd=7)  # E:bad_reduce_cmd


def k_axis_out_of_range(a):
    t = nl.load(a)
    nisa.tensor_reduce(dst=nl.ndarray((4, 1), nl.float32), op=nl.add, data=t, axis=3)  # E:axis_range


def k_tile_position_alone(a):
    p = nl.ndarray((8, 8), nl.float32, buffer=nl.psum)
    nisa.nc_matmul(p, nl.load(a), nl.load(a), tile_position=(0, 0))  # E:tile_alone


def k_tile_illegal(a):
    p = nl.ndarray((8, 8), nl.float32, buffer=nl.psum)
    nisa.nc_matmul(p, nl.load(a), nl.load(a), tile_position=(32, 0), tile_size=(64, 128))  # E:tile_illegal


def k_transpose_3d(a):
    nl.transpose(nl.zeros((4, 2, 2), nl.float32))  # E:transpose_3d


def k_bad_pattern(a):
    nisa.iota(nl.ndarray((4, 8), nl.int32), pattern=[1, 8])  # E:bad_pattern


def k_alu_given_activation(a):
    t = nl.load(a)
    nisa.tensor_tensor(dst=t, data1=t, data2=t, op=nl.exp)  # E:alu_act


def k_activation_given_alu(a):
    nisa.activation(op=nl.add, data=nl.load(a))  # E:act_alu


def k_not_an_operator(a):
    t = nl.load(a)
    nisa.tensor_scalar(dst=t, data=t, op0="add", operand0=1.0)  # E:not_op


def k_shape_not_ints(a):
    nl.ndarray("big", nl.float32)  # E:shape_not_ints


def k_zero_extent(a):
    nl.ndarray((4, 0), nl.float32)  # E:zero_extent


def k_address_on_hbm(a):
    nl.ndarray((4, 8), nl.float32, buffer=nl.shared_hbm, address=(0, 0))  # E:address_hbm


def k_full_on_hbm(a):
    nl.full((4, 8), 1.0, nl.float32, buffer=nl.shared_hbm)  # E:full_hbm


def k_string_buffer(a):
    nl.ndarray((4, 8), nl.float32, buffer="sbuf")  # E:string_buffer


def k_not_a_buffer(a):
    nl.zeros((4, 8), nl.float32, buffer=5)  # E:not_buffer


def k_loop_step(a):
    nl.fori_loop(0, 4, lambda i: None, step=0)  # E:loop_step


def k_program_id(a):
    nl.program_id(1)  # E:program_id


def k_num_programs(a):
    nl.num_programs(2)  # E:num_programs


def k_binary_no_tensor(a):
    nl.add(1.0, 2.0)  # E:no_tensor


def k_binary_broadcast(a):
    nl.multiply(nl.load(a), nl.zeros((4, 3), nl.float32))  # E:broadcast


def k_softmax_axis(a):
    nl.softmax(nl.load(a), axis=0)  # E:softmax_axis


def k_load_from_sbuf(a):
    nl.load(nl.load(a))  # E:load_sbuf


def k_store_to_sbuf(a):
    t = nl.load(a)
    nl.store(t, t)  # E:store_sbuf


def k_slice_out_of_bounds(a):
    nl.load(a[0:5, :])  # E:slice_oob


def k_bad_reshape(a):
    a.reshape((5, 7))  # E:bad_reshape


def k_tensor_truth(a):
    if nl.load(a) > 0:  # E:tensor_truth
        pass


def k_tensor_subscript(a):
    t = nl.load(a)
    a[t]  # E:tensor_subscript


def k_none_subscript(a):
    a[None]  # E:none_subscript


def k_two_runtime_subscripts(a):
    r = nisa.register_alloc(0)
    a[r, r]  # E:two_runtime


def k_runtime_index_of_indirect_view(a):
    r = nisa.register_alloc(0)
    a.ap([[8, 4], [1, 8]], scalar_offset=r)[r]  # E:indirect_twice


def k_select_big_index(a):
    a.select(0, nl.load(a))  # E:select_big


def k_broadcast_to_rank(a):
    nl.load(a[:, 0:1]).broadcast_to((4, 8, 2))  # E:broadcast_rank


def k_ap_pattern(a):
    a.ap(pattern=[8, 4])  # E:ap_pattern


def k_ap_both_offsets(a):
    idx = nl.zeros((4, 1), nl.int32)
    a.ap([[8, 4], [1, 8]], scalar_offset=nisa.register_alloc(0), vector_offset=idx)  # E:ap_both


def k_ap_indirect_dim(a):
    a.ap([[8, 4], [1, 8]], scalar_offset=nisa.register_alloc(0), indirect_dim=2)  # E:ap_indirect_dim


def k_ap_scalar_shape(a):
    a.ap([[8, 4], [1, 8]], scalar_offset=nl.zeros((2, 1), nl.int32))  # E:ap_scalar_shape


def k_ap_scalar_type(a):
    a.ap([[8, 4], [1, 8]], scalar_offset=3)  # E:ap_scalar_type


def k_ap_vector_type(a):
    a.ap([[8, 4], [1, 8]], vector_offset=3)  # E:ap_vector_type


def k_ap_vector_dim(a):
    a.ap([[8, 4], [1, 8]], vector_offset=nl.zeros((4, 1), nl.int32), indirect_dim=1)  # E:ap_vector_dim


@pytest.mark.parametrize("kernel,tag,fragments", [
    (k_register_truth, "register_truth", ["a register's value is only known at run time", "nl.fori_loop"]),
    (k_bad_operand, "bad_operand", ["operand0 must be a number, got 'one'"]),
    (k_bad_engine, "bad_engine", ["engine=42 is not an engine"]),
    (k_not_a_tensor, "not_a_tensor", ["dst must be a tensor, got int"]),
    (k_op1_without_operand1, "op1_alone", ["op1 and operand1 must be given together"]),
    (k_reduce_res_without_op, "reduce_res_alone", ["activation: reduce_res needs reduce_op"]),
    (k_bad_reduce_cmd, "bad_reduce_cmd", ["reduce_cmd=7 is not a reduce command", "nisa.reduce_cmd.idle"]),
    (k_axis_out_of_range, "axis_range", ["axis 3 is out of range for data of rank 2"]),
    (k_tile_position_alone, "tile_alone", ["tile_position and tile_size must be given together"]),
    (k_tile_illegal, "tile_illegal", ["is not a legal PE-array tile", "multiple of the tile size"]),
    (k_transpose_3d, "transpose_3d", ["nl.transpose: the tile has shape (4, 2, 2)", "2-D"]),
    (k_bad_pattern, "bad_pattern", ["pattern must be a list of [step, num] pairs"]),
    (k_alu_given_activation, "alu_act", ["op=nl.exp is an activation function, not an ALU operator"]),
    (k_activation_given_alu, "act_alu", ["op=nl.add is an ALU operator, not an activation function"]),
    (k_not_an_operator, "not_op", ["op0='add' is not an ALU operator"]),
    (k_shape_not_ints, "shape_not_ints", ["shape 'big' is not a tuple of integers"]),
    (k_zero_extent, "zero_extent", ["nl.ndarray shape (4, 0) must have positive extents"]),
    (k_address_on_hbm, "address_hbm", ["address= is only meaningful for sbuf and psum tensors, not shared_hbm"]),
    (k_full_on_hbm, "full_hbm", ["creating an HBM tensor (shared_hbm) with an initial value is not supported"]),
    (k_string_buffer, "string_buffer", ["buffer='sbuf': string buffer names are not supported", "buffer=nl.sbuf"]),
    (k_not_a_buffer, "not_buffer", ["buffer=5 is not a memory region"]),
    (k_loop_step, "loop_step", ["loop step 0 must be a positive compile-time integer"]),
    (k_program_id, "program_id", ["program_id(1) is out of range for a launch grid of 0 dims"]),
    (k_num_programs, "num_programs", ["num_programs(2) is out of range"]),
    (k_binary_no_tensor, "no_tensor", ["nl.add: x or y must be a tensor, got 1.0 and 2.0"]),
    (k_binary_broadcast, "broadcast", ["nl.multiply: shapes (4, 8) and (4, 3) do not broadcast"]),
    (k_softmax_axis, "softmax_axis", ["nl.softmax: axis=0 is not the last free axis"]),
    (k_load_from_sbuf, "load_sbuf", ["Expected operand 'src' of 'load' to be in address space 'hbm'"]),
    (k_store_to_sbuf, "store_sbuf", ["Expected operand 'dst' of 'store' to be in address space 'hbm'"]),
    (k_slice_out_of_bounds, "slice_oob",
     ["tensor 'a': out-of-bound access on dim 0: index range [0, 4] exceeds dimension size 4"]),
    (k_bad_reshape, "bad_reshape", ["cannot reshape a view of shape [4, 8] (32 elements) to [5, 7]"]),
    (k_tensor_truth, "tensor_truth", ["Cannot evaluate truth value of a multi-element tensor"]),
    (k_tensor_subscript, "tensor_subscript", ["subscript is a tensor of shape (4, 8)", "vector_offset"]),
    (k_none_subscript, "none_subscript", ["unsupported subscript None"]),
    (k_two_runtime_subscripts, "two_runtime", ["only one subscript of a view may be a runtime index"]),
    (k_runtime_index_of_indirect_view, "indirect_twice",
     ["a view with runtime offsets cannot take another runtime index"]),
    (k_select_big_index, "select_big", ["select(): index is a tensor of shape (4, 8)"]),
    (k_broadcast_to_rank, "broadcast_rank", ["broadcast_to(4, 8, 2) needs rank 2"]),
    (k_ap_pattern, "ap_pattern", ["ap(): pattern must be a list of [stride, count] pairs"]),
    (k_ap_both_offsets, "ap_both", ["scalar_offset and vector_offset are mutually exclusive"]),
    (k_ap_indirect_dim, "ap_indirect_dim", ["indirect_dim 2 is out of range for a tensor of rank 2"]),
    (k_ap_scalar_shape, "ap_scalar_shape", ["scalar_offset must be a 1x1 tensor, got shape (2, 1)"]),
    (k_ap_scalar_type, "ap_scalar_type", ["scalar_offset must be a register or a 1x1 tensor"]),
    (k_ap_vector_type, "ap_vector_type", ["vector_offset must be an SBUF index tensor"]),
    (k_ap_vector_dim, "ap_vector_dim", ["vector_offset supports only indirect_dim=0"]),
], ids=lambda v: v if isinstance(v, str) else "")
def test_python_layer_errors(kernel, tag, fragments):
    # a truth test spans its whole `if` statement: the line is shown without a caret
    check_error(raises(kernel), tag, *fragments, caret=not tag.endswith("_truth"))


# --- verifier errors surfaced through Python ---------------------------------------------------

def v_partitions(a):
    return store(nl.exp(nl.zeros((256, 4), nl.float32)))  # E:v_partitions


def v_write_input(a):
    nl.store(a, nl.zeros((4, 8), nl.float32))  # E:v_write_input
    return store(nl.load(a))


def v_contraction(a):
    x, y = nl.zeros((4, 4), nl.float32), nl.zeros((8, 4), nl.float32)
    return store(nl.matmul(x, y, transpose_x=True))  # E:v_contraction


def v_moving_too_wide(a):
    p = nl.ndarray((4, 1024), nl.float32, buffer=nl.psum)
    nisa.nc_matmul(p, nl.zeros((4, 4), nl.float32), nl.zeros((4, 1024), nl.float32))  # E:v_moving
    return store(p)


def v_sbuf_capacity(a):
    big = nl.zeros((128, 60000), nl.float32)  # E:v_capacity
    return store(big[:, 0:4])


def v_bitvec_float(a):
    t = nl.load(a)
    nisa.tensor_tensor(dst=t, data1=t, data2=t, op=nl.bitwise_and)  # E:v_bitvec
    return store(t)


def v_gpsimd_psum(a):
    p = nl.zeros((4, 8), nl.float32, buffer=nl.psum)
    nisa.iota(p, pattern=[[1, 8]])  # E:v_gpsimd_psum
    return store(p)


def v_reduce_partition_axis(a):
    return store(nl.sum(nl.load(a), axis=0))  # E:v_reduce_axis0


def v_ap_out_of_bounds(a):
    t = nl.ndarray((4, 8), nl.float32)
    nisa.dma_copy(dst=t, src=a.ap([[8, 4], [1, 8]], offset=4))  # E:v_ap_oob
    return store(t)


def v_never_written(a):
    out = nl.ndarray((4, 8), nl.float32, buffer=nl.shared_hbm)  # E:v_never_written
    return out


def v_predicate_dtype(a):
    t = nl.load(a)
    nisa.tensor_copy_predicated(dst=t, src=t, predicate=t)  # E:v_predicate
    return store(t)


def v_register_never_set(a):
    row = nisa.register_alloc()
    t = nl.ndarray((1, 8), nl.float32)
    nisa.dma_copy(dst=t, src=a.ap([[8, 1], [1, 8]], scalar_offset=row))  # E:v_register_unset
    return store(t)


@pytest.mark.parametrize("kernel,tag,fragments", [
    (v_partitions, "v_partitions", ["number of partitions 256", "exceeds the architecture limit of 128",
                                    "pmax = 128"]),
    (v_write_input, "v_write_input", ["cannot write to kernel input 'a'", "nt.mutable_tensor"]),
    (v_contraction, "v_contraction", ["nc_matmul: contraction sizes differ"]),
    (v_moving_too_wide, "v_moving", ["nc_matmul", "1024"]),
    (v_sbuf_capacity, "v_capacity", ["bytes per partition"]),
    (v_bitvec_float, "v_bitvec", ["bitwise operator bitwise_and needs integer tiles"]),
    (v_gpsimd_psum, "v_gpsimd_psum", ["PSUM", "GpSimd"]),
    (v_reduce_partition_axis, "v_reduce_axis0", ["cannot reduce over axis 0, the partition dim"]),
    (v_ap_out_of_bounds, "v_ap_oob", ["out-of-bound access for tensor 'a'"]),
    (v_never_written, "v_never_written", ["output tensor 'out' is never written"]),
    (v_predicate_dtype, "v_predicate", ["predicate has dtype float32", "uint8"]),
    (v_register_never_set, "v_register_unset", ["register r0 (the runtime offset of src) is read but never set",
                                                  "nisa.register_alloc(value)"]),
], ids=lambda v: v if isinstance(v, str) else "")
def test_verifier_errors(kernel, tag, fragments):
    check_error(raises(kernel), tag, *fragments)


def test_runtime_offset_error_is_located():
    def k(a, idx):
        t = nl.ndarray((1, 8), nl.float32)
        nisa.dma_copy(dst=t, src=a.ap([[8, 1], [1, 8]], scalar_offset=nl.load(idx)))  # E:runtime_oob
        return store(t)

    err = raises(k, A, np.array([[9]], np.int32))
    check_error(err, "runtime_oob", "runtime offset out of bounds", "check the values of the offset register")


# --- errors about how a kernel is declared, called and what it returns -----------------------

def test_keyword_only_parameter():
    with pytest.raises(nki.KernelError) as info:
        @nki.jit  # E:kwonly
        def k(a, *, scale):
            return a

    check_error(info.value, "kwonly", "keyword-only parameter 'scale' is not supported", "remove the '*'",
                entry=("jit",))


def test_bad_launch_grid():
    k = nki.jit(lambda a: store(nl.load(a)))
    with pytest.raises(nki.KernelError) as info:
        k[0](A)  # E:bad_grid
    check_error(info.value, "bad_grid", "launch grid (0,) must be positive integers", entry=("__getitem__",))


def test_returns_no_output():
    def k(a):  # E:no_output
        nl.load(a)

    check_error(raises(k), "no_output", "kernel 'k' returns no output", "buffer=nl.shared_hbm", caret=False)


def test_returns_a_number():
    def k(a):
        return 3  # E:returns_int

    check_error(raises(k), "returns_int", "kernel 'k' returns int; kernels return tensors")


def test_returns_an_sbuf_tile_or_a_view():
    def k(a):
        t = nl.load(a)
        return t  # E:returns_sbuf

    check_error(raises(k), "returns_sbuf", "kernel 'k' returns tensor 't' in sbuf",
                "kernel outputs are whole tensors allocated in shared_hbm")

    def k2(a):
        out = store(nl.load(a))
        return out[0:2]  # E:returns_view

    check_error(raises(k2), "returns_view", "returns a view of tensor 'out' in shared_hbm")


def test_program_instances_return_different_outputs():
    def k(a):
        o1 = store(nl.load(a))
        o2 = store(nl.load(a))
        return o1 if nl.program_id(0) == 0 else (o1, o2)  # E:spmd_outputs

    with pytest.raises(nki.KernelError) as info:
        nki.jit(k)[2](A)
    check_error(info.value, "spmd_outputs", "program instances (0,) and (1,) return different outputs")


@pytest.mark.parametrize("arg,fragment", [
    ([1, 2], "argument 'a' is a list; kernel arguments are tensors or compile-time constants"),
    (np.zeros((2, 2)), "argument 'a': numpy dtype float64 is not supported: NKI has no float64"),
    (np.zeros((2, 2), np.int64), "numpy dtype int64 is not supported"),
    (torch.zeros(2, 2, dtype=torch.float64), "torch dtype float64 is not supported"),
    (torch.zeros(2, 2, device="meta"), "argument 'a' is a torch tensor on meta; nikki runs on CPU tensors"),
])
def test_bad_arguments_point_at_the_call(arg, fragment):
    k = nki.jit(lambda a: store(nl.load(a)))
    with pytest.raises(nki.KernelError) as info:
        k(arg)  # E:bad_argument
    check_error(info.value, "bad_argument", fragment)


def test_unknown_target_points_at_the_call():
    k = nki.jit(lambda a: store(nl.load(a)), target="trn9")
    with pytest.raises(nki.KernelError) as info:
        k(A)  # E:bad_target
    check_error(info.value, "bad_target", "unknown target 'trn9'", "trn1")


def test_bad_target_environment(monkeypatch):
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "gen9")
    k = nki.jit(lambda a: store(nl.load(a)))
    with pytest.raises(nki.KernelError) as info:
        k(A)  # E:bad_env_target
    check_error(info.value, "bad_env_target", "unknown target 'gen9'")


def test_api_outside_a_kernel():
    with pytest.raises(nki.KernelError) as info:
        nl.ndarray((4, 4), nl.float32)  # E:outside
    err = info.value
    assert "nl.ndarray called outside of a kernel" in str(err) and "@nki.jit" in str(err)
    assert err.file == __file__ and err.line == line_of("outside")


def test_typo_in_keyword_is_an_error_not_ignored():
    def k(a):
        nl.exp(nl.load(a), dtyp=nl.bfloat16)  # E:typo

    with pytest.raises(TypeError, match="unexpected keyword argument 'dtyp'") as info:
        nki.jit(k)(A)
    frames = traceback.extract_tb(info.value.__traceback__)
    assert frames[-1].lineno == line_of("typo")  # the user's line is the innermost frame
    assert set(nikki_frames(info.value)) <= {"__call__"}


def test_user_exception_inside_kernel_keeps_only_user_frames():
    def k(a):
        assert a.shape == (1, 1), "wrong shape"  # E:user_assert

    with pytest.raises(AssertionError, match="wrong shape") as info:
        nki.jit(k)(A)
    assert traceback.extract_tb(info.value.__traceback__)[-1].lineno == line_of("user_assert")
    assert set(nikki_frames(info.value)) <= {"__call__"}


def test_nki_validation_error_catches_nikki_errors():
    with pytest.raises(nisa.NkiValidationError):
        nki.jit(v_partitions)(A)


def test_kernel_error_pickles_and_keeps_fields():
    import pickle

    err = raises(k_zero_extent)
    copy = pickle.loads(pickle.dumps(err))
    assert isinstance(copy, nki.KernelError) and str(copy) == str(err) and copy.line == err.line


# --- unsupported APIs --------------------------------------------------------------------------

def u_tsr_cmd(a):
    t = nl.load(a)
    nisa.tensor_scalar_reduce(dst=t, data=t, op0=nl.add, operand0=1.0, reduce_op=nl.add,  # E:u_tsr_cmd
                              reduce_res=nl.ndarray((4, 1), nl.float32), reduce_cmd=nisa.reduce_cmd.reduce)


def u_tsr_no_res(a):
    t = nl.load(a)
    nisa.tensor_scalar_reduce(dst=t, data=t, op0=nl.add, operand0=1.0, reduce_op=nl.add)  # E:u_tsr_no_res


def u_while_loop(a):
    nl.while_loop(nisa.register_alloc(1), lambda: None)  # E:u_while_loop


@pytest.mark.parametrize("kernel,tag,api", [
    (u_tsr_cmd, "u_tsr_cmd", "tensor_scalar_reduce with reduce_cmd"),
    (u_tsr_no_res, "u_tsr_no_res", "tensor_scalar_reduce(reduce_res=None)"),
    (u_while_loop, "u_while_loop", "nl.while_loop"),
], ids=lambda v: v if isinstance(v, str) else "")
def test_unsupported_isa_features_name_the_api(kernel, tag, api):
    err = raises(kernel, exc=NotImplementedError)
    assert api in str(err) and "not supported by nikki" in str(err)
    assert traceback.extract_tb(err.__traceback__)[-1].lineno == line_of(tag)
    assert set(nikki_frames(err)) <= {"__call__"}


@pytest.mark.parametrize("name", ["rand", "random_seed", "dropout", "atomic_rmw", "all_reduce", "gemm_grid",
                                  "gemm_stationary_grid"])
def test_unsupported_language_functions_name_the_api(name):
    fn = getattr(nl, name)
    required = [p.name for p in inspect.signature(fn).parameters.values() if p.default is p.empty]

    def k(a):  # called as its NKI signature says, every required parameter a tile
        fn(**{param: nl.load(a) for param in required})

    err = raises(k, exc=NotImplementedError)
    assert f"nl.{name} is not supported by nikki" in str(err)
    assert set(nikki_frames(err)) <= {"__call__"}


@pytest.mark.parametrize("entry", ["simulate", "simulate_kernel", "baremetal"])
def test_errors_through_other_entry_points_stay_located(entry, monkeypatch):
    monkeypatch.setattr(nki.entry, "_said_baremetal", True)  # keep stderr quiet
    runner = {
        "simulate": lambda: nki.simulate(k_zero_extent)(A),
        "simulate_kernel": lambda: nki.simulate_kernel(k_zero_extent, A),
        "baremetal": lambda: nki.baremetal(k_zero_extent)(A),
    }[entry]
    with pytest.raises(nki.KernelError) as info:
        runner()
    check_error(info.value, "zero_extent", "must have positive extents",
                entry=("__call__", "simulate_kernel", "run"))
    assert len(nikki_frames(info.value)) <= 1
