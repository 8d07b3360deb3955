#include "nikki/runtime/launch.hpp"

#include <algorithm>
#include <string>

#include <fmt/format.h>

#include "nikki/ir_printer.hpp"

namespace nikki::runtime {

namespace {

const Instruction* waiting_at(const InstancePlace& place) {
  return place.at >= 0 ? &place.kernel->instructions[size_t(place.at)] : nullptr;
}

bool waits_at(const InstancePlace& place, Opcode op) {
  const Instruction* inst = waiting_at(place);
  return inst && inst->opcode == op;
}

/** The cores a core_barrier names, or a sendrecv's {send_to, recv_from, pipe_id}. */
const std::vector<int32_t>& lanes(const InstancePlace& place, const Instruction& inst) {
  return place.kernel->rare(inst).lanes;
}

SendRecvRanks ranks_of(const InstancePlace& place, const Instruction& inst) {
  return SendRecvRanks::of(place.kernel->rare(inst));
}

/** The instances a core_barrier waits for: the cores it names that the launch has. */
std::vector<size_t> barrier_members(const InstancePlace& place, const Instruction& inst, size_t instances) {
  std::vector<size_t> members;
  for (int32_t core : lanes(place, inst))
    if (core >= 0 && size_t(core) < instances) members.push_back(size_t(core));
  std::sort(members.begin(), members.end());
  return members;
}

std::string ordinal(int64_t n) {
  const int64_t tens = n % 100, ones = n % 10;
  const char* suffix = tens >= 11 && tens <= 13 ? "th" : ones == 1 ? "st" : ones == 2 ? "nd" : ones == 3 ? "rd" : "th";
  return fmt::format("{}{}", n, suffix);
}

/** "instance 1 waits at its 3rd meeting, core_barrier at kernel.py:12" or "instance 1 ended after 2 meetings". */
std::string place_text(const InstancePlace& place, size_t i) {
  const Instruction* inst = waiting_at(place);
  if (!inst) return fmt::format("instance {} ended after {} meeting{}", i, place.meetings, place.meetings == 1 ? "" : "s");
  std::string what(opcode_name(inst->opcode));
  if (inst->opcode == Opcode::core_barrier) {
    what += fmt::format("(cores=[{}])", fmt::join(lanes(place, *inst), ", "));
  } else {
    const SendRecvRanks r = ranks_of(place, *inst);
    what += fmt::format("(send_to_rank={}, recv_from_rank={})", r.send_to, r.recv_from);
  }
  return fmt::format("instance {} waits at its {} meeting, {} at {}", i, ordinal(place.meetings + 1), what,
                     place.kernel->location(inst->loc).str());
}

[[noreturn]] void fail_at(const InstancePlace& place, std::string what, std::string limit, std::string hint) {
  const Instruction& inst = *waiting_at(place);
  throw KernelError(std::move(what), place.kernel->location(inst.loc), to_string(*place.kernel, inst),
                    std::move(limit), std::move(hint));
}

void check_partners(std::span<const InstancePlace> places, size_t i) {
  const InstancePlace& place = places[i];
  const Instruction& inst = *waiting_at(place);
  const size_t n = places.size();
  if (inst.opcode == Opcode::core_barrier) {
    const std::vector<size_t> members = barrier_members(place, inst, n);
    if (!std::binary_search(members.begin(), members.end(), i))
      fail_at(place, fmt::format("core_barrier on program instance {} names cores that leave it out", i),
              "a core waits at a barrier with the other cores it names", "name this instance among cores, e.g. (0, 1)");
    return;
  }
  const SendRecvRanks r = ranks_of(place, inst);
  for (auto [rank, role] : {std::pair{r.send_to, "send_to_rank"}, std::pair{r.recv_from, "recv_from_rank"}})
    if (rank < 0 || size_t(rank) >= n)
      fail_at(place, fmt::format("sendrecv of program instance {} has {}={}, but the launch has {} instance{}", i, role,
                                 rank, n, n == 1 ? "" : "s"),
              fmt::format("ranks are the launch's program instances, 0 to {}", n - 1),
              n == 1 ? "launch the kernel on two cores (kernel[2], or NEURON_LOGICAL_NC_CONFIG=2)"
                     : "send to and receive from an instance of the launch");
}

}  // namespace

std::vector<size_t> completed_meetings(std::span<const InstancePlace> places) {
  const size_t n = places.size();
  std::vector<uint8_t> go(n, 0);
  for (size_t i = 0; i < n; ++i) {
    if (places[i].at < 0) continue;
    check_partners(places, i);
    const Instruction& inst = *waiting_at(places[i]);
    if (inst.opcode != Opcode::core_barrier) continue;
    const std::vector<size_t> members = barrier_members(places[i], inst, n);
    go[i] = std::all_of(members.begin(), members.end(), [&](size_t m) {
      return waits_at(places[m], Opcode::core_barrier) &&
             barrier_members(places[m], *waiting_at(places[m]), n) == members;
    });
  }
  // sendrecv: an instance goes on when the instance it sends to receives from it and the one it
  // receives from sends to it, both going on too (the largest such set: a ring completes at once).
  std::vector<uint8_t> exchange(n, 0);
  for (size_t i = 0; i < n; ++i) exchange[i] = waits_at(places[i], Opcode::sendrecv);
  auto ranks = [&](size_t i) { return ranks_of(places[i], *waiting_at(places[i])); };
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t i = 0; i < n; ++i) {
      if (!exchange[i]) continue;
      const SendRecvRanks r = ranks(i);
      const size_t to = size_t(r.send_to), from = size_t(r.recv_from);
      const bool paired = (to == i || (exchange[to] && ranks(to).recv_from == int32_t(i))) &&
                          (from == i || (exchange[from] && ranks(from).send_to == int32_t(i)));
      if (!paired) exchange[i] = 0, changed = true;
    }
  }
  std::vector<size_t> out;
  for (size_t i = 0; i < n; ++i)
    if (go[i] || exchange[i]) out.push_back(i);
  const auto waiting = std::find_if(places.begin(), places.end(), [](const InstancePlace& p) { return p.at >= 0; });
  if (out.empty() && waiting != places.end()) {
    std::string where;
    for (size_t i = 0; i < n; ++i) where += fmt::format("; {}", place_text(places[i], i));
    fail_at(*waiting,
            fmt::format("the program instances of the launch wait for each other forever{}", where),
            "each instance's n-th core_barrier or sendrecv meets its partners' n-th: every instance passes the "
            "same meetings in the same order",
            "run the same barriers and sendrecvs on every instance (the same loop trip counts and conditions)");
  }
  return out;
}

std::vector<size_t> meeting_partners(std::span<const InstancePlace> places, size_t i) {
  const Instruction& inst = *waiting_at(places[i]);
  if (inst.opcode == Opcode::core_barrier) return barrier_members(places[i], inst, places.size());
  const SendRecvRanks r = ranks_of(places[i], inst);
  return {size_t(r.send_to), size_t(r.recv_from)};
}

void run_launch(std::span<InstanceRun* const> instances, std::span<void* const> inputs,
                std::span<void* const> outputs, bool fill_outputs) {
  const size_t n = instances.size();
  std::vector<InstancePlace> places(n);
  std::vector<uint8_t> begun(n, 0), bound(n, 0), running(n, 1);
  // The instances' shared_hbm scratch is the first one's; its memories (and so every instance's)
  // stay bound until the last instance ends. A run alone keeps its scratch to itself.
  SharedScratch shared;
  SharedScratch* sharing = n > 1 ? &shared : nullptr;
  try {
    for (;;) {
      // Each instance in turn, until it ends or meets.
      for (size_t i = 0; i < n; ++i) {
        if (!running[i]) continue;
        if (!begun[i]) {
          places[i].kernel = &instances[i]->launched_kernel();
          begun[i] = bound[i] = 1;
          instances[i]->begin(inputs, outputs, fill_outputs && i == 0, sharing);
        }
        places[i].at = instances[i]->advance();
        running[i] = 0;
      }
      if (std::all_of(places.begin(), places.end(), [](const InstancePlace& p) { return p.at < 0; })) {
        for (size_t i = 0; i < n; ++i) {
          bound[i] = 0;  // finish() releases the memories, also when its checks throw
          instances[i]->finish();
        }
        return;
      }
      const std::vector<size_t> go = completed_meetings(places);
      // sendrecv: every payload leaves its instance before any arrives (src and dst may overlap).
      std::vector<Payload> sent(n);
      for (size_t i : go)
        if (waits_at(places[i], Opcode::sendrecv)) sent[i] = instances[i]->read_operand(1);
      for (size_t i : go) {
        if (waits_at(places[i], Opcode::sendrecv)) {
          const Instruction& inst = *waiting_at(places[i]);
          const size_t from = size_t(ranks_of(places[i], inst).recv_from);
          const Payload& p = sent[from];
          const AccessPattern dst = places[i].kernel->view(inst, 0);
          if (p.dtype != dst.dtype || p.elements() != dst.num_elements())
            fail_at(places[i],
                    fmt::format("sendrecv: instance {} receives {} {} elements from instance {} into dst '{}' of {} "
                                "{} elements",
                                i, p.elements(), info(p.dtype).name, from, places[i].kernel->storage(dst.storage).name,
                                dst.num_elements(), info(dst.dtype).name),
                    "a sendrecv's dst has the dtype and size of the src its partner sends",
                    "give src and dst the same shape and dtype on every instance");
          instances[i]->write_operand(0, p);
        }
        instances[i]->met();
        ++places[i].meetings;
        running[i] = 1;
      }
    }
  } catch (...) {
    for (size_t i = 0; i < n; ++i)
      if (bound[i]) instances[i]->abandon();
    throw;
  }
}

}  // namespace nikki::runtime
