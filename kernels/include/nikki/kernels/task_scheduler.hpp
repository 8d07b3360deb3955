// A list scheduler for library kernels that software-pipeline work across engines at trace time,
// and the on-chip buffer rings it hands out slots of.
//
// A kernel describes its work as tasks (a few instructions on one engine, with an estimated
// duration and the tasks they depend on); the scheduler simulates the engines and emits the
// tasks' instructions in simulated start order. The device program's dependencies still come
// from the JIT's hazard analysis, as for any kernel: the scheduler only chooses program order,
// which is what each engine's in-order queue follows.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <tuple>
#include <utility>
#include <vector>

#include "nikki/cost_formulas.hpp"
#include "nikki/kernels/library.hpp"

namespace nikki::kernels::scheduling {

/**
 * A ring of equally sized slots in one on-chip tensor (dim 1 indexes the slot). A slot is taken
 * for each new occupant; the tasks that use an occupant register with use(), and the first
 * writer of the next occupant of that slot waits for them (take() returns them).
 */
struct Ring {
  Tensor t;
  int64_t n = 1;
  int64_t next = 0;
  std::vector<std::vector<int>> users;

  Ring(Tensor tensor, int64_t slots) : t(std::move(tensor)), n(slots), users(size_t(slots)) {}
  /** The next slot, and the tasks that must finish before it is overwritten. */
  std::pair<int64_t, std::vector<int>> take() {
    const int64_t s = next++ % n;
    std::vector<int> prev = std::move(users[size_t(s)]);
    users[size_t(s)].clear();
    return {s, std::move(prev)};
  }
  void use(int64_t slot, int task) { users[size_t(slot)].push_back(task); }
};

/**
 * Circular allocation of contiguous spans along a tile's last dim, for work items of varying
 * width (key chunks of different lengths): many narrow items or a few wide ones are in flight.
 * take() returns the span's offset and the tasks that used the spans it overwrites.
 */
struct Arena {
  Tensor t;
  int64_t total = 0;
  int64_t head = 0;
  struct Span {
    int64_t begin, end;
    std::vector<int> users;
  };
  std::vector<Span> live;  // in allocation order

  Arena(Tensor tensor, int64_t size) : t(std::move(tensor)), total(size) {}
  std::pair<int64_t, std::vector<int>> take(int64_t width) {
    internal_check(width <= total, "scheduling: arena span larger than the arena");
    if (head + width > total) head = 0;
    const int64_t b = head, e = head + width;
    head = e;
    std::vector<int> deps;
    for (auto it = live.begin(); it != live.end();) {
      if (it->begin < e && b < it->end) {
        deps.insert(deps.end(), it->users.begin(), it->users.end());
        it = live.erase(it);
      } else {
        ++it;
      }
    }
    live.push_back(Span{b, e, {}});
    return {b, std::move(deps)};
  }
  void use(int64_t offset, int task) {
    for (auto it = live.rbegin(); it != live.rend(); ++it)
      if (it->begin == offset) {
        it->users.push_back(task);
        return;
      }
    internal_check(false, "scheduling: arena span not found");
  }
};

enum class Unit : int { tensor, vector, scalar, gpsimd, dma };
inline constexpr int kUnits = 5;

/**
 * Orders the kernel's instructions: a list scheduler run at trace time. Each task is a few
 * instructions on one engine with an estimated duration (the published per-instruction cost
 * formulas, read from the target's table) and the tasks it depends on (data, and reuse of ring
 * slots). run() simulates the engines greedily (among the tasks that can start first, the one
 * with the longest chain of work behind it; a DMA transfer is taken when the shared bandwidth can
 * take its data, the ready transfers in priority order) and emits the tasks in simulated start
 * order. Program order is thus a valid sequential order, and each engine's in-order queue gets
 * its tasks in an order that keeps it busy; the device program's real dependencies come from the
 * scheduler's hazards, as for any kernel. A task's priority only orders DMA transfers (lower
 * first).
 */
class Scheduler {
 public:
  explicit Scheduler(const TargetConfig& t) : t_(t) {}

  int add(Unit unit, double ns, std::vector<int> deps, int64_t priority, std::function<void()> emit) {
    return add_flexible({{unit, ns}}, std::move(deps), priority, [f = std::move(emit)](Unit) { f(); });
  }
  /** A task that may run on any of several engines (with its duration on each): the simulation
   *  picks the one that finishes it first and passes it to `emit`. */
  int add_flexible(std::vector<std::pair<Unit, double>> choices, std::vector<int> deps, int64_t priority,
                   std::function<void(Unit)> emit) {
    const int id = int(tasks_.size());
    tasks_.push_back(Task{std::move(choices), std::move(deps), priority, std::move(emit)});
    return id;
  }
  /** Adds a dependency of `task` on `dep` (ignored when either is -1). */
  void depend(int task, int dep) {
    if (task >= 0 && dep >= 0) tasks_[size_t(task)].deps.push_back(dep);
  }

  // Estimated durations in ns of the instruction kinds the kernels use.
  double matmul(int64_t m, int64_t n, bool wide) const {
    return cost::matmul_cycles(t_, m, n, wide) / t_.clock_ghz.tensor;
  }
  double transpose(int64_t partitions, int64_t free) const {
    return cost::pe_transpose_cycles(t_, partitions, free) / t_.clock_ghz.tensor;
  }
  /** Cycles of a Vector-engine pass over n elements of 16-bit data in SBUF: the engine's fast
   *  mode processes two per cycle where the target has it. */
  double vector_stream_cycles(int64_t n) const { return double(n) / (t_.vector_perf_mode ? 2 : 1); }
  /** Partitions of the target (a full tile's rows). */
  int64_t partitions() const { return int64_t(t_.num_partitions); }
  /** An engine instruction streaming `cycles` (already divided by its speed-up). */
  double engine(Unit u, double cycles, int64_t free_size) const {
    double c = std::max(double(t_.min_ii_cycles), cycles);
    if (free_size < int64_t(t_.pe_array_cols)) c += t_.static_overhead_cycles;
    const double ghz = u == Unit::vector ? t_.clock_ghz.vector : u == Unit::scalar ? t_.clock_ghz.scalar : t_.clock_ghz.gpsimd;
    return c / ghz;
  }
  double dma(int64_t bytes, int64_t rows) const { return cost::dma_data_ns(t_, bytes, rows); }

  void run() {
    const size_t n = tasks_.size();
    std::vector<int> waiting(n, 0);
    std::vector<double> ready(n, 0.0);
    std::vector<std::vector<int>> dependents(n);
    std::vector<int> candidates;
    for (size_t i = 0; i < n; ++i) {
      std::vector<int>& d = tasks_[i].deps;
      d.erase(std::remove(d.begin(), d.end(), -1), d.end());  // -1: no such task
      std::sort(d.begin(), d.end());
      d.erase(std::unique(d.begin(), d.end()), d.end());
      for (int j : d) {
        internal_check(j >= 0 && size_t(j) < i, "scheduling: a task depends on a later task");
        dependents[size_t(j)].push_back(int(i));
      }
      waiting[i] = int(d.size());
      if (d.empty()) candidates.push_back(int(i));
    }
    double free[kUnits] = {0, 0, 0, 0, 0};
    auto timing = [&](int id, const std::pair<Unit, double>& c) {  // (start, end) on choice c
      const int u = int(c.first);
      if (c.first == Unit::dma) {  // a fixed latency, then the shared bandwidth, one transfer at a time
        // A transfer is taken (issued) when its data phase could follow the previous one's, so that
        // the transfers ready by then go in priority order.
        const double r = ready[size_t(id)];
        return std::pair<double, double>{std::max(r, free[u] - t_.dma_fixed_latency_ns),
                                         std::max(r + t_.dma_fixed_latency_ns, free[u]) + c.second};
      }
      const double start = std::max(free[u], ready[size_t(id)]);
      return std::pair<double, double>{start, start + c.second};
    };
    // Bottom level: the longest chain of estimated durations from a task to the end of the kernel.
    std::vector<double> level(n, 0.0);
    for (size_t i = n; i-- > 0;) {
      double c = tasks_[i].choices[0].second;
      for (const auto& ch : tasks_[i].choices) c = std::min(c, ch.second);
      double after = 0;
      for (int dpt : dependents[i]) after = std::max(after, level[size_t(dpt)]);
      level[i] = c + after;
    }
    struct Option {
      int choice;
      double start, end;
    };
    std::vector<Option> options;
    for (size_t done = 0; done < n; ++done) {
      // Each candidate on the engine that finishes it first; then, among the candidates that can
      // start earliest, the one with the longest chain of work behind it (critical path first).
      options.resize(candidates.size());
      double earliest = 0;
      for (size_t k = 0; k < candidates.size(); ++k) {
        const Task& t = tasks_[size_t(candidates[k])];
        Option o{0, 0, 0};
        std::tie(o.start, o.end) = timing(candidates[k], t.choices[0]);
        for (size_t c = 1; c < t.choices.size(); ++c) {
          auto [s2, e2] = timing(candidates[k], t.choices[c]);
          if (e2 < o.end) o = Option{int(c), s2, e2};
        }
        options[k] = o;
        if (k == 0 || o.start < earliest) earliest = o.start;
      }
      size_t best = 0;
      int best_choice = -1;
      double best_start = 0, best_end = 0;
      for (size_t k = 0; k < candidates.size(); ++k) {
        const Option& o = options[k];
        if (o.start > earliest) continue;
        const Task& cand = tasks_[size_t(candidates[k])];
        bool better = best_choice < 0;
        if (!better) {
          const Task& incumbent = tasks_[size_t(candidates[best])];
          const double lk = level[size_t(candidates[k])], lb = level[size_t(candidates[best])];
          // DMA transfers share one bandwidth: they go in the order their items need them.
          if (cand.choices[0].first == Unit::dma && incumbent.choices[0].first == Unit::dma)
            better = cand.priority < incumbent.priority || (cand.priority == incumbent.priority && o.start < best_start);
          else
            better = lk > lb || (lk == lb && o.start < best_start);
        }
        if (better) {
          best = k;
          best_choice = o.choice;
          best_start = o.start;
          best_end = o.end;
        }
      }
      internal_check(best_choice >= 0, "scheduling: the task graph has a cycle");
      const int id = candidates[best];
      candidates.erase(candidates.begin() + std::ptrdiff_t(best));
      Task& t = tasks_[size_t(id)];
      const Unit unit = t.choices[size_t(best_choice)].first;
      free[int(unit)] = best_end;
      t.emit(unit);
      for (int dpt : dependents[size_t(id)]) {
        ready[size_t(dpt)] = std::max(ready[size_t(dpt)], best_end);
        if (--waiting[size_t(dpt)] == 0) candidates.push_back(dpt);
      }
    }
  }

 private:
  struct Task {
    std::vector<std::pair<Unit, double>> choices;
    std::vector<int> deps;
    int64_t priority;
    std::function<void(Unit)> emit;
  };
  const TargetConfig& t_;
  std::vector<Task> tasks_;
};

}  // namespace nikki::kernels::scheduling
