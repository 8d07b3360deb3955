#include "spill.hpp"

#include <algorithm>
#include <memory>
#include <string>
#include <tuple>
#include <unordered_set>

#include <fmt/format.h>

#include "nikki/jit/liveness.hpp"

namespace nikki::jit {

namespace {

/** One instruction that touches a tensor. */
struct Use {
  uint32_t at = 0;
  bool writes = false;      // writes some of the tensor
  bool overwrites = false;  // writes all of it and reads none of it
};

/** Where a tensor's next stretch in SBUF begins. */
struct Split {
  size_t use = 0;       // index into the tensor's uses: the first use of the new stretch
  bool reload = false;  // false: that use overwrites the whole tensor, there is nothing to bring back
  bool save = false;    // the stretch before must be copied to HBM first
};

/** A compiler-placed SBUF tensor the planner may split. */
struct Candidate {
  StorageId id = 0;
  int64_t footprint = 0;
  std::vector<Use> uses;
  std::vector<Split> splits;
  size_t cursor = 0;           // first use at or after the sweep's instruction
  size_t stretch_begin = 0;    // first use of the current stretch
  uint32_t away_until = 0;     // out of SBUF before this instruction
  bool home_current = false;   // the HBM copy holds the current value

  uint32_t split_at(const Split& s) const { return uses[s.use].at; }
  uint32_t saved_after(const Split& s) const { return uses[s.use - 1].at; }
};

/** Row-major [partitions, elements per partition] view of a whole storage. */
AccessPattern flat_view(const Kernel& k, StorageId id) {
  const Storage& s = k.storage(id);
  AccessPattern ap;
  ap.storage = id;
  ap.dtype = s.dtype;
  ap.rank = 2;
  ap.dims[0] = {s.shape.inner_elements(), s.partitions()};
  ap.dims[1] = {1, s.shape.inner_elements()};
  return ap;
}

template <class Rename>
AccessPattern renamed(const AccessPattern& ap, const Rename& rename) {
  AccessPattern out = ap;
  out.storage = rename(ap.storage);
  if (ap.indirection) {
    auto ind = std::make_shared<Indirection>(*ap.indirection);
    if (ind->scalar_tensor) ind->scalar_tensor = renamed(*ind->scalar_tensor, rename);
    if (ind->vector_offset) ind->vector_offset = renamed(*ind->vector_offset, rename);
    out.indirection = std::move(ind);
  }
  return out;
}

class Planner {
 public:
  Planner(const Kernel& k, int64_t target) : k_(k), target_(target) {}

  bool plan() {
    const uint32_t n = static_cast<uint32_t>(k_.instructions.size());
    const std::vector<LiveRange> ranges = live_ranges(k_);
    // loops_before[i]: runtime-loop instructions among the first i.
    std::vector<uint32_t> loops_before(n + 1, 0);
    for (uint32_t i = 0; i < n; ++i) {
      const Opcode op = k_.instructions[i].opcode;
      loops_before[i + 1] = loops_before[i] + (op == Opcode::loop_begin || op == Opcode::loop_end);
    }
    std::vector<int64_t> usage(n + 1, 0);
    candidate_of_.assign(k_.storages.size(), -1);
    for (StorageId id = 0; id < k_.storages.size(); ++id) {
      const Storage& s = k_.storages[id];
      const LiveRange& r = ranges[id];
      if (s.buffer != Buffer::sbuf || !r.used()) continue;
      usage[r.begin] += sbuf_footprint(s);
      usage[r.end + 1] -= sbuf_footprint(s);
      // A tensor live across a runtime loop is read by later iterations through the same
      // storage, so renaming it after a reload would be wrong; such tensors stay in place.
      if (s.user_address || loops_before[r.end + 1] != loops_before[r.begin]) continue;
      candidate_of_[id] = static_cast<int>(candidates_.size());
      candidates_.push_back(Candidate{.id = id, .footprint = sbuf_footprint(s)});
    }
    for (uint32_t i = 0; i < n; ++i) usage[i + 1] += usage[i];
    for (uint32_t i = 0; i < n; ++i)
      for_each_view(k_, k_.instructions[i], [&](const AccessPattern& ap, Access access) {
        const int c = candidate_of_[ap.storage];
        if (c < 0) return;
        std::vector<Use>& uses = candidates_[c].uses;
        if (uses.empty() || uses.back().at != i)
          uses.push_back(Use{i, false, overwrites_unread(k_, k_.instructions[i], ap.storage)});
        uses.back().writes = uses.back().writes || access != Access::read;
      });

    std::vector<size_t> by_begin(candidates_.size());
    for (size_t c = 0; c < by_begin.size(); ++c) by_begin[c] = c;
    std::stable_sort(by_begin.begin(), by_begin.end(),
                     [&](size_t a, size_t b) { return candidates_[a].uses[0].at < candidates_[b].uses[0].at; });
    std::vector<size_t> active;  // candidates whose first use is behind the sweep (dead ones go lazily)
    size_t next = 0;
    for (uint32_t p = 0; p < n; ++p) {
      while (next < by_begin.size() && candidates_[by_begin[next]].uses[0].at <= p) active.push_back(by_begin[next++]);
      if (usage[p] <= target_) continue;
      std::erase_if(active, [&](size_t c) { return candidates_[c].uses.back().at < p; });
      for (size_t c : active) {
        Candidate& cand = candidates_[c];
        while (cand.uses[cand.cursor].at < p) ++cand.cursor;
      }
      while (usage[p] > target_) {
        Candidate* victim = choose(active, p);
        if (!victim) return false;
        split(*victim);
        for (uint32_t q = p; q < victim->away_until; ++q) usage[q] -= victim->footprint;
      }
    }
    return true;
  }

  SpilledKernel rewrite() const;

 private:
  /** The idle tensor to move out at instruction p: a dead value first, then the one freeing the
   * most bytes x instructions until its next use (the furthest next use among equals). */
  Candidate* choose(const std::vector<size_t>& active, uint32_t p) {
    Candidate* best = nullptr;
    std::tuple<bool, int64_t, uint32_t> best_key{};
    for (size_t c : active) {
      Candidate& cand = candidates_[c];
      const Use& next_use = cand.uses[cand.cursor];
      if (cand.away_until > p || next_use.at == p) continue;
      const std::tuple<bool, int64_t, uint32_t> key{next_use.overwrites, cand.footprint * (next_use.at - p),
                                                    next_use.at};
      if (!best || key > best_key) {
        best = &cand;
        best_key = key;
      }
    }
    return best;
  }

  void split(Candidate& c) {
    const Use& next_use = c.uses[c.cursor];
    Split s{.use = c.cursor, .reload = !next_use.overwrites};
    if (s.reload) {
      bool written = false;
      for (size_t u = c.stretch_begin; u < c.cursor; ++u) written = written || c.uses[u].writes;
      s.save = written || !c.home_current;
    }
    c.home_current = s.reload;
    c.splits.push_back(s);
    c.stretch_begin = c.cursor;
    c.away_until = next_use.at;
  }

  const Kernel& k_;
  int64_t target_;
  std::vector<Candidate> candidates_;
  std::vector<int> candidate_of_;  // per storage: index into candidates_, or -1
};

SpilledKernel Planner::rewrite() const {
  SpilledKernel out{k_, {}, 0};
  Kernel& k = out.kernel;
  std::unordered_set<std::string> names;
  for (const Storage& s : k.storages) names.insert(s.name);
  auto add_storage = [&](Storage s, std::string name) {
    while (!names.insert(name).second) name += "'";
    s.name = std::move(name);
    s.address.reset();
    k.storages.push_back(std::move(s));
    return static_cast<StorageId>(k.storages.size() - 1);
  };

  // The storages of each split tensor: stretches[c][0] is the tensor itself, then one per split.
  struct Event {
    uint32_t at;
    size_t candidate, split;
  };
  std::vector<Event> reloads, saves;  // reloads go before `at`, saves after it
  std::vector<std::vector<StorageId>> stretches(candidates_.size());
  std::vector<StorageId> homes(candidates_.size(), kNoStorage);
  std::vector<size_t> spill_of(candidates_.size(), SIZE_MAX);  // index into out.spills
  for (size_t c = 0; c < candidates_.size(); ++c) {
    const Candidate& cand = candidates_[c];
    if (cand.splits.empty()) continue;
    const Storage original = k_.storage(cand.id);
    out.splits += cand.splits.size();
    stretches[c].push_back(cand.id);
    for (size_t i = 0; i < cand.splits.size(); ++i) {
      const Split& s = cand.splits[i];
      stretches[c].push_back(add_storage(original, fmt::format("{}.{}", original.name, i + 1)));
      if (s.reload) reloads.push_back({cand.split_at(s), c, i});
      if (s.save) saves.push_back({cand.saved_after(s), c, i});
    }
    if (saves.empty() || saves.back().candidate != c) continue;
    Storage home = original;
    home.buffer = Buffer::private_hbm;
    home.shape = Shape({original.partitions(), original.shape.inner_elements()});
    homes[c] = add_storage(home, original.name + ".spill");
    spill_of[c] = out.spills.size();
    out.spills.push_back(Spill{.tensor = cand.id, .home = homes[c]});
  }
  auto by_position = [](const Event& a, const Event& b) { return std::tie(a.at, a.candidate) < std::tie(b.at, b.candidate); };
  std::sort(reloads.begin(), reloads.end(), by_position);
  std::sort(saves.begin(), saves.end(), by_position);

  auto stretch_at = [&](StorageId id, uint32_t at) {
    const int c = candidate_of_[id];
    if (c < 0 || stretches[c].empty()) return id;
    const Candidate& cand = candidates_[c];
    size_t i = 0;  // splits at or before `at`
    while (i < cand.splits.size() && cand.split_at(cand.splits[i]) <= at) ++i;
    return stretches[c][i];
  };
  auto transfer = [&](const Event& e, bool reload) {
    const Candidate& cand = candidates_[e.candidate];
    const StorageId home = homes[e.candidate];
    const StorageId sbuf = stretches[e.candidate][reload ? e.split + 1 : e.split];
    Instruction inst;
    inst.opcode = Opcode::dma_copy;
    inst.engine = Engine::dma;
    inst.loc = k_.storage(cand.id).loc;
    k.set_instruction_name(inst, reload ? "reload" : "spill");
    inst.operands[0] = k.tensor_operand(flat_view(k, reload ? sbuf : home));
    inst.operands[1] = k.tensor_operand(flat_view(k, reload ? home : sbuf));
    Spill& record = out.spills[spill_of[e.candidate]];
    (reload ? record.reloads : record.saves).push_back(static_cast<uint32_t>(k.instructions.size()));
    if (reload) k.storages[sbuf].defined_at = static_cast<uint32_t>(k.instructions.size());
    k.instructions.push_back(std::move(inst));
  };

  const uint32_t n = static_cast<uint32_t>(k_.instructions.size());
  std::vector<uint32_t> new_index(n + 1);
  std::vector<uint32_t> block_start(n + 1);  // where the instructions emitted for old index i begin
  k.instructions.clear();
  k.instructions.reserve(n + reloads.size() + saves.size());
  size_t next_reload = 0, next_save = 0;
  for (uint32_t i = 0; i < n; ++i) {
    block_start[i] = static_cast<uint32_t>(k.instructions.size());
    for (; next_reload < reloads.size() && reloads[next_reload].at == i; ++next_reload) transfer(reloads[next_reload], true);
    Instruction inst = k_.instructions[i];
    for (Operand& o : inst.operands)
      if (o.is_tensor()) o = k.tensor_operand(renamed(k.view(o), [&](StorageId id) { return stretch_at(id, i); }));
    new_index[i] = static_cast<uint32_t>(k.instructions.size());
    k.instructions.push_back(std::move(inst));
    for (; next_save < saves.size() && saves[next_save].at == i; ++next_save) transfer(saves[next_save], false);
  }
  new_index[n] = block_start[n] = static_cast<uint32_t>(k.instructions.size());

  for (Instruction& inst : k.instructions)
    if (inst.opcode == Opcode::loop_begin || inst.opcode == Opcode::loop_end)
      k.mutable_rare(inst).jump = static_cast<int32_t>(new_index[k.rare(inst).jump]);
  for (StorageId id = 0; id < k_.storages.size(); ++id)
    k.storages[id].defined_at = block_start[std::min(k_.storages[id].defined_at, n)];
  // A stretch that starts with an overwrite (no reload) begins at that instruction.
  for (size_t c = 0; c < candidates_.size(); ++c)
    for (size_t i = 0; i < candidates_[c].splits.size(); ++i)
      if (!candidates_[c].splits[i].reload)
        k.storages[stretches[c][i + 1]].defined_at = new_index[candidates_[c].split_at(candidates_[c].splits[i])];
  for (Spill& s : out.spills) k.storages[s.home].defined_at = s.saves.front();
  return out;
}

}  // namespace

std::optional<SpilledKernel> spill_to_fit(const Kernel& kernel, int64_t target) {
  Planner planner(kernel, target);
  if (!planner.plan()) return std::nullopt;
  return planner.rewrite();
}

}  // namespace nikki::jit
