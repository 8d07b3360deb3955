// NKI's per-instruction cost model: the published formulas (Beta-1 nki.isa "Estimated instruction
// cost" notes, see docs/performance-model.md) plus the engine rules of the architecture guides
// (strided access halves the bandwidth, NeuronCore-v3 VectorE runs 16-bit SBUF data in 2x / 4x
// modes, small tiles pay a static overhead). Two places evaluate it: the timing model
// (runtime/src/timing.cpp), which estimates a compiled kernel, and the library kernels' trace-time
// task scheduler (kernels/include/nikki/kernels/toolkit/), which orders instructions by their
// expected durations. One definition keeps the order the kernels choose consistent with the model
// that then estimates them. It reads only the IR (no addresses), so it works before allocation.
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>

#include "nikki/ir.hpp"
#include "nikki/layout.hpp"
#include "nikki/target.hpp"

namespace nikki::cost {

/**
 * @brief Tensor-engine cycles of one nc_matmul: the stationary tile's load (at most
 * matmul_init_cycles, overlapped) or the moving tile's columns, whichever is longer; fp32
 * operands take matmul_fp32_slowdown times as long.
 */
inline double matmul_cycles(const TargetConfig& t, int64_t stationary_free, int64_t moving_free, bool fp32) {
  const int64_t cycles = std::max(std::min<int64_t>(t.matmul_init_cycles, stationary_free), moving_free);
  return (fp32 ? double(t.matmul_fp32_slowdown) : 1.0) * double(cycles);
}

/** @brief Tensor-engine cycles of a PE-array transpose of `partitions` x `free` elements. */
inline double pe_transpose_cycles(const TargetConfig& t, int64_t partitions, int64_t free) {
  return double(std::max(partitions, std::min<int64_t>(t.matmul_init_cycles, free)));
}

/**
 * @brief Nanoseconds a DMA transfer holds the core's shared DMA bandwidth: its bytes plus a fixed
 * overhead per DMA buffer (a contiguous run on both sides), over all DMA engines' bandwidth. The
 * fixed latency before the data moves (dma_fixed_latency_ns) is not included.
 */
inline double dma_data_ns(const TargetConfig& t, int64_t bytes, int64_t buffers) {
  return (double(bytes) + double(buffers) * double(t.dma_buffer_overhead_bytes)) /
         (double(t.dma_engines) * t.dma_bytes_per_ns_per_engine);
}

// --- per-instruction costs ---------------------------------------------------------------

namespace detail {

/** Elements per partition of a tile operand. */
inline int64_t free_size(const Kernel& k, const Operand& o) {
  if (!o.is_tensor()) return 0;
  return tile_geometry(k.storage(o.storage()), k.view(o)).free_elements;
}

inline int64_t partitions(const Kernel& k, const Operand& o) {
  return o.is_tensor() ? k.view(o).dims[0].count : 0;
}

inline bool in_sbuf(const Kernel& k, const Operand& o) { return o.is_tensor() && k.storage(o.storage()).buffer == Buffer::sbuf; }
inline bool in_psum(const Kernel& k, const Operand& o) { return o.is_tensor() && k.storage(o.storage()).buffer == Buffer::psum; }
inline bool is16(DType d) { return d == DType::bfloat16 || d == DType::float16; }

/** Innermost contiguous run of a view, in elements (1 when the minor dim is strided). */
inline int64_t contiguous_run(const AccessPattern& ap, bool on_chip) {
  int64_t run = 1;
  for (int d = ap.rank - 1; d >= (on_chip ? 1 : 0); --d) {
    if (ap.dims[d].count == 1) continue;
    if (ap.dims[d].stride != run) break;
    run *= ap.dims[d].count;
  }
  return run;
}

/** "Most-minor stride over 16 bytes halves the bandwidth" [ARCH SRAM access rules]. */
inline bool strided(const Kernel& k, const Instruction& inst, const TargetConfig& t) {
  for (int s = 0; s < inst.spec().num_slots; ++s) {
    const Operand& o = inst.operands[s];
    if (!o.is_tensor() || free_size(k, o) <= 1) continue;
    const AccessPattern ap = k.view(o);
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
inline double vector_speedup(const Kernel& k, const Instruction& inst, const TargetConfig& t) {
  if (!t.vector_perf_mode || inst.engine != Engine::vector) return 1.0;
  const Operand &dst = inst.operands[0], &src = inst.operands[1];
  if (inst.opcode == Opcode::tensor_copy || inst.opcode == Opcode::tensor_scalar) {
    const bool sbuf = in_sbuf(k, dst) && in_sbuf(k, src);
    const bool sixteen = is16(dst.dtype()) && is16(src.dtype());
    const bool contiguous = contiguous_run(k.view(dst), true) > 1 && contiguous_run(k.view(src), true) > 1;
    const int holds = int(sbuf) + int(sixteen) + int(contiguous);
    if (holds == 3) return 4.0;
    if (holds == 2 || in_psum(k, dst) != in_psum(k, src)) return 2.0;
    return 1.0;
  }
  if (inst.opcode == Opcode::tensor_tensor) {
    const Operand& b = inst.operands[2];
    const bool sbuf = in_sbuf(k, src) && in_sbuf(k, b);
    const bool sixteen = is16(dst.dtype()) && is16(src.dtype()) && is16(b.dtype());
    return sbuf && sixteen ? 2.0 : 1.0;
  }
  return 1.0;
}

}  // namespace detail

/** @brief Engine clock of a compute engine, in cycles per nanosecond. */
inline double clock_ghz(const TargetConfig& t, Engine e) {
  switch (e) {
    case Engine::tensor: return t.clock_ghz.tensor;
    case Engine::vector: return t.clock_ghz.vector;
    case Engine::scalar: return t.clock_ghz.scalar;
    case Engine::gpsimd: return t.clock_ghz.gpsimd;
    default: return t.clock_ghz.scalar;
  }
}

/** @brief Whether every tensor operand of an instruction has fewer free elements than the PE
 *  array has columns: such instructions on the Vector, Scalar and GpSimd engines pay the static
 *  instruction overhead [ARCH VectorE rules, PERF guide "static instruction overhead ~100 cycles"]. */
inline bool small_tile(const Kernel& k, const Instruction& inst) {
  for (int s = 0; s < inst.spec().num_slots; ++s) {
    const Operand& o = inst.operands[s];
    if (o.is_tensor() && k.view(o).inner_elements() >= int64_t(k.config().pe_array_cols)) return false;
  }
  return true;
}

/** @brief Engine cycles of an instruction's formula, without the static overhead of small tiles. */
inline double formula_cycles(const Kernel& k, const Instruction& inst) {
  const TargetConfig& t = k.config();
  if (inst.spec().is_control) return 0.0;
  const double min_ii = t.min_ii_cycles;
  const double gpsimd_start = t.gpsimd_start_cycles;
  const Operand& data = inst.spec().num_slots > 1 ? inst.operands[1] : inst.operands[0];
  double n = double(std::max(detail::free_size(k, data), detail::free_size(k, inst.operands[0])));
  // Bandwidth-bound terms slow down for strided access and speed up in VectorE's 16-bit modes.
  const double rate = detail::vector_speedup(k, inst, t) / (detail::strided(k, inst, t) ? 2.0 : 1.0);
  auto stream = [&](double elements) { return elements / rate; };
  const AluOp op0 = inst.attrs.op0;
  switch (inst.opcode) {
    case Opcode::nc_matmul:
      return cost::matmul_cycles(t, detail::free_size(k, inst.operands[1]), detail::free_size(k, inst.operands[2]),
                                 inst.operands[1].dtype() == DType::float32);
    case Opcode::nc_transpose:
      if (inst.engine == Engine::tensor)
        return cost::pe_transpose_cycles(t, detail::partitions(k, inst.operands[1]), detail::free_size(k, inst.operands[1]));
      return std::max(min_ii, stream(n));
    case Opcode::activation: {
      const bool reads_accumulator = inst.operands[4].is_tensor();
      return std::max(min_ii, stream(n)) + (reads_accumulator ? min_ii : 0.0);  // + ActReadAccumulator
    }
    case Opcode::tensor_scalar:
    case Opcode::tensor_copy:
    case Opcode::tensor_copy_predicated:
    case Opcode::select_reduce:
      if (inst.opcode == Opcode::tensor_copy_predicated && detail::in_sbuf(k, inst.operands[1]) && detail::in_sbuf(k, inst.operands[2]))
        return std::max(min_ii, stream(2 * n));
      return std::max(min_ii, stream(n));
    case Opcode::tensor_scalar_reduce: return std::max(min_ii, stream(n)) + min_ii;
    case Opcode::tensor_tensor: {
      const bool mixed = detail::in_psum(k, inst.operands[1]) != detail::in_psum(k, inst.operands[2]);
      const bool fast = detail::in_sbuf(k, inst.operands[1]) && detail::in_sbuf(k, inst.operands[2]) &&
                        inst.operands[0].dtype() == DType::bfloat16 && inst.operands[1].dtype() == DType::bfloat16 &&
                        inst.operands[2].dtype() == DType::bfloat16 &&
                        (op0 == AluOp::add || op0 == AluOp::multiply || op0 == AluOp::subtract);
      return std::max(min_ii, stream(mixed || fast ? n : 2 * n));
    }
    case Opcode::scalar_tensor_tensor: {
      const bool fast = inst.operands[1].dtype() == DType::bfloat16 && inst.operands[3].dtype() == DType::bfloat16 &&
                        op0 == AluOp::subtract && inst.attrs.op1 == AluOp::multiply && int64_t(n) % 2 == 0;
      return stream(fast ? n : 2 * n);
    }
    case Opcode::tensor_tensor_scan: return std::max(min_ii, stream(2 * n));
    case Opcode::tensor_reduce: {
      const bool fast = inst.operands[0].dtype() == DType::bfloat16 && data.dtype() == DType::bfloat16 &&
                        (op0 == AluOp::add || op0 == AluOp::maximum);
      return stream(fast ? n / 2 : n);
    }
    case Opcode::memset: {
      const DType d = inst.operands[0].dtype();
      const bool fast = inst.operands[1].imm() == 0.0 && detail::is16(d);
      return std::max(min_ii, stream(fast ? n / 2 : n));
    }
    case Opcode::reciprocal: return std::max(min_ii, stream(8 * n));
    case Opcode::bn_stats: return std::max(min_ii, stream(n));
    case Opcode::bn_aggr: return std::max(min_ii, 13.0 * (n / 3.0));
    case Opcode::max8:
    case Opcode::nc_find_index8: return n;
    case Opcode::iota:
    case Opcode::affine_select:
    // No published formulas: like iota, the GpSimd start-up plus one element per cycle.
    case Opcode::nc_n_gather:
    case Opcode::local_gather:
    case Opcode::nonzero_with_count: return gpsimd_start + n;
    // nc_match_replace8 scans each row once per value, like nc_find_index8 ("N cycles").
    case Opcode::nc_match_replace8: return n;
    case Opcode::tensor_partition_reduce:
      // No published formula: one pass over the free elements of every partition group of the
      // 8 GpSimd cores (docs/performance-model.md, assumption A4).
      return gpsimd_start + n * std::max<int64_t>(1, detail::partitions(k, data) / 16);
    default: return std::max(min_ii, stream(n));
  }
}

/** @brief Engine cycles an instruction occupies its compute engine (0 for control instructions). */
inline double compute_cycles(const Kernel& k, const Instruction& inst) {
  double cycles = formula_cycles(k, inst);
  const bool small_engine_op = inst.engine == Engine::vector || inst.engine == Engine::scalar || inst.engine == Engine::gpsimd;
  if (small_engine_op && small_tile(k, inst)) cycles += k.config().static_overhead_cycles;
  return cycles;
}

/** @brief What a DMA transfer moves: bytes and contiguous DMA buffers (descriptor elements). */
struct DmaWork {
  int64_t bytes = 0;
  int64_t buffers = 0;
};

inline DmaWork dma_work(const Kernel& k, const Instruction& inst) {
  const AccessPattern dst = k.view(inst, 0), src = k.view(inst, 1);
  const int64_t elements = dst.num_elements();
  DmaWork w;
  w.bytes = elements * std::max(dtype_size(dst.dtype), dtype_size(src.dtype));
  // A DMA buffer is a contiguous run on both sides; an on-chip side breaks at every partition.
  const int64_t run_dst = detail::contiguous_run(dst, k.storage(dst.storage).on_chip());
  const int64_t run_src = detail::contiguous_run(src, k.storage(src.storage).on_chip());
  const int64_t run = std::max<int64_t>(1, std::gcd(run_dst, run_src));
  w.buffers = std::max<int64_t>(1, elements / run);
  return w;
}

/**
 * @brief Nanoseconds an instruction keeps its engine busy: compute cycles at the engine's clock,
 * or for a DMA transfer the time its data holds the shared DMA bandwidth (the fixed latency
 * before the data moves is dma_fixed_latency_ns on top).
 */
inline double busy_ns(const Kernel& k, const Instruction& inst) {
  const TargetConfig& t = k.config();
  if (inst.engine == Engine::dma) {
    const DmaWork w = dma_work(k, inst);
    return dma_data_ns(t, w.bytes, w.buffers);
  }
  return compute_cycles(k, inst) / clock_ghz(t, inst.engine);
}

/** @brief The on-chip ports an instruction holds while it runs, where engines share them. */
struct SharedPorts {
  bool sbuf = false;
  bool psum = false;
};

/**
 * @brief The shared ports `inst` takes turns on: on targets with shared_sbuf_port (NeuronCore-v2)
 * VectorE and GpSimd take turns on SBUF, with shared_psum_port VectorE and ScalarE on PSUM.
 */
inline SharedPorts shared_ports(const Kernel& k, const Instruction& inst) {
  const TargetConfig& t = k.config();
  auto touches = [&](bool (*in)(const Kernel&, const Operand&)) {
    for (int s = 0; s < inst.spec().num_slots; ++s)
      if (in(k, inst.operands[s])) return true;
    return false;
  };
  const Engine e = inst.engine;
  return {t.shared_sbuf_port && (e == Engine::vector || e == Engine::gpsimd) && touches(detail::in_sbuf),
          t.shared_psum_port && (e == Engine::vector || e == Engine::scalar) && touches(detail::in_psum)};
}

}  // namespace nikki::cost
