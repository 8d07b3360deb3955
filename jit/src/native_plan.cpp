// From a device program to its native code: derive (or load) the plan, generate or load one
// routine per template, and bind each instruction to its routine.
#include <chrono>
#include <cstring>
#include <unordered_map>

#include "byte_codec.hpp"
#include "native_templates.hpp"

namespace nikki::jit {

namespace {

class CompiledProgram final : public NativeCode {
 public:
  CompiledProgram(std::vector<NativeInstruction> instructions, NativeStats stats, std::shared_ptr<void> keep_alive)
      : keep_alive_(std::move(keep_alive)) {
    instructions_ = std::move(instructions);
    stats_ = stats;
  }

 private:
  std::shared_ptr<void> keep_alive_;
};

bool same_template(const NativeTemplate& a, const NativeTemplate& b) {
  return std::memcmp(&a.desc, &b.desc, sizeof(native::OpDesc)) == 0 && std::strcmp(a.entry, b.entry) == 0;
}

uint64_t template_hash(const NativeTemplate& t) {
  const Hash128 h = Hasher().bytes(&t.desc, sizeof(native::OpDesc)).str(t.entry).finish();
  return h.lo;
}

constexpr uint32_t kPlanMagic = 0x4e4b504c;  // "NKPL"

}  // namespace

NativePlan plan_native(const Kernel& kernel) {
  NativePlan plan;
  plan.instructions.resize(kernel.instructions.size());
  // Templates are about a kilobyte each: index them by hash and compare bytes only on a hash match.
  std::unordered_multimap<uint64_t, uint32_t> by_hash;
  for (uint32_t i = 0; i < kernel.instructions.size(); ++i) {
    auto made = make_template(kernel, i);
    if (!made) {
      plan.fallbacks += !kernel.instructions[i].spec().is_control;
      plan.instructions[i].template_id = NativePlan::kInterpreted;
      continue;
    }
    auto& [t, instruction] = *made;
    const uint64_t h = template_hash(t);
    uint32_t id = uint32_t(plan.templates.size());
    for (auto [it, end] = by_hash.equal_range(h); it != end; ++it)
      if (same_template(plan.templates[it->second], t)) {
        id = it->second;
        break;
      }
    if (id == plan.templates.size()) {
      plan.templates.push_back(t);
      by_hash.emplace(h, id);
    }
    plan.instructions[i] = instruction;
    plan.instructions[i].template_id = id;
  }
  return plan;
}

std::vector<uint8_t> serialize_plan(const NativePlan& plan, const Hash128& program_key) {
  Writer w;
  w.u32(kPlanMagic);
  w.pod(program_key);
  w.i64(plan.fallbacks);
  w.u32(plan.templates.size());
  for (const NativeTemplate& t : plan.templates) {
    w.pod(t.desc);
    w.str(t.entry);
  }
  w.u32(plan.instructions.size());
  for (const NativeInstruction& inst : plan.instructions) {
    w.u32(inst.template_id);
    if (inst.template_id == NativePlan::kInterpreted) continue;
    for (const NativeOperand& o : inst.operands) {
      w.u8(uint8_t(o.kind));
      if (o.kind == NativeOperand::Kind::none) continue;
      w.u32(o.storage);
      w.i64(o.byte_offset);
      w.f64(o.imm);
      // The run-time offset itself lives in the kernel's operand; the plan records only its use.
      w.u8(o.indirection != nullptr);
      w.i64(o.scalar_bytes);
      w.i64(o.min_shift);
      w.i64(o.max_shift);
    }
  }
  return std::move(w.out);
}

std::optional<NativePlan> deserialize_plan(const std::vector<uint8_t>& bytes, const Kernel& kernel,
                                          const Hash128& program_key) {
  // A plan that does not fit the kernel is simply derived again, so damage surfaces as nullopt.
  try {
    Reader r(bytes.data(), bytes.size());
    if (r.u32() != kPlanMagic) return std::nullopt;
    // A plan copied under another program's key would pass every structural check below.
    if (!(r.pod<Hash128>() == program_key)) return std::nullopt;
    NativePlan plan;
    plan.fallbacks = r.i64();
    const uint32_t num_templates = r.count(sizeof(native::OpDesc));
    plan.templates.resize(num_templates);
    plan.entry_names.reserve(num_templates);  // no reallocation: templates point into the names
    for (NativeTemplate& t : plan.templates) {
      t.desc = r.pod<native::OpDesc>();
      t.entry = plan.entry_names.emplace_back(r.str()).c_str();
    }
    if (r.count(4) != kernel.instructions.size()) return std::nullopt;
    plan.instructions.resize(kernel.instructions.size());
    for (uint32_t i = 0; i < plan.instructions.size(); ++i) {
      NativeInstruction& inst = plan.instructions[i];
      inst.template_id = r.u32();
      if (inst.template_id == NativePlan::kInterpreted) continue;
      if (inst.template_id >= num_templates) return std::nullopt;
      for (int slot = 0; slot < kMaxSlots; ++slot) {
        NativeOperand& o = inst.operands[slot];
        o.kind = r.enumeration<NativeOperand::Kind>(3);
        if (o.kind == NativeOperand::Kind::none) continue;
        o.storage = r.u32();
        if (o.kind == NativeOperand::Kind::tensor && o.storage >= kernel.storages.size()) return std::nullopt;
        o.byte_offset = r.i64();
        o.imm = r.f64();
        if (r.u8()) {
          const Operand& source = kernel.instructions[i].operands[slot];
          if (!source.is_tensor() || !source.is_dynamic()) return std::nullopt;
          o.indirection = kernel.indirection(source);
        }
        o.scalar_bytes = r.i64();
        o.min_shift = r.i64();
        o.max_shift = r.i64();
      }
    }
    if (!r.done()) return std::nullopt;
    return plan;
  } catch (const KernelError&) {
    return std::nullopt;
  }
}

std::shared_ptr<const NativeCode> compile_native(const DeviceProgram& program, const CacheKey* cache_key) {
  const auto start = std::chrono::steady_clock::now();
  const Kernel& k = program.kernel;
  DiskCache cache = cache_key ? DiskCache() : DiskCache(CacheSettings{{}, false});
  const Hash128 program_hash = cache_key ? cache_key->hash() : Hash128{};
  std::optional<NativePlan> plan;
  if (cache.enabled())
    if (auto bytes = cache.load("native-plan", *cache_key)) {
      plan = deserialize_plan(*bytes, k, program_hash);
      if (!plan) log_rejected_entry(cache.path("native-plan", *cache_key), "not a plan of this program");
    }
  if (!plan) {
    plan = plan_native(k);
    if (cache.enabled()) cache.store("native-plan", *cache_key, serialize_plan(*plan, program_hash));
  }
  GeneratedRoutines code = generate_routines(plan->templates);
  NativeStats stats;
  for (NativeInstruction& inst : plan->instructions)
    if (inst.template_id != NativePlan::kInterpreted) {
      inst.routine = code.routines[inst.template_id];
      ++stats.instructions;
    }
  stats.origin = code.origin;
  stats.compiled = code.compiled;
  stats.code_bytes = code.code_bytes;
  stats.fallbacks = plan->fallbacks;
  stats.templates = int64_t(plan->templates.size());
  stats.milliseconds = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  return std::make_shared<CompiledProgram>(std::move(plan->instructions), stats, std::move(code.keep_alive));
}

const char* code_origin_name(CodeOrigin origin) {
  switch (origin) {
    case CodeOrigin::none: return "none";
    case CodeOrigin::compiled: return "compiled";
    case CodeOrigin::disk_cache: return "disk cache";
    case CodeOrigin::in_memory: return "in memory";
  }
  return "?";
}

}  // namespace nikki::jit
