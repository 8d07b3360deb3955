// NKI's per-instruction cost formulas (Beta-1 nki.isa "Estimated instruction cost" notes, see
// docs/performance-model.md), plus the engine rules of the architecture guides: strided access
// halves the bandwidth, NeuronCore-v3 VectorE runs 16-bit SBUF data in 2x / 4x modes.
#include "cost_model.hpp"

#include <algorithm>
#include <numeric>

#include "nikki/cost_formulas.hpp"
#include "nikki/layout.hpp"

namespace nikki::runtime {

namespace {

/** Elements per partition of a tile operand. */
int64_t free_size(const Kernel& k, const Operand& o) {
  if (!o.is_tensor()) return 0;
  return tile_geometry(k.storage(o.ap.storage), o.ap).free_elements;
}

int64_t partitions(const Kernel& k, const Operand& o) {
  return o.is_tensor() ? o.ap.dims[0].count : 0;
}

bool in_sbuf(const Kernel& k, const Operand& o) { return o.is_tensor() && k.storage(o.ap.storage).buffer == Buffer::sbuf; }
bool in_psum(const Kernel& k, const Operand& o) { return o.is_tensor() && k.storage(o.ap.storage).buffer == Buffer::psum; }
bool is16(DType d) { return d == DType::bfloat16 || d == DType::float16; }

/** Innermost contiguous run of a view, in elements (1 when the minor dim is strided). */
int64_t contiguous_run(const AccessPattern& ap, bool on_chip) {
  int64_t run = 1;
  for (int d = ap.rank - 1; d >= (on_chip ? 1 : 0); --d) {
    if (ap.dims[d].count == 1) continue;
    if (ap.dims[d].stride != run) break;
    run *= ap.dims[d].count;
  }
  return run;
}

/** "Most-minor stride over 16 bytes halves the bandwidth" [ARCH SRAM access rules]. */
bool strided(const Kernel& k, const Instruction& inst, const TargetConfig& t) {
  for (int s = 0; s < inst.spec().num_slots; ++s) {
    const Operand& o = inst.operands[s];
    if (!o.is_tensor() || free_size(k, o) <= 1) continue;
    const AccessPattern& ap = o.ap;
    int64_t minor = 0;
    for (int d = ap.rank - 1; d >= 1; --d)
      if (ap.dims[d].count > 1) {
        minor = ap.dims[d].stride * dtype_size(ap.dtype);
        break;
      }
    if (minor > int64_t(t.stride_penalty_bytes) || minor < 0) return true;
  }
  return false;
}

/** NeuronCore-v3 VectorE performance modes [ARCH trainium2_arch: "performance mode"]. */
double vector_speedup(const Kernel& k, const Instruction& inst, const TargetConfig& t) {
  if (!t.vector_perf_mode || inst.engine != Engine::vector) return 1.0;
  const Operand &dst = inst.operands[0], &src = inst.operands[1];
  if (inst.opcode == Opcode::tensor_copy || inst.opcode == Opcode::tensor_scalar) {
    const bool sbuf = in_sbuf(k, dst) && in_sbuf(k, src);
    const bool sixteen = is16(dst.ap.dtype) && is16(src.ap.dtype);
    const bool contiguous = contiguous_run(dst.ap, true) > 1 && contiguous_run(src.ap, true) > 1;
    const int holds = int(sbuf) + int(sixteen) + int(contiguous);
    if (holds == 3) return 4.0;
    if (holds == 2 || in_psum(k, dst) != in_psum(k, src)) return 2.0;
    return 1.0;
  }
  if (inst.opcode == Opcode::tensor_tensor) {
    const Operand& b = inst.operands[2];
    const bool sbuf = in_sbuf(k, src) && in_sbuf(k, b);
    const bool sixteen = is16(dst.ap.dtype) && is16(src.ap.dtype) && is16(b.ap.dtype);
    return sbuf && sixteen ? 2.0 : 1.0;
  }
  return 1.0;
}

}  // namespace

double clock_ghz(const TargetConfig& t, Engine e) {
  switch (e) {
    case Engine::tensor: return t.clock_ghz.tensor;
    case Engine::vector: return t.clock_ghz.vector;
    case Engine::scalar: return t.clock_ghz.scalar;
    case Engine::gpsimd: return t.clock_ghz.gpsimd;
    default: return t.clock_ghz.scalar;
  }
}

double compute_cycles(const Kernel& k, const Instruction& inst) {
  const TargetConfig& t = k.config();
  if (inst.spec().is_control) return 0.0;
  const double min_ii = t.min_ii_cycles;
  const double gpsimd_start = t.gpsimd_start_cycles;
  const Operand& data = inst.spec().num_slots > 1 ? inst.operands[1] : inst.operands[0];
  double n = double(std::max(free_size(k, data), free_size(k, inst.operands[0])));
  // Bandwidth-bound terms slow down for strided access and speed up in VectorE's 16-bit modes.
  const double rate = vector_speedup(k, inst, t) / (strided(k, inst, t) ? 2.0 : 1.0);
  auto stream = [&](double elements) { return elements / rate; };
  const AluOp op0 = inst.attrs.op0;
  switch (inst.opcode) {
    case Opcode::nc_matmul:
      return cost::matmul_cycles(t, free_size(k, inst.operands[1]), free_size(k, inst.operands[2]),
                                 inst.operands[1].ap.dtype == DType::float32);
    case Opcode::nc_transpose:
      if (inst.engine == Engine::tensor)
        return cost::pe_transpose_cycles(t, partitions(k, inst.operands[1]), free_size(k, inst.operands[1]));
      return std::max(min_ii, stream(n));
    case Opcode::activation: {
      const bool reads_accumulator = inst.operands[4].is_tensor();
      return std::max(min_ii, stream(n)) + (reads_accumulator ? min_ii : 0.0);  // + ActReadAccumulator
    }
    case Opcode::tensor_scalar:
    case Opcode::tensor_copy:
    case Opcode::tensor_copy_predicated:
    case Opcode::select_reduce:
      if (inst.opcode == Opcode::tensor_copy_predicated && in_sbuf(k, inst.operands[1]) && in_sbuf(k, inst.operands[2]))
        return std::max(min_ii, stream(2 * n));
      return std::max(min_ii, stream(n));
    case Opcode::tensor_scalar_reduce: return std::max(min_ii, stream(n)) + min_ii;
    case Opcode::tensor_tensor: {
      const bool mixed = in_psum(k, inst.operands[1]) != in_psum(k, inst.operands[2]);
      const bool fast = in_sbuf(k, inst.operands[1]) && in_sbuf(k, inst.operands[2]) &&
                        inst.operands[0].ap.dtype == DType::bfloat16 && inst.operands[1].ap.dtype == DType::bfloat16 &&
                        inst.operands[2].ap.dtype == DType::bfloat16 &&
                        (op0 == AluOp::add || op0 == AluOp::multiply || op0 == AluOp::subtract);
      return std::max(min_ii, stream(mixed || fast ? n : 2 * n));
    }
    case Opcode::scalar_tensor_tensor: {
      const bool fast = inst.operands[1].ap.dtype == DType::bfloat16 && inst.operands[3].ap.dtype == DType::bfloat16 &&
                        op0 == AluOp::subtract && inst.attrs.op1 == AluOp::multiply && int64_t(n) % 2 == 0;
      return stream(fast ? n : 2 * n);
    }
    case Opcode::tensor_tensor_scan: return std::max(min_ii, stream(2 * n));
    case Opcode::tensor_reduce: {
      const bool fast = inst.operands[0].ap.dtype == DType::bfloat16 && data.ap.dtype == DType::bfloat16 &&
                        (op0 == AluOp::add || op0 == AluOp::maximum);
      return stream(fast ? n / 2 : n);
    }
    case Opcode::memset: {
      const DType d = inst.operands[0].ap.dtype;
      const bool fast = inst.operands[1].imm == 0.0 && is16(d);
      return std::max(min_ii, stream(fast ? n / 2 : n));
    }
    case Opcode::reciprocal: return std::max(min_ii, stream(8 * n));
    case Opcode::bn_stats: return std::max(min_ii, stream(n));
    case Opcode::bn_aggr: return std::max(min_ii, 13.0 * (n / 3.0));
    case Opcode::max8:
    case Opcode::nc_find_index8: return n;
    case Opcode::iota:
    case Opcode::affine_select: return gpsimd_start + n;
    case Opcode::tensor_partition_reduce:
      // No published formula: one pass over the free elements of every partition group of the
      // 8 GpSimd cores (docs/performance-model.md, assumption A4).
      return gpsimd_start + n * std::max<int64_t>(1, partitions(k, data) / 16);
    default: return std::max(min_ii, stream(n));
  }
}

DmaWork dma_work(const Kernel& k, const Instruction& inst) {
  const AccessPattern &dst = inst.operands[0].ap, &src = inst.operands[1].ap;
  const int64_t elements = dst.num_elements();
  DmaWork w;
  w.bytes = elements * std::max(dtype_size(dst.dtype), dtype_size(src.dtype));
  // A DMA buffer is a contiguous run on both sides; an on-chip side breaks at every partition.
  const int64_t run_dst = contiguous_run(dst, k.storage(dst.storage).on_chip());
  const int64_t run_src = contiguous_run(src, k.storage(src.storage).on_chip());
  const int64_t run = std::max<int64_t>(1, std::gcd(run_dst, run_src));
  w.buffers = std::max<int64_t>(1, elements / run);
  return w;
}

}  // namespace nikki::runtime
