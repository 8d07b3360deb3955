// Tests of spilling (jit/src/spill.cpp, driven by jit/src/allocate.cpp): compiler-placed SBUF
// tensors that do not fit are saved to HBM while idle and reloaded before their next use; results
// stay bit for bit those of a run with enough SBUF in every executor, the spill DMAs are in the
// streams and the estimate, the warning names what moved, and what cannot spill still errors.
#include <algorithm>
#include <cmath>
#include <string>
#include <string_view>
#include <vector>

#include "error_check.hpp"
#include "harness.hpp"
#include "raw_ir.hpp"
#include "nikki/jit/liveness.hpp"
#include "nikki/kernels/registry.hpp"
#include "nikki/runtime/profile.hpp"

namespace nikki::test {
namespace {

constexpr std::string_view kFile = "test_spill.cpp";

#define CHECK_ERROR(error, line, ...) check_kernel_error(error, kFile, line, {__VA_ARGS__})

constexpr Mode kModes[] = {Mode::program_order, Mode::streams_interp, Mode::streams_native};

// trn2 has 212984 bytes (about 208 KiB) of SBUF per partition: four of these 48 KiB tiles fit,
// five do not.
constexpr int64_t kTile = 12288;
// 64 KiB tiles: three of them and a 48 KiB tile do not fit.
constexpr int64_t kWide = 16384;

const Storage& storage(const Kernel& k, std::string_view name) {
  for (const Storage& s : k.storages)
    if (s.name == name) return s;
  FAIL("no storage named " << name);
  return k.storages.front();
}

/** The outputs of `kernel` in every executor, checked to agree bit for bit; returns them. */
std::vector<HostTensor> run_everywhere(const Kernel& kernel, std::vector<HostTensor*> inputs,
                                       jit::CompileOptions options = {}) {
  std::vector<HostTensor> first;
  for (Mode mode : kModes) {
    CAPTURE(int(mode));
    std::vector<HostTensor> outs = run_kernel(kernel, inputs, mode, options);
    if (first.empty()) first = std::move(outs);
    else
      for (size_t o = 0; o < outs.size(); ++o) CHECK(outs[o].bytes == first[o].bytes);
  }
  return first;
}

/** Elements of `got` that differ from `want(i)` (float32 bits, so NaN never matches). */
template <class Want>
int64_t mismatches(const HostTensor& got, Want&& want) {
  int64_t wrong = 0;
  for (int64_t i = 0; i < got.size(); ++i) wrong += got.get(i) != want(i);
  return wrong;
}

int line_tiles = 0;

/** Five scaled copies of x, made before they are summed: at most four fit. */
Tensor five_tiles(Tensor x) {
  Tensor out = nl::ndarray({128, kTile}, nl::float32, nl::shared_hbm, "out");
  Tensor xs = nl::ndarray({128, kTile}, nl::float32, nl::sbuf, "xs");
  isa::dma_copy(xs, x);
  std::vector<Tensor> ts;
  for (int i = 0; i < 5; ++i) {
    line_tiles = __LINE__; ts.push_back(nl::ndarray({128, kTile}, nl::float32, nl::sbuf, fmt::format("t{}", i)));
    isa::tensor_scalar(ts.back(), xs, nl::multiply, double(i + 1), {.op1 = nl::add, .operand1 = isa::Scalar(0.5 * i)});
  }
  Tensor acc = nl::ndarray({128, kTile}, nl::float32, nl::sbuf, "acc");
  isa::tensor_copy(acc, ts[0]);
  for (int i = 1; i < 5; ++i) isa::tensor_tensor(acc, acc, ts[i], nl::add);
  isa::dma_copy(out, acc);
  return out;
}

float five_tiles_reference(float x) {
  float acc = 0;
  for (int i = 0; i < 5; ++i) {
    float t = x * float(i + 1);
    t = t + 0.5f * float(i);
    acc = i == 0 ? t : acc + t;
  }
  return acc;
}

const TensorSpec kTileSpec = spec({128, kTile}, nl::float32, "x");

/** Adds the first 16 columns of c = x + x * scale to acc, through three 64 KiB tiles that are all
 * operands of one instruction: a 48 KiB tensor idle meanwhile has to leave SBUF. */
void add_wide_phase(Tensor x, Tensor acc, double scale, std::string_view suffix = "") {
  Tensor a = nl::ndarray({128, kWide}, nl::float32, nl::sbuf, fmt::format("a{}", suffix));
  isa::dma_copy(a, x);
  Tensor b = nl::ndarray({128, kWide}, nl::float32, nl::sbuf, fmt::format("b{}", suffix));
  isa::tensor_scalar(b, a, nl::multiply, scale);
  Tensor c = nl::ndarray({128, kWide}, nl::float32, nl::sbuf, fmt::format("c{}", suffix));
  isa::tensor_tensor(c, a, b, nl::add);
  isa::tensor_tensor(acc, acc, c(nl::all, nl::ds(0, 16)), nl::add);
}

/** Element i of the [128, 16] output of kernels that read x [128, kWide] through add_wide_phase. */
float x_at(const HostTensor& x, int64_t i) { return x.get(i / 16 * kWide + i % 16); }

}  // namespace

TEST_CASE("spill: tensors that do not fit at once are spilled and the result is exact in every executor") {
  Kernel kernel = trace("k", five_tiles, kTileSpec);
  jit::Program program = jit::compile(kernel);
  const Kernel& k = program.kernel();
  REQUIRE_FALSE(program.spills.empty());
  for (const jit::Spill& s : program.spills) {
    CAPTURE(k.storage(s.tensor).name);
    CHECK(k.storage(s.tensor).buffer == Buffer::sbuf);
    CHECK(k.storage(s.home).buffer == Buffer::private_hbm);
    CHECK(k.storage(s.home).total_bytes() == k.storage(s.tensor).total_bytes());
    CHECK(s.saves.size() >= 1);
    CHECK(s.reloads.size() >= 1);
    // A save copies a stretch of the tensor to its home; a reload brings the home back into a
    // later stretch of the same shape and source line.
    for (uint32_t i : s.saves) {
      const Instruction& inst = k.instructions[i];
      CHECK(inst.opcode == Opcode::dma_copy);
      CHECK(inst.operands[0].storage() == s.home);
      CHECK(k.storage(inst.operands[1].storage()).buffer == Buffer::sbuf);
      CHECK(inst.loc == k.storage(s.tensor).loc);
    }
    for (uint32_t i : s.reloads) {
      const Instruction& inst = k.instructions[i];
      CHECK(inst.operands[1].storage() == s.home);
      const Storage& stretch = k.storage(inst.operands[0].storage());
      CHECK(stretch.buffer == Buffer::sbuf);
      CHECK(stretch.shape == k.storage(s.tensor).shape);
      CHECK(stretch.loc == k.storage(s.tensor).loc);
    }
  }
  // Every SBUF placement stays inside the memory.
  for (const Storage& s : k.storages)
    if (s.buffer == Buffer::sbuf)
      CHECK(s.address->byte_offset + s.partition_bytes() <= int64_t(k.config().sbuf_bytes_per_partition));

  HostTensor x = random_tensor(DType::float32, {128, kTile}, 5);
  std::vector<HostTensor> outs = run_everywhere(kernel, {&x});
  CHECK(mismatches(outs[0], [&](int64_t i) { return five_tiles_reference(x.get(i)); }) == 0);
}

TEST_CASE("spill: the spill DMAs run in DMA queues and the estimate counts their bytes") {
  jit::Program program = jit::compile(trace("k", five_tiles, kTileSpec));
  const jit::DeviceProgram& device = *program.device;
  CHECK(device.spills == program.spills);
  for (const jit::Spill& s : program.spills)
    for (const std::vector<uint32_t>* transfers : {&s.saves, &s.reloads})
      for (uint32_t i : *transfers) CHECK(device.streams[device.placement[i].first].queue.kind == jit::QueueKind::dma);
  const runtime::Profile profile = runtime::estimate(device);
  const int64_t io_bytes = 2 * 128 * kTile * 4;  // x in, out back
  const int64_t spilled = jit::spilled_bytes(device.kernel, program.spills);
  CHECK(spilled > 0);
  CHECK(profile.dma_bytes == io_bytes + spilled);
}

TEST_CASE("spill: the device-program file keeps the spills and rejects one that names a missing tensor") {
  jit::Program program = jit::compile(trace("k", five_tiles, kTileSpec));
  std::vector<uint8_t> bytes = jit::serialize(*program.device);
  CHECK(jit::deserialize(bytes).spills == program.spills);
  // The spills section ends the file: a count, then per spill the tensor, the home and two lists.
  size_t section = 4;
  for (const jit::Spill& s : program.spills) section += 4 * (4 + s.saves.size() + s.reloads.size());
  const size_t first_tensor = bytes.size() - section + 4;
  for (int b = 0; b < 4; ++b) bytes[first_tensor + b] = 0xff;
  try {
    jit::deserialize(bytes, jit::PayloadCheck::trusted);
    FAIL("a damaged spill record was accepted");
  } catch (const KernelError& e) {
    CHECK(std::string(e.what()).find("a spill names a missing tensor") != std::string::npos);
  }
}

TEST_CASE("spill: the warning names each spilled tensor, where it was allocated, the bytes and the fix") {
  jit::Program program = jit::compile(trace("k", five_tiles, kTileSpec));
  REQUIRE(program.diagnostics.size() == 1);
  const jit::Diagnostic& d = program.diagnostics[0];
  const Kernel& k = program.kernel();
  INFO(d.message);
  CHECK(d.kind == jit::Diagnostic::Kind::spill);
  CHECK(d.where.line == uint32_t(line_tiles));
  CHECK(d.message.find("kernel 'k': the SBUF tensors live at once need more than the 212984 B per partition of "
                       "trn2, so nikki spilled") != std::string::npos);
  size_t saves = 0, reloads = 0;
  for (const jit::Spill& s : program.spills) {
    saves += s.saves.size();
    reloads += s.reloads.size();
    const Storage& st = k.storage(s.tensor);
    CHECK(d.message.find(fmt::format("'{}' f32[128, 12288] 48 KiB per partition (allocated at {}:{}): {} spill", st.name,
                                     __FILE__, line_tiles, s.saves.size())) != std::string::npos);
  }
  const int64_t bytes = jit::spilled_bytes(k, program.spills);
  REQUIRE(bytes % (1 << 20) == 0);  // whole 6 MiB tiles
  CHECK(d.message.find(fmt::format("{} spill and {} reload DMAs move {} MiB per run", saves, reloads, bytes >> 20)) !=
        std::string::npos);
  CHECK(d.message.find("to avoid spills, keep fewer large tiles live at once: tile the free dim") != std::string::npos);
  CHECK(jit::spill_warning(k, {}).empty());
}

TEST_CASE("spill: a tensor only read after its reload is saved once, however often it is reloaded") {
  // r is loaded once and read at the end of each of three phases; each phase needs three 64 KiB
  // tiles at one instruction, which leaves no room for r.
  auto kernel = [](Tensor x) {
    Tensor out = nl::ndarray({128, 16}, nl::float32, nl::shared_hbm, "out");
    Tensor acc = nl::ndarray({128, 16}, nl::float32, nl::sbuf, "acc");
    isa::memset(acc, 0.0);
    Tensor r = nl::ndarray({128, kTile}, nl::float32, nl::sbuf, "r");
    isa::dma_copy(r, x(nl::all, nl::ds(0, kTile)));
    for (int j = 0; j < 3; ++j) {
      add_wide_phase(x, acc, double(j + 2), std::to_string(j));
      isa::tensor_tensor(acc, acc, r(nl::all, nl::ds(0, 16)), nl::add);
    }
    isa::dma_copy(out, acc);
    return out;
  };
  Kernel traced = trace("k", kernel, spec({128, kWide}, nl::float32, "x"));
  jit::Program program = jit::compile(traced);
  REQUIRE(program.spills.size() == 1);
  const jit::Spill& s = program.spills[0];
  CHECK(program.kernel().storage(s.tensor).name == "r");
  CHECK(s.saves.size() == 1);
  CHECK(s.reloads.size() == 3);

  HostTensor x = random_tensor(DType::float32, {128, kWide}, 9);
  std::vector<HostTensor> outs = run_everywhere(traced, {&x});
  CHECK(mismatches(outs[0], [&](int64_t i) {
          const float v = x_at(x, i);
          float acc = 0;
          for (int j = 0; j < 3; ++j) {
            acc = acc + (v + v * float(j + 2));
            acc = acc + v;
          }
          return acc;
        }) == 0);
}

TEST_CASE("spill: a value overwritten before it is read again moves nowhere, its storage is only split") {
  // d is read, idle while three 64 KiB tiles are in use, then overwritten whole and read again.
  auto kernel = [](Tensor x) {
    Tensor out = nl::ndarray({128, 16}, nl::float32, nl::shared_hbm, "out");
    Tensor acc = nl::ndarray({128, 16}, nl::float32, nl::sbuf, "acc");
    Tensor d = nl::ndarray({128, kTile}, nl::float32, nl::sbuf, "d");
    isa::memset(d, 1.0);
    isa::tensor_copy(acc, d(nl::all, nl::ds(0, 16)));
    add_wide_phase(x, acc, 2.0);
    isa::memset(d, 4.0);
    isa::tensor_tensor(acc, acc, d(nl::all, nl::ds(0, 16)), nl::add);
    isa::dma_copy(out, acc);
    return out;
  };
  Kernel traced = trace("k", kernel, spec({128, kWide}, nl::float32, "x"));
  jit::Program program = jit::compile(traced);
  CHECK(program.spills.empty());
  CHECK(program.diagnostics.empty());
  const Kernel& k = program.kernel();
  CHECK(k.instructions.size() == traced.instructions.size());
  // The second value of d lives in a storage of its own, which may take c's bytes.
  CHECK(storage(k, "d.1").shape == storage(k, "d").shape);
  CHECK(k.storage(k.instructions[k.instructions.size() - 3].operands[0].storage()).name == "d.1");

  HostTensor x = random_tensor(DType::float32, {128, kWide}, 4);
  std::vector<HostTensor> outs = run_everywhere(traced, {&x});
  CHECK(mismatches(outs[0], [&](int64_t i) {
          const float v = x_at(x, i);
          return (1.0f + (v + v * 2.0f)) + 4.0f;
        }) == 0);
}

TEST_CASE("spill: tensors placed with address= stay where they are; automatic ones spill around them") {
  auto kernel = [](Tensor x) {
    Tensor out = nl::ndarray({128, 16}, nl::float32, nl::shared_hbm, "out");
    // 100 KiB at the start of SBUF, idle in between its two uses: a candidate if it were automatic.
    Tensor m = nl::ndarray({128, 25600}, nl::float32, nl::sbuf, "m", Address{0, 0});
    isa::memset(m, 3.0);
    Tensor acc = nl::ndarray({128, 16}, nl::float32, nl::sbuf, "acc");
    isa::tensor_copy(acc, m(nl::all, nl::ds(0, 16)));
    Tensor r = nl::ndarray({128, kTile}, nl::float32, nl::sbuf, "r");
    isa::dma_copy(r, x(nl::all, nl::ds(0, kTile)));
    Tensor a = nl::ndarray({128, kTile}, nl::float32, nl::sbuf, "a");
    isa::tensor_scalar(a, r, nl::multiply, 2.0);
    Tensor b = nl::ndarray({128, kTile}, nl::float32, nl::sbuf, "b");
    isa::tensor_tensor(b, a, a, nl::add);  // m, r, a, b: 244 KiB
    isa::tensor_tensor(acc, acc, b(nl::all, nl::ds(0, 16)), nl::add);
    isa::tensor_tensor(acc, acc, r(nl::all, nl::ds(0, 16)), nl::add);
    isa::tensor_tensor(acc, acc, m(nl::all, nl::ds(0, 16)), nl::add);
    isa::dma_copy(out, acc);
    return out;
  };
  Kernel traced = trace("k", kernel, spec({128, kTile}, nl::float32, "x"));
  jit::Program program = jit::compile(traced);
  REQUIRE(program.spills.size() == 1);
  CHECK(program.kernel().storage(program.spills[0].tensor).name == "r");
  CHECK(storage(program.kernel(), "m").address == Address{0, 0});
  HostTensor x = random_tensor(DType::float32, {128, kTile}, 2);
  std::vector<HostTensor> outs = run_everywhere(traced, {&x});
  CHECK(mismatches(outs[0], [&](int64_t i) {
          const float v = x.get(i / 16 * kTile + i % 16);
          const float a = v * 2.0f;
          return ((3.0f + (a + a)) + v) + 3.0f;
        }) == 0);
}

TEST_CASE("spill: what spilling cannot help keeps the capacity error") {
  int line = 0;
  SUBCASE("the operands of one instruction") {
    auto kernel = [&](Tensor x) {
      Tensor out = nl::ndarray({128, 16}, nl::float32, nl::shared_hbm, "out");
      Tensor a = nl::ndarray({128, 20480}, nl::float32, nl::sbuf, "a");  // 80 KiB each: 240 KiB together
      Tensor b = nl::ndarray({128, 20480}, nl::float32, nl::sbuf, "b");
      Tensor c = nl::ndarray({128, 20480}, nl::float32, nl::sbuf, "c");
      isa::memset(a, 1.0);
      isa::memset(b, 2.0);
      line = __LINE__; isa::tensor_tensor(c, a, b, nl::add);
      isa::dma_copy(out, c(nl::all, nl::ds(0, 16)));
      return out;
    };
    CHECK_ERROR(kernel_error(kernel, kTileSpec), line,
                "SBUF capacity exceeded: 3 live tensors need 240 KiB per partition, trn2 has 212984 B",
                "'a' f32[128, 20480] 80 KiB per partition", "in: tensor_tensor", "use smaller tiles");
  }
  SUBCASE("a manually placed tensor and the operands beside it") {
    auto kernel = [&](Tensor x) {
      Tensor out = nl::ndarray({128, 16}, nl::float32, nl::shared_hbm, "out");
      Tensor m = nl::ndarray({128, 37888}, nl::float32, nl::sbuf, "m", Address{0, 0});  // 148 KiB
      isa::memset(m, 1.0);
      Tensor a = nl::ndarray({128, kTile}, nl::float32, nl::sbuf, "a");
      isa::dma_copy(a, x);
      Tensor b = nl::ndarray({128, kTile}, nl::float32, nl::sbuf, "b");
      line = __LINE__; isa::tensor_tensor(b, a, m(nl::all, nl::ds(0, kTile)), nl::add);
      isa::dma_copy(out, b(nl::all, nl::ds(0, 16)));
      return out;
    };
    CHECK_ERROR(kernel_error(kernel, kTileSpec), line,
                "SBUF capacity exceeded: 3 live tensors need 244 KiB per partition, trn2 has 212984 B",
                "'m' f32[128, 37888] 148 KiB per partition");
  }
}

TEST_CASE("spill: tensors live across a runtime loop stay in place; tensors of one iteration may spill") {
  // across: whether r is loaded before the loop (live through it) or in each iteration.
  auto kernel = [&](bool across) {
    return [&, across](Tensor x) {
      Tensor out = nl::ndarray({128, 16}, nl::float32, nl::shared_hbm, "out");
      Tensor acc = nl::ndarray({128, 16}, nl::float32, nl::sbuf, "acc");
      isa::memset(acc, 0.0);
      auto load_r = [&] {
        Tensor r = nl::ndarray({128, kTile}, nl::float32, nl::sbuf, "r");
        isa::dma_copy(r, x(nl::all, nl::ds(0, kTile)));
        return r;
      };
      std::optional<Tensor> r;
      if (across) r = load_r();
      const RegisterId i = x.builder().new_register();
      append(Opcode::loop_begin, {Operand::reg_(i), Operand::immediate(0), Operand::immediate(3)});
      if (!across) r = load_r();  // created in the body: rewritten by every iteration
      add_wide_phase(x, acc, 2.0);
      isa::tensor_tensor(acc, acc, (*r)(nl::all, nl::ds(0, 16)), nl::add);
      append(Opcode::loop_end, {});
      isa::dma_copy(out, acc);
      return out;
    };
  };
  const TensorSpec x_spec = spec({128, kWide}, nl::float32, "x");
  Kernel inside = trace("k", kernel(false), x_spec);
  link_loops(inside);
  jit::Program program = jit::compile(inside);
  REQUIRE(program.spills.size() == 1);
  CHECK(program.spills[0].reloads.size() == 1);  // once in the body, run each iteration
  HostTensor x = random_tensor(DType::float32, {128, kWide}, 8);
  std::vector<HostTensor> outs = run_everywhere(inside, {&x});
  CHECK(mismatches(outs[0], [&](int64_t e) {
          const float v = x_at(x, e);
          float acc = 0;
          for (int j = 0; j < 3; ++j) acc = (acc + (v + v * 2.0f)) + v;
          return acc;
        }) == 0);

  Kernel across = trace("k", kernel(true), x_spec);
  link_loops(across);
  std::optional<KernelError> e = compile_kernel_error(across);
  REQUIRE(e.has_value());
  CHECK(std::string(e->what()).find("SBUF capacity exceeded: 5 live tensors need 245824 B per partition") !=
        std::string::npos);
}

namespace {

/** SBUF bytes per partition of the storages live at the busiest instruction of an allocated kernel. */
int64_t peak_sbuf(const Kernel& k) {
  const std::vector<jit::LiveRange> ranges = jit::live_ranges(k);
  std::vector<int64_t> usage(k.instructions.size() + 1, 0);
  for (StorageId id = 0; id < k.storages.size(); ++id)
    if (k.storages[id].buffer == Buffer::sbuf && ranges[id].used()) {
      usage[ranges[id].begin] += k.storages[id].partition_bytes();
      usage[ranges[id].end + 1] -= k.storages[id].partition_bytes();
    }
  int64_t peak = 0, now = 0;
  for (int64_t u : usage) peak = std::max(peak, now += u);
  return peak;
}

}  // namespace

TEST_CASE("spill: library kernels squeezed into part of the SBUF compute the same bits") {
  // A smaller SBUF budget (a testing hook) makes kernels that fit spill; the result must not change.
  // The first example of each kernel that spills is run on the native executor, and on the
  // reference semantics for the first few kernels: the reference semantics is slow, and the
  // executors' agreement is checked on every example elsewhere.
  constexpr int kInterpretedKernels = 4;
  int spilled = 0;
  for (const kernels::KernelInfo& info : kernels::registry()) {
    for (const kernels::ExampleCase& ex : info.examples) {
      CAPTURE(info.name);
      CAPTURE(ex.label);
      Kernel kernel = kernels::trace_library_kernel(info, ex.inputs, ex.params);
      const int64_t peak = peak_sbuf(jit::compile(kernel).kernel());
      jit::CompileOptions squeezed;
      squeezed.allocate_options.sbuf_budget = peak * 2 / 3;
      std::optional<jit::Program> program;
      try {
        program = jit::compile(kernel, squeezed);
      } catch (const KernelError&) {
        continue;  // one instruction alone needs more than the budget
      }
      if (program->spills.empty()) continue;
      ++spilled;
      for (const Storage& s : program->kernel().storages)
        if (s.buffer == Buffer::sbuf && s.address)
          CHECK(s.address->byte_offset + s.partition_bytes() <= squeezed.allocate_options.sbuf_budget);
      std::vector<HostTensor> inputs;
      uint32_t seed = 11;
      for (const TensorSpec& s : ex.inputs)
        inputs.push_back(is_float(s.dtype) ? random_tensor(s.dtype, s.shape, seed++, 0.25f, 1.0f)
                                           : HostTensor(s.dtype, s.shape));
      std::vector<HostTensor*> ptrs;
      for (HostTensor& t : inputs) ptrs.push_back(&t);
      std::vector<HostTensor> roomy = run_kernel(kernel, ptrs, Mode::streams_native);
      for (Mode mode : {Mode::streams_interp, Mode::streams_native}) {
        if (mode == Mode::streams_interp && spilled > kInterpretedKernels) continue;
        CAPTURE(int(mode));
        std::vector<HostTensor> tight = run_kernel(kernel, ptrs, mode, squeezed);
        for (size_t o = 0; o < roomy.size(); ++o) CHECK(tight[o].bytes == roomy[o].bytes);
      }
      break;
    }
  }
  MESSAGE(spilled << " library kernels spilled (their first spilling example checked)");
  CHECK(spilled >= 5);
}

}  // namespace nikki::test
