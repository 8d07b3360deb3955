// The loop-dependency check of the sanitizer: for each recorded run of an nl.affine_range loop,
// the accesses of its instructions in program order go through a hazard tracker (the memory
// footprints the scheduler uses: tensors as partition x byte boxes, HBM tensors as rows x bytes),
// and every hazard between two different iterations is a candidate. Boxes are conservative, so a
// candidate is confirmed on the exact elements both views touch before it counts: iterations
// writing interleaved columns of one tensor are independent.
#include "nikki/jit/sanitize.hpp"

#include <algorithm>
#include <cstdlib>
#include <optional>
#include <string_view>
#include <unordered_set>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "nikki/hazards.hpp"
#include "nikki/ir_printer.hpp"
#include "nikki/jit/liveness.hpp"

namespace nikki::jit {

bool sanitize_from_env() {
  const char* env = std::getenv("NIKKI_SANITIZE");
  if (!env || !*env) return false;
  const std::string_view v(env);
  if (v == "1") return true;
  if (v == "0") return false;
  throw KernelError(fmt::format("NIKKI_SANITIZE={} is not 0 or 1", v), {}, {}, "NIKKI_SANITIZE is 0 (off) or 1 (on)",
                    "set NIKKI_SANITIZE=1 to sanitize kernels, or unset it");
}

namespace {

/**
 * An update NKI lets affine_range iterations share: an associative, commutative accumulation
 * into one tile (nc_matmul into PSUM; acc = acc op x on an engine). `slots` has bit s set when
 * operand slot s holds the accumulator, its old value or its new one.
 */
struct Accumulation {
  AluOp op = AluOp::bypass;  // bypass: not an accumulation
  uint8_t slots = 0;
  bool holds(int slot) const { return op != AluOp::bypass && slot >= 0 && ((slots >> slot) & 1); }
  bool joins(const Accumulation& other) const { return op != AluOp::bypass && op == other.op; }
};

Accumulation accumulation_of(const Kernel& k, const Instruction& inst) {
  const Attributes& at = inst.attrs;
  if (inst.opcode == Opcode::nc_matmul)
    return inst.access(0) == Access::read_write && !at.is_transpose ? Accumulation{AluOp::add, 0b1} : Accumulation{};
  // The combining operator and the operand slots that may hold the accumulator's old value:
  // acc - x accumulates -x, but x - acc is no accumulation of acc.
  AluOp op = AluOp::bypass;
  uint8_t inputs = 0;
  switch (inst.opcode) {
    case Opcode::tensor_tensor:  // data1 op data2
      op = at.op0;
      inputs = op == AluOp::subtract ? 0b010 : 0b110;
      break;
    case Opcode::tensor_scalar:  // data op0 operand0, with no second operator
      if (!inst.operands[3].is_none() && at.op1 != AluOp::bypass) return {};
      op = at.op0;
      inputs = op == AluOp::subtract && at.reverse0 ? 0 : 0b010;
      break;
    case Opcode::scalar_tensor_tensor:  // (data op0 operand0) op1 operand1: a multiply-accumulate
      op = at.op1;
      inputs = op == AluOp::subtract && !at.reverse1 ? 0 : 0b1000;
      break;
    default: return {};
  }
  if (!is_reduce_op(op) || !inputs) return {};
  if (op == AluOp::subtract) op = AluOp::add;
  const AccessPattern dst = k.view(inst, 0);
  // In place: the destination is the accumulator operand (acc += x).
  for (int slot = 1; slot < kMaxSlots; ++slot)
    if (((inputs >> slot) & 1) && inst.operands[slot].is_tensor() && same_static_view(dst, k.view(inst, slot)))
      return {op, uint8_t(1 | (1 << slot))};
  // Renamed: a new tensor takes the result (acc = nl.add(acc, x) makes a new acc each iteration).
  // A destination elsewhere in an operand's tensor is no accumulation (s[i] = s[i-1] + x[i]).
  for (int slot = 1; slot < kMaxSlots; ++slot)
    if (inst.operands[slot].is_tensor() && inst.operands[slot].storage() == dst.storage) return {};
  return {op, uint8_t(1 | inputs)};
}

using hazards::Region;

/** One memory access of an instruction. */
struct Use {
  AccessPattern ap;
  int slot;  // operand slot; -1 for the index tensor of a runtime offset
  bool write;
  Region region;  // its footprint, each tensor its own memory (the kernel need not be allocated)
};

/** The static accesses of an instruction (views with runtime offsets have no known address). */
std::vector<Use> uses_of(const Kernel& k, const Instruction& inst) {
  auto footprint = [&](const AccessPattern& ap) { return hazards::view_region(k, ap, hazards::Placement::storage); };
  std::vector<Use> uses;
  for (int slot = 0; slot < inst.spec().num_slots; ++slot) {
    const Operand& o = inst.operands[slot];
    if (!o.is_tensor()) continue;
    if (const Indirection* ind = k.indirection(o)) {
      for (const std::optional<AccessPattern>* index : {&ind->scalar_tensor, &ind->vector_offset})
        if (*index && !(*index)->is_dynamic()) uses.push_back({**index, -1, false, footprint(**index)});
      continue;
    }
    const Access access = inst.access(slot);
    const AccessPattern ap = k.view(o);
    const Region region = footprint(ap);
    if (access != Access::write) uses.push_back({ap, slot, false, region});
    if (access != Access::read) uses.push_back({ap, slot, true, region});
  }
  return uses;
}

/** Whether two static views of one storage share a byte: exact within a budget of element runs,
 * past it as their footprints say (yes, since the caller only asks when those overlap). */
bool share_bytes(const AccessPattern& a, const AccessPattern& b) {
  constexpr size_t kBudget = size_t(1) << 16;
  using Intervals = std::vector<std::pair<int64_t, int64_t>>;
  auto bytes = [&](const AccessPattern& ap, Intervals& out) {
    if (!element_intervals(ap, out, kBudget)) return false;
    const int64_t size = dtype_size(ap.dtype);
    for (auto& [first, last] : out) first *= size, last *= size;
    std::sort(out.begin(), out.end());
    return true;
  };
  Intervals x, y;
  if (!bytes(a, x) || !bytes(b, y)) return true;
  for (size_t i = 0, j = 0; i < x.size() && j < y.size();) {
    if (x[i].first < y[j].second && y[j].first < x[i].second) return true;
    if (x[i].second <= y[j].second) ++i;
    else ++j;
  }
  return false;
}

enum class Kind : uint8_t { reads, overwrites_written, overwrites_read, partial_read, partial_overwrite };

/** A dependency between iterations: `later` (iteration `later_iteration`) against `earlier`. */
struct Conflict {
  Kind kind;
  const ParallelLoop* loop;
  uint32_t earlier, later;
  size_t earlier_iteration, later_iteration;
  StorageId storage;
  /** True dependencies (a read of another iteration's value) come first in a report. */
  int rank() const { return kind == Kind::reads || kind == Kind::partial_read ? 0 : 1; }
};

/** A chain of accumulations into one tile that spans iterations: where another iteration joined. */
struct Carry {
  uint32_t instruction;
  size_t iteration;
};

class LoopChecker {
 public:
  explicit LoopChecker(const Kernel& k) : k_(k) {}

  void check(const ParallelLoop& loop) {
    if (loop.iterations() < 2) return;
    const uint32_t begin = loop.iteration_begin.front();
    hazards::Tracker hazards;
    std::vector<std::vector<Use>> uses(loop.end - begin);
    std::vector<std::optional<Carry>> carried(loop.end - begin);
    size_t iteration = 0;
    for (uint32_t i = begin; i < loop.end; ++i) {
      while (i >= loop.iteration_end(iteration)) ++iteration;
      std::vector<Use>& mine = uses[i - begin];
      mine = uses_of(k_, k_.instructions[i]);
      ++instructions_;
      hazards::Footprints f;
      for (const Use& u : mine) f.add(u.region, u.write ? Access::write : Access::read);
      for (uint32_t d : hazards.add(i, f)) {
        const size_t other = iteration_of(loop, d);
        // Within an iteration, only an accumulator another iteration also accumulates into matters.
        if (other == iteration && !carried[d - begin]) continue;
        for (const Use& x : uses[d - begin])
          for (const Use& y : mine) {
            if (!(x.write || y.write) || x.ap.storage != y.ap.storage || !x.region.overlaps(y.region) ||
                !share_bytes(x.ap, y.ap))
              continue;
            if (other != iteration) between_iterations(loop, d, x, other, i, y, iteration, carried[i - begin]);
            else within_iteration(loop, d, x, i, y, iteration, carried[d - begin], carried[i - begin]);
          }
      }
    }
    ++loops_;
    iterations_ += loop.iterations();
  }

  const std::optional<Conflict>& first() const { return first_; }
  /** Pairs of instructions with a dependency between their iterations. */
  size_t conflicts() const { return pairs_.size(); }
  std::string summary() const {
    return fmt::format("{} affine_range loop runs checked ({} iterations, {} instructions): {}\n", loops_,
                       iterations_, instructions_,
                       pairs_.empty() ? std::string("no dependency between iterations")
                                      : fmt::format("{} dependencies between iterations", pairs_.size()));
  }

 private:
  static size_t iteration_of(const ParallelLoop& loop, uint32_t inst) {
    const auto& b = loop.iteration_begin;
    return size_t(std::upper_bound(b.begin(), b.end(), inst) - b.begin()) - 1;
  }

  void between_iterations(const ParallelLoop& loop, uint32_t d, const Use& x, size_t other, uint32_t i, const Use& y,
                          size_t iteration, std::optional<Carry>& carry) {
    const Accumulation a = accumulation_of(k_, k_.instructions[d]), b = accumulation_of(k_, k_.instructions[i]);
    if (a.joins(b) && a.holds(x.slot) && b.holds(y.slot)) {
      if (!carry) carry = Carry{d, other};  // both accumulate into one tile: NKI allows it
      return;
    }
    const Kind kind = !x.write ? Kind::overwrites_read : y.write ? Kind::overwrites_written : Kind::reads;
    add(Conflict{kind, &loop, d, i, other, iteration, y.ap.storage});
  }

  /** A same-iteration access to an accumulator that another iteration also accumulates into:
   * the chain goes on, or the access sees (or clobbers) a partial result. */
  void within_iteration(const ParallelLoop& loop, uint32_t d, const Use& x, uint32_t i, const Use& y, size_t iteration,
                        const std::optional<Carry>& earlier_carry, std::optional<Carry>& carry) {
    if (!earlier_carry || !x.write) return;
    const Accumulation a = accumulation_of(k_, k_.instructions[d]), b = accumulation_of(k_, k_.instructions[i]);
    if (!a.holds(x.slot)) return;
    if (a.joins(b) && b.holds(y.slot)) {
      if (!carry) carry = earlier_carry;
      return;
    }
    add(Conflict{y.write ? Kind::partial_overwrite : Kind::partial_read, &loop, earlier_carry->instruction, i,
                 earlier_carry->iteration, iteration, y.ap.storage});
  }

  void add(const Conflict& c) {
    pairs_.insert((uint64_t(c.earlier) << 32) | c.later);
    if (!first_ || c.rank() < first_->rank()) first_ = c;
  }

  const Kernel& k_;
  std::optional<Conflict> first_;
  std::unordered_set<uint64_t> pairs_;  // (earlier, later) instruction pairs in conflict
  size_t loops_ = 0, iterations_ = 0, instructions_ = 0;
};

[[noreturn]] void report(const Kernel& k, const Conflict& c, size_t more) {
  const Instruction& later = k.instructions[c.later];
  const std::string other_line = k.location(k.instructions[c.earlier].loc).str();
  const std::string tensor = k.storage(c.storage).name;
  const int64_t mine = c.loop->value(c.later_iteration), theirs = c.loop->value(c.earlier_iteration);
  const bool partial = c.kind == Kind::partial_read || c.kind == Kind::partial_overwrite;
  const char* does = c.kind == Kind::reads || c.kind == Kind::partial_read ? "reads" : "overwrites";
  const std::string what =
      partial ? fmt::format("iteration {} {} '{}' while it holds a partial accumulation: iteration {} accumulates "
                            "into it at {}",
                            mine, does, tensor, theirs, other_line)
              : fmt::format("iteration {} {} '{}', which iteration {} {} at {}", mine, does, tensor, theirs,
                            c.kind == Kind::overwrites_read ? "read" : "wrote", other_line);
  // A tile allocated in the loop body is a new tensor in each iteration: one two iterations
  // share was allocated before the loop.
  const bool shared_tile = k.storage(c.storage).on_chip();
  std::string hint;
  if (partial)
    hint = fmt::format("use '{}' after the loop, when every iteration has accumulated; or use nl.sequential_range",
                       tensor);
  else if (c.kind == Kind::reads)
    hint = "use nl.sequential_range for a loop whose iterations depend on each other";
  else if (shared_tile)
    hint = fmt::format("allocate the tile inside the loop (one per iteration) or give each iteration its own part of "
                       "'{}'; or use nl.sequential_range",
                       tensor);
  else
    hint = fmt::format("give each iteration its own part of '{}', or use nl.sequential_range", tensor);
  throw KernelError(
      fmt::format("loop-carried dependency in the nl.affine_range loop at {}: {}{}", k.location(c.loop->loc).str(),
                  what,
                  more == 0   ? std::string()
                  : more == 1 ? std::string(" (and 1 more dependency between its iterations)")
                              : fmt::format(" (and {} more dependencies between its iterations)", more)),
      k.location(later.loc), to_string(k, later),
      "NKI may reorder and overlap the iterations of an affine_range loop; only accumulations into one tile "
      "(nc_matmul into PSUM, += on a tile) may span them",
      hint);
}

LoopChecker check_loops(const Kernel& kernel) {
  LoopChecker checker(kernel);
  for (const ParallelLoop& loop : kernel.parallel_loops) checker.check(loop);
  return checker;
}

}  // namespace

void check_parallel_loops(const Kernel& kernel) {
  const LoopChecker checker = check_loops(kernel);
  if (checker.first()) report(kernel, *checker.first(), checker.conflicts() - 1);
}

std::string parallel_loops_summary(const Kernel& kernel) { return check_loops(kernel).summary(); }

}  // namespace nikki::jit
