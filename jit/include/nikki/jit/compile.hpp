// The compile pipeline: named, timed, dumpable stages from a traced kernel to an executable
// program. Today: verify -> allocate. Scheduling into engine streams and native code generation
// are later stages of the same pipeline.
#pragma once

#include <string>
#include <vector>

#include "nikki/ir.hpp"

namespace nikki::jit {

/** @brief Wall time of one pipeline stage. */
struct StageTiming {
  std::string stage;
  double milliseconds = 0;
};

/** @brief A compiled kernel: the verified, allocated IR plus what each stage took. */
struct Program {
  Kernel kernel;
  std::vector<StageTiming> timings;
};

/**
 * @brief Runs every stage on `kernel`. Throws KernelError for user mistakes.
 *
 * NIKKI_DUMP=<dir> writes each stage's artifact as <dir>/<kernel>.<n>.<stage>.txt;
 * NIKKI_LOG=stages prints each stage's time to stderr.
 */
Program compile(Kernel kernel);

}  // namespace nikki::jit
