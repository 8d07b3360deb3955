// KernelBuilder: the one way IR gets built, by the C++ DSL and by the Python tracer alike.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <iterator>
#include <optional>
#include <source_location>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "nikki/ir_attributes.hpp"

namespace nikki {

/**
 * @brief The default of max_instructions(): nikki keeps every traced instruction in memory, about
 * 2 KiB each in the IR and 4 KiB once compiled, so 2^20
 * instructions take about 4 GiB. A 16384^3 bf16 library matmul traces into about 600000.
 */
inline constexpr int64_t kDefaultMaxInstructions = int64_t(1) << 20;

/**
 * @brief The most instructions one kernel, or all program instances of one SPMD launch together,
 * may trace into: NIKKI_MAX_INSTRUCTIONS when it is a positive integer, else
 * kDefaultMaxInstructions. A kernel that unrolls past it fails at once instead of exhausting memory.
 */
inline int64_t max_instructions() {
  if (const char* env = std::getenv("NIKKI_MAX_INSTRUCTIONS"); env && *env) {
    char* end = nullptr;
    const long long v = std::strtoll(env, &end, 10);
    if (*end == '\0' && v > 0) return v;
  }
  return kDefaultMaxInstructions;
}

/** @brief The limit max_instructions() enforces, as error messages state it. */
inline std::string instruction_limit_text(int64_t limit) {
  return fmt::format("at most {} instructions per kernel launch (NIKKI_MAX_INSTRUCTIONS): nikki keeps every traced "
                     "instruction in memory, about 4 KiB each once compiled",
                     limit);
}

/** @brief SPMD launch context of one traced program instance (kernel[g0, g1](...)). */
struct ProgramGrid {
  std::vector<int64_t> dims;         // grid extents; empty = no grid (one instance)
  std::vector<int64_t> program_ids;  // this instance's coordinates, one per grid dim
};

/**
 * @brief Accumulates a Kernel: storages, registers, instructions with interned source locations.
 *
 * The builder checks only what it needs to build well-formed IR (operands belong to this
 * kernel, slot kinds match the opcode); hardware rules are the verifier's job (jit/verify).
 */
class KernelBuilder {
 public:
  explicit KernelBuilder(std::string name, TargetId target = default_target(), ProgramGrid grid = {})
      : grid_(std::move(grid)), max_instructions_(max_instructions()) {
    kernel_.name = std::move(name);
    kernel_.target = target;
    kernel_.locations.emplace_back();  // LocId 0: unknown
  }
  KernelBuilder(const KernelBuilder&) = delete;
  KernelBuilder& operator=(const KernelBuilder&) = delete;

  const TargetConfig& config() const { return target_config(kernel_.target); }
  TargetId target() const { return kernel_.target; }
  const ProgramGrid& grid() const { return grid_; }
  const Kernel& kernel() const { return kernel_; }

  /** @brief Interns a C++ call site. Cheap: keyed by the file-name pointer, line and column. */
  LocId location(const std::source_location& loc) {
    CppKey key{loc.file_name(), loc.line(), loc.column()};
    auto it = cpp_locations_.find(key);
    if (it != cpp_locations_.end()) return it->second;
    LocId id = location(SourceLocation::from(loc));
    cpp_locations_.emplace(key, id);
    return id;
  }
  /** @brief Interns a source location given by value (the Python tracer's frames). */
  LocId location(const SourceLocation& loc) {
    std::string key = fmt::format("{}\n{}\n{}", loc.file, loc.line, loc.column);
    auto it = locations_.find(key);
    if (it != locations_.end()) return it->second;
    LocId id = static_cast<LocId>(kernel_.locations.size());
    kernel_.locations.push_back(loc);
    locations_.emplace(std::move(key), id);
    return id;
  }
  const SourceLocation& source(LocId id) const { return kernel_.location(id); }

  /**
   * @brief Adds a storage; names are made unique ("x", "x_1", ...) so the text form is
   * unambiguous. Throws KernelError for a shape no tensor can have: a negative extent, an empty
   * dim in anything but a kernel input, or more bytes than an int64 counts (every size computed
   * from the storage later is then exact).
   */
  StorageId add_storage(std::string_view name, Buffer buffer, DType dtype, const Shape& shape,
                        StorageRole role, LocId loc, std::optional<Address> address = std::nullopt) {
    check_storage_shape(name, dtype, shape, role, loc);
    Storage s;
    s.name = unique_name(name.empty() ? std::string_view("t") : name);
    s.buffer = buffer;
    s.dtype = dtype;
    s.shape = shape;
    s.role = role;
    s.loc = loc;
    s.address = address;
    s.user_address = address.has_value();
    s.defined_at = static_cast<uint32_t>(kernel_.instructions.size());
    auto id = static_cast<StorageId>(kernel_.storages.size());
    kernel_.storages.push_back(std::move(s));
    if (role == StorageRole::input) kernel_.inputs.push_back(id);
    return id;
  }
  Storage& storage(StorageId id) { return kernel_.storages.at(id); }
  const Storage& storage(StorageId id) const { return kernel_.storages.at(id); }

  RegisterId new_register() { return kernel_.num_registers++; }

  /** @brief Instruction `index` of the kernel so far, for rewriting (bounds-checked). */
  Instruction& instruction(size_t index) { return kernel_.instructions.at(index); }
  /** @brief The kernel so far, for a front end that sets attributes generically (ir_attributes.hpp). */
  Kernel& kernel_for_update() { return kernel_; }
  /** @brief A tensor operand of this kernel for `view` (see Kernel::tensor_operand). */
  Operand operand(const AccessPattern& view) { return kernel_.tensor_operand(view); }
  /** @brief The rare attributes of an instruction being built for this kernel, for writing. */
  RareAttributes& rare(Instruction& inst) { return kernel_.mutable_rare(inst); }
  /** @brief Gives an instruction being built for this kernel its user name (nisa name=). */
  void set_name(Instruction& inst, std::string_view name) { kernel_.set_instruction_name(inst, name); }

  /** @brief Appends an instruction after checking its operands fit the opcode's slots. */
  Instruction& append(const Instruction& inst) {
    return append_in_place([&](Instruction& slot) { slot = inst; });
  }

  /**
   * @brief Appends an instruction that `fill` writes in place, then checks it like append. Front
   * ends that emit one per traced call save building a temporary and copying it.
   */
  template <class Fill>
  Instruction& append_in_place(Fill&& fill) {
    if (int64_t(kernel_.instructions.size()) >= max_instructions_) {
      // Checked before the array grows (it would double); the probe only names the user's line.
      Instruction probe;
      fill(probe);
      throw KernelError(fmt::format("kernel '{}' unrolls into more than {} instructions", kernel_.name,
                                    max_instructions_),
                        source(probe.loc), std::string(opcode_name(probe.opcode)),
                        instruction_limit_text(max_instructions_),
                        "trace a smaller problem (estimated times grow with the number of tiles), or loop at run "
                        "time (nl.fori_loop, nl.dynamic_range), which traces the loop body once");
    }
    Instruction& inst = kernel_.instructions.emplace_back();
    try {
      fill(inst);
      check_slots(inst);
    } catch (...) {
      kernel_.instructions.pop_back();
      throw;
    }
    if (inst.engine == Engine::unknown) inst.engine = default_engine(inst);
    return inst;
  }

  /**
   * @brief Internal check that an instruction's operands fit its opcode's slots and that it sets
   * no attribute its opcode does not use.
   */
  void check_slots(const Instruction& inst) const {
    const OpcodeSpec& spec = inst.spec();
    for (int s = 0; s < kMaxSlots; ++s) {
      const Operand& o = inst.operands[s];
      if (s >= spec.num_slots) {
        internal_check(o.is_none(), "operand given for a slot the opcode does not have");
        continue;
      }
      const SlotSpec& slot = spec.slots[s];
      if (o.is_none()) {
        internal_check(slot.optional, "required operand slot left empty");
        continue;
      }
      uint8_t kind = o.is_tensor() ? kTensor : o.is_imm() ? kImm : kReg;
      internal_check((slot.kinds & kind) != 0, "operand kind not allowed in this slot");
      if (o.is_tensor())
        internal_check(o.storage() < kernel_.storages.size(), "operand names a storage of another kernel");
    }
    internal_check(!unused_attribute_set(kernel_, inst), "an instruction sets an attribute its opcode does not use");
  }

  /**
   * @brief NKI's engine for an instruction that names none: the opcode's, except that tensor_tensor
   * runs power, and arithmetic on all-32-bit-integer tiles, on GpSimd (exact integer arithmetic
   * there) unless a tile is in PSUM, which GpSimd cannot read; and nc_transpose into PSUM is the
   * Tensor engine's, elsewhere the Vector engine's.
   */
  Engine default_engine(const Instruction& inst) const {
    auto in_psum = [&](int slot) {
      const Operand& o = inst.operands[slot];
      return o.is_tensor() && storage(o.storage()).buffer == Buffer::psum;
    };
    if (inst.opcode == Opcode::tensor_tensor) {
      bool int32 = true;
      for (int slot = 0; slot < 3; ++slot) {
        const DType t = inst.operands[slot].dtype();
        int32 = int32 && (t == DType::int32 || t == DType::uint32) && !in_psum(slot);
      }
      const AluOp op = inst.attrs.op0;
      if (op == AluOp::power || (int32 && !is_bitvec_op(op))) return Engine::gpsimd;
    }
    if (inst.opcode == Opcode::nc_transpose) return in_psum(0) ? Engine::tensor : Engine::vector;
    return inst.spec().default_engine;
  }

  /** @brief Instructions appended so far: a mark for take_instructions_since. */
  size_t num_instructions() const { return kernel_.instructions.size(); }

  /**
   * @brief Removes and returns the instructions appended after `mark`. Trace-time schedulers
   * record a piece of work this way, then append() its instructions in the order they choose.
   * Loop markers (which point at each other by index) cannot be taken.
   */
  std::vector<Instruction> take_instructions_since(size_t mark) {
    internal_check(mark <= kernel_.instructions.size(), "take_instructions_since: mark past the end");
    std::vector<Instruction> taken(std::make_move_iterator(kernel_.instructions.begin() + std::ptrdiff_t(mark)),
                                   std::make_move_iterator(kernel_.instructions.end()));
    kernel_.instructions.resize(mark);
    for (const Instruction& inst : taken)
      internal_check(inst.opcode != Opcode::loop_begin && inst.opcode != Opcode::loop_end,
                     "take_instructions_since: a runtime loop cannot be moved");
    return taken;
  }

  /** @brief Points a loop marker at its partner (loop_begin -> loop_end and back). */
  void set_jump(int32_t index, int32_t target) { kernel_.mutable_rare(kernel_.instructions.at(index)).jump = target; }

  /**
   * @brief Whether nl.affine_range loops are recorded in Kernel::parallel_loops (for the
   * sanitizer). Off by default: the loop calls below then return at once.
   */
  void record_parallel_loops(bool on) { record_loops_ = on; }
  bool records_parallel_loops() const { return record_loops_; }

  /** @brief Opens a parallel loop at `loc` inside the innermost open one; -1 when not recording. */
  int32_t open_parallel_loop(LocId loc, int64_t start, int64_t step) {
    if (!record_loops_) return -1;
    ParallelLoop loop;
    loop.loc = loc;
    loop.parent = open_loops_.empty() ? -1 : open_loops_.back();
    loop.start = start;
    loop.step = step;
    const auto id = static_cast<int32_t>(kernel_.parallel_loops.size());
    kernel_.parallel_loops.push_back(std::move(loop));
    open_loops_.push_back(id);
    return id;
  }
  /** @brief The next iteration of `loop` begins with the next instruction appended. */
  void begin_iteration(int32_t loop) {
    if (loop < 0) return;
    kernel_.parallel_loops.at(loop).iteration_begin.push_back(static_cast<uint32_t>(kernel_.instructions.size()));
  }
  /** @brief Ends `loop` (and any loop opened inside it and left open, e.g. by a `break`). */
  void close_parallel_loop(int32_t loop) {
    if (std::find(open_loops_.begin(), open_loops_.end(), loop) == open_loops_.end()) return;  // closed
    for (int32_t innermost = -1; innermost != loop; open_loops_.pop_back()) {
      innermost = open_loops_.back();
      kernel_.parallel_loops[innermost].end = static_cast<uint32_t>(kernel_.instructions.size());
    }
  }

  /** @brief Marks a storage as a kernel output (in return order). */
  void add_output(StorageId id) { kernel_.outputs.push_back(id); }

  /** @brief Hands over the finished kernel; the builder is empty afterwards. */
  Kernel finish() {
    if (!open_loops_.empty()) close_parallel_loop(open_loops_.front());
    return std::move(kernel_);
  }

  /** @brief The builder of the kernel being traced on this thread, or null. */
  static KernelBuilder*& current_slot() {
    thread_local KernelBuilder* current = nullptr;
    return current;
  }
  /** @brief The builder of the kernel being traced; a KernelError if no kernel is being traced. */
  static KernelBuilder& current(const std::source_location& where) {
    KernelBuilder* b = current_slot();
    if (!b)
      throw KernelError("NKI API called outside of a kernel", SourceLocation::from(where), {}, {},
                        "call nl/isa functions only inside a function traced by nikki::trace "
                        "(or an @nki.jit kernel)");
    return *b;
  }

 private:
  struct CppKey {
    const char* file;
    uint32_t line;
    uint32_t column;
    bool operator==(const CppKey&) const = default;
  };
  struct CppKeyHash {
    size_t operator()(const CppKey& k) const {
      return std::hash<const void*>()(k.file) ^ (size_t(k.line) << 20) ^ k.column;
    }
  };

  void check_storage_shape(std::string_view name, DType dtype, const Shape& shape, StorageRole role, LocId loc) const {
    for (int64_t e : shape)
      if (e < 0 || (e == 0 && role != StorageRole::input))
        throw KernelError(fmt::format("tensor '{}' has shape {} with extent {}", name, shape.str(), e), source(loc),
                          role == StorageRole::input ? "input" : "ndarray",
                          role == StorageRole::input ? "input extents are >= 0" : "every extent must be >= 1",
                          "give the tensor a shape such as (128, 512)");
    if (!shape.checked_bytes(dtype_size(dtype)))
      throw KernelError(fmt::format("tensor '{}' of shape {} and dtype {} has more bytes than a 64-bit integer can "
                                    "count",
                                    name, shape.str(), dtype_name(dtype)),
                        source(loc), role == StorageRole::input ? "input" : "ndarray", size_limit_text(),
                        "use smaller extents; no NeuronCore memory holds a tensor this large");
  }

  /** "x", then "x_1", "x_2", ...: a counter per base name keeps this O(1) for tiles allocated in loops. */
  std::string unique_name(std::string_view base) {
    std::string name(base);
    int& next = next_suffix_[name];
    while (!names_.insert(name).second) name = fmt::format("{}_{}", base, ++next);
    return name;
  }

  Kernel kernel_;
  ProgramGrid grid_;
  int64_t max_instructions_;
  bool record_loops_ = false;
  std::vector<int32_t> open_loops_;  // parallel loops being traced, innermost last
  std::unordered_map<CppKey, LocId, CppKeyHash> cpp_locations_;
  std::unordered_map<std::string, LocId> locations_;
  std::unordered_set<std::string> names_;
  std::unordered_map<std::string, int> next_suffix_;
};

/** @brief Makes a builder the current one for the lifetime of the scope (nests). */
class BuilderScope {
 public:
  explicit BuilderScope(KernelBuilder& b) : previous_(KernelBuilder::current_slot()) {
    KernelBuilder::current_slot() = &b;
  }
  ~BuilderScope() { KernelBuilder::current_slot() = previous_; }
  BuilderScope(const BuilderScope&) = delete;
  BuilderScope& operator=(const BuilderScope&) = delete;

 private:
  KernelBuilder* previous_;
};

}  // namespace nikki
