// The simulated NeuronCore's state (internal to runtime/): its memories, HBM bindings, registers
// and the engines' accumulators, and how an operand view maps onto them. What each instruction
// does to this state is the reference semantics (reference_semantics.hpp); the native routines
// change the same state (native_dispatch.hpp), so every executor's results compare bit for bit.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core_memory.hpp"
#include "nikki/layout.hpp"
#include "nikki/numerics.hpp"
#include "nikki/runtime/launch.hpp"

namespace nikki::runtime {

/** The elements of one operand view, in row-major order, as (partition, free) pairs; a null
 * address is an element that oob_mode=skip leaves untransferred. */
struct Elements {
  std::vector<uint8_t*> ptr;
  DType dtype = DType::float32;
  int64_t partitions = 1;
  int64_t free = 1;

  uint8_t* at(int64_t p, int64_t f) const { return ptr[p * free + f]; }
  float get(int64_t p, int64_t f) const { return numerics::load_float(dtype, at(p, f)); }
  void set(int64_t p, int64_t f, float v) const { numerics::store_float(dtype, at(p, f), v); }
  int64_t get_int(int64_t p, int64_t f) const { return numerics::load_int(dtype, at(p, f)); }
  void set_int(int64_t p, int64_t f, int64_t v) const { numerics::store_int(dtype, at(p, f), v); }
  int64_t size() const { return static_cast<int64_t>(ptr.size()); }
};

/**
 * The state of one simulated NeuronCore running one kernel: SBUF and PSUM (rows of
 * `row_pitch` bytes, one per partition), a "written by a matmul" flag per 4-byte PSUM word, the
 * HBM tensors' addresses, registers, and the per-partition ScalarE and VectorE accumulators.
 *
 * The large memories are borrowed for the length of a run: bind() returns the Run that holds
 * them, and the addressing functions are valid only while it lives. Between runs the machine
 * keeps only what it derived from the kernel (resident_bytes()).
 */
class Machine {
 public:
  explicit Machine(const Kernel& kernel);
  Machine(const Machine&) = delete;
  Machine& operator=(const Machine&) = delete;

  const Kernel& kernel() const { return kernel_; }
  const TargetConfig& config() const { return config_; }

  // --- runs ---------------------------------------------------------------------------------
  /** The memories of one run: a borrowed CoreMemory and the HBM scratch tensors (zeros). The
   * machine points into them while the run lasts; they are given back when it ends. */
  class Run {
   public:
    explicit Run(Machine& m);
    ~Run();
    Run(const Run&) = delete;
    Run& operator=(const Run&) = delete;

   private:
    Machine& machine_;
    CoreMemoryLease memory_;
    ZeroedMemory scratch_;  // pages committed only where the kernel touches them
  };

  /** Binds the caller's HBM buffers and the memories of one run, and resets the run state; the
   * run lasts as long as the returned object. Outputs get sentinels unless `fill_outputs` is
   * false (later instances of an SPMD grid share earlier ones' outputs). */
  [[nodiscard]] std::unique_ptr<Run> bind(std::span<void* const> inputs, std::span<void* const> outputs,
                                          bool fill_outputs = true);

  /** Fills the storages whose live range begins at instruction `index` with sentinels (not the
   * shared_hbm scratch of a launch whose instances share it: see share_scratch). */
  void begin_instruction(size_t index) {
    for (StorageId id : fills_[index])
      if (!shares_scratch(id)) fill_sentinel(id);
  }

  /** Makes this run's shared_hbm scratch tensors those of the launch (call right after bind()).
   * The first instance publishes its own, filled with sentinels once (the bytes its accesses reach)
   * since a partner may write them before this instance's live range begins; later instances
   * adopt them in allocation order. Throws KernelError when the instances' shared_hbm tensors
   * differ in shape or dtype. */
  void share_scratch(SharedScratch& launch);
  /** Whether HBM scratch tensor `id` is shared with the other instances of the launch. */
  bool shares_scratch(StorageId id) const { return !shared_.empty() && shared_[id]; }

  /** Bytes this machine keeps between runs (its memories are borrowed per run, not counted). */
  size_t resident_bytes() const;

  // --- memories and addressing (while a run lasts) ------------------------------------------
  /** Bytes from one partition's row of SBUF or PSUM to the next. */
  int64_t row_pitch(Buffer buffer) const { return buffer == Buffer::sbuf ? sbuf_row_ : psum_row_; }
  /** First byte of SBUF or PSUM (partition 0). */
  uint8_t* memory(Buffer buffer) const { return buffer == Buffer::sbuf ? sbuf_ : psum_; }
  /** Address of an HBM storage's first byte (the caller's buffer, or this run's scratch). */
  uint8_t* hbm(StorageId id) const { return hbm_[id]; }

  /** Address of a storage's first byte (on-chip: its first partition at its byte offset). */
  uint8_t* storage_base(StorageId id) const {
    const Storage& s = kernel_.storages[id];
    if (is_hbm(s.buffer)) return hbm_[id];
    return memory(s.buffer) + s.address->partition * row_pitch(s.buffer) + s.address->byte_offset;
  }

  /** Address of element `e` (row-major over the storage's shape, in elements of `dtype`). */
  uint8_t* element(StorageId id, DType dtype, int64_t e) const;

  /** The "written by a matmul since allocation" flag of the 4-byte PSUM word holding `psum_byte`. */
  uint8_t& psum_written(const uint8_t* psum_byte) const { return psum_written_[(psum_byte - psum_) / 4]; }
  /** Working memory of the native routines (native::kScratchFloats floats). */
  float* native_scratch() const { return native_scratch_; }

  /** Whether a storage is an HBM scratch tensor (memory of the run, not the caller's). */
  bool is_scratch_hbm(StorageId id) const {
    const Storage& s = kernel_.storages[id];
    return s.role == StorageRole::scratch && is_hbm(s.buffer);
  }
  /** The bytes of an HBM scratch tensor that the kernel's accesses can reach. */
  ByteRange scratch_hbm_used(StorageId id) const { return scratch_hbm_used_[id]; }

  /** The elements a view addresses, with runtime offsets applied and bounds-checked. */
  Elements resolve(const Instruction& inst, const AccessPattern& ap) const;
  Elements operand(const Instruction& inst, int slot) const { return resolve(inst, kernel_.view(inst, slot)); }
  /** The operand's elements, or none when the slot holds an immediate or nothing. */
  Elements optional_operand(const Instruction& inst, int slot) const {
    return inst.operands[slot].is_tensor() ? operand(inst, slot) : Elements{};
  }

  /** The bytes of tensor operand `slot`'s elements (a sendrecv's src leaving this core). */
  Payload read_payload(const Instruction& inst, int slot) const;
  /** Stores a payload of the operand's dtype and size into tensor operand `slot` (a sendrecv's dst). */
  void write_payload(const Instruction& inst, int slot, const Payload& payload) const;

  /** Throws the KernelError of a fault at run time (an offset out of bounds, a bad index). */
  [[noreturn]] void runtime_fault(const Instruction& inst, std::string what, std::string hint) const;

  // --- registers and accumulators -----------------------------------------------------------
  int64_t& reg(RegisterId r) { return regs_[r]; }
  int64_t reg(RegisterId r) const { return regs_[r]; }
  /** ScalarE's per-partition accumulators (activation with reduce). */
  std::vector<float>& scalar_acc() { return scalar_acc_; }
  /** VectorE's per-partition accumulators (select_reduce, range_select, tensor_scalar_reduce). */
  std::vector<float>& vector_acc() { return vector_acc_; }

 private:
  static uint64_t next_id();
  void fill_sentinel(StorageId id);
  void mark_scratch_hbm_used();

  const Kernel& kernel_;
  const TargetConfig& config_;
  int64_t sbuf_row_;
  int64_t psum_row_;
  // SBUF, PSUM and their flags belong to a CoreMemory borrowed for the length of a run (bind());
  // null between runs.
  uint8_t* sbuf_ = nullptr;
  uint8_t* psum_ = nullptr;
  uint8_t* psum_written_ = nullptr;  // per 4-byte PSUM word: written by a matmul since allocation
  float* native_scratch_ = nullptr;  // working memory of the native routines
  std::vector<uint8_t*> hbm_;        // base address of every HBM storage
  std::vector<std::pair<StorageId, int64_t>> scratch_hbm_;  // HBM scratch tensors' offsets in one block
  int64_t scratch_hbm_bytes_ = 0;
  std::vector<ByteRange> scratch_hbm_used_;  // bytes of each HBM scratch tensor that accesses can reach
  std::vector<uint8_t> shared_;              // per storage: shared_hbm scratch of the launch (share_scratch)
  std::vector<int64_t> regs_;
  std::vector<float> scalar_acc_;
  std::vector<float> vector_acc_;
  std::vector<std::vector<StorageId>> fills_;  // storages whose live range begins at instruction i
  std::vector<StorageId> output_fills_;        // outputs whose initial fill a run could observe
  uint64_t id_;                                // unique in the process: who used a CoreMemory last
  // The rectangle of rows x bytes per row that the kernel's SBUF and PSUM tensors occupy.
  int64_t sbuf_rows_used_ = 0, sbuf_row_bytes_used_ = 0, psum_rows_used_ = 0, psum_row_bytes_used_ = 0;
};

}  // namespace nikki::runtime
