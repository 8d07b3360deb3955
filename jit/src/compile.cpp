#include "nikki/jit/compile.hpp"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string_view>

#include <fmt/format.h>

#include "nikki/ir_printer.hpp"
#include "nikki/jit/allocate.hpp"
#include "nikki/jit/cache.hpp"
#include "nikki/jit/native.hpp"
#include "nikki/jit/sanitize.hpp"
#include "nikki/jit/streams.hpp"
#include "nikki/jit/verify.hpp"

namespace nikki::jit {

namespace {

/** Runs stages in order, timing each and dumping its artifact when NIKKI_DUMP is set. */
class StageRunner {
 public:
  StageRunner(Program& program, std::string kernel_name) : program_(program), name_(std::move(kernel_name)) {
    if (const char* dir = std::getenv("NIKKI_DUMP"); dir && *dir) dump_dir_ = dir;
  }

  template <class F, class Dump>
  void run(std::string_view name, F&& stage, Dump&& artifact) {
    auto start = std::chrono::steady_clock::now();
    stage();
    double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    program_.timings.push_back({std::string(name), ms});
    if (log_enabled("stages"))
      std::fprintf(stderr, "nikki: %s: stage %-10.*s %8.3f ms\n", name_.c_str(), int(name.size()),
                   name.data(), ms);
    if (!dump_dir_.empty()) {
      std::filesystem::create_directories(dump_dir_);
      auto path = std::filesystem::path(dump_dir_) /
                  fmt::format("{}.{}.{}.txt", name_, program_.timings.size(), name);
      std::ofstream(path) << artifact();
    }
  }

 private:

  Program& program_;
  std::string name_;
  std::string dump_dir_;
};

}  // namespace

CacheKey program_cache_key(const Kernel& kernel, const CompileOptions& options, const Hash128& build) {
  // The serialized IR holds the target, every instruction, storage and source location.
  std::vector<uint8_t> ir = serialize_kernel(kernel);
  CacheKey key;
  key.str("device-program").bytes(&build, sizeof(Hash128)).u64(uint64_t(options.schedule_options.drop_dependency));
  key.u64(uint64_t(options.allocate_options.sbuf_budget));
  key.bytes(ir.data(), ir.size());
  return key;
}

size_t kernel_memory_bytes(const Kernel& kernel) {
  // Heap strings shorter than the small-string buffer cost nothing beyond the object itself.
  auto heap = [](const std::string& s) { return s.capacity() > 15 ? s.capacity() + 1 : 0; };
  size_t bytes = sizeof(Kernel) + heap(kernel.name) + kernel.instructions.capacity() * sizeof(Instruction) +
                 kernel.storages.capacity() * sizeof(Storage) + kernel.locations.capacity() * sizeof(SourceLocation) +
                 (kernel.inputs.capacity() + kernel.outputs.capacity()) * sizeof(StorageId) +
                 kernel.wide_views.capacity() * sizeof(AccessPattern) +
                 kernel.rare_attributes.capacity() * sizeof(RareAttributes) +
                 kernel.instruction_names.capacity() * sizeof(std::string);
  for (const AccessPattern& ap : kernel.wide_views)
    if (ap.indirection) bytes += sizeof(Indirection);
  for (const RareAttributes& r : kernel.rare_attributes)
    bytes += heap(r.text) + r.pattern.capacity() * sizeof(Dim) + r.lanes.capacity() * sizeof(int32_t);
  for (const std::string& name : kernel.instruction_names) bytes += heap(name);
  for (const Storage& s : kernel.storages) bytes += heap(s.name);
  for (const SourceLocation& l : kernel.locations) bytes += heap(l.file) + heap(l.function);
  return bytes;
}

size_t memory_bytes(const Program& program) {
  size_t bytes = sizeof(Program) + program.timings.capacity() * sizeof(StageTiming);
  if (program.device) {
    const DeviceProgram& d = *program.device;
    bytes += kernel_memory_bytes(d.kernel) + d.streams.capacity() * sizeof(Stream) +
             d.placement.capacity() * sizeof(d.placement[0]);
    for (const Stream& s : d.streams) {
      bytes += s.ops.capacity() * sizeof(StreamOp);
      for (const StreamOp& op : s.ops) bytes += op.waits.capacity() * sizeof(SemaphoreWait);
    }
  } else {
    bytes += kernel_memory_bytes(program.unscheduled);
  }
  if (program.native) bytes += program.native->memory_bytes();
  return bytes;
}

Program compile(Kernel kernel, const CompileOptions& options) {
  Program program;
  StageRunner stages(program, kernel.name);
  const bool scheduled = options.schedule || options.native;
  DiskCache cache = options.disk_cache ? DiskCache() : DiskCache(CacheSettings{{}, false});
  CacheKey key;
  if (scheduled && cache.enabled()) {
    key = program_cache_key(kernel, options, build_id());
    std::optional<std::vector<uint8_t>> hit;
    stages.run("cache", [&] {
      hit = cache.load("program", key);
      if (!hit) return;
      try {
        program.device = std::make_shared<DeviceProgram>(deserialize(*hit, PayloadCheck::trusted));
      } catch (const KernelError& e) {
        // An entry that passes the cache's checks but not the program format (edited by hand, or
        // written by a build with a colliding id): recompile and overwrite it.
        log_rejected_entry(cache.path("program", key), fmt::format("not a device program ({})", e.summary()));
        hit.reset();
      }
    }, [&] { return fmt::format("device program {}: {}\n", key.hash().hex(), hit ? "hit" : "miss"); });
  }
  auto sanitize = [&] {
    if (options.sanitize)
      stages.run("sanitize", [&] { check_parallel_loops(kernel); }, [&] { return parallel_loops_summary(kernel); });
  };
  if (program.device) sanitize();  // a cache hit skips the stages below, not the loop check
  if (!program.device) {
    stages.run("verify", [&] { verify(kernel); }, [&] { return to_string(kernel); });
    sanitize();
    stages.run("allocate", [&] { program.spills = allocate(kernel, options.allocate_options); },
               [&] { return to_string(kernel); });
    if (scheduled) {
      stages.run("schedule", [&] {
        auto device = std::make_shared<DeviceProgram>(schedule(std::move(kernel), options.schedule_options));
        device->spills = program.spills;
        program.device = std::move(device);
      }, [&] { return disassemble(*program.device); });
      if (cache.enabled()) cache.store("program", key, serialize(*program.device));
    } else {
      program.unscheduled = std::move(kernel);
    }
  } else {
    program.spills = program.device->spills;
  }
  if (!program.spills.empty()) {
    const Kernel& k = program.kernel();
    std::string message = spill_warning(k, program.spills);
    if (log_enabled("spills")) std::fprintf(stderr, "nikki: warning: %s\n", message.c_str());
    program.diagnostics.push_back(
        Diagnostic{Diagnostic::Kind::spill, std::move(message), k.location(k.storage(program.spills[0].tensor).loc)});
  }
  if (options.native) {
    stages.run("native", [&] { program.native = compile_native(*program.device, cache.enabled() ? &key : nullptr); }, [&] {
      const NativeStats& s = program.native->stats();
      return fmt::format("native code for {}: {} instructions in {} routines ({}; {} new), {} interpreted, {:.3f} ms\n",
                         native_target_description(), s.instructions, s.templates, code_origin_name(s.origin),
                         s.compiled, s.fallbacks, s.milliseconds);
    });
  }
  return program;
}

}  // namespace nikki::jit
