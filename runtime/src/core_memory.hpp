// The simulated core's large memories, borrowed for the length of one run (internal to runtime/).
//
// SBUF, PSUM and the native routines' scratch of one core take tens of megabytes. When every
// compiled program kept its own, a process that met many kernels (a test suite, a training loop
// with changing shapes) held gigabytes of memories that were idle between runs. A correct kernel
// never sees what an earlier run left (each tensor is filled with sentinels or overwritten where
// its live range begins), so executors take one from a small process-wide pool when a run starts
// and give it back when it ends. A kernel with a missing dependency (which can read a tile before
// it is written) never sees another kernel's values: Machine::Run clears the extent a kernel's
// tensors occupy when the memory's last user was another machine, so such a kernel sees zeros
// there, or its own previous run's values, as when each executor owned its memories.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "nikki/runtime/executor.hpp"

namespace nikki::runtime {

/** @brief One core's SBUF, PSUM, PSUM "written" flags and native scratch. */
struct CoreMemory {
  size_t sbuf_bytes = 0, psum_bytes = 0;
  uint64_t last_user = 0;  // the Machine::id of its last run (0: none yet)
  std::unique_ptr<uint8_t[]> sbuf;          // contents undefined until a run writes them
  std::unique_ptr<uint8_t[]> psum;          // likewise
  std::unique_ptr<uint8_t[]> psum_written;  // one flag per 4-byte PSUM word, zero when new
  std::unique_ptr<float[]> native_scratch;  // native::kScratchFloats floats for the native routines
};

/** @brief A CoreMemory of the given sizes for the lifetime of the lease: an idle one from the
 * pool when there is one, else a new one. The pool keeps at most kIdleCoreMemories idle. */
class CoreMemoryLease {
 public:
  CoreMemoryLease(size_t sbuf_bytes, size_t psum_bytes);
  ~CoreMemoryLease();
  CoreMemoryLease(const CoreMemoryLease&) = delete;
  CoreMemoryLease& operator=(const CoreMemoryLease&) = delete;

  CoreMemory& operator*() const { return *memory_; }
  CoreMemory* operator->() const { return memory_.get(); }

 private:
  std::unique_ptr<CoreMemory> memory_;
};

/** @brief How many memories the pool keeps idle at most: enough for a few threads running
 * kernels at once without reallocating, few enough to stay a small part of a process. */
inline constexpr size_t kIdleCoreMemories = 2;

/**
 * @brief Zero-filled memory whose pages the OS commits only when they are first written: a
 * simulated memory then costs the host what a kernel touches of it, not its capacity (an SPMD
 * launch holds one simulated core per program instance, and HBM scratch tensors can be gigabytes).
 */
class ZeroedMemory {
 public:
  ZeroedMemory() = default;
  /** Reserves `bytes` of address space; throws KernelError when the host cannot. */
  explicit ZeroedMemory(size_t bytes);
  ZeroedMemory(ZeroedMemory&& o) noexcept;
  ZeroedMemory& operator=(ZeroedMemory&& o) noexcept;
  ZeroedMemory(const ZeroedMemory&) = delete;
  ZeroedMemory& operator=(const ZeroedMemory&) = delete;
  ~ZeroedMemory();

  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  uint8_t& operator[](size_t i) const { return data_[i]; }

 private:
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace nikki::runtime
