"""Invalid kernels: a valid prefix, one statement that breaks a hardware or language rule, and a
valid suffix. The case records the rule, the pattern nikki's KernelError must match and the line it
must point at (the faulty statement; for a bad allocation, the allocation or its use).

Limits come from the target's table, so "one past the limit" is exact on every target.
"""

from __future__ import annotations

import numpy as np

from .case import Case, ExpectedError
from .gen_python import PythonKernelGen, fmt_num


def _alloc_line(g: PythonKernelGen, shape, dtype: str, buffer: str, address=None) -> tuple[str, int]:
    """Emits an allocation (at `address` when given); returns its name and body line."""
    name = g.fresh("bad")
    at = f", address={tuple(address)}" if address else ""
    line = g.emit(f"{name} = nl.ndarray({tuple(shape)}, dtype=nl.{dtype}, buffer=nl.{buffer}{at})")
    return name, line


def fault_partitions_over_pmax(g):
    p = g.pmax + g.rng.choice([1, 2, g.pmax])
    name, at = _alloc_line(g, (p, 8), "float32", g.rng.choice(["sbuf", "psum"]))
    use = g.emit(f"nisa.memset({name}, 0.0)")
    return ExpectedError(r"partitions|partition dimension", (at, use), "partition dim over pmax")


def fault_engine_partitions_over_pmax(g):
    name = g.fresh("bad")
    at = g.emit(f"{name} = nl.ndarray(({g.pmax}, 2, 8), dtype=nl.float32, buffer=nl.sbuf)")
    use = g.emit(f"nisa.memset({name}.reshape(({g.pmax * 2}, 8)), 1.0)")
    return ExpectedError(r"partition", (at, use), "engine access over pmax partitions")


class _Matmul:
    """Valid bf16 matmul operands [K, M] and [K, N] (sizes may be forced past a limit); `emit`
    writes the faulty nc_matmul with some operands replaced and returns its expected error."""

    def __init__(self, g, k=None, m=None, n=None):
        self.g = g
        self.k = k or g.partitions()
        self.m = m or g.size(g.lim["gemm_stationary_fmax"])
        self.n = n or g.size(g.lim["psum_bank_fmax"])
        self.st = g.load_tile(self.k, self.m, "bfloat16").name
        self.mv = g.load_tile(self.k, self.n, "bfloat16").name

    def emit(self, pattern: str, what: str, stationary=None, moving=None, dst_buffer="psum", dst_cols=None,
             dst_view="", also_alloc=False) -> ExpectedError:
        dst, alloc = _alloc_line(self.g, (self.m, dst_cols or self.n), "float32", dst_buffer)
        at = self.g.emit(f"nisa.nc_matmul({dst}{dst_view}, {stationary or self.st}, {moving or self.mv})")
        return ExpectedError(pattern, (at, alloc) if also_alloc else (at,), what)


def fault_matmul_stationary_in_psum(g):
    mm = _Matmul(g)
    ps, _ = _alloc_line(g, (mm.k, mm.m), "bfloat16", "psum")
    g.emit(f"nisa.tensor_copy({ps}, {mm.st})")
    return mm.emit(r"must be in SBUF", "matmul stationary in PSUM", stationary=ps)


def fault_matmul_moving_in_hbm(g):
    mm = _Matmul(g)
    return mm.emit(r"SBUF/PSUM only|must be in SBUF", "matmul moving in HBM",
                   moving=g.find_input((mm.k, mm.n), "bfloat16"))


def fault_matmul_dst_in_sbuf(g):
    return _Matmul(g).emit(r"must be in PSUM", "matmul dst in SBUF", dst_buffer="sbuf")


def fault_matmul_moving_too_wide(g):
    mm = _Matmul(g, n=g.lim["gemm_moving_fmax"] + g.rng.choice([1, 8]))
    return mm.emit(r"moving free size|bytes per partition", "matmul moving over gemm_moving_fmax", also_alloc=True)


def fault_matmul_stationary_too_wide(g):
    mm = _Matmul(g, m=g.lim["gemm_stationary_fmax"] + g.rng.choice([1, 16]))
    return mm.emit(r"stationary free size|partitions", "matmul stationary over its limit", also_alloc=True)


def fault_matmul_contraction_mismatch(g):
    mm = _Matmul(g, k=g.rng.choice([16, 32, 64]))
    return mm.emit(r"contraction sizes differ", "matmul contraction mismatch", stationary=f"{mm.st}[0:{mm.k // 2}, :]")


def fault_matmul_dtype(g):
    mm = _Matmul(g)
    bad_dtype = g.rng.choice(["int8", "int32", "uint8"])
    bad = g.load_tile(mm.k, mm.m, bad_dtype)
    return mm.emit(rf"has dtype {bad_dtype}", "matmul operand dtype", stationary=bad.name)


def fault_matmul_mixed_precision(g):
    mm = _Matmul(g)
    wide = g.load_tile(mm.k, mm.n, "float32")
    return mm.emit(r"stationary is bfloat16 but moving is float32", "matmul fp32 with bf16", moving=wide.name)


def fault_psum_bank_crossing(g):
    bank = g.lim["psum_bank_fmax"]
    mm = _Matmul(g, n=g.rng.choice([bank // 2, bank]))
    start = bank - g.rng.choice([1, mm.n // 2])
    return mm.emit(r"crossing a PSUM bank", "matmul output across a PSUM bank", dst_cols=2 * bank,
                   dst_view=f"[:, {start}:{start + mm.n}]")


def fault_psum_overflow(g):
    count = g.lim["psum_num_banks"] + 1
    names = []
    for _ in range(count):
        name, _ = _alloc_line(g, (g.partitions(), g.lim["psum_bank_fmax"]), "float32", "psum")
        g.emit(f"nisa.memset({name}, 1.0)")
        names.append(name)
    sink = g.alloc((1, g.lim["psum_bank_fmax"]), "float32", "sbuf")
    for name in names:
        g.emit(f"nisa.tensor_copy({sink.name}, {name}[0:1, :])")
    return ExpectedError(r"PSUM|psum", (), "more live PSUM tiles than banks")


def fault_sbuf_tile_too_big(g):
    cap = g.lim["sbuf_fmax_bytes"] // 4
    name, at = _alloc_line(g, (g.partitions(), cap + g.rng.choice([1, 100])), "float32", "sbuf")
    use = g.emit(f"nisa.memset({name}, 0.0)")
    return ExpectedError(r"bytes per partition", (at, use), "SBUF tile over capacity")


def fault_sbuf_overflow(g):
    """The three operands of one instruction need more SBUF than there is. Tensors the compiler
    placed spill to HBM when they are merely live, so only what one instruction reads and writes
    at once must fit."""
    each = g.lim["sbuf_fmax_bytes"] // 4 * 2 // 5 + g.rng.randint(1, 100)
    names = []
    for _ in range(2):
        name, _ = _alloc_line(g, (8, each), "float32", "sbuf")
        g.emit(f"nisa.memset({name}, 1.0)")
        names.append(name)
    sink = g.alloc((8, each), "float32", "sbuf")
    at = g.emit(f"nisa.tensor_tensor({sink.name}, {names[0]}, {names[1]}, nl.{g.rng.choice(['add', 'multiply'])})")
    return ExpectedError(r"SBUF capacity exceeded", (at,), "one instruction's operands over SBUF capacity")


def fault_oob_slice(g):
    t = g.load_tile(g.partitions(), g.size(64))
    w = t.free if len(t.shape) == 2 else t.shape[-1]
    p = t.partitions
    expr = g.rng.choice([f"{t.name}[0:{p}, 0:{w + 1}]" if len(t.shape) == 2 else f"{t.name}[0:{p}, :, 0:{w + 1}]",
                         f"{t.name}[0:{p + 1}, ...]"])
    dst = g.alloc(t.shape, t.dtype)
    at = g.emit(f"nisa.tensor_copy({dst.name}, {expr})")
    return ExpectedError(r"out.of.bound", (at,), "slice past the end")


def fault_oob_hbm(g):
    rows, cols = 8, g.size(32)
    src = g.find_input((rows, cols), "float32")
    dst = g.alloc((rows, cols), "float32")
    at = g.emit(f"nisa.dma_copy({dst.name}, {src}.ap([[{cols}, {rows}], [1, {cols}]], offset={g.rng.choice([1, cols])}))")
    return ExpectedError(r"out-of-bound", (at,), "access pattern past the end of an input")


def fault_oob_ap_on_chip(g):
    t = g.load_tile(g.partitions(), g.size(64))
    w, p = t.free, t.partitions
    dst = g.alloc((p, w), t.dtype)
    at = g.emit(f"nisa.tensor_copy({dst.name}, {t.name}.ap([[{w}, {p}], [1, {w}]], offset={g.rng.choice([1, 3])}))")
    return ExpectedError(r"out-of-bound|outside its partition row", (at,), "on-chip access pattern past the end")


def _bad_statement(g, statement: str, pattern: str, what: str, free=None, partitions=None, dst_shape=None,
                   dtype="float32") -> ExpectedError:
    """Loads a 2-D tile `a`, allocates a float32 `dst` (a's shape unless dst_shape(p, f) says
    otherwise) and emits `statement` (formatted with {a} and {dst}), the faulty line."""
    a = g.load_tile(partitions or g.partitions(), free or g.size(64), dtype, flat=True)
    p, f = a.shape
    dst = g.alloc(dst_shape(p, f) if dst_shape else (p, f), "float32")
    at = g.emit(statement.format(a=a.name, dst=dst.name))
    return ExpectedError(pattern, (at,), what)


def fault_shape_mismatch(g):
    p, f = g.partitions(), g.size(64, low=2)
    a = g.load_tile(p, f)
    b = g.load_tile(p, f - 1)
    dst = g.alloc((p, f), "float32")
    at = g.emit(f"nisa.tensor_tensor({dst.name}, {a.name}, {b.name}, nl.add)")
    return ExpectedError(r"elements per partition mismatch", (at,), "operand free sizes differ")


def fault_partition_mismatch(g):
    p, f = g.rng.choice([16, 32, 64]), g.size(64)
    a = g.load_tile(p, f, "float32")
    b = g.load_tile(p // 2, f, "float32")
    dst = g.alloc((p, f), "float32")
    at = g.emit(f"nisa.tensor_tensor({dst.name}, {a.name}, {b.name}, nl.multiply)")
    return ExpectedError(r"number of partitions mismatch", (at,), "operand partitions differ")


def fault_bitwise_on_float(g):
    op = g.rng.choice(["bitwise_and", "bitwise_or", "left_shift"])
    return _bad_statement(g, f"nisa.tensor_tensor({{dst}}, {{a}}, {{a}}, nl.{op})", r"needs integer tiles",
                          "bitwise operator on floats")


def fault_predicate_dtype(g):
    p, f = g.partitions(), g.size(64)
    pred = g.load_tile(p, f, g.rng.choice(["float32", "bfloat16", "int32"]))
    src = g.load_tile(p, f, "float32")
    dst = g.alloc((p, f), "float32")
    g.emit(f"nisa.memset({dst.name}, 0.0)")
    at = g.emit(f"nisa.tensor_copy_predicated(dst={dst.name}, src={src.name}, predicate={pred.name})")
    return ExpectedError(r"predicate has dtype", (at,), "predicate of a float / int32 dtype")


def fault_write_input(g):
    t = g.load_tile(g.partitions(), g.size(32), "float32")
    src = g.find_input((t.partitions, t.free), "float32")
    at = g.emit(f"nisa.dma_copy(dst={src}, src={t.name}[...])")
    return ExpectedError(r"cannot write to kernel input", (at,), "write to an input")


def _register_offset_dma(g, init: str, pattern: str, what: str) -> ExpectedError:
    """A row of a 4-row input read at the offset in a register allocated as register_alloc(init)."""
    rows, cols = 4, g.size(32)
    src = g.find_input((rows, cols), "float32")
    reg = g.fresh("r")
    g.emit(f"{reg} = nisa.register_alloc({init})")
    dst = g.alloc((1, cols), "float32")
    at = g.emit(f"nisa.dma_copy(dst={dst.name}, src={src}.ap([[{cols}, 1], [1, {cols}]], scalar_offset={reg}))")
    return ExpectedError(pattern, (at,), what)


def fault_unset_register(g):
    return _register_offset_dma(g, "", r"register .*never set", "read of a register never set")


def fault_runtime_offset_oob(g):
    return _register_offset_dma(g, str(4 + g.rng.choice([0, 3])), r"runtime offset out of bounds",
                                "register offset past the end")


def fault_gather_oob(g):
    p = g.rng.choice([4, 16, 32])
    rows, cols = p, g.size(32)
    table = g.find_input((rows, cols), "float32")
    idx_in = g.new_input((p, 1), "int32", f"const:{rows + g.rng.choice([0, 5])}")
    idx = g.alloc((p, 1), "int32")
    g.emit(f"nisa.dma_copy(dst={idx.name}, src={idx_in})")
    dst = g.alloc((p, cols), "float32")
    at = g.emit(f"nisa.dma_copy(dst={dst.name}, src={table}.ap([[{cols}, {p}], [1, {cols}]], "
                f"vector_offset={idx.name}, indirect_dim=0))")
    return ExpectedError(r"runtime offset out of bounds|out of bounds", (at,), "gather index past the end")


def fault_gpsimd_psum(g):
    p, f = g.partitions(), g.size(64)
    a = g.load_tile(p, f, "float32")
    ps, _ = _alloc_line(g, (p, f), "float32", "psum")
    g.emit(f"nisa.tensor_copy({ps}, {a.name})")
    dst = g.alloc((p, f), "float32")
    at = g.emit(f"nisa.tensor_tensor({dst.name}, {ps}, {a.name}, nl.add, engine=nisa.gpsimd_engine)")
    return ExpectedError(r"GpSimd engine cannot access", (at,), "GpSimd reading PSUM")


def fault_start_partition(g):
    q = g.lim["partition_quadrant"]
    a = g.load_tile(g.pmax, g.size(32), "float32")
    start = g.rng.choice([1, q // 2, q + 3])
    count = g.rng.choice([q - 1 if start + q - 1 <= g.pmax else 2, 2 * q]) if start + 2 * q <= g.pmax else 2
    dst = g.alloc((count, a.free), "float32")
    at = g.emit(f"nisa.tensor_copy({dst.name}, {a.name}[{start}:{start + count}, ...])")
    return ExpectedError(r"cannot start at partition", (at,), "start-partition rule")


def fault_vector_transpose_too_big(g):
    return _bad_statement(g, "nisa.nc_transpose({dst}, {a}, engine=nisa.vector_engine)",
                          r"vector engine transpose limit", "vector transpose over 32x32", free=4,
                          partitions=g.lim["vector_transpose_max"] + g.rng.choice([1, 32]),
                          dst_shape=lambda p, f: (f, p))


def fault_transpose_dtype(g):
    a = g.load_tile(g.rng.choice([8, 16]), 8, "float32")
    dst = g.alloc((8, a.partitions), "bfloat16")
    at = g.emit(f"nisa.nc_transpose({dst.name}, {a.name}, engine=nisa.vector_engine)")
    return ExpectedError(r"does not convert dtypes", (at,), "transpose converting dtype")


def fault_bn_stats_too_wide(g):
    return _bad_statement(g, "nisa.bn_stats({dst}, {a})", r"bn_stats_fmax", "bn_stats over bn_stats_fmax",
                          free=g.lim["bn_stats_fmax"] + g.rng.choice([1, 64]), dst_shape=lambda p, f: (p, 6))


def fault_max8_too_few(g):
    return _bad_statement(g, "nisa.max8(dst={dst}, src={a})", r"max8 reads", "max8 with fewer than 8 elements",
                          free=g.lim["max8_min_elems"] - g.rng.choice([1, 3]), dst_shape=lambda p, f: (p, 8))


def fault_memset_out_of_range(g):
    dtype, value = g.rng.choice([("int8", 300), ("uint8", -1), ("int16", 40000), ("uint16", 70000)])
    dst = g.alloc((g.partitions(), 8), dtype)
    at = g.emit(f"nisa.memset({dst.name}, {value})")
    return ExpectedError(r"outside the range", (at,), "memset value out of the dtype's range")


def fault_divide_op(g):
    return _bad_statement(g, "nisa.tensor_tensor({dst}, {a}, {a}, nl.divide)", r"not a NeuronCore ALU operator",
                          "divide in tensor_tensor")


def fault_reduce_axis0(g):
    return _bad_statement(g, "nisa.tensor_reduce({dst}, nl.add, {a}, axis=0)", r"axis 0",
                          "tensor_reduce over the partition dim", dst_shape=lambda p, f: (1, f))


def fault_activation_reduce_op(g):
    op = g.rng.choice(["multiply", "maximum"])
    res = g.alloc((g.pmax, 1), "float32")
    return _bad_statement(g, f"nisa.activation(dst={{dst}}, op=nl.exp, data={{a}}, reduce_op=nl.{op}, "
                          f"reduce_res={res.name}[0:{{dst}}.shape[0], :])", rf"reduce_op={op} is not supported",
                          "activation reducing with another operator")


def fault_scalar_engine_op(g):
    op = g.rng.choice(["maximum", "subtract"])
    return _bad_statement(g, f"nisa.tensor_scalar({{dst}}, {{a}}, nl.{op}, 1.0, engine=nisa.scalar_engine)",
                          r"not supported on the scalar engine", "tensor_scalar operator on ScalarE")


def fault_vector_offset_on_engine(g):
    p = g.rng.choice([4, 8])
    t = g.load_tile(p, 8, "float32")
    idx_in = g.new_input((p, 1), "int32", f"index:{p}")
    idx = g.alloc((p, 1), "int32")
    g.emit(f"nisa.dma_copy(dst={idx.name}, src={idx_in})")
    dst = g.alloc((p, 8), "float32")
    at = g.emit(f"nisa.tensor_copy({dst.name}, {t.name}.ap([[8, {p}], [1, 8]], vector_offset={idx.name}))")
    return ExpectedError(r"vector_offset", (at,), "gather on a compute engine")


def fault_output_never_written(g):
    name = f"out{len(g.outputs)}"
    at = g.emit(f"{name} = nl.ndarray((4, 4), dtype=nl.float32, buffer=nl.shared_hbm)")
    g.outputs.append((name, "float32", (4, 4)))
    g.output_vals.append(None)
    return ExpectedError(r"never written", (at,), "returned output never written")


def fault_trn1_scalar_copy(g):
    if g.lim["generation"] >= 3:
        return fault_scalar_engine_op(g)
    return _bad_statement(g, "nisa.tensor_copy({dst}, {a}, engine=nisa.scalar_engine)", r"scalar engine",
                          "tensor_copy on the trn1 scalar engine")


def fault_unary_operand(g):
    op = g.rng.choice(["abs", "square", "relu", "reciprocal"])
    return _bad_statement(g, f"nisa.tensor_scalar({{dst}}, {{a}}, nl.{op}, {fmt_num(g.rng.choice([1.0, 2.5]))})",
                          r"is unary", "unary operator with a nonzero operand")


def fault_placed_tiles_overlap(g):
    top = g.lim["sbuf_fmax_bytes"] - 4096
    first, _ = _alloc_line(g, (32, 64), "float32", "sbuf", address=(0, top))
    second, at = _alloc_line(g, (32, 64), "float32", "sbuf", address=(0, top + g.rng.choice([4, 128])))
    g.emit(f"nisa.memset({first}, 1.0)")
    g.emit(f"nisa.memset({second}, 2.0)")
    sink = g.alloc((32, 64), "float32")
    g.emit(f"nisa.tensor_tensor({sink.name}, {first}, {second}, nl.add)")
    return ExpectedError(r"overlaps tensor", (at,), "address= tiles overlapping while both are live")


def fault_placed_psum_off_bank(g):
    offset = g.rng.choice([4, 1024, g.lim["psum_bank_fmax_bytes"] + 8])
    name, at = _alloc_line(g, (16, 8), "float32", "psum", address=(0, offset))
    use = g.emit(f"nisa.memset({name}, 0.0)")
    return ExpectedError(r"bank boundary", (at, use), "address= PSUM tile not at a bank start")


def fault_placed_past_the_end(g):
    end = g.lim["sbuf_fmax_bytes"]
    name, at = _alloc_line(g, (8, 64), "float32", "sbuf", address=(0, end - g.rng.choice([4, 64])))
    use = g.emit(f"nisa.memset({name}, 0.0)")
    return ExpectedError(r"past the end", (at, use), "address= tile past the end of SBUF")


FAULTS = [v for k, v in sorted(globals().items()) if k.startswith("fault_")]


def generate_invalid(seed: int) -> Case:
    """A kernel from `seed` with one fault: a few valid steps, the fault, a few more, the outputs."""
    with np.errstate(all="ignore"):  # the model computes with infinities and NaNs on purpose
        g = PythonKernelGen(seed)
        fault = g.rng.choice(FAULTS)
        for _ in range(g.rng.randint(0, 3)):
            getattr(g, g.pick_step())()
        error = fault(g)
        for _ in range(g.rng.randint(0, 2)):
            getattr(g, g.pick_step())()
        if not any(t.init.any() for t in g.tiles) or not g.outputs or g.rng.random() < 0.7:
            written = [t for t in g.tiles if t.init.any()]
            g.store_output(written[-1] if written else g.load_tile(4, 4, "float32"))
    source, first = g.source()
    error.lines = tuple(first + i for i in error.lines)
    g.features.add(fault.__name__)
    return Case(seed=seed, front="python", source=source, error=error, features=sorted(g.features))
