// The scheduling pass: program order -> per-queue streams with semaphore waits.
//
// Hazards are found on memory footprints at allocated addresses (nikki/hazards.hpp): tensors that
// share bytes over their lifetimes are ordered like accesses to one tensor.
#include <algorithm>
#include <array>
#include <vector>

#include <fmt/format.h>

#include "nikki/hazards.hpp"
#include "nikki/jit/liveness.hpp"
#include "nikki/jit/streams.hpp"

namespace nikki::jit {

namespace {

constexpr int kComputeQueues = 5;  // tensor, vector, scalar, gpsimd, sync

int compute_queue(Engine e) {
  switch (e) {
    case Engine::tensor: return 0;
    case Engine::vector: return 1;
    case Engine::scalar: return 2;
    case Engine::gpsimd: return 3;
    default: return 4;  // sync: control instructions and anything without an engine
  }
}

}  // namespace

std::string queue_name(QueueId q) {
  switch (q.kind) {
    case QueueKind::tensor: return "qTensor";
    case QueueKind::vector: return "qVector";
    case QueueKind::scalar: return "qScalar";
    case QueueKind::gpsimd: return "qGpSimd";
    case QueueKind::sync: return "qSync";
    case QueueKind::dma: return fmt::format("qDMA{}", q.index);
  }
  return "q?";
}

DeviceProgram schedule(Kernel kernel, const ScheduleOptions& options) {
  internal_check(kernel.allocated, "schedule needs an allocated kernel");
  DeviceProgram program;
  const uint32_t dma_queues = kernel.config().dma_queues;
  const int num_queues = kComputeQueues + static_cast<int>(dma_queues);
  program.streams.resize(num_queues);
  const QueueKind kinds[kComputeQueues] = {QueueKind::tensor, QueueKind::vector, QueueKind::scalar, QueueKind::gpsimd,
                                           QueueKind::sync};
  for (int q = 0; q < kComputeQueues; ++q) program.streams[q].queue = {kinds[q], 0};
  for (uint32_t d = 0; d < dma_queues; ++d) program.streams[kComputeQueues + d].queue = {QueueKind::dma, uint16_t(d)};

  const auto& insts = kernel.instructions;
  program.placement.assign(insts.size(), {0, 0});
  using Clock = std::vector<uint32_t>;
  std::vector<Clock> queue_clock(num_queues, Clock(num_queues, 0));  // what each queue knows has completed
  std::vector<uint32_t> count(num_queues, 0);                        // ops issued since the last barrier
  std::vector<Clock> done_clock(insts.size());                       // knowledge when an instruction completes
  std::vector<uint32_t> position_in_epoch(insts.size(), 0);
  hazards::Tracker tracker;
  uint32_t next_dma = 0;
  // A scratch tensor's first instruction also fills the whole tensor with sentinels (NaN / 4),
  // a write to every byte of it, not just to the part the instruction names.
  const std::vector<std::vector<StorageId>> fills = sentinel_fills(kernel, live_ranges(kernel));
  int64_t wait_edges = 0;

  for (uint32_t i = 0; i < insts.size(); ++i) {
    const Instruction& inst = insts[i];
    if (inst.opcode == Opcode::loop_begin || inst.opcode == Opcode::loop_end || is_meeting(inst.opcode)) {
      for (int q = 0; q < num_queues; ++q) {
        program.streams[q].ops.push_back(StreamOp{StreamOp::Kind::barrier, i, {}});
        std::fill(queue_clock[q].begin(), queue_clock[q].end(), 0);
      }
      std::fill(count.begin(), count.end(), 0);
      tracker.clear();  // everything before a barrier has completed
      continue;
    }
    const int q = inst.engine == Engine::dma ? kComputeQueues + int(next_dma++ % dma_queues) : compute_queue(inst.engine);
    hazards::Footprints f = hazards::footprints(kernel, inst, hazards::Placement::address);
    for (StorageId id : fills[i]) f.writes.push_back(hazards::whole_storage(kernel, id, hazards::Placement::address));
    std::vector<uint32_t> deps = tracker.add(i, f);

    // Waits: the latest dependency first, since its completion implies the most.
    StreamOp op{StreamOp::Kind::instruction, i, {}};
    Clock& clock = queue_clock[q];
    for (auto it = deps.rbegin(); it != deps.rend(); ++it) {
      const uint32_t j = *it;
      const int qj = static_cast<int>(program.placement[j].first);
      const uint32_t need = position_in_epoch[j] + 1;
      if (qj == q || clock[qj] >= need) continue;
      if (wait_edges++ == options.drop_dependency) continue;
      op.waits.push_back(SemaphoreWait{uint16_t(qj), need});
      for (int x = 0; x < num_queues; ++x) clock[x] = std::max(clock[x], done_clock[j][x]);
    }
    position_in_epoch[i] = count[q]++;
    clock[q] = count[q];
    done_clock[i] = clock;
    program.placement[i] = {uint32_t(q), uint32_t(program.streams[q].ops.size())};
    program.streams[q].ops.push_back(std::move(op));
  }
  program.kernel = std::move(kernel);
  return program;
}

int64_t count_dependency_waits(const DeviceProgram& program) {
  int64_t n = 0;
  for (const Stream& s : program.streams)
    for (const StreamOp& op : s.ops) n += static_cast<int64_t>(op.waits.size());
  return n;
}

}  // namespace nikki::jit
