// The compile pipeline: named, timed, dumpable stages from a traced kernel to an executable
// program: verify -> allocate -> schedule (engine streams) -> native (LLVM ORC).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "nikki/ir.hpp"
#include "nikki/jit/cache.hpp"
#include "nikki/jit/native.hpp"
#include "nikki/jit/streams.hpp"

namespace nikki::jit {

/** @brief Wall time of one pipeline stage. */
struct StageTiming {
  std::string stage;
  double milliseconds = 0;
};

/** @brief Which stages to run after verify and allocate. */
struct CompileOptions {
  bool schedule = true;  // build the per-engine streams
  bool native = false;   // generate native routines through LLVM (needs schedule)
  bool disk_cache = true;  // reuse device programs and native code from NIKKI_CACHE_DIR
  ScheduleOptions schedule_options;
};

/** @brief A compiled kernel: the verified, allocated IR, its device program and native code, and
 * what each stage took. */
struct Program {
  /** @brief The verified, allocated kernel: the device program's when scheduled. */
  const Kernel& kernel() const { return device ? device->kernel : unscheduled; }

  Kernel unscheduled;  // the kernel of a program compiled without scheduling (else empty: no copy)
  std::shared_ptr<const DeviceProgram> device;  // null unless CompileOptions::schedule
  std::shared_ptr<const NativeCode> native;     // null unless CompileOptions::native
  std::vector<StageTiming> timings;
};

/**
 * @brief Runs the stages on `kernel`: verify -> allocate -> schedule -> native. Throws KernelError
 * for user mistakes.
 *
 * With the disk cache, a kernel compiled before (same IR, locations, target, options and nikki
 * build) skips verify, allocate and schedule, and its native code is loaded instead of generated.
 * NIKKI_DUMP=<dir> writes each stage's artifact as <dir>/<kernel>.<n>.<stage>.txt;
 * NIKKI_LOG=stages prints each stage's time to stderr; NIKKI_LOG=cache says which cache entries were
 * rejected (damaged, of another key or format) and rebuilt.
 */
Program compile(Kernel kernel, const CompileOptions& options = {});

/** @brief Approximate bytes held by a kernel's IR (instructions, storages, source locations). */
size_t kernel_memory_bytes(const Kernel& kernel);

/** @brief Approximate bytes held by a program: its IR, streams and native code (object code
 * shared with other programs of the same template set is counted in full). */
size_t memory_bytes(const Program& program);

/** @brief The disk-cache key of a kernel's device program: the canonical IR (with the target and
 * source locations), the options that change the program, and the nikki build. */
CacheKey program_cache_key(const Kernel& kernel, const CompileOptions& options, const Hash128& build);

}  // namespace nikki::jit
