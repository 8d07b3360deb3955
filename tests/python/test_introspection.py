"""Kernel introspection (Kernel.storages() / instructions(), bindings/src/program_introspection.cpp)
and the numpy-eager executor built on it (bench/python/numpy_eager.py), which must keep matching
nikki's results."""

import gc
import importlib.util
import json
import os

import ml_dtypes
import numpy as np
import pytest

import nikki as nki
import nikki.isa as nisa
import nikki.language as nl
from nikki import _core

HERE = os.path.dirname(os.path.abspath(__file__))
NUMPY_EAGER = os.path.join(HERE, "..", "..", "bench", "python", "numpy_eager.py")


def _numpy_eager():
    spec = importlib.util.spec_from_file_location("nikki_bench_numpy_eager", NUMPY_EAGER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@nki.jit
def probe(a, b):
    out = nl.ndarray((128, 32), nl.float32, buffer=nl.shared_hbm)
    x = nl.ndarray((128, 32), nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=x, src=a[128:256, 0:64:2])
    y = nl.ndarray((128, 32), nl.bfloat16, buffer=nl.sbuf)
    nisa.dma_copy(dst=y, src=b)
    nisa.tensor_scalar(dst=x[:, 8:16], data=x[:, 0:8], op0=nl.multiply, operand0=2.0, op1=nl.subtract,
                       operand1=1.0, reverse1=True)
    s = nl.ndarray((128, 1), nl.float32, buffer=nl.sbuf)
    nisa.tensor_reduce(dst=s, op=nl.maximum, data=x, axis=1, negate=True, keepdims=True)
    nisa.activation(dst=x, op=nl.exp, data=y, bias=s, scale=0.5)
    p = nl.ndarray((32, 32), nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=p, stationary=x, moving=x)
    nisa.tensor_copy(dst=x[0:32, :], src=p)
    nisa.dma_copy(dst=out, src=x)
    return out


def _probe_inputs(rng):
    a = rng.standard_normal((256, 64), dtype=np.float32)
    b = rng.standard_normal((128, 32)).astype(ml_dtypes.bfloat16)
    return a, b


def _probe_kernel(rng):
    return probe.specialize(*_probe_inputs(rng)).programs[0].kernel


def test_storages_describe_every_tensor(rng):
    k = _probe_kernel(rng)
    st = k.storages()
    by_name = {s["name"]: s for s in st}
    assert [s["id"] for s in st] == list(range(len(st)))
    assert by_name["a"] == {"id": 0, "name": "a", "buffer": "hbm", "dtype": "float32", "shape": (256, 64),
                            "role": "input", "writable": False, "address": None}
    assert by_name["b"]["dtype"] == "bfloat16" and by_name["b"]["role"] == "input"
    assert by_name["out"]["buffer"] == "shared_hbm" and by_name["out"]["role"] == "output"
    assert (by_name["x"]["buffer"], by_name["x"]["role"], by_name["x"]["shape"]) == ("sbuf", "scratch", (128, 32))
    assert by_name["p"]["buffer"] == "psum"
    # a compiled kernel is allocated: every on-chip storage has a (partition, byte offset)
    assert k.allocated
    assert all(isinstance(s["address"], tuple) for s in st if s["buffer"] in ("sbuf", "psum"))
    assert k.inputs == (by_name["a"]["id"], by_name["b"]["id"])
    assert k.outputs == (by_name["out"]["id"],)
    assert k.target == "trn2"


def test_instructions_in_program_order_with_views(rng):
    k = _probe_kernel(rng)
    ids = {s["name"]: s["id"] for s in k.storages()}
    insts = k.instructions()
    assert [i["opcode"] for i in insts] == ["dma_copy", "dma_copy", "tensor_scalar", "tensor_reduce", "activation",
                                            "nc_matmul", "tensor_copy", "dma_copy"]
    assert [i["index"] for i in insts] == list(range(k.num_instructions))
    assert [i["engine"] for i in insts][:6] == ["dma", "dma", "vector", "vector", "scalar", "tensor"]

    # a[128:256, 0:64:2]: offset 128 rows of 64, rows of stride 64, every other column
    load = insts[0]
    assert load["slots"] == ("dst", "src") and load["access"] == ("write", "read")
    assert load["operands"][0] == (ids["x"], "float32", 0, ((32, 128), (1, 32)))
    assert load["operands"][1] == (ids["a"], "float32", 128 * 64, ((64, 128), (2, 32)))
    view = load["operands"][1]
    assert isinstance(view, _core.TensorView)
    assert (view.storage, view.dtype, view.offset, view.pattern) == tuple(view)

    ts = insts[2]
    assert ts["operands"][0] == (ids["x"], "float32", 8, ((32, 128), (1, 8)))
    assert ts["operands"][1] == (ids["x"], "float32", 0, ((32, 128), (1, 8)))
    assert ts["operands"][2:] == [2.0, 1.0]  # immediates are floats
    assert ts["attrs"] == {"op0": "multiply", "op1": "subtract", "reverse0": False, "reverse1": True}

    red = insts[3]
    assert red["attrs"] == {"op0": "maximum", "axes": (1,), "negate": True, "keepdims": True}

    act = insts[4]
    assert act["slots"] == ("dst", "data", "bias", "scale", "reduce_res")
    assert act["operands"][1][:2] == (ids["y"], "bfloat16")
    assert act["operands"][2] == (ids["s"], "float32", 0, ((1, 128), (1, 1)))
    assert act["operands"][3] == 0.5 and act["operands"][4] is None  # absent optional slot
    assert act["attrs"] == {"func": "exp", "reduce_op": "bypass", "reduce_cmd": "idle"}

    mm = insts[5]
    assert mm["attrs"]["accumulate"] == "automatic" and mm["attrs"]["is_transpose"] is False
    assert mm["access"] == ("read_write", "read", "read")  # automatic accumulation reads dst
    assert insts[6]["operands"][0] == (ids["x"], "float32", 0, ((32, 32), (1, 32)))

    assert all(i["location"][0] == __file__ for i in insts)
    assert insts[0]["location"][1] + 2 == insts[1]["location"][1]
    assert "runtime_offsets" not in insts[0]
    assert k.instruction(4) == act
    with pytest.raises(IndexError, match=rf"instruction index {k.num_instructions} out of range: kernel '\w+' has "
                                         rf"{k.num_instructions} instructions"):
        k.instruction(k.num_instructions)


def test_introspection_is_plain_data(rng):
    k = _probe_kernel(rng)
    # JSON-serializable as is (the namedtuples are tuples), so tools can dump it
    dumped = json.loads(json.dumps({"storages": k.storages(), "instructions": k.instructions()}))
    assert dumped["instructions"][0]["operands"][1][3] == [[64, 128], [2, 32]]
    # enum names map back to the _core enums
    for inst in k.instructions():
        assert getattr(_core.Opcode, inst["opcode"]).name == inst["opcode"]
        assert getattr(_core.Engine, inst["engine"]).name == inst["engine"]


def test_runtime_offsets_are_described(rng):
    @nki.jit
    def gather_rows(table, idx):
        out = nl.ndarray((4, 8), nl.float32, buffer=nl.shared_hbm)
        i = nl.ndarray((4, 1), nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(dst=i, src=idx)
        t = nl.ndarray((4, 8), nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=table.ap([[8, 4], [1, 8]], vector_offset=i, indirect_dim=0))
        nisa.dma_copy(dst=out, src=t)
        return out

    table = np.arange(64, dtype=np.float32).reshape(8, 8)
    idx = np.array([[3], [0], [7], [1]], dtype=np.int32)
    k = gather_rows.specialize(table, idx).programs[0].kernel
    dynamic = [i for i in k.instructions() if "runtime_offsets" in i]
    assert len(dynamic) == 1
    ro = dynamic[0]["runtime_offsets"][1]
    assert ro["indirect_dim"] == 0 and ro["vector_offset"][0] == [s["name"] for s in k.storages()].index("i")
    assert ro["scalar_tensor"] is None and ro["scalar_register"] is None
    with pytest.raises(NotImplementedError, match="runtime offsets"):
        _numpy_eager().NumpyEagerExecutor(k)


@nki.jit
def eager_mix(a, w):
    """Most opcodes numpy-eager supports, on small tiles: PSUM accumulation over two matmuls,
    fused activation + reduce, bn_stats / bn_aggr, reductions, casts to bf16."""
    out = nl.ndarray((64, 96), nl.bfloat16, buffer=nl.shared_hbm)
    stats_out = nl.ndarray((64, 4), nl.float32, buffer=nl.shared_hbm)
    at = nl.ndarray((128, 2, 64), nl.bfloat16, buffer=nl.sbuf)  # the DMA casts fp32 -> bf16
    nisa.dma_copy(dst=at[:, 0, :], src=a[0:128, :])
    nisa.dma_copy(dst=at[:, 1, :], src=a[128:256, :])
    wt = nl.ndarray((128, 2, 96), nl.bfloat16, buffer=nl.sbuf)
    nisa.dma_copy(dst=wt[:, 0, :], src=w[0:128, :])
    nisa.dma_copy(dst=wt[:, 1, :], src=w[128:256, :])
    acc = nl.ndarray((64, 96), nl.float32, buffer=nl.psum)
    for k in range(2):
        nisa.nc_matmul(dst=acc, stationary=at[:, k, :], moving=wt[:, k, :])
    y = nl.ndarray((64, 96), nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=y, src=acc)
    neg_max = nl.ndarray((64, 1), nl.float32, buffer=nl.sbuf)
    nisa.tensor_reduce(dst=neg_max, op=nl.maximum, data=y, axis=1, negate=True, keepdims=True)
    e = nl.ndarray((64, 96), nl.float32, buffer=nl.sbuf)
    total = nl.ndarray((64, 1), nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=e, op=nl.exp, data=y, bias=neg_max, scale=1.0, reduce_op=nl.add, reduce_res=total,
                    reduce_cmd=nisa.reduce_cmd.reset_reduce)
    inv = nl.ndarray((64, 1), nl.float32, buffer=nl.sbuf)
    nisa.reciprocal(dst=inv, data=total)
    sm = nl.ndarray((64, 96), nl.float32, buffer=nl.sbuf)
    nisa.scalar_tensor_tensor(dst=sm, data=e, op0=nl.multiply, operand0=inv, op1=nl.add, operand1=y)
    stats = nl.ndarray((64, 2, 6), nl.float32, buffer=nl.sbuf)
    nisa.bn_stats(dst=stats[:, 0, :], data=y[:, 0:48])
    nisa.bn_stats(dst=stats[:, 1, :], data=y[:, 48:96])
    st = nl.ndarray((64, 4), nl.float32, buffer=nl.sbuf)
    nisa.bn_aggr(dst=st[:, 0:2], data=stats)
    nisa.memset(dst=st[:, 2:3], value=0.25)
    nisa.iota(dst=st[:, 3:4], pattern=[[0, 1]], offset=3, channel_multiplier=2)
    nisa.dma_copy(dst=stats_out, src=st)
    o = nl.ndarray((64, 96), nl.bfloat16, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=o, data=sm, op0=nl.subtract, operand0=st[:, 0:1], op1=nl.abs, operand1=0.0)
    nisa.tensor_tensor(dst=o, data1=o, data2=sm, op=nl.maximum)
    nisa.dma_copy(dst=out, src=o)
    return out, stats_out


def test_numpy_eager_matches_nikki(rng):
    numpy_eager = _numpy_eager()
    a = (rng.standard_normal((256, 64)) * 0.1).astype(np.float32)
    w = rng.standard_normal((256, 96)).astype(ml_dtypes.bfloat16)
    want = eager_mix(a, w)
    eager = numpy_eager.NumpyEagerExecutor(eager_mix.specialize(a, w).programs[0].kernel)
    got = eager.run(a, w)
    assert len(got) == 2
    for g, wnt in zip(got, want):
        assert g.dtype == wnt.dtype and g.shape == wnt.shape
        g64, w64 = g.astype(np.float64), wnt.astype(np.float64)
        assert not np.isnan(w64).any() and not np.isnan(g64).any()
        u = 2.0**-8 if g.dtype == ml_dtypes.bfloat16 else 2.0**-24
        np.testing.assert_allclose(g64, w64, rtol=4 * u, atol=2.0**-16 * np.abs(w64).max())
    # memset and iota are exact
    np.testing.assert_array_equal(got[1][:, 2:4], want[1][:, 2:4])
    np.testing.assert_array_equal(want[1][:, 3], 3 + 2 * np.arange(64))


@nki.jit
def eager_mix2(a, ident):
    """The selection, sorting and transpose opcodes: max8 / nc_find_index8, iota into a uint8
    predicate (saturating), predicated copy, select_reduce, affine_select, tensor_scalar_reduce,
    partition reduce, Vector-engine transpose and TensorE transpose mode."""
    out = nl.ndarray((128, 32), nl.float32, buffer=nl.shared_hbm)
    small = nl.ndarray((32, 64), nl.float32, buffer=nl.shared_hbm)
    idx_out = nl.ndarray((128, 8), nl.uint32, buffer=nl.shared_hbm)
    x = nl.ndarray((128, 32), nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=x, src=a)
    idt = nl.ndarray((32, 32), nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=idt, src=ident)
    top = nl.ndarray((128, 8), nl.float32, buffer=nl.sbuf)
    nisa.max8(dst=top, src=x)
    where = nl.ndarray((128, 8), nl.uint32, buffer=nl.sbuf)
    nisa.nc_find_index8(dst=where, data=x, vals=top)
    nisa.dma_copy(dst=idx_out, src=where)
    pred = nl.ndarray((128, 32), nl.uint8, buffer=nl.sbuf)
    nisa.iota(dst=pred, pattern=[[1, 32]], offset=-5, channel_multiplier=1)
    y = nl.ndarray((128, 32), nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=y, src=x)
    nisa.tensor_copy_predicated(dst=y, src=-1.0, predicate=pred, reverse_pred=True)
    z = nl.ndarray((128, 32), nl.float32, buffer=nl.sbuf)
    best = nl.ndarray((128, 1), nl.float32, buffer=nl.sbuf)
    nisa.select_reduce(dst=z, predicate=pred, on_true=x, on_false=0.5, reduce_res=best)
    w = nl.ndarray((128, 32), nl.float32, buffer=nl.sbuf)
    nisa.affine_select(dst=w, pattern=[[-1, 32]], channel_multiplier=1, on_true_tile=z, on_false_value=-2.0,
                       cmp_op=nl.greater_equal)
    s = nl.ndarray((128, 32), nl.float32, buffer=nl.sbuf)
    tot = nl.ndarray((128, 1), nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar_reduce(dst=s, data=w, op0=nl.multiply, operand0=best, reduce_op=nl.add, reduce_res=tot)
    col = nl.ndarray((1, 32), nl.float32, buffer=nl.sbuf)
    nisa.tensor_partition_reduce(dst=col, op=nl.maximum, data=s)
    r = nl.ndarray((128, 32), nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=r, data=s, op0=nl.add, operand0=tot, op1=nl.subtract, operand1=1.0, reverse1=True)
    nisa.dma_copy(dst=out, src=r)
    t = nl.ndarray((32, 32), nl.float32, buffer=nl.sbuf)
    nisa.nc_transpose(dst=t, data=x[0:32, :])
    tp = nl.ndarray((32, 32), nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=tp, stationary=x[32:64, :], moving=idt, is_transpose=True)
    sm = nl.ndarray((32, 64), nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=sm[:, 0:32], data1=t, data2=tp, op=nl.add)
    nisa.memset(dst=sm[:, 32:64], value=3.0)
    nisa.tensor_copy(dst=sm[0:1, 32:64], src=col)
    nisa.dma_copy(dst=small, src=sm)
    return out, small, idx_out


def test_numpy_eager_matches_nikki_on_selection_opcodes(rng):
    a = rng.standard_normal((128, 32)).astype(np.float32)
    ident = np.eye(32, dtype=np.float32)
    want = eager_mix2(a, ident)
    got = _numpy_eager().NumpyEagerExecutor(eager_mix2.specialize(a, ident).programs[0].kernel).run(a, ident)
    out, small, idx = got
    np.testing.assert_allclose(out, want[0], rtol=4 * 2.0**-24, atol=2.0**-16 * np.abs(want[0]).max())
    np.testing.assert_array_equal(small, want[1])  # transposes, max and memset are exact
    np.testing.assert_array_equal(idx, want[2])
    np.testing.assert_array_equal(small[:, 0:32], a[0:32, :].T + a[32:64, :].T)


def test_numpy_eager_names_unsupported_opcodes(rng):
    @nki.jit
    def scan(a):
        out = nl.ndarray((128, 16), nl.float32, buffer=nl.shared_hbm)
        t = nl.ndarray((128, 16), nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=a)
        nisa.tensor_tensor_scan(dst=t, data0=t, data1=t, initial=0.0, op0=nl.multiply, op1=nl.add)
        nisa.dma_copy(dst=out, src=t)
        return out

    k = scan.specialize(np.zeros((128, 16), np.float32)).programs[0].kernel
    with pytest.raises(NotImplementedError, match="tensor_tensor_scan"):
        _numpy_eager().NumpyEagerExecutor(k)


@nki.jit
def _default_engines(f, i):
    x, n = nl.load(f), nl.load(i)
    rx = nl.ndarray(f.shape, nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=rx, data1=x, data2=x, op=nl.add)        # float: Vector engine
    nisa.tensor_tensor(dst=rx, data1=x, data2=x, op=nl.power)      # power: GpSimd
    rn = nl.ndarray(i.shape, nl.int32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=rn, data1=n, data2=n, op=nl.add)        # all int32: GpSimd
    nisa.tensor_tensor(dst=rn, data1=n, data2=n, op=nl.bitwise_and)  # bitwise: Vector engine
    rp = nl.ndarray(i.shape, nl.int32, buffer=nl.psum)
    nisa.tensor_tensor(dst=rp, data1=n, data2=n, op=nl.add)        # a PSUM tile: Vector engine
    tp = nl.ndarray((f.shape[1], f.shape[0]), nl.float32, buffer=nl.psum)
    nisa.nc_transpose(dst=tp, data=x)                              # into PSUM: Tensor engine
    ts = nl.ndarray((f.shape[1], f.shape[0]), nl.float32, buffer=nl.sbuf)
    nisa.nc_transpose(dst=ts, data=x)                              # into SBUF: Vector engine
    out = nl.ndarray(f.shape, nl.float32, buffer=nl.shared_hbm)
    nl.store(out, rx)
    return out


def test_default_engines_follow_nki():
    f, i = np.ones((8, 8), np.float32), np.ones((8, 8), np.int32)
    k = _default_engines.specialize(f, i).programs[0].kernel
    engines = [(inst["opcode"], inst["engine"]) for inst in k.instructions()
               if inst["opcode"] in ("tensor_tensor", "nc_transpose")]
    assert engines == [("tensor_tensor", "vector"), ("tensor_tensor", "gpsimd"), ("tensor_tensor", "gpsimd"),
                       ("tensor_tensor", "vector"), ("tensor_tensor", "vector"), ("nc_transpose", "tensor"),
                       ("nc_transpose", "vector")]


def test_native_stats_name_where_the_code_came_from(tmp_path, monkeypatch):
    """LLVM for a new template set, the loaded code while a program with the same templates is
    alive, the disk cache once none is."""
    monkeypatch.setenv("NIKKI_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("NIKKI_EXECUTOR", "native")

    def scale_rows(a):  # a shape no other test uses, so its templates are new to this process
        out = nl.ndarray((96, 77), nl.float32, buffer=nl.shared_hbm)
        t = nl.ndarray((96, 77), nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=a)
        nisa.tensor_scalar(dst=t, data=t, op0=nl.multiply, operand0=3.0)
        nisa.dma_copy(dst=out, src=t)
        return out

    a = np.arange(96 * 77, dtype=np.float32).reshape(96, 77)

    def compile_fresh():  # a new kernel object: nothing cached in Python
        return nki.jit(scale_rows).specialize(a).programs[0]

    first = compile_fresh()
    assert first.native_stats["origin"] == "compiled"
    assert first.native_stats["templates"] == 3  # two copies (their views differ) and the multiply
    second = compile_fresh()  # while the first program holds the code
    assert second.native_stats["origin"] == "in memory"
    del first, second
    gc.collect()
    assert compile_fresh().native_stats["origin"] == "disk cache"
    np.testing.assert_array_equal(nki.jit(scale_rows)(a), a * 3)
