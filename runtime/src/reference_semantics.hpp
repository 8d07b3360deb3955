// The reference semantics of every instruction (internal to runtime/): the executable
// specification that the interpreter runs, that the stream executor falls back to for
// instructions without a native routine, and that the sanitizer's shadow follows.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "machine.hpp"

namespace nikki::runtime::reference {

/** Runs `inst` on `m`. A loop instruction that jumps sets `pc` to its jump target (the caller
 * steps past it as past any instruction); other instructions leave `pc` alone. */
void execute(Machine& m, const Instruction& inst, size_t& pc);

/** Applies a reduce command to per-partition accumulators given an instruction's partial result
 * for partition p (a NaN partial, summed with raw IEEE adds, is stored as the canonical NaN, as
 * alu_apply gives). */
void apply_reduce_cmd(ReduceCmd cmd, AluOp op, float identity, std::vector<float>& acc, int64_t p, float partial,
                      bool has_partial);

/** Elements each output of a tensor_reduce folds: the reduced axes are a suffix of the free
 * dims, so each output element reduces one run of consecutive input elements. */
int64_t reduce_run(const Kernel& k, const Instruction& inst);

/** The affine values of iota / affine_select for partition c: offset + c * channel_multiplier +
 * sum(step * index) over the pattern, one per free element, computed in int32. */
std::vector<int64_t> affine_values(const RareAttributes& at, int64_t c, int64_t free);

}  // namespace nikki::runtime::reference
