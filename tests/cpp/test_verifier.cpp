// Tests of the verifier (jit/src/verify.cpp) and of the errors the DSL raises while tracing.
//
// One test per rule: the smallest kernel that breaks exactly that rule, checked for a KernelError
// that names this file and the line of the offending call (`line = __LINE__;` sits on the same
// line as the call), the instruction, the numbers involved, the limit and the hint. Most tests
// also compile the nearest legal kernel, so rules are not stricter than NKI's.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "error_check.hpp"
#include "raw_ir.hpp"

namespace {

using namespace nikki;
using isa::Scalar;
using test::check_compiles;
using test::kernel_error;

constexpr std::string_view kFile = "test_verifier.cpp";

#define CHECK_ERROR(error, line, ...) test::check_kernel_error(error, kFile, line, {__VA_ARGS__})

const TensorSpec X = spec({128, 512}, nl::float32, "x");

Tensor sb(const Shape& shape, DType dtype = nl::float32, std::string_view name = "t", Loc loc = Loc::current()) {
  return nl::ndarray(shape, dtype, nl::sbuf, name, std::nullopt, loc);
}
Tensor ps(const Shape& shape, DType dtype = nl::float32, std::string_view name = "acc", Loc loc = Loc::current()) {
  return nl::ndarray(shape, dtype, nl::psum, name, std::nullopt, loc);
}
/** An initialized SBUF tile (memset to `value`, 0 for integer dtypes by default). */
Tensor filled(const Shape& shape, DType dtype = nl::float32, std::string_view name = "t", double value = 0.0,
              Loc loc = Loc::current()) {
  Tensor t = sb(shape, dtype, name, loc);
  isa::memset(t, value, Engine::unknown, loc);
  return t;
}
/** Copies `t` (through SBUF when it is in PSUM) into a new shared_hbm output and returns it. */
Tensor store(const Tensor& t, Loc loc = Loc::current()) {
  Tensor src = t;
  if (t.buffer() == nl::psum) {
    src = sb(t.shape(), t.dtype(), "evict", loc);
    isa::tensor_copy(src, t, Engine::unknown, loc);
  }
  Tensor out = nl::ndarray(t.shape(), t.dtype(), nl::shared_hbm, "out", std::nullopt, loc);
  isa::dma_copy(out, src, loc);
  return out;
}

using test::append;

}  // namespace

// ============================================================================================
// Storages (checked on every on-chip tensor, where it is created)
// ============================================================================================

TEST_CASE("verify: on-chip tensors have a partition dim and a free dim") {
  int line = 0;
  auto k = [&](bool bad) {
    return [&, bad](Tensor x) {
      line = __LINE__; Tensor t = bad ? sb({128}) : sb({128, 1});
      isa::dma_copy(t, x(nl::all, nl::ds(0, 1)));
      return store(t);
    };
  };
  CHECK_ERROR(kernel_error(k(true), X), line, "sbuf tensor 't' has shape [128]",
              "SBUF/PSUM tensors are at least 2-D (partition dim first)", "(128, 1)", "in: ndarray");
  check_compiles(kernel_error(k(false), X));
}

TEST_CASE("verify: tensors span at most pmax (128) partitions") {
  int line = 0;
  auto k = [&](int64_t partitions) {
    return [&, partitions](Tensor x) {
      line = __LINE__; Tensor t = filled({partitions, 64});
      return store(t);
    };
  };
  CHECK_ERROR(kernel_error(k(256), X), line,
              "number of partitions 256 of tensor 't' exceeds the architecture limit of 128",
              "pmax = 128 partitions on trn2 (NeuronCore-v3)", "nl.tile_size.pmax");
  check_compiles(kernel_error(k(128), X));
}

TEST_CASE("verify: a tensor fits in one partition of SBUF or PSUM") {
  int line = 0;
  auto k = [&](Buffer buffer, int64_t free) {
    return [&, buffer, free](Tensor x) {
      line = __LINE__; Tensor t = nl::ndarray({128, free}, nl::float32, buffer, "big");
      isa::memset(t, 0.0);
      return store(t);
    };
  };
  // trn2: 212984 usable SBUF bytes (53246 float32) and 8 x 2 KiB PSUM banks (4096 float32) per partition.
  CHECK_ERROR(kernel_error(k(nl::sbuf, 53247), X), line,
              "tensor 'big' needs 212988 bytes per partition but sbuf has 212984 bytes per partition",
              "sbuf capacity per partition on trn2", "tile the free dim");
  check_compiles(kernel_error(k(nl::sbuf, 53246), X));
  CHECK_ERROR(kernel_error(k(nl::psum, 4097), X), line,
              "tensor 'big' needs 16388 bytes per partition but psum has 16384 bytes per partition");
  check_compiles(kernel_error(k(nl::psum, 4096), X));
}

TEST_CASE("verify: manual PSUM addresses start on a bank boundary") {
  int line = 0;
  auto k = [&](uint32_t byte) {
    return [&, byte](Tensor x) {
      line = __LINE__; Tensor acc = nl::ndarray({128, 512}, nl::float32, nl::psum, "acc", Address{0, byte});
      isa::memset(acc, 0.0);
      return store(acc);
    };
  };
  CHECK_ERROR(kernel_error(k(1024), X), line,
              "PSUM tensor 'acc' at address byte 1024 does not start at a bank boundary",
              "PSUM banks are 2048 bytes per partition", "address=(0, k * 2048)");
  check_compiles(kernel_error(k(2048), X));
}

TEST_CASE("verify: manual addresses lie inside the buffer") {
  int line = 0;
  auto k = [&](Shape shape, Address a) {
    return [&, shape, a](Tensor x) {
      line = __LINE__; Tensor t = nl::ndarray(shape, nl::float32, nl::sbuf, "t", a);
      isa::memset(t, 0.0);
      return store(t);
    };
  };
  CHECK_ERROR(kernel_error(k({128, 1024}, {0, 212984 - 4096 + 4}), X), line,
              "tensor 't' at address (0, 208892) spans partitions [0, 128) and bytes [208892, 212988)",
              "past the end of sbuf", "sbuf has 128 partitions x 212984 bytes per partition on trn2",
              "choose an address inside the buffer");
  check_compiles(kernel_error(k({128, 1024}, {0, 212984 - 4096}), X));
  CHECK_ERROR(kernel_error(k({64, 16}, {96, 0}), X), line, "spans partitions [96, 160)");
}

TEST_CASE("verify: manual addresses follow the start-partition rule") {
  int line = 0;
  auto k = [&](uint32_t partition) {
    return [&, partition](Tensor x) {
      line = __LINE__; Tensor t = nl::ndarray({64, 16}, nl::float32, nl::sbuf, "t", Address{partition, 0});
      isa::memset(t, 0.0);
      return store(t);
    };
  };
  CHECK_ERROR(kernel_error(k(32), X), line, "tensor 't': an access of 64 partitions cannot start at partition 32",
              "start partition must be 0 for > 64 partitions, 0 or 64 for 33-64, a multiple of 32 for <= 32",
              "start the access at partition 0 or 64");
  check_compiles(kernel_error(k(64), X));
}

TEST_CASE("verify: every returned tensor is written") {
  int line = 0;
  auto k = [&](bool bad) {
    return [&, bad](Tensor x) {
      line = __LINE__; Tensor out = nl::ndarray({128, 512}, nl::float32, nl::shared_hbm, "out");
      if (!bad) isa::dma_copy(out, x);
      return out;
    };
  };
  CHECK_ERROR(kernel_error(k(true), X), line, "output tensor 'out' is never written",
              "every returned tensor must be written by the kernel", "nisa.dma_copy");
  check_compiles(kernel_error(k(false), X));
}

// ============================================================================================
// Operands: bounds, inputs, runtime offsets, buffers and tile geometry
// ============================================================================================

TEST_CASE("verify: a view's dtype size divides the tensor's bytes") {
  int line = 0;
  auto k = [&](int64_t bytes) {
    return [&, bytes](Tensor x) {
      Tensor raw = filled({1, bytes}, nl::uint8, "raw");
      Tensor d = sb({1, 1}, nl::int16, "d");
      line = __LINE__; isa::tensor_copy(d, raw.ap({{1, 1}, {1, 1}}, ApOptions{.dtype = nl::int16}));
      return store(d);
    };
  };
  CHECK_ERROR(kernel_error(k(3), X), line, "tensor_copy: src views tensor 'raw' (3 bytes) as int16",
              "(2 bytes) must divide the tensor's size", "in: tensor_copy");
  check_compiles(kernel_error(k(4), X));
}

TEST_CASE("verify: static accesses stay inside the tensor") {
  int line = 0;
  auto k = [&](int64_t count) {
    return [&, count](Tensor x) {
      Tensor t = filled({128, 64}, nl::float32, "t");
      Tensor d = sb({128, count}, nl::float32, "d");
      line = __LINE__; isa::tensor_copy(d, t.ap({{64, 128}, {1, count}}));
      return store(d);
    };
  };
  CHECK_ERROR(kernel_error(k(65), X), line,
              "out-of-bound access for tensor 't' (src): elements [0, 8192] of a tensor with 8192 elements",
              "tensor 't' has shape [128, 64]");
  check_compiles(kernel_error(k(64), X));
}

TEST_CASE("verify: kernel inputs are read-only unless declared mutable") {
  int line = 0;
  auto k = [&](Tensor x) {
    Tensor t = filled({128, 512}, nl::float32, "t", 1.0);
    line = __LINE__; isa::dma_copy(x, t);
    return store(t);
  };
  CHECK_ERROR(kernel_error(k, X), line, "dma_copy: cannot write to kernel input 'x'", "kernel parameters are immutable",
              "nt.mutable_tensor");
  check_compiles(kernel_error(k, TensorSpec{{128, 512}, nl::float32, "x", /*writable=*/true}));
}

TEST_CASE("verify: runtime offsets come from integer tensors") {
  int line = 0;
  auto k = [&](DType idx_dtype) {
    return [&, idx_dtype](Tensor x) {
      Tensor idx = filled({1, 1}, idx_dtype, "idx");
      Tensor row = sb({1, 512}, nl::float32, "row");
      line = __LINE__; isa::dma_copy(row, x.ap({{512, 1}, {1, 512}}, ApOptions{.scalar_offset_tensor = idx}));
      return store(row);
    };
  };
  CHECK_ERROR(kernel_error(k(nl::float32), X), line,
              "dma_copy: scalar_offset tensor 'idx' has dtype float32; runtime offsets are integers",
              "int32 or uint32");
  check_compiles(kernel_error(k(nl::int32), X));
}

TEST_CASE("verify: runtime offsets are not read from PSUM") {
  int line = 0;
  auto k = [&](Buffer buffer) {
    return [&, buffer](Tensor x) {
      Tensor idx = nl::ndarray({1, 1}, nl::int32, buffer, "idx");
      isa::memset(idx, 0);
      Tensor row = sb({1, 512}, nl::float32, "row");
      line = __LINE__; isa::dma_copy(row, x.ap({{512, 1}, {1, 512}}, ApOptions{.scalar_offset_tensor = idx}));
      return store(row);
    };
  };
  CHECK_ERROR(kernel_error(k(nl::psum), X), line, "scalar_offset tensor 'idx' is in PSUM",
              "runtime offsets are read from SBUF or HBM", "copy the offsets to SBUF first");
  check_compiles(kernel_error(k(nl::sbuf), X));
}

TEST_CASE("verify: vector_offset (gather/scatter) is for DMA only") {
  int line = 0;
  auto k = [&](bool bad) {
    return [&, bad](Tensor x) {
      Tensor idx = filled({128, 1}, nl::int32, "idx");
      Tensor d = sb({128, 512}, nl::float32, "d");
      Tensor rows = x.ap({{512, 128}, {1, 512}}, ApOptions{.vector_offset = idx});
      line = __LINE__; if (bad) isa::tensor_copy(d, rows); else isa::dma_copy(d, rows);
      return store(d);
    };
  };
  CHECK_ERROR(kernel_error(k(true), X), line, "tensor_copy: src uses a vector_offset (gather/scatter) access",
              "per-partition vector offsets are only supported by DMA instructions", "gather with nisa.dma_copy");
  check_compiles(kernel_error(k(false), X));
}

TEST_CASE("verify: vector_offset gathers from an HBM tensor") {
  int line = 0;
  auto k = [&](bool bad) {
    return [&, bad](Tensor x) {
      Tensor idx = filled({128, 1}, nl::int32, "idx");
      Tensor src = filled({128, 512}, nl::float32, "src");
      Tensor d = sb({128, 512}, nl::float32, "d");
      Tensor from = bad ? src : x;
      line = __LINE__; isa::dma_copy(d, from.ap({{512, 128}, {1, 512}}, ApOptions{.vector_offset = idx}));
      return store(d);
    };
  };
  CHECK_ERROR(kernel_error(k(true), X), line, "vector_offset indexes tensor 'src' in sbuf",
              "the gathered/scattered tensor must be in HBM");
  check_compiles(kernel_error(k(false), X));
}

TEST_CASE("verify: vector_offset indices are read from SBUF") {
  int line = 0;
  auto k = [&](bool bad) {
    return [&, bad](Tensor x, Tensor ids) {
      Tensor idx = sb({128, 1}, nl::int32, "idx");
      isa::dma_copy(idx, ids);
      Tensor d = sb({128, 512}, nl::float32, "d");
      line = __LINE__; isa::dma_copy(d, x.ap({{512, 128}, {1, 512}}, ApOptions{.vector_offset = bad ? ids : idx}));
      return store(d);
    };
  };
  const TensorSpec ids = spec({128, 1}, nl::int32, "ids");
  CHECK_ERROR(kernel_error(k(true), X, ids), line, "vector_offset index tensor 'ids' is in hbm",
              "the per-partition indices of a gather/scatter are read from SBUF", "(P, 1) SBUF tile");
  check_compiles(kernel_error(k(false), X, ids));
}

TEST_CASE("verify: vector_offset has one index per partition of the access") {
  int line = 0;
  auto k = [&](int64_t rows) {
    return [&, rows](Tensor x) {
      Tensor idx = filled({rows, 1}, nl::int32, "idx");
      Tensor d = sb({128, 512}, nl::float32, "d");
      line = __LINE__; isa::dma_copy(d, x.ap({{512, 128}, {1, 512}}, ApOptions{.vector_offset = idx}));
      return store(d);
    };
  };
  CHECK_ERROR(kernel_error(k(64), X), line,
              "vector_offset has shape [64, 1] but the access needs one index per row (128, 1)",
              "pass a (128, 1) index tile");
  check_compiles(kernel_error(k(128), X));
}

TEST_CASE("verify: DMA does not access PSUM") {
  int line = 0;
  auto k = [&](bool bad) {
    return [&, bad](Tensor x) {
      Tensor acc = ps({128, 512});
      isa::memset(acc, 0.0);
      Tensor out = nl::ndarray({128, 512}, nl::float32, nl::shared_hbm, "out");
      Tensor t = sb({128, 512});
      isa::tensor_copy(t, acc);
      line = __LINE__; isa::dma_copy(out, bad ? acc : t);
      return out;
    };
  };
  CHECK_ERROR(kernel_error(k(true), X), line, "dma_copy: src ('acc' psum f32[128, 512]) is in PSUM",
              "DMA moves data between HBM and SBUF only", "copy PSUM to SBUF with nisa.tensor_copy first");
  check_compiles(kernel_error(k(false), X));
}

TEST_CASE("verify: compute engines read and write SBUF/PSUM only") {
  int line = 0;
  auto k = [&](bool bad) {
    return [&, bad](Tensor x) {
      Tensor in = sb({128, 512}, nl::float32, "in");
      isa::dma_copy(in, x);
      Tensor t = sb({128, 512});
      line = __LINE__; isa::tensor_copy(t, bad ? x : in);
      return store(t);
    };
  };
  CHECK_ERROR(kernel_error(k(true), X), line,
              "tensor_copy: src ('x' hbm f32[128, 512]) is in hbm; compute engines read and write SBUF/PSUM only",
              "load the data into SBUF with nisa.dma_copy first");
  check_compiles(kernel_error(k(false), X));
}

TEST_CASE("verify: the GpSimd engine cannot access PSUM") {
  int line = 0;
  auto copy = [&](Engine engine) {
    return [&, engine](Tensor x) {
      Tensor t = filled({128, 512});
      Tensor acc = ps({128, 512});
      line = __LINE__; isa::tensor_copy(acc, t, engine);
      return store(acc);
    };
  };
  CHECK_ERROR(kernel_error(copy(isa::gpsimd_engine), X), line,
              "tensor_copy: dst ('acc' psum f32[128, 512]) is in PSUM, which the GpSimd engine cannot access",
              "the GpSimd engine reads and writes SBUF only", "use the vector engine, or copy the data to SBUF");
  check_compiles(kernel_error(copy(isa::vector_engine), X));
  // iota runs only on GpSimd, so the hint cannot suggest another engine.
  auto iota = [&](Buffer buffer) {
    return [&, buffer](Tensor x) {
      Tensor t = nl::ndarray({128, 64}, nl::int32, buffer, "ids");
      line = __LINE__; isa::iota(t, {{1, 64}});
      return store(t);
    };
  };
  CHECK_ERROR(kernel_error(iota(nl::psum), X), line, "iota: dst ('ids' psum i32[128, 64]) is in PSUM",
              "iota runs only on the GpSimd engine: allocate the tensor in SBUF");
  check_compiles(kernel_error(iota(nl::sbuf), X));
}

TEST_CASE("verify: engine operands span at most 128 partitions") {
  int line = 0;
  auto k = [&](bool bad) {
    return [&, bad](Tensor x) {
      Tensor a = filled({128, 512}, nl::float32, "a");
      Tensor d = sb({128, 256}, nl::float32, "d");
      Tensor data = bad ? a.reshape({256, 256}) : a(nl::all, nl::ds(0, 256));
      line = __LINE__; isa::tensor_tensor(d, data, data, nl::add);
      return store(d);
    };
  };
  // The NKI simulator's message: "tensor_tensor data1 partition dimension 256 exceeds maximum 128".
  CHECK_ERROR(kernel_error(k(true), X), line, "tensor_tensor: data1 partition dimension 256 exceeds maximum 128",
              "pmax = 128", "tile the partition dim");
  check_compiles(kernel_error(k(false), X));
}

TEST_CASE("verify: engine operands step through consecutive partitions") {
  int line = 0;
  auto k = [&](int64_t step) {
    return [&, step](Tensor x) {
      Tensor a = filled({128, 64}, nl::float32, "a");
      Tensor d = sb({64, 64}, nl::float32, "d");
      line = __LINE__; isa::tensor_copy(d, a.slice(0, 0, 64 * step, step));
      return store(d);
    };
  };
  CHECK_ERROR(kernel_error(k(2), X), line, "tensor_copy: src steps over partitions with stride 2",
              "the first dim of an engine operand is the partition dim, with step 1");
  check_compiles(kernel_error(k(1), X));
}

TEST_CASE("verify: free-dim accesses stay inside their partition") {
  int line = 0;
  auto k = [&](int64_t count) {
    return [&, count](Tensor x) {
      Tensor a = filled({128, 64}, nl::float32, "a");
      Tensor d = sb({64, count}, nl::float32, "d");
      line = __LINE__; isa::tensor_copy(d, a.ap({{64, 64}, {1, count}}));
      return store(d);
    };
  };
  CHECK_ERROR(kernel_error(k(96), X), line, "tensor_copy: src free-dim access runs outside its partition row",
              "each partition of 'a' holds 64 elements");
  check_compiles(kernel_error(k(64), X));
}

TEST_CASE("verify: engines access at most 64K elements per partition of SBUF and 4K of PSUM") {
  int line = 0;
  auto k = [&](Buffer buffer, DType dtype, int64_t free) {
    return [&, buffer, dtype, free](Tensor x) {
      Tensor t = nl::ndarray({1, free}, dtype, buffer, "t");
      line = __LINE__; isa::memset(t, 0);
      return store(t);
    };
  };
  CHECK_ERROR(kernel_error(k(nl::sbuf, nl::uint8, 70000), X), line, "memset: dst has 70000 elements per partition",
              "at most 65536 elements per partition from sbuf", "split the instruction along the free dim");
  check_compiles(kernel_error(k(nl::sbuf, nl::uint8, 65536), X));
  CHECK_ERROR(kernel_error(k(nl::psum, nl::bfloat16, 5000), X), line, "memset: dst has 5000 elements per partition",
              "at most 4096 elements per partition from psum");
  check_compiles(kernel_error(k(nl::psum, nl::bfloat16, 4096), X));
}

TEST_CASE("verify: engine access patterns have at most 4 free dims") {
  int line = 0;
  auto k = [&](std::vector<int64_t> order) {
    return [&, order](Tensor x) {
      Tensor a = filled({128, 2, 2, 2, 2, 2}, nl::float32, "a");
      Tensor d = sb({128, 32}, nl::float32, "d");
      line = __LINE__; isa::tensor_copy(d, a.permute(order));
      return store(d);
    };
  };
  // Reversing the free dims leaves 5 dims that cannot be merged into fewer.
  CHECK_ERROR(kernel_error(k({0, 5, 4, 3, 2, 1}), X), line,
              "tensor_copy: src [128, 2, 2, 2, 2, 2] needs 5 free dims in its access pattern "
              "(strides [32, 1, 2, 4, 8, 16])",
              "an engine access pattern has a partition dim and at most 4 free dims on trn2",
              "copy the data into a contiguous tile first");
  // Contiguous dims merge: the plain view is one free dim, a single swap leaves 3.
  check_compiles(kernel_error(k({0, 1, 2, 3, 4, 5}), X));
  check_compiles(kernel_error(k({0, 1, 2, 3, 5, 4}), X));
}

TEST_CASE("verify: engine accesses follow the start-partition rule") {
  int line = 0;
  auto k = [&](int64_t start, int64_t count) {
    return [&, start, count](Tensor x) {
      Tensor a = filled({128, 64}, nl::float32, "a");
      Tensor d = sb({count, 64}, nl::float32, "d");
      line = __LINE__; isa::tensor_copy(d, a.slice(0, start, start + count));
      return store(d);
    };
  };
  CHECK_ERROR(kernel_error(k(32, 64), X), line,
              "tensor_copy: src: an access of 64 partitions cannot start at partition 32",
              "0 or 64 for 33-64", "start the access at partition 0 or 64");
  check_compiles(kernel_error(k(64, 64), X));
  CHECK_ERROR(kernel_error(k(16, 16), X), line, "an access of 16 partitions cannot start at partition 16",
              "start the access at a multiple of 32");
  check_compiles(kernel_error(k(96, 32), X));
}

// ============================================================================================
// Operand agreement, engines and ALU operators (shared by several instructions)
// ============================================================================================

TEST_CASE("verify: operands span the same number of partitions") {
  int line = 0;
  auto k = [&](int64_t partitions) {
    return [&, partitions](Tensor x) {
      Tensor a = filled({128, 512}, nl::float32, "a");
      Tensor b = filled({partitions, 512}, nl::float32, "b");
      Tensor d = sb({128, 512}, nl::float32, "d");
      line = __LINE__; isa::tensor_tensor(d, a, b, nl::add);
      return store(d);
    };
  };
  // NKI's err_num_partition_mismatch example uses the same operands.
  CHECK_ERROR(kernel_error(k(1), X), line,
              "number of partitions mismatch: data1 ('a' sbuf f32[128, 512]) has 128, "
              "data2 ('b' sbuf f32[1, 512]) has 1",
              "operands must span the same partitions");
  check_compiles(kernel_error(k(128), X));
}

TEST_CASE("verify: element-wise operands have the same elements per partition") {
  int line = 0;
  auto k = [&](int64_t free) {
    return [&, free](Tensor x) {
      Tensor a = filled({128, 512}, nl::float32, "a");
      Tensor b = filled({128, free}, nl::float32, "b");
      Tensor d = sb({128, 512}, nl::float32, "d");
      line = __LINE__; isa::tensor_tensor(d, a, b, nl::add);
      return store(d);
    };
  };
  CHECK_ERROR(kernel_error(k(256), X), line,
              "elements per partition mismatch: data1 ('a' sbuf f32[128, 512]) has 512, "
              "data2 ('b' sbuf f32[128, 256]) has 256",
              "use tensor_scalar for a [P, 1] operand");
  check_compiles(kernel_error(k(512), X));
}

TEST_CASE("verify: scalar-or-vector operands are [P, 1]") {
  int line = 0;
  auto k = [&](int64_t free) {
    return [&, free](Tensor x) {
      Tensor a = filled({128, 512}, nl::float32, "a");
      Tensor s = filled({128, free}, nl::float32, "s");
      Tensor d = sb({128, 512}, nl::float32, "d");
      line = __LINE__; isa::tensor_scalar(d, a, nl::multiply, s);
      return store(d);
    };
  };
  CHECK_ERROR(kernel_error(k(2), X), line,
              "tensor_scalar: operand0 must be a scalar or a [128, 1] vector, got shape [128, 2]",
              "per-partition operands have one element per partition");
  check_compiles(kernel_error(k(1), X));
}

TEST_CASE("verify: a vector activation scale is float32; tensor_scalar vectors may be of any dtype") {
  int line = 0;
  auto k = [&](DType dtype, bool activation) {
    return [&, dtype, activation](Tensor x) {
      Tensor a = filled({128, 512}, nl::float32, "a");
      Tensor s = filled({128, 1}, dtype, "s");
      Tensor d = sb({128, 512}, nl::float32, "d");
      if (activation) {
        line = __LINE__; isa::activation(d, nl::exp, a, {.scale = s});
      } else {
        isa::tensor_scalar(d, a, nl::multiply, s);
      }
      return store(d);
    };
  };
  CHECK_ERROR(kernel_error(k(nl::bfloat16, true), X), line, "scale has dtype bfloat16; a vector scale must be float32",
              "float32 [P, 1] tile");
  check_compiles(kernel_error(k(nl::float32, true), X));
  check_compiles(kernel_error(k(nl::bfloat16, false), X));
}

TEST_CASE("verify: at most one input is read from PSUM") {
  int line = 0;
  auto k = [&](Buffer second) {
    return [&, second](Tensor x) {
      Tensor a = ps({128, 512}, nl::float32, "a");
      isa::memset(a, 1.0);
      Tensor b = nl::ndarray({128, 512}, nl::float32, second, "b");
      isa::memset(b, 2.0);
      Tensor d = sb({128, 512}, nl::float32, "d");
      line = __LINE__; isa::tensor_tensor(d, a, b, nl::add);
      return store(d);
    };
  };
  CHECK_ERROR(kernel_error(k(nl::psum), X), line, "tensor_tensor: data1 and data2 are both in PSUM",
              "at most one tensor input may be read from PSUM", "copy one of them to SBUF first");
  check_compiles(kernel_error(k(nl::sbuf), X));
}

TEST_CASE("verify: instructions run only on their engines") {
  int line = 0;
  auto k = [&](Engine engine) {
    return [&, engine](Tensor x) {
      Tensor a = filled({128, 512}, nl::float32, "a");
      Tensor d = sb({128, 512}, nl::float32, "d");
      line = __LINE__; isa::tensor_tensor(d, a, a, nl::add, engine);
      return store(d);
    };
  };
  CHECK_ERROR(kernel_error(k(isa::scalar_engine), X), line, "tensor_tensor: cannot run on the scalar engine",
              "tensor_tensor runs on: vector, gpsimd", "pass engine= one of: vector, gpsimd");
  check_compiles(kernel_error(k(isa::gpsimd_engine), X));
}

TEST_CASE("verify: bitwise operators act on integer tiles") {
  int line = 0;
  auto k = [&](DType dtype) {
    return [&, dtype](Tensor x) {
      Tensor a = filled({128, 512}, dtype, "a");
      Tensor d = sb({128, 512}, dtype, "d");
      line = __LINE__; isa::tensor_tensor(d, a, a, nl::bitwise_and);
      return store(d);
    };
  };
  CHECK_ERROR(kernel_error(k(nl::float32), X), line,
              "bitwise operator bitwise_and needs integer tiles, but dst is float32",
              "bitvec operators act on integer bit patterns", ".view()");
  check_compiles(kernel_error(k(nl::int32), X));
}

TEST_CASE("verify: bitwise operators take integer immediates") {
  int line = 0;
  auto k = [&](double value) {
    return [&, value](Tensor x) {
      Tensor a = filled({128, 512}, nl::int32, "a");
      Tensor d = sb({128, 512}, nl::int32, "d");
      line = __LINE__; isa::tensor_scalar(d, a, nl::bitwise_and, value);
      return store(d);
    };
  };
  CHECK_ERROR(kernel_error(k(1.5), X), line,
              "tensor_scalar: bitwise operator bitwise_and needs an integer operand, but operand0 is 1.5",
              "pass an integer immediate");
  check_compiles(kernel_error(k(3), X));
}

TEST_CASE("verify: bitwise operators run on the vector engine") {
  int line = 0;
  auto k = [&](Engine engine) {
    return [&, engine](Tensor x) {
      Tensor a = filled({128, 512}, nl::int32, "a");
      Tensor d = sb({128, 512}, nl::int32, "d");
      line = __LINE__; isa::tensor_tensor(d, a, a, nl::bitwise_xor, engine);
      return store(d);
    };
  };
  CHECK_ERROR(kernel_error(k(isa::gpsimd_engine), X), line,
              "bitwise operator bitwise_xor cannot run on the gpsimd engine",
              "bitvec operators run on the vector engine only", "engine=nki.isa.vector_engine");
  check_compiles(kernel_error(k(isa::vector_engine), X));
}

TEST_CASE("verify: divide, mod and fmod are not NeuronCore ALU operators") {
  int line = 0;
  auto k = [&](nl::Op op) {
    return [&, op](Tensor x) {
      Tensor a = filled({128, 512}, nl::float32, "a", 1.0);
      Tensor d = sb({128, 512}, nl::float32, "d");
      line = __LINE__; isa::tensor_tensor(d, a, a, op);
      return store(d);
    };
  };
  CHECK_ERROR(kernel_error(k(nl::divide), X), line, "tensor_tensor: op=divide is not a NeuronCore ALU operator",
              "multiply by the reciprocal");
  CHECK_ERROR(kernel_error(k(nl::mod), X), line, "op=mod is not a NeuronCore ALU operator", "compute the remainder");
  check_compiles(kernel_error(k(nl::multiply), X));
}

TEST_CASE("verify: average and bypass are not element-wise operators") {
  int line = 0;
  auto k = [&](nl::Op op) {
    return [&, op](Tensor x) {
      Tensor a = filled({128, 512}, nl::float32, "a");
      Tensor d = sb({128, 512}, nl::float32, "d");
      line = __LINE__; isa::tensor_tensor(d, a, a, op);
      return store(d);
    };
  };
  CHECK_ERROR(kernel_error(k(nl::average), X), line, "tensor_tensor: op=average is not an element-wise operator",
              "nl.average is only a tensor_partition_reduce operator");
  check_compiles(kernel_error(k(nl::add), X));
}

TEST_CASE("verify: arithmetic shift right is not supported") {
  int line = 0;
  auto k = [&](nl::Op op) {
    return [&, op](Tensor x) {
      Tensor a = filled({128, 512}, nl::int32, "a");
      Tensor d = sb({128, 512}, nl::int32, "d");
      line = __LINE__; isa::tensor_tensor(d, a, a, op);
      return store(d);
    };
  };
  CHECK_ERROR(kernel_error(k(nl::detail::alu(AluOp::arith_shift_right)), X), line,
              "op=arith_shift_right: arithmetic shift right is not supported by the hardware", "use nl.right_shift");
  check_compiles(kernel_error(k(nl::right_shift), X));
}

TEST_CASE("verify: abs_max and abs_min need NeuronCore-v4") {
  int line = 0;
  auto k = [&](nl::Op op) {
    return [&, op](Tensor x) {
      Tensor a = filled({128, 512}, nl::float32, "a");
      Tensor d = sb({128, 512}, nl::float32, "d");
      line = __LINE__; isa::tensor_tensor(d, a, a, op);
      return store(d);
    };
  };
  CHECK_ERROR(kernel_error(k(nl::abs_max), X), line,
              "op=abs_max needs NeuronCore-v4; trn2 (NeuronCore-v3) does not have it",
              "nl.maximum");
  check_compiles(kernel_error(k(nl::maximum), X));
}

TEST_CASE("verify: binary instructions reject unary operators") {
  int line = 0;
  auto k = [&](nl::Op op) {
    return [&, op](Tensor x) {
      Tensor a = filled({128, 512}, nl::float32, "a");
      Tensor d = sb({128, 512}, nl::float32, "d");
      line = __LINE__; isa::tensor_tensor(d, a, a, op);
      return store(d);
    };
  };
  CHECK_ERROR(kernel_error(k(nl::abs), X), line, "tensor_tensor: op=abs is a unary operator",
              "op of tensor_tensor takes a binary operator", "tensor_scalar (operand0=0)");
  check_compiles(kernel_error(k(nl::subtract), X));
}

TEST_CASE("verify: reductions use legal reduction operators") {
  int line = 0;
  auto k = [&](nl::Op op) {
    return [&, op](Tensor x) {
      Tensor a = filled({128, 512}, nl::float32, "a");
      Tensor d = sb({128, 1}, nl::float32, "d");
      line = __LINE__; isa::tensor_reduce(d, op, a, {1});
      return store(d);
    };
  };
  CHECK_ERROR(kernel_error(k(nl::greater), X), line, "tensor_reduce: op=greater is not a legal reduction operator",
              "reductions use add, subtract, multiply, maximum, minimum");
  check_compiles(kernel_error(k(nl::maximum), X));
}

// ============================================================================================
// Instructions
// ============================================================================================

TEST_CASE("verify: dma_copy moves equal element counts") {
  int line = 0;
  auto k = [&](int64_t free) {
    return [&, free](Tensor x) {
      Tensor t = sb({128, 256}, nl::float32, "t");
      line = __LINE__; isa::dma_copy(t, x(nl::all, nl::ds(0, free)));
      return store(t);
    };
  };
  CHECK_ERROR(kernel_error(k(512), X), line, "dma_copy: dst has 32768 elements [128, 256] but src has 65536 [128, 512]",
              "dma_copy moves the same number of elements", "slice dst or src");
  check_compiles(kernel_error(k(256), X));
}

TEST_CASE("verify: tensor_copy runs on the scalar engine from NeuronCore-v3") {
  int line = 0;
  auto k = [&](Tensor x) {
    Tensor a = filled({128, 512}, nl::float32, "a");
    Tensor d = sb({128, 512}, nl::float32, "d");
    line = __LINE__; isa::tensor_copy(d, a, isa::scalar_engine);
    return store(d);
  };
  CHECK_ERROR(test::kernel_error_on(TraceOptions{.target = TargetId::trn1}, k, X), line,
              "tensor_copy cannot run on the scalar engine of trn1 (NeuronCore-v2)", "activation(op=nl.copy)");
  check_compiles(test::kernel_error_on(TraceOptions{.target = TargetId::trn2}, k, X));
}

TEST_CASE("verify: tensor_tensor computes power on the GpSimd engine") {
  int line = 0;
  auto k = [&](Engine engine) {
    return [&, engine](Tensor x) {
      Tensor a = filled({128, 512}, nl::float32, "a", 2.0);
      Tensor d = sb({128, 512}, nl::float32, "d");
      line = __LINE__; isa::tensor_tensor(d, a, a, nl::power, engine);
      return store(d);
    };
  };
  CHECK_ERROR(kernel_error(k(isa::vector_engine), X), line, "tensor_tensor: op=power cannot run on the vector engine",
              "nl.power on the GpSimd engine only", "pass engine=nki.isa.gpsimd_engine");
  check_compiles(kernel_error(k(isa::gpsimd_engine), X));
  check_compiles(kernel_error(k(isa::unknown_engine), X));  // the default engine of power is GpSimd
}

TEST_CASE("verify: tensor_scalar operators are both bitwise or both arithmetic") {
  int line = 0;
  auto k = [&](nl::Op op1) {
    return [&, op1](Tensor x) {
      Tensor a = filled({128, 512}, nl::int32, "a");
      Tensor d = sb({128, 512}, nl::int32, "d");
      const isa::TensorScalarOptions o{.op1 = op1, .operand1 = Scalar(1)};
      line = __LINE__; isa::tensor_scalar(d, a, nl::bitwise_and, 3, o);
      return store(d);
    };
  };
  CHECK_ERROR(kernel_error(k(nl::add), X), line, "tensor_scalar: op0=bitwise_and is bitwise but op1=add is arithmetic",
              "op0 and op1 must both be bitwise or both be arithmetic operators");
  check_compiles(kernel_error(k(nl::bitwise_or), X));
}

TEST_CASE("verify: the scalar engine runs tensor_scalar as multiply and/or add only") {
  int line = 0;
  auto k = [&](nl::Op op0) {
    return [&, op0](Tensor x) {
      Tensor a = filled({128, 512}, nl::float32, "a");
      Tensor d = sb({128, 512}, nl::float32, "d");
      const isa::TensorScalarOptions o{.op1 = nl::add, .operand1 = Scalar(1.0), .engine = isa::scalar_engine};
      line = __LINE__; isa::tensor_scalar(d, a, op0, 2.0, o);
      return store(d);
    };
  };
  CHECK_ERROR(kernel_error(k(nl::subtract), X), line,
              "tensor_scalar: op0=subtract, op1=add is not supported on the scalar engine",
              "(multiply, add), (multiply) or (add)", "use the vector engine");
  check_compiles(kernel_error(k(nl::multiply), X));
}

TEST_CASE("verify: tensor_scalar runs on the GpSimd engine only for rsqrt") {
  int line = 0;
  auto k = [&](nl::Op op0) {
    return [&, op0](Tensor x) {
      Tensor a = filled({128, 512}, nl::float32, "a", 4.0);
      Tensor d = sb({128, 512}, nl::float32, "d");
      line = __LINE__; isa::tensor_scalar(d, a, op0, 0.0, {.engine = isa::gpsimd_engine});
      return store(d);
    };
  };
  CHECK_ERROR(kernel_error(k(nl::add), X), line, "tensor_scalar: op0=add is not supported on the GpSimd engine",
              "tensor_scalar runs on the GpSimd engine only for rsqrt");
  check_compiles(kernel_error(k(nl::rsqrt), X));
}

TEST_CASE("verify: unary operators take operand 0") {
  int line = 0;
  auto k = [&](double operand) {
    return [&, operand](Tensor x) {
      Tensor a = filled({128, 512}, nl::float32, "a");
      Tensor d = sb({128, 512}, nl::float32, "d");
      line = __LINE__; isa::tensor_scalar(d, a, nl::abs, operand);
      return store(d);
    };
  };
  CHECK_ERROR(kernel_error(k(1.0), X), line, "tensor_scalar: abs is unary; operand0 must be 0, got 1",
              "the operand of a unary operator must be None or 0", "pass operand0=0.0");
  check_compiles(kernel_error(k(0.0), X));
}

TEST_CASE("verify: scalar_tensor_tensor takes arithmetic operators") {
  int line = 0;
  auto k = [&](nl::Op op0) {
    return [&, op0](Tensor x) {
      Tensor a = filled({128, 512}, nl::int32, "a");
      Tensor d = sb({128, 512}, nl::int32, "d");
      line = __LINE__; isa::scalar_tensor_tensor(d, a, op0, 1, nl::add, a);
      return store(d);
    };
  };
  CHECK_ERROR(kernel_error(k(nl::bitwise_and), X), line,
              "scalar_tensor_tensor: op0=bitwise_and, op1=add: bitwise operators are not supported",
              "scalar_tensor_tensor takes arithmetic operators only");
  check_compiles(kernel_error(k(nl::multiply), X));
}

TEST_CASE("verify: activation bias is any dtype but tfloat32") {
  int line = 0;
  auto k = [&](DType dtype) {
    return [&, dtype](Tensor x) {
      Tensor a = filled({128, 512}, nl::float32, "a");
      Tensor b = filled({128, 1}, dtype, "b");
      Tensor d = sb({128, 512}, nl::float32, "d");
      line = __LINE__; isa::activation(d, nl::exp, a, {.bias = b});
      return store(d);
    };
  };
  CHECK_ERROR(kernel_error(k(nl::tfloat32), X), line, "activation: bias has dtype tfloat32",
              "bias can be any dtype except tfloat32");
  check_compiles(kernel_error(k(nl::float32), X));
  check_compiles(kernel_error(k(nl::bfloat16), X));
  check_compiles(kernel_error(k(nl::int32), X));  // NKI: "any supported dtype except tfloat32"
}

TEST_CASE("verify: activation reduces with nl.add only") {
  int line = 0;
  auto k = [&](nl::Op op) {
    return [&, op](Tensor x) {
      Tensor a = filled({128, 512}, nl::float32, "a");
      Tensor r = sb({128, 1}, nl::float32, "r");
      Tensor d = sb({128, 512}, nl::float32, "d");
      line = __LINE__; isa::activation(d, nl::exp, a, {.reduce_op = op, .reduce_res = r});
      return store(r);
    };
  };
  CHECK_ERROR(kernel_error(k(nl::maximum), X), line, "activation: reduce_op=maximum is not supported",
              "the scalar engine's accumulators reduce with nl.add only", "pass reduce_op=nl.add");
  check_compiles(kernel_error(k(nl::add), X));
}

TEST_CASE("verify: activation does not support reduce_cmd=load_reduce") {
  int line = 0;
  auto k = [&](ReduceCmd cmd) {
    return [&, cmd](Tensor x) {
      Tensor a = filled({128, 512}, nl::float32, "a");
      Tensor r = sb({128, 1}, nl::float32, "r");
      Tensor d = sb({128, 512}, nl::float32, "d");
      line = __LINE__; isa::activation(d, nl::exp, a, {.reduce_op = nl::add, .reduce_res = r, .reduce_cmd = cmd});
      return store(r);
    };
  };
  CHECK_ERROR(kernel_error(k(ReduceCmd::load_reduce), X), line, "activation: reduce_cmd=load_reduce is not supported",
              "idle, reset, reduce or reset_reduce");
  check_compiles(kernel_error(k(ReduceCmd::reset_reduce), X));
}

TEST_CASE("verify: tensor_reduce negates arithmetic reductions only") {
  int line = 0;
  auto k = [&](bool negate) {
    return [&, negate](Tensor x) {
      Tensor a = filled({128, 512}, nl::int32, "a");
      Tensor d = sb({128, 1}, nl::int32, "d");
      line = __LINE__; isa::tensor_reduce(d, nl::bitwise_or, a, {1}, negate);
      return store(d);
    };
  };
  CHECK_ERROR(kernel_error(k(true), X), line, "tensor_reduce: negate=True with the bitwise operator bitwise_or",
              "negate applies to arithmetic reductions only");
  check_compiles(kernel_error(k(false), X));
}

TEST_CASE("verify: tensor_reduce needs an axis") {
  int line = 0;
  auto k = [&](std::vector<int> axis) {
    return [&, axis](Tensor x) {
      Tensor a = filled({128, 512}, nl::float32, "a");
      Tensor d = sb({128, 1}, nl::float32, "d");
      line = __LINE__; isa::tensor_reduce(d, nl::add, a, axis);
      return store(d);
    };
  };
  CHECK_ERROR(kernel_error(k({}), X), line, "tensor_reduce: axis is empty", "axis=[1]");
  check_compiles(kernel_error(k({1}), X));
  check_compiles(kernel_error(k({-1}), X));
}

TEST_CASE("verify: tensor_reduce never reduces the partition dim") {
  int line = 0;
  auto k = [&](std::vector<int> axis) {
    return [&, axis](Tensor x) {
      Tensor a = filled({128, 512}, nl::float32, "a");
      Tensor d = sb({128, 1}, nl::float32, "d");
      line = __LINE__; isa::tensor_reduce(d, nl::add, a, axis);
      return store(d);
    };
  };
  CHECK_ERROR(kernel_error(k({0, 1}), X), line, "tensor_reduce: cannot reduce over axis 0, the partition dim",
              "tensor_reduce reduces free dims only", "nisa.tensor_partition_reduce");
  check_compiles(kernel_error(k({1}), X));
}

TEST_CASE("verify: tensor_reduce reduces the trailing free dims") {
  int line = 0;
  auto k = [&](std::vector<int> axis, int64_t kept) {
    return [&, axis, kept](Tensor x) {
      Tensor a = filled({128, 4, 8}, nl::float32, "a");
      Tensor d = sb({128, kept}, nl::float32, "d");
      line = __LINE__; isa::tensor_reduce(d, nl::add, a, axis);
      return store(d);
    };
  };
  CHECK_ERROR(kernel_error(k({1}, 8), X), line, "tensor_reduce: axis 2 is not reduced but an earlier axis is",
              "the reduced axes must be the last free dims, ending at the final dim");
  check_compiles(kernel_error(k({2}, 4), X));
  check_compiles(kernel_error(k({1, 2}, 1), X));
}

TEST_CASE("verify: tensor_reduce axes exist in the data view (IR)") {
  // The C++ API rejects such axes while tracing; the verifier also guards IR built by other front ends.
  int line = 0;
  Kernel k = trace("k", [&](Tensor x) {
    Tensor a = filled({128, 512}, nl::float32, "a");
    Tensor d = sb({128, 1}, nl::float32, "d");
    line = __LINE__; isa::tensor_reduce(d, nl::add, a, {1});
    return store(d);
  }, X);
  check_compiles(test::compile_kernel_error(k));
  for (Instruction& inst : k.instructions)
    if (inst.opcode == Opcode::tensor_reduce) inst.attrs.axes |= 1u << 3;
  CHECK_ERROR(test::compile_kernel_error(k), line, "tensor_reduce: axis [1, 3] is out of range for data of rank 2",
              "axes are 1 to 1");
}

TEST_CASE("verify: tensor_reduce dst has the reduced shape") {
  int line = 0;
  auto k = [&](int64_t free) {
    return [&, free](Tensor x) {
      Tensor a = filled({128, 4, 8}, nl::float32, "a");
      Tensor d = sb({128, free}, nl::float32, "d");
      line = __LINE__; isa::tensor_reduce(d, nl::maximum, a, {2});
      return store(d);
    };
  };
  CHECK_ERROR(kernel_error(k(8), X), line,
              "tensor_reduce: dst has 8 elements per partition; reducing [128, 4, 8] over axis [2] leaves 4",
              "size dst as data's shape with the reduced axes removed");
  check_compiles(kernel_error(k(4), X));
}

TEST_CASE("verify: tensor_scalar_reduce takes an arithmetic op0") {
  int line = 0;
  auto k = [&](nl::Op op0) {
    return [&, op0](Tensor x) {
      Tensor a = filled({128, 512}, nl::int32, "a");
      Tensor d = sb({128, 512}, nl::int32, "d");
      Tensor r = sb({128, 1}, nl::float32, "r");
      line = __LINE__; isa::tensor_scalar_reduce(d, a, op0, 1, nl::add, r);
      return store(r);
    };
  };
  CHECK_ERROR(kernel_error(k(nl::bitwise_and), X), line, "tensor_scalar_reduce: op0=bitwise_and is a bitwise operator",
              "tensor_scalar_reduce takes an arithmetic op0 only");
  check_compiles(kernel_error(k(nl::multiply), X));
}

TEST_CASE("verify: tensor_scalar_reduce accepts a unary op0 with operand0=0") {
  // NKI: op0 is any arithmetic operator; operand0 "must be None or 0 when op0 is a unary operator".
  int line = 0;
  auto k = [&](double operand) {
    return [&, operand](Tensor x) {
      Tensor a = filled({128, 512}, nl::float32, "a", -1.0);
      Tensor d = sb({128, 512}, nl::float32, "d");
      Tensor r = sb({128, 1}, nl::float32, "r");
      line = __LINE__; isa::tensor_scalar_reduce(d, a, nl::abs, operand, nl::add, r);
      return store(r);
    };
  };
  check_compiles(kernel_error(k(0.0), X));
  CHECK_ERROR(kernel_error(k(2.0), X), line, "tensor_scalar_reduce: abs is unary; operand0 must be 0, got 2");
}

TEST_CASE("verify: tensor_scalar_reduce reduce_op is add, multiply, maximum or minimum") {
  int line = 0;
  auto k = [&](nl::Op op) {
    return [&, op](Tensor x) {
      Tensor a = filled({128, 512}, nl::float32, "a");
      Tensor d = sb({128, 512}, nl::float32, "d");
      Tensor r = sb({128, 1}, nl::float32, "r");
      line = __LINE__; isa::tensor_scalar_reduce(d, a, nl::multiply, 2.0, op, r);
      return store(r);
    };
  };
  CHECK_ERROR(kernel_error(k(nl::subtract), X), line, "tensor_scalar_reduce: reduce_op=subtract is not supported",
              "reduce_op is one of add, multiply, maximum, minimum");
  check_compiles(kernel_error(k(nl::minimum), X));
}

TEST_CASE("verify: tensor_scalar_reduce does not support reverse0") {
  int line = 0;
  auto k = [&](bool reverse0) {
    return [&, reverse0](Tensor x) {
      Tensor a = filled({128, 512}, nl::float32, "a");
      Tensor d = sb({128, 512}, nl::float32, "d");
      Tensor r = sb({128, 1}, nl::float32, "r");
      line = __LINE__; isa::tensor_scalar_reduce(d, a, nl::subtract, 2.0, nl::add, r, reverse0);
      return store(r);
    };
  };
  CHECK_ERROR(kernel_error(k(true), X), line, "tensor_scalar_reduce: reverse0=True is not supported",
              "use tensor_scalar with reverse0=True, then tensor_reduce");
  check_compiles(kernel_error(k(false), X));
}

// --- nc_matmul ---------------------------------------------------------------------------

TEST_CASE("verify: nc_matmul reads stationary and moving from SBUF") {
  int line = 0;
  auto k = [&](Buffer buffer) {
    return [&, buffer](Tensor x) {
      Tensor st = nl::ndarray({128, 128}, nl::float32, buffer, "st");
      isa::memset(st, 1.0);
      Tensor mv = filled({128, 512}, nl::float32, "mv");
      Tensor acc = ps({128, 512});
      line = __LINE__; isa::nc_matmul(acc, st, mv);
      return store(acc);
    };
  };
  CHECK_ERROR(kernel_error(k(nl::psum), X), line, "nc_matmul: stationary ('st' psum f32[128, 128]) must be in SBUF",
              "nc_matmul reads stationary and moving from SBUF");
  check_compiles(kernel_error(k(nl::sbuf), X));
}

TEST_CASE("verify: nc_matmul writes PSUM") {
  int line = 0;
  auto k = [&](Buffer buffer) {
    return [&, buffer](Tensor x) {
      Tensor st = filled({128, 128}, nl::bfloat16, "st");
      Tensor mv = filled({128, 512}, nl::bfloat16, "mv");
      Tensor d = nl::ndarray({128, 512}, nl::float32, buffer, "d");
      line = __LINE__; isa::nc_matmul(d, st, mv);
      return store(d);
    };
  };
  CHECK_ERROR(kernel_error(k(nl::sbuf), X), line, "nc_matmul: dst ('d' sbuf f32[128, 512]) must be in PSUM",
              "the tensor engine writes PSUM only", "buffer=nl.psum");
  check_compiles(kernel_error(k(nl::psum), X));
}

TEST_CASE("verify: nc_matmul input dtypes") {
  int line = 0;
  auto k = [&](DType dtype) {
    return [&, dtype](Tensor x) {
      Tensor st = filled({128, 128}, dtype, "st");
      Tensor mv = filled({128, 512}, nl::bfloat16, "mv");
      Tensor acc = ps({128, 512});
      line = __LINE__; isa::nc_matmul(acc, st, mv);
      return store(acc);
    };
  };
  CHECK_ERROR(kernel_error(k(nl::int8), X), line, "nc_matmul: stationary has dtype int8",
              "matmul inputs on trn2 (NeuronCore-v3) are float8_e4m3, float8_e5m2, bfloat16, float16, tfloat32 "
              "or float32");
  // OCP fp8 (float8_e4m3fn) is a NeuronCore-v4 matmul input.
  CHECK_ERROR(kernel_error(k(nl::float8_e4m3fn), X), line, "stationary has dtype float8_e4m3fn");
  check_compiles(kernel_error(k(nl::float8_e4m3), X));
  check_compiles(kernel_error(k(nl::float16), X));
}

TEST_CASE("verify: float32/tfloat32 matmul operands pair with float32/tfloat32") {
  int line = 0;
  auto k = [&](DType moving) {
    return [&, moving](Tensor x) {
      Tensor st = filled({128, 128}, nl::float32, "st");
      Tensor mv = filled({128, 512}, moving, "mv");
      Tensor acc = ps({128, 512});
      line = __LINE__; isa::nc_matmul(acc, st, mv);
      return store(acc);
    };
  };
  CHECK_ERROR(kernel_error(k(nl::bfloat16), X), line, "nc_matmul: stationary is float32 but moving is bfloat16",
              "float32/tfloat32 inputs must be paired with float32/tfloat32");
  check_compiles(kernel_error(k(nl::tfloat32), X));
}

TEST_CASE("verify: nc_matmul writes float32 results") {
  int line = 0;
  auto k = [&](DType dtype) {
    return [&, dtype](Tensor x) {
      Tensor st = filled({128, 128}, nl::bfloat16, "st");
      Tensor mv = filled({128, 512}, nl::bfloat16, "mv");
      Tensor acc = ps({128, 512}, dtype);
      line = __LINE__; isa::nc_matmul(acc, st, mv);
      return store(acc);
    };
  };
  CHECK_ERROR(kernel_error(k(nl::bfloat16), X), line, "nc_matmul: dst has dtype bfloat16",
              "matmul results are float32 on trn2 (NeuronCore-v3)", "allocate the PSUM tile as nl.float32");
  check_compiles(kernel_error(k(nl::float32), X));
}

TEST_CASE("verify: nc_matmul transpose mode writes the stationary dtype (or float32)") {
  int line = 0;
  auto k = [&](DType dst) {
    return [&, dst](Tensor x) {
      Tensor data = filled({128, 64}, nl::bfloat16, "data");
      Tensor identity = filled({128, 128}, nl::bfloat16, "identity");
      Tensor acc = ps({64, 128}, dst);
      line = __LINE__; isa::nc_matmul(acc, data, identity, {.is_transpose = true});
      return store(acc);
    };
  };
  CHECK_ERROR(kernel_error(k(nl::float16), X), line,
              "nc_matmul: is_transpose=True with dst float16 but stationary bfloat16",
              "in transpose mode dst has the dtype of the transposed (stationary) tile, or float32",
              "allocate dst as bfloat16");
  check_compiles(kernel_error(k(nl::bfloat16), X));
  check_compiles(kernel_error(k(nl::float32), X));
  // NeuronCore-v2 has no transpose mode (is_transpose is only a profiler hint): dst stays float32.
  CHECK_ERROR(test::kernel_error_on(TraceOptions{.target = TargetId::trn1}, k(nl::bfloat16), X), line,
              "nc_matmul: dst has dtype bfloat16", "matmul results are float32 on trn1 (NeuronCore-v2)");
}

TEST_CASE("verify: nc_matmul contracts equal partition counts") {
  int line = 0;
  auto k = [&](int64_t k_moving) {
    return [&, k_moving](Tensor x) {
      Tensor st = filled({128, 128}, nl::bfloat16, "st");
      Tensor mv = filled({k_moving, 512}, nl::bfloat16, "mv");
      Tensor acc = ps({128, 512});
      line = __LINE__; isa::nc_matmul(acc, st, mv);
      return store(acc);
    };
  };
  CHECK_ERROR(kernel_error(k(64), X), line,
              "nc_matmul: contraction sizes differ: stationary has 128 partitions, moving has 64",
              "stationary and moving share the partition (contraction) dim");
  check_compiles(kernel_error(k(128), X));
}

TEST_CASE("verify: nc_matmul stationary free size is at most 128") {
  int line = 0;
  auto k = [&](int64_t m) {
    return [&, m](Tensor x) {
      Tensor st = filled({128, m}, nl::bfloat16, "st");
      Tensor mv = filled({128, 512}, nl::bfloat16, "mv");
      Tensor acc = ps({128, 512});
      line = __LINE__; isa::nc_matmul(acc, st, mv);
      return store(acc);
    };
  };
  CHECK_ERROR(kernel_error(k(256), X), line, "nc_matmul: stationary free size 256 exceeds 128",
              "gemm_stationary_fmax = 128", "tile the stationary free dim");
  check_compiles(kernel_error(k(128), X));
}

TEST_CASE("verify: nc_matmul moving free size is at most 512") {
  int line = 0;
  auto k = [&](int64_t n) {
    return [&, n](Tensor x) {
      Tensor st = filled({128, 128}, nl::bfloat16, "st");
      Tensor mv = filled({128, n}, nl::bfloat16, "mv");
      Tensor acc = ps({128, 512});
      line = __LINE__; isa::nc_matmul(acc, st, mv);
      return store(acc);
    };
  };
  CHECK_ERROR(kernel_error(k(1024), X), line, "nc_matmul: moving free size 1024 exceeds 512", "gemm_moving_fmax = 512",
              "tile the moving free dim");
  check_compiles(kernel_error(k(512), X));
}

TEST_CASE("verify: nc_matmul dst is stationary.T @ moving") {
  int line = 0;
  auto k = [&](int64_t rows) {
    return [&, rows](Tensor x) {
      Tensor st = filled({128, 64}, nl::bfloat16, "st");
      Tensor mv = filled({128, 512}, nl::bfloat16, "mv");
      Tensor acc = ps({rows, 512});
      line = __LINE__; isa::nc_matmul(acc, st, mv);
      return store(acc);
    };
  };
  CHECK_ERROR(kernel_error(k(128), X), line,
              "nc_matmul: dst [128, 512] does not match stationary.T @ moving = [64, 512]",
              "dst partitions = stationary free size", "allocate dst as [64, 512]");
  check_compiles(kernel_error(k(64), X));
}

TEST_CASE("verify: one matmul accumulates within one PSUM bank") {
  int line = 0;
  auto k = [&](int64_t start) {
    return [&, start](Tensor x) {
      Tensor st = filled({128, 128}, nl::bfloat16, "st");
      Tensor mv = filled({128, 512}, nl::bfloat16, "mv");
      Tensor acc = ps({128, 1024});
      line = __LINE__; isa::nc_matmul(acc(nl::all, nl::ds(start, 512)), st, mv);
      return store(acc);
    };
  };
  CHECK_ERROR(kernel_error(k(256), X), line,
              "nc_matmul: dst spans bytes [1024, 3072) of each partition, crossing a PSUM bank boundary",
              "one matmul accumulates within one PSUM bank of 2048 bytes (512 float32) per partition",
              "split the moving free dim");
  check_compiles(kernel_error(k(512), X));
}

// --- nc_transpose --------------------------------------------------------------------------

TEST_CASE("verify: nc_transpose keeps the dtype") {
  int line = 0;
  auto k = [&](DType dst) {
    return [&, dst](Tensor x) {
      Tensor data = filled({128, 64}, nl::bfloat16, "data");
      Tensor t = ps({64, 128}, dst, "t");
      line = __LINE__; isa::nc_transpose(t, data);
      return store(t);
    };
  };
  CHECK_ERROR(kernel_error(k(nl::float32), X), line, "nc_transpose: dst is float32 but data is bfloat16",
              "nc_transpose does not convert dtypes");
  check_compiles(kernel_error(k(nl::bfloat16), X));
}

TEST_CASE("verify: nc_transpose dst is the transpose of data") {
  int line = 0;
  auto k = [&](Shape dst) {
    return [&, dst](Tensor x) {
      Tensor data = filled({128, 64}, nl::float32, "data");
      Tensor t = ps(dst, nl::float32, "t");
      line = __LINE__; isa::nc_transpose(t, data);
      return store(t);
    };
  };
  CHECK_ERROR(kernel_error(k({128, 64}), X), line, "nc_transpose: dst [128, 64] is not the transpose of data [128, 64]",
              "allocate dst as [64, 128]");
  check_compiles(kernel_error(k({64, 128}), X));
}

TEST_CASE("verify: tensor-engine transposes go from SBUF into PSUM") {
  int line = 0;
  auto k = [&](Buffer dst) {
    return [&, dst](Tensor x) {
      Tensor data = filled({128, 64}, nl::float32, "data");
      Tensor t = nl::ndarray({64, 128}, nl::float32, dst, "t");
      line = __LINE__; isa::nc_transpose(t, data, isa::tensor_engine);
      return store(t);
    };
  };
  CHECK_ERROR(kernel_error(k(nl::sbuf), X), line, "nc_transpose: data is in sbuf and dst in sbuf",
              "the tensor engine transposes from SBUF into PSUM");
  check_compiles(kernel_error(k(nl::psum), X));
}

TEST_CASE("verify: vector-engine transposes are at most 32x32") {
  int line = 0;
  auto k = [&](int64_t n) {
    return [&, n](Tensor x) {
      Tensor data = filled({n, n}, nl::float32, "data");
      Tensor t = sb({n, n}, nl::float32, "t");
      line = __LINE__; isa::nc_transpose(t, data);
      return store(t);
    };
  };
  CHECK_ERROR(kernel_error(k(64), X), line, "nc_transpose: data [64, 64] exceeds the vector engine transpose limit",
              "at most [32, 32] on the vector engine", "use the tensor engine (dst in PSUM)");
  check_compiles(kernel_error(k(32), X));
}

// --- memset, iota, affine_select -----------------------------------------------------------

TEST_CASE("verify: memset into an integer tile takes an integer value") {
  int line = 0;
  auto k = [&](double value) {
    return [&, value](Tensor x) {
      Tensor t = sb({128, 64}, nl::int32, "t");
      line = __LINE__; isa::memset(t, value);
      return store(t);
    };
  };
  CHECK_ERROR(kernel_error(k(2.5), X), line, "memset: value 2.5 does not match the integer dtype int32",
              "memset's value must have the dst dtype's type");
  check_compiles(kernel_error(k(2), X));
}

TEST_CASE("verify: memset values fit the dtype") {
  int line = 0;
  auto k = [&](double value) {
    return [&, value](Tensor x) {
      Tensor t = sb({128, 64}, nl::uint8, "t");
      line = __LINE__; isa::memset(t, value);
      return store(t);
    };
  };
  CHECK_ERROR(kernel_error(k(300), X), line, "memset: value 300 is outside the range of uint8 [0, 255]");
  check_compiles(kernel_error(k(255), X));
}

TEST_CASE("verify: iota patterns have 1 to 4 [step, num] pairs") {
  int line = 0;
  auto k = [&](std::vector<Dim> pattern) {
    return [&, pattern](Tensor x) {
      Tensor t = sb({128, 32}, nl::int32, "t");
      line = __LINE__; isa::iota(t, pattern);
      return store(t);
    };
  };
  CHECK_ERROR(kernel_error(k({{16, 2}, {8, 2}, {4, 2}, {2, 2}, {1, 2}}), X), line,
              "iota: pattern has 5 [step, num] pairs",
              "the pattern has 1 to 4 [step, num] pairs");
  check_compiles(kernel_error(k({{8, 4}, {4, 2}, {2, 2}, {1, 2}}), X));
}

TEST_CASE("verify: iota pattern nums are positive") {
  int line = 0;
  auto k = [&](int64_t num) {
    return [&, num](Tensor x) {
      Tensor t = sb({128, 32}, nl::int32, "t");
      line = __LINE__; isa::iota(t, {{0, num}, {1, 32}});
      return store(t);
    };
  };
  CHECK_ERROR(kernel_error(k(0), X), line, "iota: pattern pair 0 has num 0", "every num of the pattern must be >= 1");
  check_compiles(kernel_error(k(1), X));
}

TEST_CASE("verify: iota patterns cover dst") {
  int line = 0;
  auto k = [&](int64_t num) {
    return [&, num](Tensor x) {
      Tensor t = sb({128, 32}, nl::int32, "t");
      line = __LINE__; isa::iota(t, {{1, num}}, 0, 1);
      return store(t);
    };
  };
  CHECK_ERROR(kernel_error(k(16), X), line, "iota: pattern generates 16 elements per partition but dst has 32",
              "the pattern's element count must equal dst's elements per partition");
  check_compiles(kernel_error(k(32), X));
}

TEST_CASE("verify: iota offsets, multipliers and steps are int32") {
  int line = 0;
  auto k = [&](int64_t offset, int64_t multiplier, int64_t step) {
    return [&, offset, multiplier, step](Tensor x) {
      Tensor t = sb({128, 32}, nl::int32, "t");
      line = __LINE__; isa::iota(t, {{step, 32}}, offset, multiplier);
      return store(t);
    };
  };
  CHECK_ERROR(kernel_error(k(int64_t(1) << 31, 0, 1), X), line, "iota: offset 2147483648 does not fit in int32",
              "iota computes its affine value in int32 arithmetic", "keep offset within [-2147483648, 2147483647]");
  CHECK_ERROR(kernel_error(k(0, -(int64_t(1) << 32), 1), X), line,
              "iota: channel_multiplier -4294967296 does not fit in int32");
  CHECK_ERROR(kernel_error(k(0, 1, int64_t(3) << 31), X), line,
              "iota: pattern step 0 6442450944 does not fit in int32");
  check_compiles(kernel_error(k(2147483647, -2147483648LL, -2147483648LL), X));
}

TEST_CASE("verify: affine_select compares with a comparison operator") {
  int line = 0;
  auto k = [&](nl::Op cmp) {
    return [&, cmp](Tensor x) {
      Tensor v = filled({128, 128}, nl::float32, "v", 1.0);
      Tensor d = sb({128, 128}, nl::float32, "d");
      line = __LINE__; isa::affine_select(d, {{1, 128}}, -1, v, -1e9, cmp);
      return store(d);
    };
  };
  CHECK_ERROR(kernel_error(k(nl::add), X), line, "affine_select: cmp_op=add is not a comparison operator",
              "cmp_op is one of equal, not_equal, greater, greater_equal, less, less_equal");
  check_compiles(kernel_error(k(nl::greater_equal), X));
}

// --- statistics ----------------------------------------------------------------------------

TEST_CASE("verify: bn_stats reads at most bn_stats_fmax (512) elements per partition") {
  int line = 0;
  auto k = [&](int64_t free) {
    return [&, free](Tensor x) {
      Tensor a = filled({128, free}, nl::float32, "a");
      Tensor s = sb({128, 6}, nl::float32, "s");
      line = __LINE__; isa::bn_stats(s, a);
      return store(s);
    };
  };
  CHECK_ERROR(kernel_error(k(1024), X), line, "bn_stats: data has 1024 elements per partition", "bn_stats_fmax = 512",
              "aggregate with bn_aggr");
  check_compiles(kernel_error(k(512), X));
}

TEST_CASE("verify: bn_stats writes 6 values per partition") {
  int line = 0;
  auto k = [&](int64_t free) {
    return [&, free](Tensor x) {
      Tensor a = filled({128, 512}, nl::float32, "a");
      Tensor s = sb({128, free}, nl::float32, "s");
      line = __LINE__; isa::bn_stats(s, a);
      return store(s);
    };
  };
  CHECK_ERROR(kernel_error(k(4), X), line,
              "bn_stats: dst has 4 elements per partition", "bn_stats writes 6 values per partition",
              "allocate dst as [P, 6]");
  check_compiles(kernel_error(k(6), X));
}

TEST_CASE("verify: bn_aggr reads (count, mean, variance*count) triples") {
  int line = 0;
  auto k = [&](int64_t free) {
    return [&, free](Tensor x) {
      Tensor s = filled({128, free}, nl::float32, "s", 1.0);
      Tensor m = sb({128, 2}, nl::float32, "m");
      line = __LINE__; isa::bn_aggr(m, s);
      return store(m);
    };
  };
  CHECK_ERROR(kernel_error(k(8), X), line, "bn_aggr: data has 8 elements per partition",
              "bn_aggr reads (count, mean, variance*count) triples");
  check_compiles(kernel_error(k(12), X));
}

TEST_CASE("verify: bn_aggr writes mean and variance") {
  int line = 0;
  auto k = [&](int64_t free) {
    return [&, free](Tensor x) {
      Tensor s = filled({128, 6}, nl::float32, "s", 1.0);
      Tensor m = sb({128, free}, nl::float32, "m");
      line = __LINE__; isa::bn_aggr(m, s);
      return store(m);
    };
  };
  CHECK_ERROR(kernel_error(k(3), X), line, "bn_aggr: dst has 3 elements per partition",
              "bn_aggr writes (mean, variance) per partition", "allocate dst as [P, 2]");
  check_compiles(kernel_error(k(2), X));
}

TEST_CASE("verify: tensor_tensor_scan takes arithmetic operators") {
  int line = 0;
  auto k = [&](nl::Op op0) {
    return [&, op0](Tensor x) {
      Tensor a = filled({128, 512}, nl::int32, "a");
      Tensor d = sb({128, 512}, nl::int32, "d");
      line = __LINE__; isa::tensor_tensor_scan(d, a, a, 0.0, op0, nl::add);
      return store(d);
    };
  };
  CHECK_ERROR(kernel_error(k(nl::bitwise_and), X), line,
              "tensor_tensor_scan: op0=bitwise_and, op1=add: bitwise operators are not supported",
              "tensor_tensor_scan takes binary arithmetic operators only");
  check_compiles(kernel_error(k(nl::multiply), X));
}

// --- predication and selection ----------------------------------------------------------------

TEST_CASE("verify: tensor_copy_predicated predicates are unsigned integers") {
  int line = 0;
  auto k = [&](DType pred_dtype) {
    return [&, pred_dtype](Tensor x) {
      Tensor src = filled({128, 512}, nl::float32, "src", 1.0);
      Tensor pred = filled({128, 512}, pred_dtype, "pred");
      Tensor d = filled({128, 512}, nl::float32, "d");
      line = __LINE__; isa::tensor_copy_predicated(d, src, pred);
      return store(d);
    };
  };
  CHECK_ERROR(kernel_error(k(nl::float32), X), line, "tensor_copy_predicated: predicate has dtype float32",
              "predicates are uint8, uint16 or uint32");
  check_compiles(kernel_error(k(nl::uint8), X));
  check_compiles(kernel_error(k(nl::uint32), X));
}

TEST_CASE("verify: tensor_copy_predicated copies between equal dtypes") {
  int line = 0;
  auto k = [&](DType src_dtype) {
    return [&, src_dtype](Tensor x) {
      Tensor src = filled({128, 512}, src_dtype, "src", 1.0);
      Tensor pred = filled({128, 512}, nl::uint8, "pred", 1);
      Tensor d = filled({128, 512}, nl::float32, "d");
      line = __LINE__; isa::tensor_copy_predicated(d, src, pred);
      return store(d);
    };
  };
  CHECK_ERROR(kernel_error(k(nl::bfloat16), X), line, "tensor_copy_predicated: src is bfloat16 but dst is float32",
              "src and dst must have the same dtype");
  check_compiles(kernel_error(k(nl::float32), X));
}

TEST_CASE("verify: select_reduce predicates are 8- or 16-bit integers") {
  int line = 0;
  auto k = [&](DType pred_dtype) {
    return [&, pred_dtype](Tensor x) {
      Tensor v = filled({128, 512}, nl::float32, "v", 1.0);
      Tensor pred = filled({128, 512}, pred_dtype, "pred");
      Tensor d = sb({128, 512}, nl::float32, "d");
      line = __LINE__; isa::select_reduce(d, pred, v, -1.0);
      return store(d);
    };
  };
  CHECK_ERROR(kernel_error(k(nl::uint32), X), line, "select_reduce: predicate has dtype uint32",
              "select_reduce predicates are int8, uint8, int16 or uint16");
  check_compiles(kernel_error(k(nl::int16), X));
}

TEST_CASE("verify: select_reduce on_true is not a 32-bit integer or tfloat32") {
  int line = 0;
  auto k = [&](DType dtype) {
    return [&, dtype](Tensor x) {
      Tensor v = filled({128, 512}, dtype, "v", 1);
      Tensor pred = filled({128, 512}, nl::uint8, "pred");
      Tensor d = sb({128, 512}, nl::float32, "d");
      line = __LINE__; isa::select_reduce(d, pred, v, -1.0);
      return store(d);
    };
  };
  CHECK_ERROR(kernel_error(k(nl::int32), X), line, "select_reduce: on_true has dtype int32",
              "on_true cannot be tfloat32, int32 or uint32");
  check_compiles(kernel_error(k(nl::int16), X));
}

TEST_CASE("verify: select_reduce reduce_res is a float tile") {
  int line = 0;
  auto k = [&](DType dtype) {
    return [&, dtype](Tensor x) {
      Tensor v = filled({128, 512}, nl::float32, "v", 1.0);
      Tensor pred = filled({128, 512}, nl::uint8, "pred");
      Tensor d = sb({128, 512}, nl::float32, "d");
      Tensor r = sb({128, 1}, dtype, "r");
      line = __LINE__; isa::select_reduce(d, pred, v, -1.0, {.reduce_res = r});
      return store(r);
    };
  };
  CHECK_ERROR(kernel_error(k(nl::int32), X), line, "select_reduce: reduce_res has dtype int32",
              "reduce_res must have a float dtype");
  check_compiles(kernel_error(k(nl::bfloat16), X));
}

TEST_CASE("verify: select_reduce reduces with maximum only") {
  int line = 0;
  auto k = [&](nl::Op op) {
    return [&, op](Tensor x) {
      Tensor v = filled({128, 512}, nl::float32, "v", 1.0);
      Tensor pred = filled({128, 512}, nl::uint8, "pred");
      Tensor d = sb({128, 512}, nl::float32, "d");
      Tensor r = sb({128, 1}, nl::float32, "r");
      line = __LINE__; isa::select_reduce(d, pred, v, -1.0, {.reduce_res = r, .reduce_op = op});
      return store(r);
    };
  };
  CHECK_ERROR(kernel_error(k(nl::add), X), line, "select_reduce: reduce_op=add is not supported",
              "select_reduce reduces with nl.maximum only", "pass reduce_op=nl.maximum");
  check_compiles(kernel_error(k(nl::maximum), X));
}

TEST_CASE("verify: select_reduce on_false may be a [P, 1] vector of any float dtype") {
  // NKI requires float32 only of a scalar on_false; a vector on_false has no dtype rule.
  auto k = [](DType dtype) {
    return [dtype](Tensor x) {
      Tensor v = filled({128, 512}, nl::float32, "v", 1.0);
      Tensor pred = filled({128, 512}, nl::uint8, "pred");
      Tensor f = filled({128, 1}, dtype, "f", -1.0);
      Tensor d = sb({128, 512}, nl::float32, "d");
      isa::select_reduce(d, pred, v, f);
      return store(d);
    };
  };
  check_compiles(kernel_error(k(nl::float32), X));
  check_compiles(kernel_error(k(nl::bfloat16), X));
}

// --- max8, nc_find_index8 ---------------------------------------------------------------------

TEST_CASE("verify: max8 reads 8 to 16384 elements per partition") {
  int line = 0;
  auto k = [&](int64_t free) {
    return [&, free](Tensor x) {
      Tensor a = filled({128, free}, nl::float32, "a");
      Tensor m = sb({128, 8}, nl::float32, "m");
      line = __LINE__; isa::max8(m, a);
      return store(m);
    };
  };
  CHECK_ERROR(kernel_error(k(4), X), line,
              "max8: src has 4 elements per partition", "max8 reads 8 to 16384 elements per partition",
              "pad the row");
  CHECK_ERROR(kernel_error(k(16385), X), line, "max8: src has 16385 elements per partition");
  check_compiles(kernel_error(k(8), X));
  check_compiles(kernel_error(k(16384), X));
}

TEST_CASE("verify: max8 writes 8 values per partition") {
  int line = 0;
  auto k = [&](int64_t free) {
    return [&, free](Tensor x) {
      Tensor a = filled({128, 64}, nl::float32, "a");
      Tensor m = sb({128, free}, nl::float32, "m");
      line = __LINE__; isa::max8(m, a);
      return store(m);
    };
  };
  CHECK_ERROR(kernel_error(k(4), X), line,
              "max8: dst has 4 elements per partition", "max8 writes 8 values per partition");
  check_compiles(kernel_error(k(8), X));
}

TEST_CASE("verify: max8 reads a source of at most 3 dims") {
  int line = 0;
  auto k = [&](Shape src) {
    return [&, src](Tensor x) {
      Tensor a = filled(src, nl::float32, "a");
      Tensor m = sb({128, 8}, nl::float32, "m");
      line = __LINE__; isa::max8(m, a);
      return store(m);
    };
  };
  CHECK_ERROR(kernel_error(k({128, 2, 4, 8}), X), line,
              "max8: src is 4-D ([128, 2, 4, 8])", "max8 reads src of up to 3 dims",
              "flatten the free dims");
  check_compiles(kernel_error(k({128, 8, 8}), X));
}

TEST_CASE("verify: nc_find_index8 reads 8 to 16384 elements per partition") {
  int line = 0;
  auto k = [&](int64_t free) {
    return [&, free](Tensor x) {
      Tensor a = filled({128, free}, nl::float32, "a");
      Tensor v = filled({128, 8}, nl::float32, "v");
      Tensor i = sb({128, 8}, nl::uint32, "i");
      line = __LINE__; isa::nc_find_index8(i, a, v);
      return store(i);
    };
  };
  CHECK_ERROR(kernel_error(k(4), X), line, "nc_find_index8: data has 4 elements per partition",
              "nc_find_index8 reads 8 to 16384 elements per partition");
  check_compiles(kernel_error(k(64), X));
}

TEST_CASE("verify: nc_find_index8 vals and dst have 8 elements per partition") {
  int line = 0;
  auto k = [&](int64_t vals) {
    return [&, vals](Tensor x) {
      Tensor a = filled({128, 64}, nl::float32, "a");
      Tensor v = filled({128, vals}, nl::float32, "v");
      Tensor i = sb({128, 8}, nl::uint32, "i");
      line = __LINE__; isa::nc_find_index8(i, a, v);
      return store(i);
    };
  };
  CHECK_ERROR(kernel_error(k(4), X), line, "nc_find_index8: vals has 4 elements per partition",
              "vals and dst have exactly 8 elements per partition");
  check_compiles(kernel_error(k(8), X));
}

TEST_CASE("verify: nc_find_index8 writes uint16 or uint32 indices") {
  int line = 0;
  auto k = [&](DType dtype) {
    return [&, dtype](Tensor x) {
      Tensor a = filled({128, 64}, nl::float32, "a");
      Tensor v = filled({128, 8}, nl::float32, "v");
      Tensor i = sb({128, 8}, dtype, "i");
      line = __LINE__; isa::nc_find_index8(i, a, v);
      return store(i);
    };
  };
  CHECK_ERROR(kernel_error(k(nl::int32), X), line,
              "nc_find_index8: dst has dtype int32", "indices are written as uint16 or uint32");
  check_compiles(kernel_error(k(nl::uint16), X));
}

TEST_CASE("verify: nc_find_index8 reads tensors of at most 3 dims") {
  int line = 0;
  auto k = [&](Shape data) {
    return [&, data](Tensor x) {
      Tensor a = filled(data, nl::float32, "a");
      Tensor v = filled({128, 8}, nl::float32, "v");
      Tensor i = sb({128, 8}, nl::uint32, "i");
      line = __LINE__; isa::nc_find_index8(i, a, v);
      return store(i);
    };
  };
  CHECK_ERROR(kernel_error(k({128, 2, 4, 8}), X), line, "nc_find_index8: data is 4-D ([128, 2, 4, 8])");
  check_compiles(kernel_error(k({128, 8, 8}), X));
}

// --- tensor_partition_reduce ------------------------------------------------------------------

TEST_CASE("verify: tensor_partition_reduce operators") {
  int line = 0;
  auto k = [&](nl::Op op) {
    return [&, op](Tensor x) {
      Tensor a = filled({128, 64}, nl::float32, "a");
      Tensor d = sb({1, 64}, nl::float32, "d");
      line = __LINE__; isa::tensor_partition_reduce(d, op, a);
      return store(d);
    };
  };
  CHECK_ERROR(kernel_error(k(nl::multiply), X), line, "tensor_partition_reduce: op=multiply is not supported",
              "tensor_partition_reduce reduces with add, average, maximum, bitwise_or or bitwise_and");
  check_compiles(kernel_error(k(nl::average), X));
}

TEST_CASE("verify: tensor_partition_reduce bitwise reductions need integer tiles") {
  int line = 0;
  auto k = [&](DType dtype) {
    return [&, dtype](Tensor x) {
      Tensor a = filled({128, 64}, dtype, "a");
      Tensor d = sb({1, 64}, dtype, "d");
      line = __LINE__; isa::tensor_partition_reduce(d, nl::bitwise_or, a);
      return store(d);
    };
  };
  CHECK_ERROR(kernel_error(k(nl::float32), X), line,
              "tensor_partition_reduce: op=bitwise_or needs integer tiles, but dst is float32",
              "bitwise reductions act on integer bit patterns");
  check_compiles(kernel_error(k(nl::uint32), X));
}

TEST_CASE("verify: tensor_partition_reduce writes one partition") {
  int line = 0;
  auto k = [&](int64_t partitions) {
    return [&, partitions](Tensor x) {
      Tensor a = filled({128, 64}, nl::float32, "a");
      Tensor d = sb({partitions, 64}, nl::float32, "d");
      line = __LINE__; isa::tensor_partition_reduce(d, nl::add, a);
      return store(d);
    };
  };
  CHECK_ERROR(kernel_error(k(2), X), line, "tensor_partition_reduce: dst [2, 64] must be [1, 64]",
              "allocate dst as [1, 64]");
  check_compiles(kernel_error(k(1), X));
}

// --- registers and runtime loops (raw IR: the C++ API has no register calls yet) ---------------

TEST_CASE("verify: registers load and store single elements") {
  int line = 0;
  auto k = [&](int64_t free) {
    return [&, free](Tensor x) {
      KernelBuilder& b = x.builder();
      Tensor t = filled({1, free}, nl::int32, "t", 3);
      const RegisterId r = b.new_register();
      line = __LINE__; append(Opcode::register_load, {Operand::reg_(r), test::tensor_operand(t)});
      return store(t);
    };
  };
  CHECK_ERROR(kernel_error(k(2), X), line, "register_load: src must be a single element, got shape [1, 2]",
              "registers load from and store to 1x1 tensors");
  check_compiles(kernel_error(k(1), X));
}

TEST_CASE("verify: registers do not access PSUM") {
  int line = 0;
  auto k = [&](Buffer buffer) {
    return [&, buffer](Tensor x) {
      KernelBuilder& b = x.builder();
      Tensor t = nl::ndarray({1, 1}, nl::int32, buffer, "t");
      const RegisterId r = b.new_register();
      append(Opcode::register_move, {Operand::reg_(r), Operand::immediate(7)});
      line = __LINE__; append(Opcode::register_store, {test::tensor_operand(t), Operand::reg_(r)});
      return store(t);
    };
  };
  CHECK_ERROR(kernel_error(k(nl::psum), X), line, "register_store: dst ('t' psum i32[1, 1]) is in PSUM",
              "registers load from and store to SBUF or HBM");
  check_compiles(kernel_error(k(nl::sbuf), X));
}

TEST_CASE("verify: registers are set before they are read") {
  int line = 0;
  // how: 0 reads an unset register as a runtime offset, 1 as a loop bound, 2 copies it; 3 sets it first
  auto k = [&](int how) {
    return [&, how](Tensor x) {
      Tensor t = sb({1, 512}, nl::float32, "t");
      isa::Register r = isa::register_alloc();
      if (how == 3) isa::register_move(r, 2);
      if (how == 2) {
        isa::Register copy = isa::register_alloc();
        line = __LINE__; isa::register_move(copy, r);
      }
      if (how == 1) {
        line = __LINE__; nl::fori_loop(0, r, [&](isa::Register) { isa::dma_copy(t, x(Slice{0, 1}, nl::all)); });
      } else {
        const int at = __LINE__; isa::dma_copy(t, x.ap({{512, 1}, {1, 512}}, ApOptions{.scalar_offset_register = r.id}));
        if (how != 2) line = at;
      }
      return store(t);
    };
  };
  CHECK_ERROR(kernel_error(k(0), X), line, "dma_copy: register r0 (the runtime offset of src) is read but never set",
              "a register has no value until an instruction writes it", "nisa.register_alloc(value)");
  CHECK_ERROR(kernel_error(k(1), X), line, "loop_begin: register r0 (upper) is read but never set");
  CHECK_ERROR(kernel_error(k(2), X), line, "register_move: register r0 (src) is read but never set");
  check_compiles(kernel_error(k(3), X));
}

TEST_CASE("verify: runtime loops count up with a positive step") {
  int line = 0;
  auto traced = [&](int64_t step) {
    Kernel k = trace("k", [&](Tensor x) {
      KernelBuilder& b = x.builder();
      Tensor t = sb({128, 512}, nl::float32, "t");
      RareAttributes rare;
      rare.step = step;
      const RegisterId i = b.new_register();
      line = __LINE__; append(Opcode::loop_begin, {Operand::reg_(i), Operand::immediate(0), Operand::immediate(4)}, {}, rare);
      isa::dma_copy(t, x);
      append(Opcode::loop_end, {});
      return store(t);
    }, X);
    // Link the loop's two ends, as a front end building runtime loops does.
    int32_t begin = -1;
    for (int32_t n = 0; n < static_cast<int32_t>(k.instructions.size()); ++n) {
      if (k.instructions[n].opcode == Opcode::loop_begin) begin = n;
      if (k.instructions[n].opcode == Opcode::loop_end) {
        k.mutable_rare(k.instructions[n]).jump = begin;
        k.mutable_rare(k.instructions[begin]).jump = n;
      }
    }
    return k;
  };
  CHECK_ERROR(test::compile_kernel_error(traced(0)), line,
              "loop_begin: loop step 0 must be a positive compile-time integer");
  check_compiles(test::compile_kernel_error(traced(1)));
}

// ============================================================================================
// Errors raised while tracing (nl.hpp, nl_init.hpp, isa.hpp, trace.hpp)
// ============================================================================================

TEST_CASE("verify: NKI calls outside a kernel are rejected") {
  int line = 0;
  std::optional<KernelError> e;
  try {
    line = __LINE__; nl::ndarray({128, 512}, nl::float32);
  } catch (const KernelError& err) {
    e = err;
  }
  CHECK_ERROR(e, line, "NKI API called outside of a kernel", "nikki::trace");
}

TEST_CASE("verify: nl.ndarray needs a shape") {
  int line = 0;
  auto k = [&](Tensor x) {
    line = __LINE__; Tensor t = nl::ndarray(Shape{}, nl::float32);
    return x;
  };
  CHECK_ERROR(kernel_error(k, X), line, "nl.ndarray needs at least one dim", "in: ndarray", "(128, 512)");
}

TEST_CASE("verify: nl.ndarray extents are positive") {
  int line = 0;
  auto k = [&](Tensor x) {
    line = __LINE__; Tensor t = nl::ndarray({128, 0}, nl::float32);
    return x;
  };
  CHECK_ERROR(kernel_error(k, X), line,
              "nl.ndarray shape [128, 0] has a non-positive extent", "every extent must be >= 1");
}

TEST_CASE("verify: address= is for on-chip tensors only") {
  int line = 0;
  auto k = [&](Tensor x) {
    line = __LINE__; Tensor out = nl::ndarray({128, 512}, nl::float32, nl::shared_hbm, "out", Address{0, 0});
    isa::dma_copy(out, x);
    return out;
  };
  CHECK_ERROR(kernel_error(k, X), line, "address= is only meaningful for sbuf and psum tensors, not shared_hbm",
              "drop address= for HBM tensors");
}

TEST_CASE("verify: program_id and num_programs axes exist in the launch grid") {
  int line = 0;
  const TraceOptions grid{.grid = ProgramGrid{{2}, {1}}};
  auto id = [&](int axis) {
    return [&, axis](Tensor x) {
      Tensor t = sb({128, 512});
      line = __LINE__; int64_t pid = nl::program_id(axis);
      isa::dma_copy(t, x);
      isa::tensor_scalar(t, t, nl::add, double(pid));
      return store(t);
    };
  };
  CHECK_ERROR(test::kernel_error_on(grid, id(1), X), line, "program_id(1) is out of range for a launch grid of 1 dims",
              "kernel[g0, g1]");
  check_compiles(test::kernel_error_on(grid, id(0), X));
  auto count = [&](Tensor x) {
    line = __LINE__; int64_t n = nl::num_programs(2);
    (void)n;
    return x;
  };
  CHECK_ERROR(test::kernel_error_on(grid, count, X), line,
              "num_programs(2) is out of range for a launch grid of 1 dims");
}

TEST_CASE("verify: HBM tensors cannot be created with a value") {
  int line = 0;
  auto k = [&](Tensor x) {
    line = __LINE__; Tensor t = nl::zeros({128, 512}, nl::float32, nl::shared_hbm);
    return t;
  };
  CHECK_ERROR(kernel_error(k, X), line, "creating an HBM tensor (shared_hbm) with an initial value is not supported",
              "create it in sbuf");
}

TEST_CASE("verify: instructions need tensors, not empty handles") {
  int line = 0;
  auto dst = [&](Tensor x) {
    Tensor a = filled({128, 512});
    line = __LINE__; isa::tensor_copy(Tensor{}, a);
    return store(a);
  };
  CHECK_ERROR(kernel_error(dst, X), line, "tensor_copy: dst is an empty tensor handle");
  auto operand = [&](Tensor x) {
    Tensor a = filled({128, 512});
    line = __LINE__; isa::tensor_copy(a, Tensor{});
    return store(a);
  };
  CHECK_ERROR(kernel_error(operand, X), line, "tensor_copy: operand 'src' is an empty tensor handle");
  auto view = [&](Tensor x) {
    line = __LINE__; Tensor v = Tensor{}.reshape({1});
    return x;
  };
  CHECK_ERROR(kernel_error(view, X), line, "operation on an empty tensor handle");
}

TEST_CASE("verify: operators are used in their role (ALU operator or activation function)") {
  int line = 0;
  auto alu = [&](Tensor x) {
    Tensor a = filled({128, 512});
    line = __LINE__; isa::tensor_tensor(a, a, a, nl::exp);
    return store(a);
  };
  CHECK_ERROR(kernel_error(alu, X), line, "tensor_tensor: op=exp is an activation function, not an ALU operator",
              "use an ALU operator such as nl.add");
  auto act = [&](Tensor x) {
    Tensor a = filled({128, 512});
    line = __LINE__; isa::activation(a, nl::add, a);
    return store(a);
  };
  CHECK_ERROR(kernel_error(act, X), line, "activation: op=add is an ALU operator, not an activation function",
              "use an activation function such as nl.exp");
  // Names with both roles work in both places.
  check_compiles(kernel_error([](Tensor x) {
    Tensor a = filled({128, 512}, nl::float32, "a", 1.0);
    isa::activation(a, nl::abs, a);
    isa::tensor_scalar(a, a, nl::abs, 0.0);
    return store(a);
  }, X));
}

TEST_CASE("verify: tensors belong to the kernel being traced") {
  int line = 0;
  auto outer = [&](Tensor x) {
    Tensor a = filled({128, 512}, nl::float32, "a");
    auto inner = [&](Tensor y) {
      Tensor b = sb({128, 512}, nl::float32, "b");
      line = __LINE__; isa::tensor_copy(b, a);
      return store(b);
    };
    (void)trace("inner", inner, X);
    return store(a);
  };
  CHECK_ERROR(kernel_error(outer, X), line, "tensor_copy: operand 'src' (tensor 'a') belongs to a different kernel",
              "tensors cannot be shared between kernels");
}

TEST_CASE("verify: tensor_scalar op1 and operand1 come together") {
  int line = 0;
  auto k = [&](Tensor x) {
    Tensor a = filled({128, 512});
    line = __LINE__; isa::tensor_scalar(a, a, nl::add, 1.0, {.op1 = nl::multiply});
    return store(a);
  };
  CHECK_ERROR(kernel_error(k, X), line, "tensor_scalar: op1 and operand1 must be given together",
              "pass both op1= and operand1=, or neither");
}

TEST_CASE("verify: activation reduce_res needs reduce_op") {
  int line = 0;
  auto k = [&](Tensor x) {
    Tensor a = filled({128, 512});
    Tensor r = sb({128, 1}, nl::float32, "r");
    line = __LINE__; isa::activation(a, nl::exp, a, {.reduce_res = r});
    return store(a);
  };
  CHECK_ERROR(kernel_error(k, X), line, "activation: reduce_res needs reduce_op", "pass reduce_op=nl.add");
}

TEST_CASE("verify: tensor_reduce axes exist while tracing") {
  int line = 0;
  auto k = [&](Tensor x) {
    Tensor a = filled({128, 512});
    Tensor d = sb({128, 1});
    line = __LINE__; isa::tensor_reduce(d, nl::add, a, {2});
    return store(d);
  };
  CHECK_ERROR(kernel_error(k, X), line, "tensor_reduce: axis 2 is out of range for data of rank 2");
}

TEST_CASE("verify: kernels return whole shared_hbm tensors") {
  int line = 0;
  auto on_chip = [&](Tensor x) {
    line = __LINE__; Tensor t = sb({128, 512}, nl::float32, "t");
    isa::dma_copy(t, x);
    return t;
  };
  // Returned values carry no C++ source line; the error points at the tensor's creation.
  CHECK_ERROR(kernel_error(on_chip, X), line, "kernel returns tensor 't' in sbuf",
              "kernel outputs are whole tensors allocated in shared_hbm", "buffer=nl.shared_hbm");
  auto view = [&](Tensor x) {
    line = __LINE__; Tensor out = nl::ndarray({128, 512}, nl::float32, nl::shared_hbm, "out");
    isa::dma_copy(out, x);
    return out(nl::all, nl::ds(0, 256));
  };
  CHECK_ERROR(kernel_error(view, X), line, "kernel returns a view of tensor 'out' in shared_hbm");
  // Returning a read-only input is rejected too (inputs have no creation line: see the report).
  auto input = [](Tensor x) { return x; };
  std::optional<KernelError> e = kernel_error(input, X);
  REQUIRE(e);
  CHECK(std::string(e->what()).find("kernel returns tensor 'x' in hbm") != std::string::npos);
  auto mutable_input = [](Tensor x) {
    Tensor t = filled({128, 512});
    isa::dma_copy(x, t);
    return x;
  };
  check_compiles(kernel_error(mutable_input, TensorSpec{{128, 512}, nl::float32, "x", /*writable=*/true}));
}

// ============================================================================================
// View errors (tensor.hpp, access_pattern.hpp): raised while tracing, at the user's line
// ============================================================================================

namespace {
/** Traces `view(x)` for an input x of `shape` and returns the KernelError. */
template <class F>
std::optional<KernelError> view_error(F view, Shape shape = {128, 512}, DType dtype = nl::float32) {
  return kernel_error([&](Tensor x) {
    Tensor v = view(x);
    (void)v;
    Tensor out = nl::ndarray(x.shape(), x.dtype(), nl::shared_hbm, "out");
    isa::dma_copy(out, x);
    return out;
  }, TensorSpec{shape, dtype, "x", false});
}
}  // namespace

TEST_CASE("verify: indexing stays within the tensor") {
  int line = 0;
  CHECK_ERROR(view_error([&](Tensor x) { line = __LINE__; return x.index({0, 0, 0}); }), line,
              "tensor 'x': too many indices (3) for a tensor of rank 2");
  CHECK_ERROR(view_error([&](Tensor x) { line = __LINE__; return x(0, 600); }), line,
              "tensor 'x': index 600 is out of bounds for dim 1 of size 512", "dim 1 has 512 elements");
  // NKI: "Out-of-bound access for tensor `x` on dimension 1: index range [0, 4095] exceed dimension size of 4000".
  CHECK_ERROR(view_error([&](Tensor x) { line = __LINE__; return x(nl::all, nl::ds(0, 513)); }), line,
              "out-of-bound access on dim 1: index range [0, 512] exceeds dimension size 512", "shrink the slice");
  CHECK_ERROR(view_error([&](Tensor x) { line = __LINE__; return x.slice(1, 100, 50); }), line,
              "index range [100, 49] exceeds dimension size 512");
  CHECK_ERROR(view_error([&](Tensor x) { line = __LINE__; return x.select(1, 600); }), line,
              "index 600 is out of bounds for dim 1 of size 512");
  CHECK(!view_error([](Tensor x) { return x(-1, nl::ds(0, 512)); }));
}

TEST_CASE("verify: view dims exist") {
  int line = 0;
  CHECK_ERROR(view_error([&](Tensor x) { line = __LINE__; return x.slice(5, 0, 1); }), line,
              "slice: dim 5 is out of range for a view of rank 2", "use a dim in [-2, 2)");
  CHECK_ERROR(view_error([&](Tensor x) { line = __LINE__; return x.expand_dim(5); }), line,
              "expand_dim: dim 5 out of range for rank 2");
}

TEST_CASE("verify: slices step forwards") {
  int line = 0;
  CHECK_ERROR(view_error([&](Tensor x) { line = __LINE__; return x.slice(1, 0, 4, 0); }), line,
              "slice step must be positive, got 0", "reverse iteration is not expressible");
}

TEST_CASE("verify: permute lists every dim once") {
  int line = 0;
  CHECK_ERROR(view_error([&](Tensor x) { line = __LINE__; return x.permute({0}); }), line,
              "permute needs 2 dims, got 1");
  CHECK_ERROR(view_error([&](Tensor x) { line = __LINE__; return x.permute({1, 1}); }), line,
              "permute lists dim 1 twice");
  CHECK(!view_error([](Tensor x) { return x.permute({1, 0}); }));
}

TEST_CASE("verify: broadcast repeats size-1 dims") {
  int line = 0;
  CHECK_ERROR(view_error([&](Tensor x) { line = __LINE__; return x.broadcast(1, 4); }), line,
              "broadcast needs a dim of size 1, dim 1 has size 512");
  CHECK_ERROR(view_error([&](Tensor x) { line = __LINE__; return x(nl::all, nl::ds(0, 1)).broadcast(1, 0); }), line,
              "broadcast size must be positive, got 0");
  CHECK(!view_error([](Tensor x) { return x(nl::all, nl::ds(0, 1)).broadcast(1, 4); }));
}

TEST_CASE("verify: expand_dim and squeeze_dim") {
  int line = 0;
  CHECK_ERROR(view_error([&](Tensor x) { line = __LINE__; return x.expand_dim(0); }, Shape{1, 1, 1, 1, 1, 1, 1, 2}),
              line, "expand_dim: view would exceed the maximum rank", "at most 8 dims");
  CHECK_ERROR(view_error([&](Tensor x) { line = __LINE__; return x.squeeze_dim(1); }), line,
              "squeeze_dim: dim 1 has size 512, not 1");
  CHECK(!view_error([](Tensor x) { return x.expand_dim(1).squeeze_dim(1); }));
}

TEST_CASE("verify: reshapes keep the element count and need contiguity") {
  int line = 0;
  CHECK_ERROR(view_error([&](Tensor x) { line = __LINE__; return x.reshape({128, 256}); }), line,
              "cannot reshape a view of shape [128, 512] (65536 elements) to [128, 256] (32768 elements)",
              "reshape must preserve the number of elements");
  CHECK_ERROR(view_error([&](Tensor x) { line = __LINE__; return x.reshape({-128, -512}); }), line,
              "reshape: extent -128 must be positive");
  CHECK_ERROR(view_error([&](Tensor x) { line = __LINE__; return x(nl::all, nl::ds(0, 256)).reshape({32768}); }), line,
              "cannot reshape view of shape [128, 256] to [32768] without a copy",
              "reshape needs the merged dims to be contiguous", "nisa.tensor_copy");
  CHECK_ERROR(view_error([&](Tensor x) { line = __LINE__; return x.reshape_dim(1, {3, 100}); }), line,
              "reshape_dim: [3, 100] does not have 512 elements (dim 1 has)");
  CHECK_ERROR(view_error([&](Tensor x) { line = __LINE__; return x.flatten_dims(1, 0); }), line,
              "flatten_dims: start dim is after end dim");
  CHECK(!view_error([](Tensor x) { return x.reshape_dim(1, {4, 128}).flatten_dims(0, 1); }));
}

TEST_CASE("verify: view(dtype) needs a contiguous last dim of whole elements") {
  int line = 0;
  CHECK_ERROR(view_error([&](Tensor x) { line = __LINE__; return x.permute({1, 0}).view(nl::bfloat16); }), line,
              "view(dtype) needs a contiguous last dim", "the last dim must have stride 1");
  auto partial_words = [&](Tensor x) { line = __LINE__; return x(nl::all, nl::ds(0, 3)).view(nl::int32); };
  CHECK_ERROR(view_error(partial_words, Shape{128, 6}, nl::uint8), line,
              "view(int32): the stride (6 bytes) is not a multiple of 4 bytes");
  CHECK(!view_error([](Tensor x) { return x.view(nl::int32).view(nl::bfloat16); }));
}

TEST_CASE("verify: raw access patterns (.ap) are well formed") {
  int line = 0;
  CHECK_ERROR(view_error([&](Tensor x) { line = __LINE__; return x.ap({}); }), line,
              "ap(): pattern needs 1 to 8 [stride, count] pairs, got 0");
  CHECK_ERROR(view_error([&](Tensor x) { line = __LINE__; return x.ap({{1, 0}}); }), line,
              "ap(): count 0 of pattern entry 0 must be positive");
  // (Multi-line lambdas stay outside macro arguments, where GCC reports locations differently.)
  auto indirect_dim = [&](Tensor x) {
    line = __LINE__; return x.ap({{512, 1}, {1, 512}}, ApOptions{.scalar_offset_register = 0, .indirect_dim = 5});
  };
  CHECK_ERROR(view_error(indirect_dim), line, "ap(): indirect_dim 5 is out of range for a tensor of rank 2");
  auto scalar_offset = [&](Tensor x) {
    Tensor idx = sb({1, 2}, nl::int32, "idx");
    line = __LINE__; return x.ap({{512, 1}, {1, 512}}, ApOptions{.scalar_offset_tensor = idx});
  };
  CHECK_ERROR(view_error(scalar_offset), line, "ap(): scalar_offset must be a 1x1 tensor, got shape [1, 2]",
              "pass a [1, 1] SBUF tensor or a register");
  auto vector_offset = [&](Tensor x) {
    Tensor idx = sb({128, 1}, nl::int32, "idx");
    line = __LINE__; return x.ap({{512, 128}, {1, 512}}, ApOptions{.vector_offset = idx, .indirect_dim = 1});
  };
  CHECK_ERROR(view_error(vector_offset), line, "ap(): vector_offset supports only indirect_dim=0",
              "indirect_dim must be 0");
}

TEST_CASE("verify: view transformations report ViewError without a location") {
  // view::slice and view::ds are reachable only through the Tensor methods above, which check
  // bounds first; called directly they still refuse empty or out-of-range selections.
  AccessPattern ap = full_view(0, DType::float32, {128, 512});
  try {
    (void)view::slice(ap, 1, 10, 10);
    FAIL("expected a ViewError");
  } catch (const ViewError& e) {
    CHECK(e.what == "slice [10:10] of dim 1 (size 512) selects no elements");
  }
  try {
    (void)view::ds(ap, 1, 500, 20);
    FAIL("expected a ViewError");
  } catch (const ViewError& e) {
    CHECK(e.what == "out-of-bound access on dim 1: index range [500, 519] exceeds dimension size 512");
    CHECK(e.limit == "dim 1 has 512 elements");
  }
}
