// The NeuronCore generations nikki models. This is the only place hardware numbers live: every
// limit the verifier checks and every cost the timing model charges is read from these tables.
//
// Sources (see docs/hardware.md for the full citations):
//   [TS]   NKI docs, nki.language.tile_size (SDK 2.32) and the Beta-1 programming model's tile-size
//          constraints TC#1-TC#3 (SDK 2.26).
//   [ARCH] NKI architecture guides: trainium_inferentia2_arch.rst (NeuronCore-v2),
//          trainium2_arch.rst (NeuronCore-v3), and neuron-core-v2/v3.rst.
//   [DMA]  nki-dma-overview.rst and nki-dma-bandwidth-guide.rst.
//   [COST] Beta-1 nki.isa per-instruction "Estimated instruction cost" notes (engine cycles).
//   [PERF] nki_perf_guide.rst.
//   [NKIPY] nkipy HardwareConstants.h, which mirrors the nki wheel's target_info (usable SBUF).
//   [CHIP] Neuron architecture pages of the Trainium chips: trainium.rst (Trn1: "32 GiB of device
//          memory", two NeuronCore-v2) and trainium2.rst / trainium2_arch.rst (Trn2: "4 HBM stacks
//          with a total device memory capacity of 96GiB", eight NeuronCore-v3).
#pragma once

#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>

#include "nikki/error.hpp"

namespace nikki {

/** @brief The modelled NeuronCore generations. */
enum class TargetId : uint8_t {
  trn1,  // NeuronCore-v2 (Trainium1, Inferentia2)
  trn2,  // NeuronCore-v3 (Trainium2); nikki's default
};

/** @brief The compute engines and the DMA queues of one NeuronCore. */
enum class Engine : uint8_t { tensor, vector, scalar, gpsimd, sync, dma, unknown };

inline constexpr std::string_view engine_name(Engine e) {
  switch (e) {
    case Engine::tensor: return "tensor";
    case Engine::vector: return "vector";
    case Engine::scalar: return "scalar";
    case Engine::gpsimd: return "gpsimd";
    case Engine::sync: return "sync";
    case Engine::dma: return "dma";
    case Engine::unknown: return "unknown";
  }
  return "?";
}

/** @brief Clock of each engine, in GHz (cycles per nanosecond). */
struct EngineClocks {
  double tensor;
  double vector;
  double scalar;
  double gpsimd;
};

/** @brief Everything nikki knows about one NeuronCore generation. */
struct TargetConfig {
  TargetId id;
  std::string_view name;        // "trn1", "trn2"
  std::string_view core;        // "NeuronCore-v2"
  int generation;               // 2, 3 (nki.isa.nc_version)

  // --- on-chip memories -----------------------------------------------------------------
  uint32_t num_partitions;            // pmax [TS TC#1], 128 SBUF/PSUM partitions [ARCH]
  uint32_t sbuf_bytes_per_partition;  // usable SBUF per partition (sbuf_fmax_bytes) [NKIPY]
  uint32_t sbuf_physical_bytes_per_partition;  // 192 KiB (v2) / 224 KiB (v3) [ARCH]
  uint32_t psum_num_banks;            // 8 banks [TS psum_num_banks] [ARCH]
  uint32_t psum_bank_bytes;           // 2 KiB per partition per bank [TS psum_bank_fmax_bytes]
  uint32_t partition_quadrant;        // start-partition granularity: 32 [ARCH access rules]
  /** Device memory (HBM) of the chip the core sits on: the most that the HBM tensors of one
   *  kernel launch (inputs, outputs, scratch) can hold together, since a kernel may address
   *  the whole device memory. 32 GiB (Trn1) / 96 GiB (Trn2) [CHIP]. */
  int64_t hbm_bytes_per_chip;
  uint32_t cores_per_chip;            // NeuronCores sharing that HBM: 2 (Trn1), 8 (Trn2) [CHIP]
  uint32_t gpsimd_core_partitions;    // each of the 8 GpSimd cores serves 16 partitions [ARCH]

  // --- instruction limits ---------------------------------------------------------------
  uint32_t gemm_stationary_fmax;  // stationary free size <= 128 [TS TC#3]
  uint32_t gemm_moving_fmax;      // moving free size <= 512 [TS TC#3]
  uint32_t bn_stats_fmax;         // bn_stats free size <= 512 [TS bn_stats_fmax]
  uint32_t vector_transpose_max;  // VectorE nc_transpose <= 32x32 [nki.isa.nc_transpose]
  uint32_t max_free_elems_sbuf;   // VectorE free size up to 64K elements from SBUF [ARCH]
  uint32_t max_free_elems_psum;   // ... and 4K elements from PSUM [ARCH]
  uint32_t max_access_dims;       // partition + 4 free dims per access pattern [ARCH]
  uint32_t max8_min_elems;        // max8 input free size range [nki.isa.max8]
  uint32_t max8_max_elems;

  // --- timing (used by the timing model; estimates, never measurements) ----------------
  EngineClocks clock_ghz;               // [ARCH] summary tables
  uint32_t dma_engines;                 // 16 DMA engines per core [ARCH] [DMA]
  uint32_t dma_queues;                  // 16 queues per engine [DMA]
  double dma_bytes_per_ns_per_engine;   // 17 B/ns (v2), 23 B/ns (v3) [DMA bandwidth guide]
  double dma_fixed_latency_ns;          // ~1300 ns semaphore-to-start per transfer [DMA]
  uint32_t min_ii_cycles;               // MIN_II ~64 engine cycles [COST]
  uint32_t gpsimd_start_cycles;         // GPSIMD_START ~150 cycles [COST iota/affine_select]
  uint32_t static_overhead_cycles;      // ~100-cycle static instruction overhead [ARCH] [PERF]
  uint32_t stride_penalty_bytes;        // minor stride > 16 B halves bandwidth [ARCH]
  uint32_t matmul_init_cycles;          // MM_INIT_LATENCY = 64 TensorE cycles [ARCH]
  uint32_t matmul_fp32_slowdown;        // fp32 matmul costs 4x the 16-bit cycles [COST nc_matmul]
  uint32_t pe_array_rows;               // 128 x 128 processing elements [ARCH]
  uint32_t pe_array_cols;
  /** Per contiguous DMA buffer (descriptor element), the time of this many bytes: with 512 B,
   * a 256 B-per-partition transfer runs at a third of the bandwidth ("<256 B/partition severely
   * overhead-bound"), 2 KiB at 80% ("approaches peak"), 4 KiB at 89% ("saturates") [DMA]. */
  uint32_t dma_buffer_overhead_bytes;
  bool vector_perf_mode;          // NeuronCore-v3 VectorE 2x/4x modes for 16-bit SBUF data [ARCH v3]
  bool shared_sbuf_port;          // v2: VectorE and GpSimdE cannot access SBUF at once [ARCH]
  bool shared_psum_port;          // v2: VectorE and ScalarE cannot access PSUM at once [ARCH]

  uint32_t psum_bytes_per_partition() const { return psum_num_banks * psum_bank_bytes; }
  uint32_t psum_bank_fp32_elems() const { return psum_bank_bytes / 4; }
};

inline constexpr TargetConfig kTrn1 = {
    .id = TargetId::trn1,
    .name = "trn1",
    .core = "NeuronCore-v2",
    .generation = 2,
    .num_partitions = 128,
    .sbuf_bytes_per_partition = 180224,
    .sbuf_physical_bytes_per_partition = 192 * 1024,
    .psum_num_banks = 8,
    .psum_bank_bytes = 2048,
    .partition_quadrant = 32,
    .hbm_bytes_per_chip = int64_t(32) << 30,
    .cores_per_chip = 2,
    .gpsimd_core_partitions = 16,
    .gemm_stationary_fmax = 128,
    .gemm_moving_fmax = 512,
    .bn_stats_fmax = 512,
    .vector_transpose_max = 32,
    .max_free_elems_sbuf = 65536,
    .max_free_elems_psum = 4096,
    .max_access_dims = 5,
    .max8_min_elems = 8,
    .max8_max_elems = 16384,
    // VectorE: the summary tables say 1.12 GHz, the SRAM-access rules 128 elements per cycle at
    // 1.4 GHz per engine interface; the published Mamba latencies side with 1.4
    // (docs/performance-model.md, "Where the sources disagree").
    .clock_ghz = {.tensor = 2.8, .vector = 1.4, .scalar = 1.4, .gpsimd = 1.4},
    .dma_engines = 16,
    .dma_queues = 16,
    .dma_bytes_per_ns_per_engine = 17.0,
    .dma_fixed_latency_ns = 1300.0,
    .min_ii_cycles = 64,
    .gpsimd_start_cycles = 150,
    .static_overhead_cycles = 100,
    .stride_penalty_bytes = 16,
    .matmul_init_cycles = 64,
    .matmul_fp32_slowdown = 4,
    .pe_array_rows = 128,
    .pe_array_cols = 128,
    .dma_buffer_overhead_bytes = 512,
    .vector_perf_mode = false,
    .shared_sbuf_port = true,
    .shared_psum_port = true,
};

inline constexpr TargetConfig kTrn2 = {
    .id = TargetId::trn2,
    .name = "trn2",
    .core = "NeuronCore-v3",
    .generation = 3,
    .num_partitions = 128,
    .sbuf_bytes_per_partition = 212984,
    .sbuf_physical_bytes_per_partition = 224 * 1024,
    .psum_num_banks = 8,
    .psum_bank_bytes = 2048,
    .partition_quadrant = 32,
    .hbm_bytes_per_chip = int64_t(96) << 30,
    .cores_per_chip = 8,
    .gpsimd_core_partitions = 16,
    .gemm_stationary_fmax = 128,
    .gemm_moving_fmax = 512,
    .bn_stats_fmax = 512,
    .vector_transpose_max = 32,
    .max_free_elems_sbuf = 65536,
    .max_free_elems_psum = 4096,
    .max_access_dims = 5,
    .max8_min_elems = 8,
    .max8_max_elems = 16384,
    .clock_ghz = {.tensor = 2.4, .vector = 0.96, .scalar = 1.2, .gpsimd = 1.2},
    .dma_engines = 16,
    .dma_queues = 16,
    .dma_bytes_per_ns_per_engine = 23.0,
    .dma_fixed_latency_ns = 1300.0,
    .min_ii_cycles = 64,
    .gpsimd_start_cycles = 150,
    .static_overhead_cycles = 100,
    .stride_penalty_bytes = 16,
    .matmul_init_cycles = 64,
    .matmul_fp32_slowdown = 4,
    .pe_array_rows = 128,
    .pe_array_cols = 128,
    .dma_buffer_overhead_bytes = 512,
    .vector_perf_mode = true,
    .shared_sbuf_port = false,
    .shared_psum_port = false,
};

/** @brief The config table of a target. */
inline const TargetConfig& target_config(TargetId id) {
  return id == TargetId::trn1 ? kTrn1 : kTrn2;
}

/** @brief Parses the names NKI accepts (NEURON_PLATFORM_TARGET_OVERRIDE): trn1|inf2|gen2, trn2|gen3. */
inline std::optional<TargetId> parse_target(std::string_view name) {
  if (name == "trn1" || name == "inf2" || name == "gen2") return TargetId::trn1;
  if (name == "trn2" || name == "gen3") return TargetId::trn2;
  return std::nullopt;
}

/** @brief Parses a target name or throws a KernelError listing the supported names. */
inline TargetId require_target(std::string_view name) {
  if (auto t = parse_target(name)) return *t;
  throw KernelError(fmt::format("unknown target '{}'", name), {}, {},
                    "nikki models trn1 (NeuronCore-v2) and trn2 (NeuronCore-v3)",
                    "use one of trn1, inf2, gen2, trn2, gen3");
}

/** @brief trn2 unless NEURON_PLATFORM_TARGET_OVERRIDE names another target. */
inline TargetId default_target() {
  if (const char* env = std::getenv("NEURON_PLATFORM_TARGET_OVERRIDE"); env && *env)
    return require_target(env);
  return TargetId::trn2;
}

}  // namespace nikki
