// A launch of a kernel: its program instances (the SPMD grid, or the two cores of a logical
// NeuronCore) each run on a simulated NeuronCore of their own, share the caller's HBM buffers,
// and meet where the kernel says so: at nisa.core_barrier and nisa.sendrecv.
//
// The instances run in turn, each until it ends or reaches a meeting instruction with every
// engine queue drained; a meeting completes once all its members have reached it (sendrecv: the
// partners' data moves then), and the instances go on to their next meeting. So instance 0 runs
// to its first barrier, instance 1 to its first barrier, both go on, and so on: one of the
// interleavings the hardware may run, which every correctly synchronized kernel gives the same
// results under.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "nikki/ir.hpp"

namespace nikki::runtime {

/** @brief The elements of one operand view, as a launch moves them between program instances. */
struct Payload {
  DType dtype = DType::float32;
  std::vector<uint8_t> bytes;  // the view's elements in row-major order
  int64_t elements() const { return static_cast<int64_t>(bytes.size() / dtype_size(dtype)); }
};

/** @brief The shared_hbm scratch tensors of a launch: every instance's n-th shared_hbm tensor is
 * the first instance's n-th, as the cores of a logical NeuronCore share the HBM. */
struct SharedScratch {
  struct Tensor {
    const Kernel* kernel;
    StorageId storage;
    uint8_t* base;
  };
  bool published = false;       // the first instance has bound its tensors
  std::vector<Tensor> tensors;  // in allocation order, alive until the launch ends
};

/**
 * @brief A run of one program instance that stops where instances meet. begin() binds the
 * buffers; advance() runs until the program ends or reaches a core_barrier or sendrecv; the next
 * advance() goes on past that instruction. The stream executor and the reference interpreter
 * (with the sanitizer) both run this way.
 */
class InstanceRun {
 public:
  virtual ~InstanceRun() = default;
  /** @brief The verified, allocated kernel the run executes. */
  virtual const Kernel& launched_kernel() const = 0;
  /** @brief Binds the caller's buffers; `fill_outputs` fills the outputs with the sentinels;
   * `shared` (null: a run alone) is the launch's shared_hbm scratch (Machine::share_scratch). */
  virtual void begin(std::span<void* const> inputs, std::span<void* const> outputs, bool fill_outputs,
                     SharedScratch* shared) = 0;
  /** @brief Runs on: the index of the meeting instruction it stopped at, or -1 once the program ended. */
  virtual int64_t advance() = 0;
  /** @brief The elements of tensor operand `slot` of the meeting instruction it stopped at (the
   * sanitizer throws KernelError when they were computed from never-written memory). */
  virtual Payload read_operand(int slot) const = 0;
  /** @brief Stores `payload` (same dtype and size) into tensor operand `slot` of that instruction. */
  virtual void write_operand(int slot, const Payload& payload) = 0;
  /** @brief The meeting it stopped at completed: memory its partners share with it (outputs,
   * writable inputs, shared_hbm scratch) may hold their writes (the sanitizer counts them as valid). */
  virtual void met() {}
  /** @brief Ends a run whose program ended: the sanitizer checks the outputs; memories are released. */
  virtual void finish() = 0;
  /** @brief Releases the memories of a run that will not finish (another instance failed). */
  virtual void abandon() noexcept = 0;
};

/**
 * @brief Runs one launch: `instances[i]` is program instance i (the grid's instances in row-major
 * order; a sendrecv's ranks and a core_barrier's cores number them), all on the same HBM buffers
 * (inputs in parameter order, outputs in return order; the first instance fills the outputs with
 * sentinels when `fill_outputs`). Their shared_hbm scratch tensors are shared too (SharedScratch),
 * and every instance keeps its memories until the last one ends.
 *
 * A core_barrier completes when every instance it names that the launch has is at a core_barrier
 * naming the same cores; a sendrecv when the instance it sends to is at a sendrecv receiving from
 * it and the instance it receives from at one sending to it. Throws KernelError when the instances
 * wait for each other forever (a deadlock: their meetings do not pair up), naming where each one is.
 */
void run_launch(std::span<InstanceRun* const> instances, std::span<void* const> inputs,
                std::span<void* const> outputs, bool fill_outputs = true);

/** @brief Where a program instance of a launch is: stopped at a meeting instruction, or ended. */
struct InstancePlace {
  const Kernel* kernel = nullptr;
  int64_t at = -1;          // the meeting instruction it waits at, or -1: ended
  int64_t meetings = 0;     // meetings it completed so far
};

/**
 * @brief The instances that may go on past the meeting they wait at, given where every instance
 * of the launch is (the rules of run_launch). Throws KernelError when some wait and none may go on,
 * or when a meeting names an instance the launch does not have.
 */
std::vector<size_t> completed_meetings(std::span<const InstancePlace> places);

/** @brief The instances whose arrival the meeting instance `i` waits at depends on: a
 * core_barrier's cores in the launch, a sendrecv's two partners. */
std::vector<size_t> meeting_partners(std::span<const InstancePlace> places, size_t i);

}  // namespace nikki::runtime
