// What limits a kernel, read from its estimated profile: the roofline position, each engine's busy
// time and idle time by cause, the critical path through the kernel's lines, and the changes that
// would help most. Every figure is an ESTIMATE of the timing model, never a measurement.
#pragma once

#include <string>
#include <vector>

#include "nikki/runtime/profile.hpp"

namespace nikki::runtime {

/** @brief Time a queue sat idle for one reason ("waiting for qVector: exp at k.py:42"). */
struct IdleReason {
  std::string queue;
  std::string reason;
  double ns = 0;
};

/** @brief Time one source line spent on the critical path, on one queue. */
struct PathLine {
  std::string line;    // file:line, or "(no source line)"
  std::string queue;
  std::string opcode;  // its first instruction's opcode
  double ns = 0;
  int64_t instructions = 0;
};

/** @brief A suggested change and the estimated time it is about. */
struct Suggestion {
  std::string text;
  double stake_ns = 0;  // the estimated time the suggestion addresses (ranks suggestions)
};

/** @brief The explanation of one estimated profile. */
struct Explanation {
  std::string kernel, target;
  double total_ns = 0;
  double flops = 0;           // useful FLOPs when given, else the matmul FLOPs executed
  double io_bytes = 0;        // the kernel's inputs and outputs: compulsory HBM traffic
  double compute_roofline_ns = 0, memory_roofline_ns = 0;
  std::string limit;          // one sentence: what limits the kernel
  std::vector<QueueUsage> queues;   // queues that ran something
  std::vector<IdleReason> idle;     // largest first
  std::vector<PathLine> critical_path;  // largest first
  int64_t path_instructions = 0;
  std::vector<Suggestion> suggestions;  // at most three, largest stake first

  /** @brief The explanation as text, labelled as an estimate. */
  std::string text(size_t rows = 5) const;
};

/**
 * @brief Explains a profile of `program` (from runtime::estimate). `useful_flops` > 0 measures the
 * compute roofline by the algorithm's FLOPs instead of the matmul FLOPs executed.
 */
Explanation explain(const Profile& profile, const jit::DeviceProgram& program, double useful_flops = 0);

}  // namespace nikki::runtime
