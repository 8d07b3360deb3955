// nikki_fuzz: random kernels through the C++ DSL (nikki::nl / nikki::isa), driven by a seed.
//
//   nikki_fuzz --seed S --cases N   runs seeds S..S+N-1; prints "case <seed> begin" before and
//                                    "case <seed> ok|FAIL <kind> ..." after each case
//   nikki_fuzz --seed S --print     prints the kernel of seed S as C++ DSL code
//
// A valid kernel is compiled once (with native code) and run seven ways: the reference interpreter
// in program order (the executable spec), and the stream executor with the reference semantics
// and with native routines under the stream orders latest-first, earliest-first and two random
// seeds. Every output must be byte-identical to the program-order run. An invalid kernel (one seed
// in four) carries one fault that breaks a hardware rule; tracing, compiling or running it must
// throw nikki::KernelError whose message names the rule and whose location is the line of the
// faulty call. Anything else (another exception, a wrong message or location, a mismatch) is a
// failure; crashes and hangs are caught by the harness that runs this program
// (tests/fuzz/kernelfuzz/harness.py).
#include <algorithm>
#include <atomic>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "nikki/jit/compile.hpp"
#include "nikki/nikki.hpp"
#include "nikki/numerics.hpp"
#include "nikki/runtime/executor.hpp"
#include "nikki/runtime/interpreter.hpp"

namespace {

using namespace nikki;
namespace isa = nikki::isa;

/** A tile of the kernel being generated, and the C++ expression that names it. */
struct Tile {
  std::string name;
  Tensor t;
  DType dtype;
  Buffer buffer;
  int64_t partitions;
  int64_t free;
  bool initialized = false;
};

/** A view of a tile as a tensor and as C++ source. */
struct View {
  Tensor t;
  std::string expr;
  Tile* tile;
};

/** The fault an invalid kernel carries: a fragment of the expected message and the line of the
 * faulty DSL call (0 when the error may be reported at an allocation instead). */
struct Fault {
  std::string pattern;
  uint32_t line = 0;
  std::string what;
};

struct HostTensor {
  DType dtype;
  Shape shape;
  std::vector<uint8_t> bytes;
};

const char* dtype_code(DType d) {
  static const char* names[] = {"float32", "bfloat16", "float16", "tfloat32", "float8_e4m3", "float8_e4m3fn",
                                "float8_e5m2", "int8", "int16", "int32", "uint8", "uint16", "uint32", "bool_"};
  return names[static_cast<int>(d)];
}

const char* buffer_code(Buffer b) { return b == Buffer::psum ? "nl::psum" : "nl::sbuf"; }

std::string shape_code(const Shape& s) {
  std::string out = "{";
  for (int d = 0; d < s.rank(); ++d) out += fmt::format("{}{}", d ? ", " : "", s[d]);
  return out + "}";
}

/** One seed in four makes an invalid kernel. */
bool invalid_seed(uint64_t seed) { return seed % 4 == 3; }

/** Builds one kernel through the DSL, recording every call as a line of C++ (the reproducer). */
class Gen {
 public:
  explicit Gen(uint64_t seed) : rng_(seed), seed_(seed) {
    target_ = pick(4) == 0 ? TargetId::trn1 : TargetId::trn2;
    t_ = &target_config(target_);
    invalid_ = invalid_seed(seed);
  }

  TargetId target() const { return target_; }
  bool invalid() const { return invalid_; }
  const std::vector<std::string>& code() const { return code_; }
  const std::optional<Fault>& fault() const { return fault_; }
  const std::vector<std::string>& features() const { return features_; }
  int outputs() const { return outs_; }

  /** Inputs: three 2-D tensors of random dtypes and sizes, and an int32 index vector. */
  std::vector<TensorSpec> input_specs() {
    static const DType dtypes[] = {DType::float32, DType::float32, DType::bfloat16, DType::float16,
                                   DType::float8_e4m3, DType::int32, DType::int8, DType::uint8};
    std::vector<TensorSpec> specs;
    for (int i = 0; i < 3; ++i) {
      // the last one sometimes wide enough for rows of thousands of elements
      Shape s{range(1, t_->num_partitions + 40), i == 2 && chance(0.2) ? range(512, 4200) : range(1, 300)};
      specs.push_back(spec(s, dtypes[pick(std::size(dtypes))], fmt::format("in{}", i)));
    }
    specs.push_back(spec({int64_t(t_->num_partitions), 1}, DType::int32, "idx"));
    return specs;
  }

  /** Deterministic host data for the inputs (small integers, reals, specials; valid indices). */
  std::vector<HostTensor> input_data(const std::vector<TensorSpec>& specs) {
    std::vector<HostTensor> data;
    for (const TensorSpec& s : specs) {
      HostTensor h{s.dtype, s.shape, std::vector<uint8_t>(s.shape.num_elements() * dtype_size(s.dtype))};
      const int domain = pick(3);
      for (int64_t i = 0; i < s.shape.num_elements(); ++i) {
        void* p = h.bytes.data() + i * dtype_size(s.dtype);
        if (s.name == "idx") {
          numerics::store_int(s.dtype, p, int64_t(pick(std::max<int64_t>(1, specs[0].shape[0]))));
        } else if (is_integer(s.dtype)) {
          numerics::store_int(s.dtype, p, int64_t(pick(20)) - (info(s.dtype).is_signed ? 8 : 0));
        } else {
          static const float special[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 1e-40f, 65504.0f, 300.0f};
          float v = domain == 0   ? float(int(pick(9)) - 4)
                    : domain == 1 ? float(std::normal_distribution<double>(0, 2)(rng_))
                    : pick(4) == 0 ? special[pick(std::size(special))]
                                   : float(std::normal_distribution<double>(0, 30)(rng_));
          numerics::store_float(s.dtype, p, v);
        }
      }
      data.push_back(std::move(h));
    }
    return data;
  }

  /** The kernel body: random steps (and for invalid kernels one fault), then the outputs. */
  std::vector<Tensor> body(const std::vector<Tensor>& in) {
    for (size_t i = 0; i < in.size(); ++i) inputs_.push_back({in[i], fmt::format("in[{}]", i)});
    const int steps = int(range(2, 9));
    const int fault_at = invalid_ ? int(pick(steps + 1)) : -1;
    for (int s = 0; s <= steps; ++s) {
      if (s == fault_at) inject_fault();
      if (s < steps) step();
    }
    std::vector<Tensor> outs;
    std::vector<Tile*> written;
    for (Tile& t : tiles_)
      if (t.initialized) written.push_back(&t);
    std::shuffle(written.begin(), written.end(), rng_);
    if (written.empty()) written.push_back(&load(range(1, 64), range(1, 64), DType::float32));
    const size_t n = std::min<size_t>(written.size(), range(1, 3));
    for (size_t i = 0; i < n; ++i) outs.push_back(store(*written[i]));
    return outs;
  }

 private:
  // --- randomness ---------------------------------------------------------------------------
  uint64_t pick(uint64_t n) { return n ? rng_() % n : 0; }
  int64_t range(int64_t lo, int64_t hi) { return lo + int64_t(pick(uint64_t(hi - lo + 1))); }
  bool chance(double p) { return std::uniform_real_distribution<double>(0, 1)(rng_) < p; }
  template <class T>
  const T& choose(const std::vector<T>& v) { return v[pick(v.size())]; }

  int64_t partitions(int64_t cap = 0) {
    cap = cap ? std::min<int64_t>(cap, t_->num_partitions) : t_->num_partitions;
    std::vector<int64_t> options;
    for (int64_t p : {1, 2, 3, 7, 16, 32, 33, 64, 100, 127, 128})
      if (p <= cap) options.push_back(p);
    return options.empty() ? cap : choose(options);
  }
  /** A free size for element-wise work: mostly up to 512, now and then a few thousand while the
   * kernel's SBUF stays well below capacity. */
  int64_t free_size() {
    std::vector<int64_t> wide;
    for (int64_t s : {1000, 2048, 4096})
      if (sbuf_bytes_ + 3 * 4 * s < int64_t(t_->sbuf_bytes_per_partition) / 2) wide.push_back(s);
    return !wide.empty() && chance(0.1) ? choose(wide) : size(512);
  }
  int64_t size(int64_t cap, int64_t low = 1) {
    std::vector<int64_t> options;
    for (int64_t s : {1, 2, 3, 5, 8, 13, 16, 31, 33, 64, 100, 128, 255, 512})
      if (s >= low && s <= cap) options.push_back(s);
    return options.empty() ? cap : choose(options);
  }
  DType tile_dtype() {
    static const std::vector<DType> d = {DType::float32, DType::float32, DType::float32, DType::bfloat16,
                                         DType::float16, DType::float8_e4m3, DType::float8_e5m2,
                                         DType::float8_e4m3fn, DType::int32, DType::int8, DType::uint16,
                                         DType::tfloat32};
    return choose(d);
  }
  std::vector<int64_t> partition_starts(int64_t count, int64_t tile_partitions) const {
    const int64_t q = t_->partition_quadrant;
    std::vector<int64_t> starts;
    if (count > 2 * q) starts = {0};
    else if (count > q) starts = {0, 2 * q};
    else for (int64_t s = 0; s < t_->num_partitions; s += q) starts.push_back(s);
    std::erase_if(starts, [&](int64_t s) { return s + count > tile_partitions; });
    return starts;
  }
  void note(std::string feature) {
    if (std::find(features_.begin(), features_.end(), feature) == features_.end()) features_.push_back(feature);
  }
  void line(std::string text) { code_.push_back(std::move(text)); }

  // --- tiles ----------------------------------------------------------------------------------
  Tile& alloc(int64_t p, int64_t f, DType d, Buffer b) {
    if (b == Buffer::psum) psum_banks_ += banks(f, d);
    else sbuf_bytes_ += f * dtype_size(d);
    std::string name = fmt::format("t{}", tiles_.size());
    Tensor t = nl::ndarray({p, f}, d, b);
    line(fmt::format("Tensor {} = nl::ndarray({{{}, {}}}, nl::{}, {});", name, p, f, dtype_code(d), buffer_code(b)));
    tiles_.push_back({name, t, d, b, p, f});
    return tiles_.back();
  }
  int64_t banks(int64_t f, DType d) const {
    return (f * dtype_size(d) + t_->psum_bank_bytes - 1) / t_->psum_bank_bytes;
  }
  bool psum_fits(int64_t f, DType d) const {
    return psum_banks_ + banks(f, d) <= int64_t(t_->psum_num_banks) * 3 / 4 && f <= t_->psum_bank_fp32_elems();
  }
  Buffer result_buffer(int64_t f, DType d) { return chance(0.2) && psum_fits(f, d) ? Buffer::psum : Buffer::sbuf; }

  /** A view of `tile` with p partitions and f free elements (slices, steps, reversed patterns). */
  std::optional<View> view(Tile& tile, int64_t p, int64_t f, bool writable) {
    auto starts = partition_starts(p, tile.partitions);
    if (starts.empty() || f > tile.free) return std::nullopt;
    const int64_t p0 = choose(starts);
    const int64_t width = tile.free;
    const int kind = int(pick(writable ? 4 : 5));
    if (kind == 1 && (f - 1) * 2 + 1 <= width) {
      const int64_t step = (f - 1) * 3 + 1 <= width && chance(0.5) ? 3 : 2;
      const int64_t span = (f - 1) * step + 1;
      const int64_t f0 = range(0, width - span);
      note("view_step");
      return View{tile.t(Slice{p0, p0 + p}, Slice{f0, f0 + span, step}),
                  fmt::format("{}(Slice{{{}, {}}}, Slice{{{}, {}, {}}})", tile.name, p0, p0 + p, f0, f0 + span, step),
                  &tile};
    }
    const int64_t f0 = range(0, width - f);
    if (kind == 2 && f > 1) {
      note("view_reversed");
      const int64_t off = p0 * width + f0 + f - 1;
      return View{tile.t.ap({{width, p}, {-1, f}}, ApOptions{.offset = off}),
                  fmt::format("{}.ap({{{{{}, {}}}, {{-1, {}}}}}, ApOptions{{.offset = {}}})", tile.name, width, p, f,
                              off),
                  &tile};
    }
    if (kind == 3 && f > 3 && f % 2 == 0) {
      note("view_split");
      return View{tile.t(Slice{p0, p0 + p}, Slice{f0, f0 + f}).reshape_dim(1, {2, f / 2}),
                  fmt::format("{}(Slice{{{}, {}}}, Slice{{{}, {}}}).reshape_dim(1, {{2, {}}})", tile.name, p0, p0 + p,
                              f0, f0 + f, f / 2),
                  &tile};
    }
    if (kind == 4 && f > 1) {
      note("view_broadcast");
      return View{tile.t(Slice{p0, p0 + p}, Slice{f0, f0 + 1}).broadcast(1, f),
                  fmt::format("{}(Slice{{{}, {}}}, Slice{{{}, {}}}).broadcast(1, {})", tile.name, p0, p0 + p, f0,
                              f0 + 1, f),
                  &tile};
    }
    if (p0 == 0 && p == tile.partitions && f0 == 0 && f == width) return View{tile.t, tile.name, &tile};
    return View{tile.t(Slice{p0, p0 + p}, Slice{f0, f0 + f}),
                fmt::format("{}(Slice{{{}, {}}}, Slice{{{}, {}}})", tile.name, p0, p0 + p, f0, f0 + f), &tile};
  }

  /** A readable view of an initialized tile, or of a freshly loaded one. */
  View source(int64_t p, int64_t f, std::vector<DType> dtypes = {}, bool sbuf_only = false,
              const Tile* exclude = nullptr) {
    std::vector<Tile*> candidates;
    for (Tile& t : tiles_)
      if (t.initialized && &t != exclude && t.partitions >= p && t.free >= f && (!sbuf_only || t.buffer == Buffer::sbuf) &&
          (dtypes.empty() || std::find(dtypes.begin(), dtypes.end(), t.dtype) != dtypes.end()))
        candidates.push_back(&t);
    std::shuffle(candidates.begin(), candidates.end(), rng_);
    for (size_t i = 0; i < std::min<size_t>(candidates.size(), 4); ++i)
      if (auto v = view(*candidates[i], p, f, false)) return *v;
    Tile& t = load(p, f, dtypes.empty() ? tile_dtype() : choose(dtypes));
    return *view(t, p, f, false);
  }

  /** A destination: a fresh tile, or a region of an existing one. */
  View dest(int64_t p, int64_t f, DType d, bool psum_ok = true) {
    if (chance(0.2)) {
      std::vector<Tile*> candidates;
      for (Tile& t : tiles_)
        if (t.dtype == d && t.partitions >= p && t.free >= f && (psum_ok || t.buffer == Buffer::sbuf))
          candidates.push_back(&t);
      if (!candidates.empty())
        if (auto v = view(*choose(candidates), p, f, true)) return *v;
    }
    Tile& t = alloc(p, f, d, psum_ok ? result_buffer(f, d) : Buffer::sbuf);
    return View{t.t, t.name, &t};
  }

  void written(View& v) { v.tile->initialized = true; }

  /** A fresh SBUF tile loaded from an input (strided, reversed or transposed access, conversion). */
  Tile& load(int64_t p, int64_t f, DType d) {
    Tile& t = alloc(p, f, d, Buffer::sbuf);
    std::vector<size_t> fits;
    for (size_t i = 0; i + 1 < inputs_.size(); ++i) {
      const Shape s = inputs_[i].first.shape();
      if (s[0] >= p && s[1] >= f) fits.push_back(i);
    }
    if (fits.empty()) {  // no input is large enough: fill the tile instead
      memset_into(View{t.t, t.name, &t});
      return t;
    }
    auto& [in, name] = inputs_[choose(fits)];
    const int64_t rows = in.shape()[0], cols = in.shape()[1];
    const int kind = int(pick(4));
    if (kind == 1 && rows >= 2 * p && cols >= 2 * f) {
      isa::dma_copy(t.t, in(Slice{0, 2 * p, 2}, Slice{1, 2 * f, 2}));
      line(fmt::format("isa::dma_copy({}, {}(Slice{{0, {}, 2}}, Slice{{1, {}, 2}}));", t.name, name, 2 * p, 2 * f));
      note("dma_step");
    } else if (kind == 2 && f > 1) {
      isa::dma_copy(t.t, in.ap({{cols, p}, {-1, f}}, ApOptions{.offset = f - 1}));
      line(fmt::format("isa::dma_copy({}, {}.ap({{{{{}, {}}}, {{-1, {}}}}}, ApOptions{{.offset = {}}}));", t.name,
                       name, cols, p, f, f - 1));
      note("dma_reversed");
    } else if (kind == 3 && rows >= f && cols >= p) {
      isa::dma_copy(t.t, in(Slice{0, f}, Slice{0, p}).permute({1, 0}));
      line(fmt::format("isa::dma_copy({}, {}(Slice{{0, {}}}, Slice{{0, {}}}).permute({{1, 0}}));", t.name, name, f, p));
      note("dma_transposed");
    } else {
      const int64_t r0 = range(0, rows - p), c0 = range(0, cols - f);
      isa::dma_copy(t.t, in(Slice{r0, r0 + p}, Slice{c0, c0 + f}));
      line(fmt::format("isa::dma_copy({}, {}(Slice{{{}, {}}}, Slice{{{}, {}}}));", t.name, name, r0, r0 + p, c0,
                       c0 + f));
    }
    t.initialized = true;
    return t;
  }

  void memset_into(View v) {
    const DType d = v.tile->dtype;
    const double value = is_integer(d) ? double(range(0, 9)) : choose(std::vector<double>{0.0, 1.0, -2.5, 3.0});
    const bool gpsimd = v.tile->buffer == Buffer::sbuf && chance(0.3);
    isa::memset(v.t, value, gpsimd ? Engine::gpsimd : Engine::unknown);
    line(fmt::format("isa::memset({}, {}{});", v.expr, value, gpsimd ? ", isa::gpsimd_engine" : ""));
    written(v);
    note("memset");
  }

  Tensor store(Tile& tile) {
    Tile* src = &tile;
    if (tile.buffer == Buffer::psum) {
      Tile& staged = alloc(tile.partitions, tile.free, tile.dtype, Buffer::sbuf);
      isa::tensor_copy(staged.t, tile.t);
      line(fmt::format("isa::tensor_copy({}, {});", staged.name, tile.name));
      staged.initialized = true;
      src = &staged;
    }
    const DType d = src->dtype == DType::tfloat32 ? DType::float32 : src->dtype;
    Tensor out = nl::ndarray({src->partitions, src->free}, d, Buffer::shared_hbm);
    isa::dma_copy(out, src->t);
    line(fmt::format("Tensor out{} = nl::ndarray({{{}, {}}}, nl::{}, nl::shared_hbm);", outs_, src->partitions,
                     src->free, dtype_code(d)));
    line(fmt::format("isa::dma_copy(out{}, {});", outs_++, src->name));
    return out;
  }

  // --- steps ----------------------------------------------------------------------------------
  const nl::Op& arith_op() {
    static const std::vector<const nl::Op*> ops = {&nl::add, &nl::subtract, &nl::multiply, &nl::maximum,
                                                   &nl::minimum, &nl::greater, &nl::equal, &nl::less_equal,
                                                   &nl::logical_or, &nl::not_equal};
    return *choose(ops);
  }
  std::string op_code(const nl::Op& op) const { return fmt::format("nl::{}", op.name == "negate" ? "negative" : op.name); }

  void step() {
    switch (pick(20)) {
      case 0: load(partitions(), size(512), tile_dtype()); break;
      case 1: memset_into(dest(partitions(), size(512), tile_dtype())); break;
      case 2: case 3: tensor_tensor(); break;
      case 4: case 5: tensor_scalar(); break;
      case 6: activation(); break;
      case 7: tensor_reduce(); break;
      case 8: matmul(); break;
      case 9: transpose(); break;
      case 10: tensor_copy(); break;
      case 11: scalar_tensor_tensor(); break;
      case 12: iota_and_select(); break;
      case 13: statistics(); break;
      case 14: scan(); break;
      case 15: predicated(); break;
      case 16: max8(); break;
      case 17: partition_reduce(); break;
      case 18: runtime_offsets(); break;
      default: loop(); break;
    }
  }

  void tensor_tensor() {
    const int64_t p = partitions(), f = free_size();
    View a = source(p, f);
    View b = source(p, f, {}, a.tile->buffer == Buffer::psum);
    const nl::Op& op = arith_op();
    View d = dest(p, f, tile_dtype());
    const bool gpsimd = chance(0.2) && a.tile->buffer == Buffer::sbuf && b.tile->buffer == Buffer::sbuf &&
                        d.tile->buffer == Buffer::sbuf;
    isa::tensor_tensor(d.t, a.t, b.t, op, gpsimd ? Engine::gpsimd : Engine::unknown);
    line(fmt::format("isa::tensor_tensor({}, {}, {}, {}{});", d.expr, a.expr, b.expr, op_code(op),
                     gpsimd ? ", isa::gpsimd_engine" : ""));
    written(d);
    note(fmt::format("tensor_tensor_{}", op.name));
  }

  void tensor_scalar() {
    const int64_t p = partitions(), f = free_size();
    View x = source(p, f);
    View d = dest(p, f, tile_dtype());
    if (is_integer(x.tile->dtype) && x.tile->dtype == d.tile->dtype && d.tile != x.tile && chance(0.4)) {
      static const std::vector<const nl::Op*> bit = {&nl::bitwise_and, &nl::bitwise_or, &nl::bitwise_xor,
                                                     &nl::left_shift, &nl::right_shift};
      const nl::Op& op = *choose(bit);
      const int64_t k = range(0, 5);
      isa::tensor_scalar(d.t, x.t, op, double(k));
      line(fmt::format("isa::tensor_scalar({}, {}, {}, {});", d.expr, x.expr, op_code(op), k));
      written(d);
      note("tensor_scalar_bitvec");
      return;
    }
    const nl::Op& op0 = arith_op();
    isa::TensorScalarOptions o;
    std::string opts;
    std::string operand0 = "2.0";
    isa::Scalar s0 = 2.0;
    if (chance(0.3)) {
      View v = source(p, 1, {DType::float32}, true, d.tile);
      s0 = v.t;
      operand0 = v.expr;
    }
    o.reverse0 = chance(0.3);
    if (chance(0.5)) {
      o.op1 = nl::add;
      o.operand1 = -1.5;
      opts = ", {.reverse0 = " + std::string(o.reverse0 ? "true" : "false") + ", .op1 = nl::add, .operand1 = -1.5}";
    } else if (o.reverse0) {
      opts = ", {.reverse0 = true}";
    }
    isa::tensor_scalar(d.t, x.t, op0, s0, o);
    line(fmt::format("isa::tensor_scalar({}, {}, {}, {}{});", d.expr, x.expr, op_code(op0), operand0, opts));
    written(d);
    note("tensor_scalar");
  }

  void scalar_tensor_tensor() {
    const int64_t p = partitions(), f = free_size();
    View x = source(p, f);
    View y = source(p, f, {}, x.tile->buffer == Buffer::psum);
    View d = dest(p, f, tile_dtype());
    const nl::Op& op0 = *choose(std::vector<const nl::Op*>{&nl::add, &nl::multiply, &nl::maximum});
    const nl::Op& op1 = *choose(std::vector<const nl::Op*>{&nl::add, &nl::subtract, &nl::minimum});
    const bool r0 = chance(0.3), r1 = chance(0.3);
    isa::scalar_tensor_tensor(d.t, x.t, op0, 3.0, op1, y.t, r0, r1);
    line(fmt::format("isa::scalar_tensor_tensor({}, {}, {}, 3.0, {}, {}, {}, {});", d.expr, x.expr, op_code(op0),
                     op_code(op1), y.expr, r0, r1));
    written(d);
    note("scalar_tensor_tensor");
  }

  void activation() {
    static const std::vector<const nl::Op*> funcs = {
        &nl::copy, &nl::exp, &nl::tanh, &nl::sigmoid, &nl::relu, &nl::gelu, &nl::silu, &nl::softplus, &nl::mish,
        &nl::erf, &nl::log, &nl::sqrt, &nl::rsqrt, &nl::reciprocal, &nl::sin, &nl::arctan, &nl::sign, &nl::abs,
        &nl::square, &nl::gelu_apprx_tanh, &nl::gelu_dx, &nl::silu_dx, &nl::erf_dx, &nl::gelu_apprx_sigmoid,
        &nl::gelu_apprx_sigmoid_dx};
    const int64_t p = partitions(), f = free_size();
    View x = source(p, f);
    View d = dest(p, f, tile_dtype());
    const nl::Op& func = *choose(funcs);
    isa::ActivationOptions o;
    std::vector<std::string> opts;
    if (chance(0.4)) {
      View b = source(p, 1, {DType::float32, DType::bfloat16}, true, d.tile);
      o.bias = b.t;
      opts.push_back(".bias = " + b.expr);
    }
    if (chance(0.4)) {
      o.scale = 0.5;
      opts.push_back(".scale = 0.5");
    }
    std::optional<View> res;
    if (chance(0.4)) {
      static const ReduceCmd cmds[] = {ReduceCmd::reset_reduce, ReduceCmd::reduce, ReduceCmd::reset, ReduceCmd::idle};
      o.reduce_cmd = cmds[pick(4)];
      o.reduce_op = nl::add;
      opts.push_back(".reduce_op = nl::add");
      res = dest(p, 1, DType::float32, false);
      if (res->tile == d.tile || res->tile == x.tile) res.reset();
      if (res) {
        o.reduce_res = res->t;
        opts.push_back(".reduce_res = " + res->expr);
      }
      opts.push_back(fmt::format(".reduce_cmd = ReduceCmd::{}", reduce_cmd_name(o.reduce_cmd)));
      note(fmt::format("activation_reduce_{}", reduce_cmd_name(o.reduce_cmd)));
    }
    isa::activation(d.t, func, x.t, o);
    std::string joined;
    for (auto& s : opts) joined += (joined.empty() ? "" : ", ") + s;
    line(fmt::format("isa::activation({}, nl::{}, {}{});", d.expr, func.name, x.expr,
                     joined.empty() ? "" : ", {" + joined + "}"));
    written(d);
    if (res) written(*res);
    note(fmt::format("activation_{}", func.name));
  }

  void tensor_reduce() {
    const int64_t p = partitions(), f = free_size();
    View x = source(p, f);
    static const std::vector<const nl::Op*> ops = {&nl::add, &nl::maximum, &nl::minimum, &nl::multiply,
                                                   &nl::subtract, &nl::logical_and};
    const nl::Op& op = *choose(ops);
    const bool negate = chance(0.2), keep = chance(0.3);
    // the reduced axes are the trailing free dims: the last one, or (3-D views) both
    const int rank = x.t.ndim();
    const bool both = rank == 3 && chance(0.5);
    const std::vector<int> axes = rank == 2 ? std::vector<int>{1} : both ? std::vector<int>{1, 2} : std::vector<int>{2};
    const int64_t kept = rank == 3 && !both ? x.t.shape()[1] : 1;
    View d = dest(p, kept, tile_dtype());
    isa::tensor_reduce(d.t, op, x.t, axes, negate, keep);
    line(fmt::format("isa::tensor_reduce({}, {}, {}, {{{}}}, {}, {});", d.expr, op_code(op), x.expr,
                     fmt::join(axes, ", "), negate, keep));
    written(d);
    note(fmt::format("tensor_reduce_{}", op.name));
    if (chance(0.3)) {
      View d2 = dest(p, f, tile_dtype());
      View r = dest(p, 1, DType::float32, false);
      if (r.tile == d2.tile) return;
      isa::tensor_scalar_reduce(d2.t, x.t, nl::multiply, 2.0, nl::maximum, r.t);
      line(fmt::format("isa::tensor_scalar_reduce({}, {}, nl::multiply, 2.0, nl::maximum, {});", d2.expr, x.expr,
                       r.expr));
      written(d2);
      written(r);
      note("tensor_scalar_reduce");
    }
  }

  void matmul() {
    const int64_t k = partitions(), m = size(t_->gemm_stationary_fmax),
                  n = size(std::min<int64_t>(t_->gemm_moving_fmax, t_->psum_bank_fp32_elems()));
    if (!psum_fits(n, DType::float32)) return tensor_tensor();
    const bool wide = chance(0.4);
    std::vector<DType> dts = wide ? std::vector<DType>{DType::float32}
                                  : std::vector<DType>{DType::bfloat16, DType::float16, DType::float8_e4m3,
                                                       DType::float8_e5m2};
    View st = source(k, m, dts, true);
    View mv = source(k, n, dts, true);
    Tile& dst = alloc(m, n, DType::float32, Buffer::psum);
    const int passes = int(range(1, 3));
    for (int i = 0; i < passes; ++i) {
      if (i) {
        st = source(k, m, dts, true);
        mv = source(k, n, dts, true);
      }
      isa::MatmulOptions o;
      std::string opts;
      if (i && chance(0.5)) {
        o.accumulate = true;
        opts = ", {.accumulate = true}";
      }
      isa::nc_matmul(dst.t, st.t, mv.t, o);
      line(fmt::format("isa::nc_matmul({}, {}, {}{});", dst.name, st.expr, mv.expr, opts));
    }
    dst.initialized = true;
    note("nc_matmul");
  }

  void transpose() {
    const bool vector = chance(0.4);
    const int64_t cap = vector ? t_->vector_transpose_max : t_->gemm_stationary_fmax;
    const int64_t p = partitions(cap), f = size(cap);
    View x = source(p, f, {}, !vector);
    if (!vector && !psum_fits(p, x.tile->dtype)) return tensor_copy();
    Tile& d = alloc(f, p, x.tile->dtype, vector ? Buffer::sbuf : Buffer::psum);
    isa::nc_transpose(d.t, x.t, vector ? Engine::vector : Engine::unknown);
    line(fmt::format("isa::nc_transpose({}, {}{});", d.name, x.expr, vector ? ", isa::vector_engine" : ""));
    d.initialized = true;
    note(vector ? "nc_transpose_vector" : "nc_transpose_tensor");
  }

  void tensor_copy() {
    const int64_t p = partitions(), f = free_size();
    View x = source(p, f);
    View d = dest(p, f, tile_dtype());
    Engine e = Engine::unknown;
    if (chance(0.3) && t_->generation >= 3) e = Engine::scalar;
    else if (chance(0.3) && x.tile->buffer == Buffer::sbuf && d.tile->buffer == Buffer::sbuf) e = Engine::gpsimd;
    isa::tensor_copy(d.t, x.t, e);
    line(fmt::format("isa::tensor_copy({}, {}{});", d.expr, x.expr,
                     e == Engine::unknown ? "" : fmt::format(", isa::{}_engine", engine_name(e))));
    written(d);
    note("tensor_copy");
    if (chance(0.3)) {
      View r = dest(p, f, tile_dtype());
      isa::reciprocal(r.t, x.t);
      line(fmt::format("isa::reciprocal({}, {});", r.expr, x.expr));
      written(r);
      note("reciprocal");
    }
  }

  void iota_and_select() {
    const int64_t p = partitions(), f = size(256);
    View d = dest(p, f, choose(std::vector<DType>{DType::int32, DType::float32, DType::int16}), false);
    const int64_t off = range(-20, 20), cm = range(-2, 2), step = choose(std::vector<int64_t>{1, -1, 2});
    isa::iota(d.t, {{step, f}}, off, cm);
    line(fmt::format("isa::iota({}, {{{{{}, {}}}}}, {}, {});", d.expr, step, f, off, cm));
    written(d);
    note("iota");
    View on_true = source(p, f, {}, true);
    View s = dest(p, f, on_true.tile->dtype, false);
    if (s.tile == on_true.tile) return;
    isa::affine_select(s.t, {{-1, f}}, 1, on_true.t, -9.0, nl::greater_equal, off);
    line(fmt::format("isa::affine_select({}, {{{{-1, {}}}}}, 1, {}, -9.0, nl::greater_equal, {});", s.expr, f,
                     on_true.expr, off));
    written(s);
    note("affine_select");
  }

  void statistics() {
    const int64_t p = partitions(), f = size(t_->bn_stats_fmax);
    View x = source(p, f, {DType::float32, DType::bfloat16, DType::float16});
    Tile& stats = alloc(p, 12, DType::float32, Buffer::sbuf);
    View y = source(p, size(t_->bn_stats_fmax), {DType::float32});
    isa::bn_stats(stats.t(Slice{0, p}, Slice{0, 6}), x.t);
    isa::bn_stats(stats.t(Slice{0, p}, Slice{6, 12}), y.t);
    line(fmt::format("isa::bn_stats({}(Slice{{0, {}}}, Slice{{0, 6}}), {});", stats.name, p, x.expr));
    line(fmt::format("isa::bn_stats({}(Slice{{0, {}}}, Slice{{6, 12}}), {});", stats.name, p, y.expr));
    stats.initialized = true;
    View d = dest(p, 2, DType::float32, false);
    isa::bn_aggr(d.t, stats.t);
    line(fmt::format("isa::bn_aggr({}, {});", d.expr, stats.name));
    written(d);
    note("bn_stats");
    note("bn_aggr");
  }

  void scan() {
    const int64_t p = partitions(), f = free_size();
    View a = source(p, f);
    View b = source(p, f, {}, a.tile->buffer == Buffer::psum);
    View d = dest(p, f, tile_dtype());
    const bool r0 = chance(0.3), r1 = chance(0.3);
    isa::tensor_tensor_scan(d.t, a.t, b.t, 0.5, nl::multiply, nl::add, r0, r1);
    line(fmt::format("isa::tensor_tensor_scan({}, {}, {}, 0.5, nl::multiply, nl::add, {}, {});", d.expr, a.expr,
                     b.expr, r0, r1));
    written(d);
    note("tensor_tensor_scan");
  }

  void predicated() {
    const int64_t p = partitions(), f = size(256);
    View x = source(p, f);
    const DType pd = choose(std::vector<DType>{DType::uint8, DType::uint16, DType::bool_});
    Tile& pred = alloc(p, f, pd, Buffer::sbuf);
    isa::tensor_scalar(pred.t, x.t, nl::greater, 0.0);
    line(fmt::format("isa::tensor_scalar({}, {}, nl::greater, 0.0);", pred.name, x.expr));
    pred.initialized = true;
    View on_true = source(p, f, {DType::float32, DType::bfloat16, DType::int16}, true, &pred);
    Tile& d = alloc(p, f, on_true.tile->dtype, Buffer::sbuf);
    isa::memset(d.t, 1.0);
    line(fmt::format("isa::memset({}, 1.0);", d.name));
    const bool reverse = chance(0.5);
    isa::tensor_copy_predicated(d.t, on_true.t, pred.t, reverse);
    line(fmt::format("isa::tensor_copy_predicated({}, {}, {}, {});", d.name, on_true.expr, pred.name, reverse));
    d.initialized = true;
    note("tensor_copy_predicated");
    Tile& s = alloc(p, f, DType::float32, Buffer::sbuf);
    Tile& r = alloc(p, 1, DType::float32, Buffer::sbuf);
    const ReduceCmd cmd = chance(0.5) ? ReduceCmd::reset_reduce : ReduceCmd::reduce;
    isa::select_reduce(s.t, pred.t, on_true.t, -1.0, {.reduce_res = r.t, .reduce_cmd = cmd});
    line(fmt::format("isa::select_reduce({}, {}, {}, -1.0, {{.reduce_res = {}, .reduce_cmd = ReduceCmd::{}}});",
                     s.name, pred.name, on_true.expr, r.name, reduce_cmd_name(cmd)));
    s.initialized = r.initialized = true;
    note("select_reduce");
  }

  void max8() {
    const int64_t p = partitions(), n = size(512, t_->max8_min_elems);
    View x = source(p, n, {}, true);
    Tile& top = alloc(p, 8, DType::float32, Buffer::sbuf);
    isa::max8(top.t, x.t);
    line(fmt::format("isa::max8({}, {});", top.name, x.expr));
    top.initialized = true;
    Tile& idx = alloc(p, 8, chance(0.5) ? DType::uint32 : DType::uint16, Buffer::sbuf);
    isa::nc_find_index8(idx.t, x.t, top.t);
    line(fmt::format("isa::nc_find_index8({}, {}, {});", idx.name, x.expr, top.name));
    idx.initialized = true;
    note("max8");
    note("nc_find_index8");
  }

  void partition_reduce() {
    const int64_t p = partitions(), f = size(256);
    View x = source(p, f, {}, true);
    const nl::Op& op = *choose(std::vector<const nl::Op*>{&nl::add, &nl::maximum, &nl::average});
    View d = dest(1, f, tile_dtype(), false);
    isa::tensor_partition_reduce(d.t, op, x.t);
    line(fmt::format("isa::tensor_partition_reduce({}, {}, {});", d.expr, op_code(op), x.expr));
    written(d);
    note(fmt::format("tensor_partition_reduce_{}", op.name));
  }

  /** Registers, scalar offsets from a register or a 1x1 tensor, and gathers by an index tile. */
  void runtime_offsets() {
    auto& [in, name] = inputs_[pick(3)];
    const int64_t rows = in.shape()[0], cols = std::min<int64_t>(in.shape()[1], 64);
    const int64_t row = range(0, rows - 1);
    isa::Register r = isa::register_alloc(row);
    line(fmt::format("isa::Register r{} = isa::register_alloc({});", regs_, row));
    Tile& t = alloc(1, cols, in.dtype(), Buffer::sbuf);
    isa::dma_copy(t.t, in.ap({{in.shape()[1], 1}, {1, cols}}, ApOptions{.scalar_offset_register = r.id}));
    line(fmt::format("isa::dma_copy({}, {}.ap({{{{{}, 1}}, {{1, {}}}}}, ApOptions{{.scalar_offset_register = r{}.id}}));",
                     t.name, name, in.shape()[1], cols, regs_));
    t.initialized = true;
    note("runtime_offset_register");
    Tile& holder = alloc(1, 1, DType::int32, Buffer::sbuf);
    isa::register_store(holder.t, r);
    line(fmt::format("isa::register_store({}, r{});", holder.name, regs_++));
    holder.initialized = true;
    note("register_store");
    Tile& t2 = alloc(1, cols, in.dtype(), Buffer::sbuf);
    isa::dma_copy(t2.t, in.ap({{in.shape()[1], 1}, {1, cols}}, ApOptions{.scalar_offset_tensor = holder.t}));
    line(fmt::format("isa::dma_copy({}, {}.ap({{{{{}, 1}}, {{1, {}}}}}, ApOptions{{.scalar_offset_tensor = {}}}));",
                     t2.name, name, in.shape()[1], cols, holder.name));
    t2.initialized = true;
    note("runtime_offset_tensor");
    // the stored value back into another register, moved once more, as a loop-free offset
    isa::Register loaded = isa::register_alloc();
    isa::register_load(loaded, holder.t);
    isa::Register moved = isa::register_alloc();
    isa::register_move(moved, loaded);
    const int n = regs_++;
    line(fmt::format("isa::Register loaded{} = isa::register_alloc(); isa::register_load(loaded{}, {});", n, n,
                     holder.name));
    line(fmt::format("isa::Register moved{} = isa::register_alloc(); isa::register_move(moved{}, loaded{});", n, n, n));
    Tile& t3 = alloc(1, cols, in.dtype(), Buffer::sbuf);
    isa::dma_copy(t3.t, in.ap({{in.shape()[1], 1}, {1, cols}}, ApOptions{.scalar_offset_register = moved.id}));
    line(fmt::format("isa::dma_copy({}, {}.ap({{{{{}, 1}}, {{1, {}}}}}, ApOptions{{.scalar_offset_register = moved{}.id}}));",
                     t3.name, name, in.shape()[1], cols, n));
    t3.initialized = true;
    note("register_load_move");
    // a gather: one row of in0 per partition, chosen by the index input
    auto& [idx_in, idx_name] = inputs_[3];
    const int64_t p = partitions();
    Tile& idx = alloc(p, 1, DType::int32, Buffer::sbuf);
    isa::dma_copy(idx.t, idx_in(Slice{0, p}, Slice{0, 1}));
    line(fmt::format("isa::dma_copy({}, {}(Slice{{0, {}}}, Slice{{0, 1}}));", idx.name, idx_name, p));
    idx.initialized = true;
    auto& [table, table_name] = inputs_[0];
    const int64_t tcols = table.shape()[1];
    Tile& g = alloc(p, tcols, table.dtype(), Buffer::sbuf);
    isa::dma_copy(g.t, table.ap({{tcols, p}, {1, tcols}}, ApOptions{.vector_offset = idx.t}));
    line(fmt::format("isa::dma_copy({}, {}.ap({{{{{}, {}}}, {{1, {}}}}}, ApOptions{{.vector_offset = {}}}));", g.name,
                     table_name, tcols, p, tcols, idx.name));
    g.initialized = true;
    note("dma_gather");
  }

  /** A device loop accumulating the rows of an input read at the loop counter. */
  /** A device loop whose body reads the input row at the counter and folds it into state kept
   * across iterations: an SBUF tile, the Scalar engine's accumulator (activation with
   * reduce_cmd=reduce into reduce_res) or a PSUM tile (automatic matmul accumulation). */
  void loop() {
    auto& [in, name] = inputs_[pick(3)];
    const int64_t rows = in.shape()[0], cols = std::min<int64_t>(in.shape()[1], 128);
    const int kind = int(pick(3));
    const int64_t m = range(1, 8);
    Tile& state = kind == 0 ? alloc(1, cols, DType::float32, Buffer::sbuf)
                  : kind == 1 ? alloc(1, 1, DType::float32, Buffer::sbuf)
                              : alloc(m, cols, DType::float32, Buffer::psum);
    Tile* ones = nullptr;
    if (kind == 0) {
      isa::memset(state.t, 0.0);
      line(fmt::format("isa::memset({}, 0.0);", state.name));
    } else if (kind == 1) {  // reset partition 0's accumulator first
      Tile& zero = alloc(1, 1, DType::float32, Buffer::sbuf);
      isa::memset(zero.t, 0.0);
      isa::activation(zero.t, nl::copy, zero.t,
                      {.reduce_op = nl::add, .reduce_res = state.t, .reduce_cmd = ReduceCmd::reset});
      line(fmt::format("isa::memset({0}, 0.0); isa::activation({0}, nl::copy, {0}, {{.reduce_op = nl::add, "
                       ".reduce_res = {1}, .reduce_cmd = ReduceCmd::reset}});",
                       zero.name, state.name));
    } else {
      ones = &alloc(1, m, DType::float32, Buffer::sbuf);
      isa::memset(ones->t, 1.0);
      line(fmt::format("isa::memset({}, 1.0);", ones->name));
    }
    const int64_t lo = range(0, rows - 1), hi = range(lo, std::min<int64_t>(rows, lo + 6)), step = range(1, 2);
    const bool reg_bound = chance(0.4);
    isa::RegisterOrInt upper = hi;
    if (reg_bound) {
      upper = isa::register_alloc(hi);
      line(fmt::format("isa::Register bound{} = isa::register_alloc({});", regs_, hi));
      note("loop_register_bound");
    }
    const int64_t stride = in.shape()[1];
    const DType d = in.dtype();
    std::vector<std::string> body = {
        fmt::format("Tensor row = nl::ndarray({{1, {}}}, nl::{}, nl::sbuf);", cols, dtype_code(d)),
        fmt::format("isa::dma_copy(row, {}.ap({{{{{}, 1}}, {{1, {}}}}}, ApOptions{{.scalar_offset_register = i.id}}));",
                    name, stride, cols)};
    nl::fori_loop(lo, upper, [&](isa::Register i) {
      Tensor row = nl::ndarray({1, cols}, d, Buffer::sbuf);
      isa::dma_copy(row, in.ap({{stride, 1}, {1, cols}}, ApOptions{.scalar_offset_register = i.id}));
      if (kind == 0) {
        isa::tensor_tensor(state.t, state.t, row, nl::add);
        body.push_back(fmt::format("isa::tensor_tensor({0}, {0}, row, nl::add);", state.name));
      } else if (kind == 1) {
        Tensor out = nl::ndarray({1, cols}, DType::float32, Buffer::sbuf);
        isa::activation(out, nl::copy, row,
                        {.reduce_op = nl::add, .reduce_res = state.t, .reduce_cmd = ReduceCmd::reduce});
        body.push_back(fmt::format("Tensor out = nl::ndarray({{1, {}}}, nl::float32, nl::sbuf);", cols));
        body.push_back(fmt::format("isa::activation(out, nl::copy, row, {{.reduce_op = nl::add, .reduce_res = {}, "
                                   ".reduce_cmd = ReduceCmd::reduce}});",
                                   state.name));
      } else {  // float32 rows pair with the float32 ones tile; other dtypes go through a copy
        Tensor mv = row;
        if (d != DType::float32) {
          mv = nl::ndarray({1, cols}, DType::float32, Buffer::sbuf);
          isa::tensor_copy(mv, row);
          body.push_back(fmt::format("Tensor mv = nl::ndarray({{1, {}}}, nl::float32, nl::sbuf); "
                                     "isa::tensor_copy(mv, row);", cols));
        }
        isa::nc_matmul(state.t, ones->t, mv);
        body.push_back(fmt::format("isa::nc_matmul({}, {}, {});", state.name, ones->name,
                                   d != DType::float32 ? "mv" : "row"));
      }
    }, step);
    line(fmt::format("nl::fori_loop({}, {}, [&](isa::Register i) {{", lo,
                     reg_bound ? fmt::format("bound{}", regs_++) : std::to_string(hi)));
    for (const std::string& l : body) line("  " + l);
    line(fmt::format("}}, {});", step));
    state.initialized = kind != 2 || hi > lo;  // a PSUM state no iteration wrote holds the sentinel
    static const char* kinds[] = {"loop_sbuf", "loop_activation_accumulator", "loop_psum_matmul"};
    note(kinds[kind]);
  }

  // --- faults ---------------------------------------------------------------------------------
  /** Records the faulty call's source, then makes it at one line of this file: the KernelError
   * must contain `pattern` and point at that line. */
  void faulty(std::string code, const char* pattern, const char* what, const std::function<void(const Loc&)>& call) {
    line(std::move(code));
    expect(Fault{pattern, __LINE__ + 1, what});
    call(Loc::current());
  }

  void expect(Fault f) {
    std::string feature = "fault:" + f.what;
    std::replace(feature.begin(), feature.end(), ' ', '_');
    note(feature);
    fault_ = std::move(f);
  }

  void inject_fault() {
    const int64_t pmax = t_->num_partitions;
    switch (pick(10)) {
      case 0: {
        Tile& t = alloc(pmax + 1, 8, DType::float32, Buffer::sbuf);  // reported at its allocation or use
        isa::memset(t.t, 0.0);
        line(fmt::format("isa::memset({}, 0.0);  // {} partitions", t.name, pmax + 1));
        expect(Fault{"exceeds the architecture limit", 0, "partition dim over pmax"});
        break;
      }
      case 1: case 2: case 3: {
        // matmul: dst in SBUF, moving of an integer dtype, or an output across a PSUM bank
        const int64_t bank = t_->psum_bank_fp32_elems(), n = bank / 2;
        const int kind = int(pick(3));
        View st = source(16, 8, {DType::bfloat16}, true);
        View mv = source(16, n, {kind == 1 ? DType::int8 : DType::bfloat16}, true);
        Tile& d = alloc(8, kind == 2 ? 2 * bank : n, DType::float32, kind == 0 ? Buffer::sbuf : Buffer::psum);
        const int64_t f0 = kind == 2 ? bank - 4 : 0;
        static const char* patterns[] = {"must be in PSUM", "has dtype int8", "crossing a PSUM bank"};
        static const char* whats[] = {"matmul dst in SBUF", "matmul operand dtype", "matmul output across a PSUM bank"};
        faulty(fmt::format("isa::nc_matmul({}(Slice{{0, 8}}, Slice{{{}, {}}}), {}, {});", d.name, f0, f0 + n, st.expr,
                           mv.expr),
               patterns[kind], whats[kind],
               [&](const Loc& loc) { isa::nc_matmul(d.t(Slice{0, 8}, Slice{f0, f0 + n}, loc), st.t, mv.t, {}, loc); });
        break;
      }
      case 4: {
        Tile& t = load(4, 4, DType::float32);
        auto& [in, name] = inputs_[0];
        faulty(fmt::format("isa::dma_copy({}(Slice{{0, 1}}, Slice{{0, 1}}), {}(Slice{{0, 1}}, Slice{{0, 1}}));", name,
                           t.name),
               "cannot write to kernel input", "write to an input",
               [&](const Loc& loc) { isa::dma_copy(in(Slice{0, 1}, Slice{0, 1}), t.t(Slice{0, 1}, Slice{0, 1}), loc); });
        break;
      }
      case 5: {
        View a = source(8, 16);
        View b = source(8, 15);
        Tile& d = alloc(8, 16, DType::float32, Buffer::sbuf);
        faulty(fmt::format("isa::tensor_tensor({}, {}, {}, nl::add);", d.name, a.expr, b.expr),
               "elements per partition mismatch", "operand free sizes differ",
               [&](const Loc& loc) { isa::tensor_tensor(d.t, a.t, b.t, nl::add, Engine::unknown, loc); });
        break;
      }
      case 6: {
        Tile& t = load(4, 8, DType::float32);
        faulty(fmt::format("{}(Slice{{0, 4}}, Slice{{0, 9}});", t.name), "out-of-bound", "slice past the end",
               [&](const Loc& loc) { (void)t.t(Slice{0, 4}, Slice{0, 9}, loc); });
        break;
      }
      case 7: case 8: {
        // a row of an input at a register offset: past the end, or never set
        const bool set = pick(2) == 0;
        auto& [in, name] = inputs_[1];
        const int64_t cols = in.shape()[1];
        isa::Register r = set ? isa::register_alloc(in.shape()[0]) : isa::register_alloc();
        line(set ? fmt::format("isa::Register r = isa::register_alloc({});", in.shape()[0])
                 : std::string("isa::Register r = isa::register_alloc();"));
        Tile& t = alloc(1, cols, in.dtype(), Buffer::sbuf);
        faulty(fmt::format("isa::dma_copy({}, {}.ap({{{{{}, 1}}, {{1, {}}}}}, ApOptions{{.scalar_offset_register = r.id}}));",
                           t.name, name, cols, cols),
               set ? "runtime offset out of bounds" : "never set",
               set ? "register offset past the end" : "read of a register never set", [&](const Loc& loc) {
                 isa::dma_copy(t.t, in.ap({{cols, 1}, {1, cols}}, ApOptions{.scalar_offset_register = r.id}, loc), loc);
               });
        break;
      }
      default: {
        View a = source(16, 8, {DType::float32}, true);
        Tile& ps = alloc(16, 8, DType::float32, Buffer::psum);
        isa::tensor_copy(ps.t, a.t);
        line(fmt::format("isa::tensor_copy({}, {});", ps.name, a.expr));
        Tile& d = alloc(16, 8, DType::float32, Buffer::sbuf);
        faulty(fmt::format("isa::tensor_tensor({}, {}, {}, nl::add, isa::gpsimd_engine);", d.name, ps.name, a.expr),
               "GpSimd engine cannot access", "GpSimd reading PSUM",
               [&](const Loc& loc) { isa::tensor_tensor(d.t, ps.t, a.t, nl::add, Engine::gpsimd, loc); });
        break;
      }
    }
  }

  std::mt19937_64 rng_;
  uint64_t seed_;
  TargetId target_;
  const TargetConfig* t_;
  bool invalid_;
  std::vector<std::pair<Tensor, std::string>> inputs_;
  std::deque<Tile> tiles_;  // a deque: views and steps keep references to tiles while more are added
  std::vector<std::string> code_;
  std::vector<std::string> features_;
  std::optional<Fault> fault_;
  int64_t psum_banks_ = 0;
  int64_t sbuf_bytes_ = 0;  // bytes per partition of every SBUF tile allocated so far
  int outs_ = 0;
  int regs_ = 0;
};

struct Outcome {
  bool ok = true;
  std::string kind;
  std::string detail;
};

std::string reproducer(uint64_t seed, const Gen& g, const std::vector<TensorSpec>& specs) {
  std::string s = fmt::format("// nikki_fuzz seed {0}: the kernel as C++ DSL code; `nikki_fuzz --seed {0} --cases 1`\n"
                              "// runs it again with the same inputs.\n",
                              seed);
  s += "Kernel kernel = nikki::trace_specs({.target = TargetId::" +
       std::string(g.target() == TargetId::trn1 ? "trn1" : "trn2") + "}, \"fuzz\", {";
  for (size_t i = 0; i < specs.size(); ++i)
    s += fmt::format("{}spec({}, nl::{}, \"{}\")", i ? ", " : "", shape_code(specs[i].shape),
                     dtype_code(specs[i].dtype), specs[i].name);
  s += "},\n    [&](const std::vector<Tensor>& in) {\n";
  for (const std::string& l : g.code()) s += "      " + l + "\n";
  std::string outs;
  for (int i = 0; i < g.outputs(); ++i) outs += fmt::format("{}out{}", i ? ", " : "", i);
  s += "      return std::vector<Tensor>{" + outs + "};\n    });\n";
  if (g.fault()) s += fmt::format("// expected: KernelError containing \"{}\" ({})\n", g.fault()->pattern,
                                  g.fault()->what);
  return s;
}

bool is_driver_file(const SourceLocation& loc) {
  const std::string_view f = loc.file;
  return f.size() >= std::strlen("fuzz_driver.cpp") && f.substr(f.size() - std::strlen("fuzz_driver.cpp")) ==
                                                             "fuzz_driver.cpp";
}

/** Judges a KernelError against the fault the kernel carries. */
Outcome judge_error(const KernelError& e, const Gen& g, const char* stage) {
  if (!g.fault())
    return {false, "unexpected_error", fmt::format("a valid kernel raised KernelError while {}:\n{}", stage, e.what())};
  const Fault& f = *g.fault();
  if (e.summary().empty()) return {false, "wrong_error", "KernelError with an empty message"};
  if (!is_driver_file(e.location()) || e.location().line == 0)
    return {false, "wrong_error", fmt::format("KernelError not located at a user line ({}):\n{}", e.location().str(),
                                              e.what())};
  if (f.line && e.location().line != f.line)
    return {false, "wrong_error", fmt::format("KernelError at line {}, the faulty call is at line {} ({}):\n{}",
                                              e.location().line, f.line, f.what, e.what())};
  if (std::string(e.what()).find(f.pattern) == std::string::npos)
    return {false, "wrong_error", fmt::format("KernelError does not mention \"{}\" ({}):\n{}", f.pattern, f.what,
                                              e.what())};
  return {};
}

std::string first_difference(const HostTensor& a, const HostTensor& b) {
  const size_t es = dtype_size(a.dtype);
  for (size_t i = 0; i * es < a.bytes.size(); ++i)
    if (std::memcmp(a.bytes.data() + i * es, b.bytes.data() + i * es, es) != 0)
      return fmt::format("element {}: {} vs {}", i, numerics::load_float(a.dtype, a.bytes.data() + i * es),
                         numerics::load_float(b.dtype, b.bytes.data() + i * es));
  return "sizes differ";
}

Outcome run_case(uint64_t seed, bool print_only, std::vector<std::string>& features, bool& invalid) {
  Gen g(seed);
  invalid = g.invalid();
  const std::vector<TensorSpec> specs = g.input_specs();
  std::vector<HostTensor> inputs = g.input_data(specs);
  Kernel kernel;
  try {
    kernel = trace_specs(TraceOptions{.target = g.target()}, fmt::format("fuzz{}", seed), specs,
                         [&](const std::vector<Tensor>& in) { return g.body(in); });
  } catch (const KernelError& e) {
    features = g.features();
    if (print_only) std::fputs(reproducer(seed, g, specs).c_str(), stdout);
    Outcome o = judge_error(e, g, "tracing");
    return o;
  }
  features = g.features();
  if (print_only) {
    std::fputs(reproducer(seed, g, specs).c_str(), stdout);
    return {};
  }
  jit::Program program;
  try {
    // every case is a new kernel: the disk cache would only fill up
    program = jit::compile(std::move(kernel), jit::CompileOptions{.native = true, .disk_cache = false});
  } catch (const KernelError& e) {
    return judge_error(e, g, "compiling");
  }
  const Kernel& k = program.kernel();
  auto fresh_outputs = [&] {
    std::vector<HostTensor> outs;
    for (StorageId id : k.outputs) {
      const Storage& s = k.storage(id);
      outs.push_back({s.dtype, s.shape, std::vector<uint8_t>(s.total_bytes())});
    }
    return outs;
  };
  struct Config {
    std::string name;
    std::function<void(std::vector<void*>&, std::vector<void*>&)> run;
  };
  std::mt19937_64 order_rng(seed ^ 0xF00D);
  const uint64_t s1 = order_rng(), s2 = order_rng(), s3 = order_rng();
  auto streams = [&](runtime::ExecutorKind kind, runtime::StreamOrder order, uint64_t s) {
    return [&program, kind, order, s](std::vector<void*>& in, std::vector<void*>& out) {
      runtime::StreamExecutor exec(program.device, kind, program.native, order, s);
      exec.run(in, out);
    };
  };
  using runtime::ExecutorKind;
  using runtime::StreamOrder;
  std::vector<Config> configs = {
      {"interpreter, program order", [&](auto& in, auto& out) { runtime::Interpreter(k).run(in, out); }},
      {"streams interp latest", streams(ExecutorKind::interp, StreamOrder::latest_first, 1)},
      {"streams native latest", streams(ExecutorKind::native, StreamOrder::latest_first, 1)},
      {"streams native earliest", streams(ExecutorKind::native, StreamOrder::earliest_first, 1)},
      {fmt::format("streams native random:{}", s1), streams(ExecutorKind::native, StreamOrder::random, s1)},
      {fmt::format("streams native random:{}", s2), streams(ExecutorKind::native, StreamOrder::random, s2)},
      {fmt::format("streams interp random:{}", s3), streams(ExecutorKind::interp, StreamOrder::random, s3)},
  };
  if (invalid) configs.resize(3);
  std::vector<HostTensor> reference;
  for (const Config& c : configs) {
    std::vector<HostTensor> in_copy = inputs;
    std::vector<HostTensor> outs = fresh_outputs();
    std::vector<void*> in_ptrs, out_ptrs;
    for (HostTensor& h : in_copy) in_ptrs.push_back(h.bytes.data());
    for (HostTensor& h : outs) out_ptrs.push_back(h.bytes.data());
    try {
      c.run(in_ptrs, out_ptrs);
    } catch (const KernelError& e) {
      Outcome o = judge_error(e, g, ("running (" + c.name + ")").c_str());
      if (!o.ok) return o;
      continue;
    }
    if (invalid)
      return {false, "missing_error", fmt::format("{}: the kernel ran, but it breaks a hardware rule ({}: expected "
                                                  "KernelError containing \"{}\")",
                                                  c.name, g.fault()->what, g.fault()->pattern)};
    for (size_t i = 0; i < inputs.size(); ++i)
      if (in_copy[i].bytes != inputs[i].bytes)
        return {false, "input_modified", fmt::format("{}: input {} was modified", c.name, i)};
    if (reference.empty()) {
      reference = std::move(outs);
      continue;
    }
    for (size_t i = 0; i < outs.size(); ++i)
      if (outs[i].bytes != reference[i].bytes)
        return {false, "mismatch", fmt::format("output {} differs between {} and {}: {}", i, configs[0].name, c.name,
                                               first_difference(reference[i], outs[i]))};
  }
  return {};
}

/** The harness's own tests: NIKKI_FUZZ_SABOTAGE=crash:<seed> (or hang:<seed>) makes this process
 * die (or never answer) at that seed, as a nikki bug could. */
void sabotage(uint64_t seed) {
  const char* env = std::getenv("NIKKI_FUZZ_SABOTAGE");
  if (!env) return;
  const std::string how = env, at = ":" + std::to_string(seed);
  if (how.size() < at.size() || how.compare(how.size() - at.size(), at.size(), at) != 0) return;
  if (how.starts_with("crash")) std::raise(SIGSEGV);
  if (how.starts_with("hang")) {  // spinning, as an executor that never finishes would
    std::atomic<uint64_t> spin{0};
    for (;;) spin.fetch_add(1, std::memory_order_relaxed);
  }
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t seed = 0;
  int64_t cases = 1;
  bool print_only = false;
  for (int i = 1; i < argc; ++i) {
    std::string_view a = argv[i];
    if (a == "--seed" && i + 1 < argc) seed = std::strtoull(argv[++i], nullptr, 10);
    else if (a == "--cases" && i + 1 < argc) cases = std::strtoll(argv[++i], nullptr, 10);
    else if (a == "--print") print_only = true;
    else {
      std::fprintf(stderr, "usage: nikki_fuzz [--seed S] [--cases N] [--print]\n");
      return 2;
    }
  }
  if (print_only) {
    std::vector<std::string> features;
    bool invalid = false;
    run_case(seed, true, features, invalid);
    return 0;
  }
  int failed = 0;
  for (int64_t c = 0; c < cases; ++c) {
    const uint64_t s = seed + uint64_t(c);
    std::printf("case %llu begin %s\n", static_cast<unsigned long long>(s), invalid_seed(s) ? "invalid" : "valid");
    std::fflush(stdout);
    sabotage(s);
    std::vector<std::string> features;
    bool invalid = false;
    Outcome o;
    try {
      o = run_case(s, false, features, invalid);
    } catch (const std::exception& e) {
      o = {false, "other_exception", e.what()};
    }
    std::string feats;
    for (const std::string& f : features) feats += " feature=" + f;
    if (o.ok) {
      std::printf("case %llu ok %s%s\n", static_cast<unsigned long long>(s), invalid ? "invalid" : "valid",
                  feats.c_str());
    } else {
      ++failed;
      // the detail first: the harness reports the lines a case printed up to its verdict
      std::printf("%s\ncase %llu FAIL %s %s%s\n", o.detail.c_str(), static_cast<unsigned long long>(s),
                  o.kind.c_str(), invalid ? "invalid" : "valid", feats.c_str());
    }
    std::fflush(stdout);
  }
  return failed ? 1 : 0;
}
