// The device program: one in-order instruction stream per engine and per DMA queue, synchronized
// by semaphores, as a NeuronCore runs it.
//
// Every queue has a semaphore counting the instructions it has completed since the last barrier.
// An instruction waits until each queue it depends on has completed enough instructions; the
// scheduler derives exactly these waits from read-after-write, write-after-read and
// write-after-write hazards on SBUF, PSUM, HBM and registers, so independent work may overlap in
// time while the program-order meaning of the kernel is kept.
//
// Runtime loops become barriers in every stream: at a barrier all queues have drained, the
// control instruction (loop_begin / loop_end) runs once, and the counts restart from zero. The
// instructions where the program instances of a launch meet (core_barrier, sendrecv) are barriers
// too: the executor stops there until the launch lets the instance go on.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "nikki/ir.hpp"
#include "nikki/jit/allocate.hpp"

namespace nikki::jit {

/** @brief Version of the device-program file format (docs/device-program.md). */
inline constexpr uint32_t kDeviceProgramVersion = 5;

/** @brief The in-order queues of one NeuronCore. */
enum class QueueKind : uint8_t { tensor, vector, scalar, gpsimd, sync, dma };

/** @brief One queue: a compute engine, the sync engine, or DMA queue `index`. */
struct QueueId {
  QueueKind kind = QueueKind::sync;
  uint16_t index = 0;
  friend bool operator==(const QueueId&, const QueueId&) = default;
};

/** @brief "qVector", "qDMA3", ... as the disassembler and profiles name queues. */
std::string queue_name(QueueId q);

/** @brief Waits until queue `queue` (an index into DeviceProgram::streams) has completed `count`
 * instructions since the last barrier. */
struct SemaphoreWait {
  uint16_t queue = 0;
  uint32_t count = 0;
  friend bool operator==(const SemaphoreWait&, const SemaphoreWait&) = default;
};

/** @brief An entry of a stream: an instruction of the kernel, or a barrier for a loop or meeting instruction. */
struct StreamOp {
  enum class Kind : uint8_t { instruction, barrier };
  Kind kind = Kind::instruction;
  uint32_t ir_index = 0;  // the kernel instruction it executes (barrier: the loop_begin / loop_end)
  std::vector<SemaphoreWait> waits;
  friend bool operator==(const StreamOp&, const StreamOp&) = default;
};

/** @brief The instructions of one queue, in issue order. */
struct Stream {
  QueueId queue;
  std::vector<StreamOp> ops;
  friend bool operator==(const Stream&, const Stream&) = default;
};

/** @brief A scheduled kernel: its verified, allocated IR plus the streams that execute it. */
struct DeviceProgram {
  Kernel kernel;
  std::vector<Stream> streams;
  /** For each kernel instruction, the stream (index) and position it was scheduled at. */
  std::vector<std::pair<uint32_t, uint32_t>> placement;
  /** The tensors the allocator spilled to HBM, and the DMAs that move them. */
  std::vector<Spill> spills;
};

/** @brief Options of the scheduling pass. */
struct ScheduleOptions {
  /** Testing hook: drop the n-th semaphore wait (-1: keep all), counting waits instruction by
   * instruction in program order and within an instruction in the order of its `waits`, to prove
   * that tests catch a missing semaphore. */
  int64_t drop_dependency = -1;
};

/**
 * @brief Schedules a verified, allocated kernel into per-queue streams with semaphore waits.
 * DMA transfers are spread round-robin over the target's DMA queues.
 */
DeviceProgram schedule(Kernel kernel, const ScheduleOptions& options = {});

/** @brief Number of dependency edges that needed a semaphore wait (for the drop_dependency hook). */
int64_t count_dependency_waits(const DeviceProgram& program);

/** @brief Human-readable listing: per stream, each op with engine, opcode, operands (buffer,
 * partitions, address, access pattern), semaphore waits and source line. */
std::string disassemble(const DeviceProgram& program);

/** @brief The device program in nikki's binary file format (docs/device-program.md). */
std::vector<uint8_t> serialize(const DeviceProgram& program);

/** @brief The kernel IR alone in the file format's encoding (the content a cache key hashes). */
std::vector<uint8_t> serialize_kernel(const Kernel& kernel);

/** @brief Whether deserialize recomputes the payload checksum. */
enum class PayloadCheck : uint8_t {
  verify,   // bytes from a file or a user
  trusted,  // bytes the disk cache already verified with its own, stronger checksum
};

/** @brief Loads a device program; throws KernelError for a truncated, corrupt or foreign file
 * (the structure is always checked; the FNV-1a checksum unless `check` is trusted). */
DeviceProgram deserialize(const std::vector<uint8_t>& bytes, PayloadCheck check = PayloadCheck::verify);

}  // namespace nikki::jit
