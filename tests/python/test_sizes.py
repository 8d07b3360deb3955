"""Sizes the machine cannot hold fail at once with a KernelError located at the user's line:
extents whose products overflow int64, Python integers beyond int64, empty inputs, tensors over
the device's HBM, kernels that unroll past the instruction budget, SPMD grids past the program
limit, and launches whose host buffers exceed the host's memory. The line each call fails on is
marked with ``# E:<name>``."""

import os
import resource
import time

import numpy as np
import pytest
import torch

import nikki as nki
import nikki.isa as nisa
import nikki.kernels as K
import nikki.language as nl
import nikki.torch as ntorch
from nikki import kernel as kernel_module

X = np.arange(128 * 4, dtype=np.float32).reshape(128, 4)
INT64_LIMIT = "must fit in a signed 64-bit integer (at most 9223372036854775807)"


def check_error(err, line, *fragments):
    """err is a KernelError located at `line` of this file whose text holds every fragment."""
    assert isinstance(err, nki.KernelError)
    text = str(err)
    for fragment in fragments:
        assert fragment in text, f"{fragment!r} not in:\n{text}"
    assert (err.file, err.line) == (__file__, line), (err.file, err.line, text)


def error_of(call):
    with pytest.raises(nki.KernelError) as info:
        call()
    return info.value


def store(t):
    out = nl.ndarray(t.shape, t.dtype, buffer=nl.shared_hbm)
    nl.store(out, t)
    return out


# --- shape arithmetic ---------------------------------------------------------------------------

def test_shapes_whose_size_overflows_int64_are_rejected_with_the_shape(line_of):
    @nki.jit
    def aliased(a):
        big = nl.ndarray((2**62 + 1, 4), nl.float32, buffer=nl.shared_hbm)  # E:wraps_to_4
        nl.store(big[2**62], nl.load(a[0]))  # with a wrapped size this wrote row 0
        return big

    check_error(error_of(lambda: aliased(X)), line_of("wraps_to_4"), "tensor 'big' of shape [4611686018427387905, "
                "4] and dtype float32 has more bytes than a 64-bit integer can count", INT64_LIMIT)

    @nki.jit
    def wide(a):
        return nl.ndarray((2**32 + 1, 2**32), nl.float32, buffer=nl.shared_hbm)  # E:wide

    err = error_of(lambda: wide(X))
    check_error(err, line_of("wide"), "shape [4294967297, 4294967296]", INT64_LIMIT)
    assert "-1 elements" not in str(err)


def test_python_integers_beyond_int64_are_kernel_errors_not_binding_errors(line_of):
    @nki.jit
    def huge_extent(a):
        return nl.ndarray((2**63, 4), nl.float32, buffer=nl.shared_hbm)  # E:extent

    check_error(error_of(lambda: huge_extent(X)), line_of("extent"), "shape (9223372036854775808, 4): extent "
                "9223372036854775808 does not fit in a signed 64-bit integer", INT64_LIMIT)

    @nki.jit
    def huge_index(a):
        t = nl.load(a[2**63:, :])  # E:index
        return store(t)

    check_error(error_of(lambda: huge_index(X)), line_of("index"), "slice start 9223372036854775808 does not fit")

    @nki.jit
    def huge_broadcast(a):
        v = a[:, 0:1].broadcast(1, 2**64)  # E:broadcast
        return store(nl.load(a))

    check_error(error_of(lambda: huge_broadcast(X)), line_of("broadcast"),
                "broadcast size 18446744073709551616 does not fit")

    @nki.jit
    def huge_reshape(a):
        v = a.reshape((2**40, 2**40))  # E:reshape
        return store(nl.load(a))

    check_error(error_of(lambda: huge_reshape(X)), line_of("reshape"), "cannot reshape to [1099511627776, "
                "1099511627776]: it has more elements than a 64-bit integer can count")

    @nki.jit
    def huge_pattern(a):
        v = a.ap([[2**62, 3], [1, 4]])  # E:pattern
        return store(nl.load(a))

    check_error(error_of(lambda: huge_pattern(X)), line_of("pattern"), "reaches offsets that overflow a 64-bit integer")

    @nki.jit
    def huge_iota(a):
        t = nl.ndarray((128, 4), nl.int32, buffer=nl.sbuf)
        nisa.iota(t, [[1, 4]], offset=2**64)  # E:iota
        return store(t)

    check_error(error_of(lambda: huge_iota(X)), line_of("iota"), "offset 18446744073709551616 does not fit")

    @nki.jit
    def far_address(a):
        t = nl.ndarray((128, 4), nl.float32, buffer=nl.sbuf, address=(0, 2**40))  # E:address
        return store(t)

    check_error(error_of(lambda: far_address(X)), line_of("address"),
                "tensor 't': address (0, 1099511627776) is outside the memory")


def test_input_specs_beyond_int64_are_kernel_errors():
    @nki.jit
    def copy(a):
        return store(nl.load(a[0:128, 0:4]))

    err = error_of(lambda: copy.specialize(nki.spec((2**63, 4), nl.float32)))
    assert "tensor 'a': shape (9223372036854775808, 4): extent 9223372036854775808 does not fit" in str(err)
    err = error_of(lambda: copy.specialize(nki.spec((2**40, 2**30), nl.float32)))
    assert "tensor 'a' of shape [1099511627776, 1073741824] and dtype float32 has more bytes than" in str(err)
    err = error_of(lambda: nki.estimate(K.softmax, nki.spec((2**63, 4), nl.float32)))
    assert "kernel 'softmax': input 'x': shape (9223372036854775808, 4): extent" in str(err)


# --- empty inputs ---------------------------------------------------------------------------------

def test_library_kernels_reject_empty_inputs_naming_the_input_and_its_shape(line_of):
    a, b = np.zeros((130, 0), np.float32), np.zeros((0, 70), np.float32)
    fragments = ("kernel 'matmul': input 'a' has shape [130, 0] with no elements",
                 "library kernels take inputs with every extent >= 1")
    err = error_of(lambda: K.matmul(a, b))  # E:matmul_call
    check_error(err, line_of("matmul_call"), *fragments)
    err = error_of(lambda: nki.estimate(K.matmul, a, b))  # E:matmul_estimate
    check_error(err, line_of("matmul_estimate"), *fragments)
    err = error_of(lambda: ntorch.library_op("matmul")(torch.zeros(130, 0), torch.zeros(0, 70)))
    assert fragments[0] in str(err)

    @nki.jit
    def inlined(x, y):
        return K.matmul(x, y)  # E:matmul_inlined

    check_error(error_of(lambda: inlined(a, b)), line_of("matmul_inlined"), *fragments)


def test_an_empty_jit_input_may_be_passed_but_not_read(line_of):
    empty = np.zeros((130, 0), np.float32)

    @nki.jit
    def ignores(e, x):
        return store(nl.load(x))

    np.testing.assert_array_equal(ignores(empty, X), X)
    assert nki.estimate(ignores, empty, X).total_ns > 0

    @nki.jit
    def reads(e, x):
        t = nl.ndarray((128, 4), nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=e.ap([[4, 128], [1, 4]]))  # E:reads_empty
        return store(t)

    check_error(error_of(lambda: reads(empty, X)), line_of("reads_empty"),
                "src accesses tensor 'e' of shape [130, 0], which has no elements")


# --- HBM capacity, the instruction budget and SPMD grids -----------------------------------------

def test_hbm_scratch_over_the_device_memory_fails_at_once(line_of):
    @nki.jit
    def scratch(a):
        s = nl.ndarray((2**38, 4), nl.float32, buffer=nl.private_hbm)  # E:scratch_4tib
        nl.store(s[0:128, :], nl.load(a))
        return store(nl.load(s[0:128, :]))

    start = time.monotonic()
    err = error_of(lambda: scratch(X))
    assert time.monotonic() - start < 5
    check_error(err, line_of("scratch_4tib"), "private_hbm tensor 's' of shape [274877906944, 4] float32 needs 4 "
                "TiB, more than the device memory of trn2",
                "96 GiB of device memory (HBM) per trn2 chip, shared by its 8 NeuronCores")
    err = error_of(lambda: scratch.with_target("trn1")(X))
    assert "32 GiB of device memory (HBM) per trn1 chip, shared by its 2 NeuronCores" in str(err)


def test_hbm_scratch_in_use_costs_what_the_kernel_touches():
    @nki.jit
    def sparse(a):
        s = nl.ndarray((2**24, 1024), nl.float32, buffer=nl.private_hbm)  # 64 GiB
        nl.store(s[2**23:2**23 + 128, 1020:1024], nl.load(a))
        return store(nl.load(s[2**23:2**23 + 128, 1020:1024]))

    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    np.testing.assert_array_equal(sparse(X), X)
    assert (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024 < 256 * 2**20


def test_broadcast_inputs_over_the_device_memory_are_rejected_before_a_copy(monkeypatch):
    def no_copy(*args, **kwargs):
        raise AssertionError("the input was materialised before the size check")

    monkeypatch.setattr(np, "ascontiguousarray", no_copy)

    @nki.jit(target="trn1")
    def corner(a):
        return store(nl.load(a[0:128, 0:4]))

    big = np.broadcast_to(np.float32(1), (2**18, 2**16))  # 64 GiB as a contiguous array
    err = error_of(lambda: corner(big))
    assert "input tensor 'a' of shape [262144, 65536] float32 needs 64 GiB, more than the device memory of trn1" \
        in str(err)
    err = error_of(lambda: corner(torch.ones(1).expand(2**18 * 2**16).reshape(2**18, 2**16)))
    assert "needs 64 GiB, more than the device memory of trn1" in str(err)


def test_launch_buffers_over_the_host_memory_are_rejected_before_a_copy(monkeypatch, line_of):
    monkeypatch.setattr(kernel_module, "_host_available_bytes", lambda: 2**30)
    copied = []
    real_copy = np.ascontiguousarray
    monkeypatch.setattr(np, "ascontiguousarray", lambda a, *args, **kw: copied.append(a) or real_copy(a, *args, **kw))

    @nki.jit
    def corner(a):
        return store(nl.load(a[0:128, 0:4]))

    big = np.broadcast_to(np.float32(1), (2**16, 2**13))  # 2 GiB once copied; within trn2's HBM
    err = error_of(lambda: corner(big))  # E:host_memory
    check_error(err, line_of("host_memory"), "kernel 'corner' needs 2.0 GiB of host memory for its launch (a "
                "contiguous copy of argument 'a': 2.0 GiB, output 0 (128, 4): 2.0 KiB), but only 1.0 GiB is available",
                "strided or broadcast inputs, which are copied into contiguous arrays")
    assert copied == []
    np.testing.assert_array_equal(corner(np.ascontiguousarray(big[:128, :4])), np.ones((128, 4), np.float32))


def test_a_kernel_that_unrolls_past_the_instruction_budget_fails_at_the_instruction(monkeypatch, line_of):
    monkeypatch.setenv("NIKKI_MAX_INSTRUCTIONS", "40")

    @nki.jit
    def unrolled(a):
        t = nl.ndarray((128, 4), nl.float32, buffer=nl.sbuf)
        for i in range(60):
            nisa.memset(t, float(i))  # E:unrolled
        return store(t)

    check_error(error_of(lambda: unrolled(X)), line_of("unrolled"),
                "kernel 'unrolled' unrolls into more than 40 instructions",
                "at most 40 instructions per kernel launch (NIKKI_MAX_INSTRUCTIONS)", "nl.fori_loop")
    # The library matmul of 65536^2 bf16 climbed to gigabytes before: now the estimate stops at the budget.
    spec = nki.spec((65536, 65536), nl.bfloat16)
    err = error_of(lambda: nki.estimate(K.matmul, spec, spec))  # E:matmul_budget
    check_error(err, line_of("matmul_budget"), "kernel 'matmul' unrolls into more than 40 instructions")


def test_spmd_instances_share_the_instruction_budget(monkeypatch):
    @nki.jit
    def add(a):
        return store(nl.add(nl.load(a), float(nl.program_id(0))))

    monkeypatch.setenv("NIKKI_MAX_INSTRUCTIONS", "15")  # a load, an add and a store per instance
    np.testing.assert_array_equal(add[5](X), X + 4)
    err = error_of(lambda: add[6](X))
    assert "the 6 program instances of kernel 'add' unroll into more than 15 instructions together" in str(err)


def test_grids_over_the_program_limit_fail_at_once(line_of):
    @nki.jit
    def add(a):
        return store(nl.load(a))

    start = time.monotonic()
    err = error_of(lambda: add[100000](X))  # E:grid_100k
    check_error(err, line_of("grid_100k"),
                "launch grid [100000] has 100000 program instances, more than nikki runs (4096)",
                "NIKKI_MAX_GRID_PROGRAMS", "nl.affine_range")
    check_error(error_of(lambda: add[10**9](X)), line_of("grid_1e9"), "1000000000 program instances")  # E:grid_1e9
    check_error(error_of(lambda: add[2**40, 2**40](X)), line_of("grid_2d"), "1208925819614629174706176")  # E:grid_2d
    assert time.monotonic() - start < 5


def test_the_grid_limit_follows_the_environment(monkeypatch):
    @nki.jit
    def add(a):
        return store(nl.add(nl.load(a), float(nl.program_id(0))))

    monkeypatch.setenv("NIKKI_MAX_GRID_PROGRAMS", "3")
    np.testing.assert_array_equal(add[3](X), X + 2)
    assert "more than nikki runs (3)" in str(error_of(lambda: add[4](X)))
    monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", "4")
    assert "launch grid [4] has 4 program instances" in str(error_of(lambda: add(X)))


def test_an_spmd_launch_holds_one_simulated_core_at_a_time():
    @nki.jit
    def add(a):
        return store(nl.add(nl.load(a), float(nl.program_id(0))))

    # Each simulated core has 28 MiB of SBUF: 256 instances kept 7 GiB before.
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    np.testing.assert_array_equal(add[256](X), X + 255)
    assert (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024 < 512 * 2**20
