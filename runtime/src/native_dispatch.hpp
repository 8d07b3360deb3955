// Calls an instruction's native routine with the addresses of its operands (internal to runtime/).
#pragma once

#include <memory>
#include <vector>

#include <fmt/format.h>

#include "machine.hpp"
#include "nikki/jit/native.hpp"

namespace nikki::runtime {

class NativeDispatch {
 public:
  NativeDispatch(const Kernel& kernel, std::shared_ptr<const jit::NativeCode> code)
      : code_(std::move(code)) {}

  /** Runs instruction `ir_index` natively; false when it has no native routine. */
  bool run(Machine& m, uint32_t ir_index) {
    const jit::NativeInstruction* n = code_ ? code_->instruction(ir_index) : nullptr;
    if (!n) return false;
    native::OpArgs args{};
    for (int s = 0; s < native::kSlots; ++s) {
      const jit::NativeOperand& o = n->operands[s];
      if (o.kind == jit::NativeOperand::Kind::imm) args.imm[s] = o.imm;
      if (o.kind != jit::NativeOperand::Kind::tensor) continue;
      uint8_t* base = m.storage_base(o.storage) + o.byte_offset;
      if (o.indirection) base += shift(m, ir_index, o) * o.scalar_bytes;
      args.base[s] = base;
    }
    args.scalar_acc = m.scalar_acc().data();
    args.vector_acc = m.vector_acc().data();
    if (m.kernel().instructions[ir_index].opcode == Opcode::nc_matmul) {
      args.psum_written = &m.psum_written(args.base[0]);
      args.psum_flag_pitch = m.row_pitch(Buffer::psum) / 4;
    }
    args.scratch = m.native_scratch();
    n->routine(&args);
    return true;
  }

 private:
  /** The run-time value of a scalar offset, bounds-checked like the interpreter does. */
  static int64_t shift(Machine& m, uint32_t ir_index, const jit::NativeOperand& o) {
    const Indirection& ind = *o.indirection;
    const Instruction& inst = m.kernel().instructions[ir_index];
    int64_t v;
    if (ind.scalar_tensor) v = m.resolve(inst, *ind.scalar_tensor).get_int(0, 0);
    else v = m.reg(ind.scalar_register);
    if (v < o.min_shift || v > o.max_shift)
      m.runtime_fault(inst,
                      fmt::format("runtime offset out of bounds: offset value {} into tensor '{}' (valid values: {} to {})",
                                  v, m.kernel().storage(o.storage).name, o.min_shift, o.max_shift),
                      "check the values of the offset register or index tensor");
    return v;
  }

  std::shared_ptr<const jit::NativeCode> code_;
};

}  // namespace nikki::runtime
