// The library kernels' one way to pipeline work across engines: a list scheduler run at trace
// time.
//
// A kernel records its work as tasks, in the order its maths defines (declaration order): each
// task is the few instructions one call emits on one engine. Everything else is derived from the
// instructions themselves: a task's engine, its estimated duration (the published cost model,
// nikki/cost_model.hpp, the same one the timing model uses) and its dependencies (every
// read-after-write, write-after-read and write-after-write against the tasks recorded before it,
// from the instructions' memory footprints, nikki/hazards.hpp). run() then simulates the engines
// greedily and emits the tasks in simulated start order. Since every hazard of the declaration
// order is kept, the program means what the declaration order means; only the overlap changes.
// Multi-buffering comes from the buffers a kernel rotates through (toolkit/buffers.hpp): reusing
// a slot depends on every task that used its previous occupant, so a ring of n slots lets work
// run up to n - 1 tiles ahead, and no kernel declares a dependency by hand.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <initializer_list>
#include <string_view>
#include <vector>

#include "nikki/cost_model.hpp"
#include "nikki/hazards.hpp"
#include "nikki/nikki.hpp"

namespace nikki::kernels::toolkit {

/** @brief How run() orders the tasks. */
enum class TaskOrder : uint8_t {
  simulated,  // the greedy simulation's start order (the default)
  declared,   // declaration order: the program as written, for tests that compare the two
};

/** @brief NIKKI_TASK_ORDER=declared makes every library kernel emit its tasks as declared. */
inline TaskOrder task_order_from_env() {
  const char* v = std::getenv("NIKKI_TASK_ORDER");
  if (v == nullptr || std::string_view(v).empty() || std::string_view(v) == "simulated") return TaskOrder::simulated;
  if (std::string_view(v) == "declared") return TaskOrder::declared;
  throw KernelError(std::string("NIKKI_TASK_ORDER=") + v + " is not a task order", SourceLocation{}, {}, {},
                    "use NIKKI_TASK_ORDER=simulated (the default) or NIKKI_TASK_ORDER=declared");
}

/**
 * @brief Orders a kernel's tasks by a simulation of the engines. Record tasks with add() (or
 * add_any() for work that can run on one of several engines), then call run() once.
 */
class TaskScheduler {
 public:
  TaskScheduler() : builder_(KernelBuilder::current(std::source_location::current())), order_(task_order_from_env()) {}
  TaskScheduler(const TaskScheduler&) = delete;
  TaskScheduler& operator=(const TaskScheduler&) = delete;

  /**
   * @brief Records a task: runs `emit` now and holds its instructions back until run(). Returns
   * the task's id, or -1 when `emit` emitted nothing. `priority` orders DMA transfers that are
   * ready together (lower first); by default a transfer goes in the order its data is needed.
   */
  int add(const std::function<void()>& emit, double priority = kWhenNeeded) { return add_any({emit}, priority); }

  /**
   * @brief Records a task coded several ways, typically the same copy on the Vector or on the
   * Scalar engine: the simulation takes the alternative that would finish first. Every
   * alternative must touch the same memory.
   */
  int add_any(std::initializer_list<std::function<void()>> alternatives, double priority = kWhenNeeded) {
    const int id = int(tasks_.size());
    const Kernel& k = builder_.kernel();
    const size_t storages = k.storages.size();
    Task task;
    task.priority = priority;
    hazards::Footprints f;
    for (const std::function<void()>& emit : alternatives) {
      const size_t mark = builder_.num_instructions();
      emit();
      Alternative alt{Engine::unknown, 0.0, {}, builder_.take_instructions_since(mark)};
      for (const Instruction& inst : alt.code) {
        internal_check(alt.engine == Engine::unknown || alt.engine == inst.engine,
                       "task scheduler: a task's instructions run on more than one engine");
        alt.engine = inst.engine;
        alt.ns += cost::busy_ns(k, inst);
        const cost::SharedPorts ports = cost::shared_ports(k, inst);
        alt.ports.sbuf = alt.ports.sbuf || ports.sbuf;
        alt.ports.psum = alt.ports.psum || ports.psum;
        hazards::add_footprints(k, inst, hazards::Placement::storage, f);
      }
      if (!alt.code.empty()) task.alternatives.push_back(std::move(alt));
    }
    internal_check(k.storages.size() == storages, "task scheduler: a task allocates a tensor; allocate before it");
    if (task.alternatives.empty()) return -1;
    for (uint32_t dep : tracker_.add(uint32_t(id), f)) task.deps.push_back(int(dep));
    tasks_.push_back(std::move(task));
    return id;
  }

  /** @brief Emits every recorded task, in simulated start order (or as declared, see TaskOrder). */
  void run() {
    if (order_ == TaskOrder::declared) {
      for (Task& t : tasks_) emit(t, 0);
    } else {
      simulate();
    }
    tasks_.clear();
    dependents_.clear();
    tracker_.clear();
  }

  /** @brief Tasks recorded and not yet emitted. */
  size_t size() const { return tasks_.size(); }

 private:
  static constexpr double kWhenNeeded = -1.0;
  static constexpr double kClearlyShorter = 0.99;

  struct Alternative {
    Engine engine;
    double ns;  // estimated busy time of its engine
    cost::SharedPorts ports;  // the shared on-chip ports it holds meanwhile (NeuronCore-v2)
    std::vector<Instruction> code;
  };
  struct Task {
    std::vector<Alternative> alternatives;
    std::vector<int> deps;  // earlier tasks, sorted
    double priority = kWhenNeeded;
  };

  void emit(Task& t, size_t alternative) {
    for (Instruction& inst : t.alternatives[alternative].code) builder_.append(std::move(inst));
  }

  static double shortest(const Task& t) {
    double ns = t.alternatives[0].ns;
    for (const Alternative& a : t.alternatives) ns = std::min(ns, a.ns);
    return ns;
  }

  static int unit(Engine e) {
    switch (e) {
      case Engine::tensor: return 0;
      case Engine::vector: return 1;
      case Engine::scalar: return 2;
      case Engine::gpsimd: return 3;
      case Engine::dma: return 4;
      default: return 5;  // sync: control instructions
    }
  }
  static constexpr int kUnits = 6;

  /** How a simulation picks among a task's alternatives. */
  enum class Choice {
    earliest_finish,  // the alternative that would finish first, when the task is scheduled
    balanced,         // fixed beforehand: each to the engine with the least work assigned so far
  };

  /** The tasks in simulated start order, each with its alternative, and the simulated end. */
  struct Schedule {
    std::vector<std::pair<int, size_t>> order;
    double makespan = 0;
  };

  /**
   * Simulates both ways of choosing alternatives and emits the schedule that ends first. Choosing
   * the alternative that would finish first is blind to the work still to come: it gives a fast
   * engine flexible work that the engine's own tasks later wait behind. Balancing the engines'
   * total work instead is blind to timing. Neither wins everywhere. The balanced schedule has to
   * be clearly shorter to be taken: the simulation approximates the timing model, and a kernel's
   * schedule should not flip on differences within that approximation.
   */
  void simulate() {
    const size_t n = tasks_.size();
    dependents_.assign(n, {});
    for (size_t i = 0; i < n; ++i)
      for (int j : tasks_[i].deps) dependents_[size_t(j)].push_back(int(i));
    set_transfer_priorities();
    Schedule best = simulate(Choice::earliest_finish);
    const bool flexible = std::any_of(tasks_.begin(), tasks_.end(), [](const Task& t) { return t.alternatives.size() > 1; });
    if (flexible) {
      Schedule balanced = simulate(Choice::balanced);
      if (balanced.makespan < kClearlyShorter * best.makespan) best = std::move(balanced);
    }
    for (const auto& [id, alternative] : best.order) emit(tasks_[size_t(id)], alternative);
  }

  /**
   * When a transfer's data is needed: the compute work declared before its first reader (or
   * before the transfer itself, for one nobody reads, such as a store), so loads go in the order
   * the program consumes them and stores after the loads needed before them.
   */
  void set_transfer_priorities() {
    const size_t n = tasks_.size();
    std::vector<double> declared_work(n, 0.0);
    for (size_t i = 1; i < n; ++i) {
      const Task& prev = tasks_[i - 1];
      declared_work[i] = declared_work[i - 1] + (prev.alternatives[0].engine == Engine::dma ? 0.0 : shortest(prev));
    }
    for (size_t i = 0; i < n; ++i) {
      Task& task = tasks_[i];
      if (task.priority != kWhenNeeded) continue;
      task.priority = declared_work[i];
      for (int d : dependents_[i]) task.priority = std::min(task.priority, declared_work[size_t(d)]);
    }
  }

  /** For Choice::balanced: each task's alternative, in declaration order the one whose engine
   *  then has the least estimated work in total. */
  std::vector<size_t> balanced_choices() const {
    double assigned[kUnits] = {0, 0, 0, 0, 0, 0};
    std::vector<size_t> choice(tasks_.size(), 0);
    for (size_t i = 0; i < tasks_.size(); ++i) {
      const Task& task = tasks_[i];
      for (size_t a = 1; a < task.alternatives.size(); ++a) {
        const Alternative &cand = task.alternatives[a], &inc = task.alternatives[choice[i]];
        if (assigned[unit(cand.engine)] + cand.ns < assigned[unit(inc.engine)] + inc.ns) choice[i] = a;
      }
      const Alternative& chosen = task.alternatives[choice[i]];
      assigned[unit(chosen.engine)] += chosen.ns;
    }
    return choice;
  }

  /**
   * The greedy simulation: each engine is an in-order queue with its clock; a DMA transfer pays
   * the fixed latency, then holds the shared bandwidth for its data; an engine's task waits for
   * the on-chip ports it shares with another engine (NeuronCore-v2). Among the ready tasks, the
   * ones that can start earliest compete: the one with the longest chain of work behind it
   * (critical path first), except that DMA transfers among themselves go by priority, since
   * they share one bandwidth in the order they are issued.
   */
  Schedule simulate(Choice choice) const {
    const TargetConfig& t = builder_.config();
    const size_t n = tasks_.size();
    const std::vector<size_t> fixed = choice == Choice::balanced ? balanced_choices() : std::vector<size_t>{};
    auto duration = [&](size_t i) { return fixed.empty() ? shortest(tasks_[i]) : tasks_[i].alternatives[fixed[i]].ns; };
    std::vector<int> waiting(n, 0);
    std::vector<double> ready(n, 0.0);
    std::vector<int> candidates;
    for (size_t i = 0; i < n; ++i) {
      waiting[i] = int(tasks_[i].deps.size());
      if (waiting[i] == 0) candidates.push_back(int(i));
    }
    // Bottom level: the longest chain of estimated durations from a task to the end.
    std::vector<double> level(n, 0.0);
    for (size_t i = n; i-- > 0;) {
      double after = 0;
      for (int d : dependents_[i]) after = std::max(after, level[size_t(d)]);
      level[i] = duration(i) + after;
    }
    double free[kUnits] = {0, 0, 0, 0, 0, 0};
    double sbuf_port_free = 0, psum_port_free = 0;
    auto timing = [&](int id, const Alternative& a) {  // (start, end) of alternative a
      const int u = unit(a.engine);
      const double r = ready[size_t(id)];
      if (a.engine == Engine::dma) {
        // Issued when its data phase could follow the previous transfer's, so that the transfers
        // ready by then go in priority order.
        return std::pair<double, double>{std::max(r, free[u] - t.dma_fixed_latency_ns),
                                         std::max(r + t.dma_fixed_latency_ns, free[u]) + a.ns};
      }
      const double start =
          std::max({free[u], r, a.ports.sbuf ? sbuf_port_free : 0.0, a.ports.psum ? psum_port_free : 0.0});
      return std::pair<double, double>{start, start + a.ns};
    };
    struct Option {
      size_t alternative = 0;
      double start = 0, end = 0;
    };
    std::vector<Option> options;
    Schedule schedule;
    for (size_t done = 0; done < n; ++done) {
      options.assign(candidates.size(), Option{});
      double earliest = 0;
      for (size_t c = 0; c < candidates.size(); ++c) {
        const size_t id = size_t(candidates[c]);
        const Task& task = tasks_[id];
        Option& o = options[c];
        for (size_t a = 0; a < task.alternatives.size(); ++a) {
          if (!fixed.empty() && a != fixed[id]) continue;
          auto [s, e] = timing(candidates[c], task.alternatives[a]);
          if (o.end == 0 || e < o.end) o = Option{a, s, e};
        }
        if (c == 0 || o.start < earliest) earliest = o.start;
      }
      size_t best = candidates.size();
      for (size_t c = 0; c < candidates.size(); ++c) {
        if (options[c].start > earliest) continue;
        if (best == candidates.size()) {
          best = c;
          continue;
        }
        const Task &cand = tasks_[size_t(candidates[c])], &inc = tasks_[size_t(candidates[best])];
        const bool both_dma = cand.alternatives[0].engine == Engine::dma && inc.alternatives[0].engine == Engine::dma;
        const double lc = level[size_t(candidates[c])], lb = level[size_t(candidates[best])];
        const bool better = both_dma ? cand.priority < inc.priority ||
                                           (cand.priority == inc.priority && options[c].start < options[best].start)
                                     : lc > lb || (lc == lb && options[c].start < options[best].start);
        if (better) best = c;
      }
      internal_check(best < candidates.size(), "task scheduler: the task graph has a cycle");
      const int id = candidates[best];
      const Option o = options[best];
      candidates.erase(candidates.begin() + std::ptrdiff_t(best));
      const Alternative& chosen = tasks_[size_t(id)].alternatives[o.alternative];
      free[unit(chosen.engine)] = o.end;
      if (chosen.ports.sbuf) sbuf_port_free = o.end;
      if (chosen.ports.psum) psum_port_free = o.end;
      schedule.order.emplace_back(id, o.alternative);
      schedule.makespan = std::max(schedule.makespan, o.end);
      for (int d : dependents_[size_t(id)]) {
        ready[size_t(d)] = std::max(ready[size_t(d)], o.end);
        if (--waiting[size_t(d)] == 0) candidates.push_back(d);
      }
    }
    return schedule;
  }

  KernelBuilder& builder_;
  TaskOrder order_;
  std::vector<Task> tasks_;
  std::vector<std::vector<int>> dependents_;  // per task: the later tasks that depend on it
  hazards::Tracker tracker_;
};

}  // namespace nikki::kernels::toolkit
