// LLVM ORC code generation for native templates. This is the only translation unit that includes
// LLVM headers (they are slow to compile and LLVM is built without exceptions: every llvm::Error is
// converted to nikki's InternalError here, never thrown through LLVM frames).
//
// For each kernel: read the entries of the embedded kernel library it needs (each entry already
// has its helpers inlined and simplified at build time, see jit/CMakeLists.txt), add one constant
// descriptor and one wrapper per template, inline the entries into the wrappers so the
// descriptors fold into them, run LLVM's O2 pipeline (with loop and SLP vectorization) for the
// host CPU, and hand the objects to an LLJIT whose resource tracker lives as long as the kernel's
// NativeCode.
#include <llvm/Bitcode/BitcodeReader.h>
#include <llvm/ExecutionEngine/Orc/ExecutionUtils.h>
#include <llvm/ExecutionEngine/Orc/JITTargetMachineBuilder.h>
#include <llvm/ExecutionEngine/Orc/LLJIT.h>
#include <llvm/ExecutionEngine/Orc/ThreadSafeModule.h>
#include <llvm/IR/Constants.h>
#include <llvm/IR/DiagnosticInfo.h>
#include <llvm/IR/DiagnosticPrinter.h>
#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/LegacyPassManager.h>
#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/Module.h>
#include <llvm/Linker/Linker.h>
#include <llvm/Passes/PassBuilder.h>
#include <llvm/Support/MemoryBuffer.h>
#include <llvm/Support/TargetSelect.h>
#include <llvm/Target/TargetMachine.h>
#include <llvm/Transforms/IPO/AlwaysInliner.h>
#include <llvm/Transforms/IPO/GlobalDCE.h>

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <exception>
#include <map>
#include <mutex>
#include <string_view>
#include <system_error>
#include <thread>

#include <fmt/format.h>

#include "byte_codec.hpp"
#include "native_templates.hpp"
#include "nikki/jit/cache.hpp"

extern const unsigned char nikki_native_bitcode[];
extern const std::size_t nikki_native_bitcode_size;

namespace nikki::jit {

namespace {

[[noreturn]] void llvm_failure(const char* what, llvm::Error err) {
  std::string message = llvm::toString(std::move(err));
  throw InternalError(fmt::format("{}: {}", what, message), std::source_location::current());
}

template <class T>
T check(llvm::Expected<T> value, const char* what) {
  if (!value) llvm_failure(what, value.takeError());
  return std::move(*value);
}

/** Threads for compiling native code: NIKKI_COMPILE_THREADS, else the cores this process may run on. */
size_t compile_threads() {
  if (const char* env = std::getenv("NIKKI_COMPILE_THREADS"); env && *env) {
    const long n = std::strtol(env, nullptr, 10);
    if (n >= 1) return size_t(std::min<long>(n, 64));
  }
  cpu_set_t cpus;
  if (sched_getaffinity(0, sizeof(cpus), &cpus) == 0) return size_t(std::max(1, CPU_COUNT(&cpus)));
  return std::max(1u, std::thread::hardware_concurrency());
}

/** Relative LLVM cost of a template of library entry `entry`, measured on cold compiles: the
 * element-wise routines with several loop versions dominate; anything else counts as a copy. */
int compile_cost(std::string_view entry) {
  if (entry == "nk_tensor_scalar" || entry == "nk_activation") return 6;
  if (entry == "nk_tensor_tensor" || entry == "nk_scalar_tensor_tensor" || entry == "nk_tensor_scalar_reduce") return 4;
  return 2;
}

/** Template indices in at most `count` groups of about equal cost (largest first, each to the
 * cheapest group so far). */
std::vector<std::vector<size_t>> balanced_groups(const std::vector<NativeTemplate>& templates, size_t count) {
  std::vector<size_t> order(templates.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return compile_cost(templates[a].entry) > compile_cost(templates[b].entry);
  });
  std::vector<std::vector<size_t>> groups(std::max<size_t>(1, std::min(count, templates.size())));
  std::vector<int> load(groups.size(), 0);
  for (size_t i : order) {
    const size_t g = size_t(std::min_element(load.begin(), load.end()) - load.begin());
    groups[g].push_back(i);
    load[g] += compile_cost(templates[i].entry);
  }
  return groups;
}

/** The cache payload of a template set's object files: a count, then each file with its size. */
std::vector<uint8_t> pack_objects(const std::vector<std::vector<uint8_t>>& objects) {
  Writer w;
  w.u32(objects.size());
  for (const std::vector<uint8_t>& o : objects) {
    w.pod<uint64_t>(o.size());
    w.bytes(o.data(), o.size());
  }
  return std::move(w.out);
}

/** The object files of a payload, or nullopt when it is not one (then they are compiled again). */
std::optional<std::vector<std::vector<uint8_t>>> unpack_objects(const std::vector<uint8_t>& payload) {
  try {
    Reader r(payload.data(), payload.size());
    std::vector<std::vector<uint8_t>> objects(r.count(8));
    for (std::vector<uint8_t>& o : objects) {
      const uint64_t size = r.pod<uint64_t>();
      if (size > payload.size()) return std::nullopt;
      o.resize(size);
      r.bytes(o.data(), size);
    }
    if (!r.done() || objects.empty()) return std::nullopt;
    return objects;
  } catch (const KernelError&) {
    return std::nullopt;
  }
}

/** The process-wide JIT: one LLJIT, the host target, a counter for unique symbol names. */
class NativeJit {
 public:
  static NativeJit& instance() {
    static NativeJit jit;
    return jit;
  }

  /**
   * Routines for a set of templates. The object code is content-addressed: a set already loaded in
   * this process is shared, one compiled by an earlier process is loaded from the disk cache, and
   * only a new set goes through LLVM.
   */
  GeneratedRoutines compile(const std::vector<NativeTemplate>& templates) {
    if (templates.empty()) return {};
    const CacheKey key = key_of(templates);
    const std::string prefix = "nikki_" + key.hash().hex();
    std::lock_guard<std::mutex> lock(mutex_);
    if (auto it = loaded_.find(prefix); it != loaded_.end())
      if (std::shared_ptr<Loaded> code = it->second.lock()) return {code->routines, code, CodeOrigin::in_memory, code->bytes};
    std::erase_if(loaded_, [](const auto& entry) { return entry.second.expired(); });
    // The names of unloaded routines stay interned until dropped explicitly.
    jit_->getExecutionSession().getSymbolStringPool()->clearDeadEntries();
    DiskCache cache;
    std::shared_ptr<Loaded> code;
    CodeOrigin origin = CodeOrigin::disk_cache;
    if (auto hit = cache.load("native", key)) {
      // An entry that passes the cache's checks can still fail to load (written by a build with a
      // colliding id, or edited by hand): it is compiled again and rewritten, never trusted.
      if (auto objects = unpack_objects(*hit)) {
        try {
          code = load(*objects, templates.size(), prefix);
        } catch (const InternalError& e) {
          log_rejected_entry(cache.path("native", key), fmt::format("not loadable ({})", e.what()));
        }
      } else {
        log_rejected_entry(cache.path("native", key), "not a set of object files");
      }
    }
    if (!code) {
      std::vector<std::vector<uint8_t>> objects = emit_objects(templates, prefix);
      origin = CodeOrigin::compiled;
      code = load(objects, templates.size(), prefix);
      cache.store("native", key, pack_objects(objects));
    }
    loaded_[prefix] = code;
    return {code->routines, code, origin, code->bytes};
  }

  std::string description() const { return fmt::format("{} ({})", cpu_, features_); }

 private:
  NativeJit() {
    llvm::InitializeNativeTarget();
    llvm::InitializeNativeTargetAsmPrinter();
    llvm::InitializeNativeTargetAsmParser();
    auto builder = check(llvm::orc::JITTargetMachineBuilder::detectHost(), "detecting the host CPU");
    builder.setCodeGenOptLevel(llvm::CodeGenOptLevel::Aggressive);
    // x86-64 JIT code defaults to the large code model, which reaches every constant through a
    // 64-bit absolute address held in a register: in loops with many constants (the activation
    // polynomials) the addresses crowd the registers and broadcasts are reloaded every
    // iteration. The small model with position-independent code reaches them PC-relative (32-bit
    // displacements: JITLink keeps an object's sections within reach of each other and routes
    // external calls and data through its own GOT and stubs).
    builder.setCodeModel(llvm::CodeModel::Small);
    builder.setRelocationModel(llvm::Reloc::PIC_);
    cpu_ = builder.getCPU();
    features_ = builder.getFeatures().getString();
    target_machine_ = check(builder.createTargetMachine(), "creating the host target machine");
    host_ = builder;
    jit_ = check(llvm::orc::LLJITBuilder().setJITTargetMachineBuilder(builder).create(), "creating the JIT");
    // Failures to load code also come back from the look-up that met them, and a damaged cache
    // entry is rebuilt: print them only when asked.
    jit_->getExecutionSession().setErrorReporter([](llvm::Error err) {
      const std::string message = llvm::toString(std::move(err));
      if (log_enabled("cache")) std::fprintf(stderr, "nikki: native code: %s\n", message.c_str());
    });
    // Generated code calls libm (exp, erf, ...) and memcpy from the running process.
    jit_->getMainJITDylib().addGenerator(check(llvm::orc::DynamicLibrarySearchGenerator::GetForCurrentProcess(
                                                   jit_->getDataLayout().getGlobalPrefix()),
                                               "resolving process symbols"));
  }

  /**
   * The routine library, holding only what `entries` reach: the bitcode is read lazily and the
   * linker materializes the functions the entries need (reading all of it cost about 15 ms per
   * compile, for a library most of which a kernel does not use).
   */
  std::unique_ptr<llvm::Module> library(llvm::LLVMContext& context, const std::vector<std::string>& entries) {
    llvm::MemoryBufferRef buffer(
        llvm::StringRef(reinterpret_cast<const char*>(nikki_native_bitcode), nikki_native_bitcode_size),
        "nikki_native_kernels");
    std::unique_ptr<llvm::Module> lazy =
        check(llvm::getLazyBitcodeModule(buffer, context), "reading the kernel library");
    lazy->setDataLayout(jit_->getDataLayout());
    lazy->setTargetTriple(target_machine_->getTargetTriple().str());
    auto m = std::make_unique<llvm::Module>("nikki_native_templates", context);
    m->setDataLayout(jit_->getDataLayout());
    m->setTargetTriple(target_machine_->getTargetTriple().str());
    for (const std::string& entry : entries) {
      llvm::Function* f = lazy->getFunction(entry);
      internal_check(f != nullptr, "native template names a missing library entry");
      m->getOrInsertFunction(entry, f->getFunctionType());
    }
    internal_check(!llvm::Linker::linkModules(*m, std::move(lazy), llvm::Linker::Flags::LinkOnlyNeeded),
                   "linking the kernel library");
    return m;
  }

  static std::string add_wrapper(llvm::Module& m, const NativeTemplate& t, const std::string& prefix, size_t index) {
    llvm::LLVMContext& ctx = m.getContext();
    llvm::Function* entry = m.getFunction(t.entry);
    internal_check(entry != nullptr, "native template names a missing library entry");
    const auto* bytes = reinterpret_cast<const uint8_t*>(&t.desc);
    auto* init = llvm::ConstantDataArray::get(ctx, llvm::ArrayRef<uint8_t>(bytes, sizeof(native::OpDesc)));
    auto* desc = new llvm::GlobalVariable(m, init->getType(), /*isConstant=*/true, llvm::GlobalValue::PrivateLinkage,
                                          init, fmt::format("nikki_desc_{}", index));
    desc->setAlignment(llvm::Align(8));
    const std::string name = fmt::format("{}_t{}", prefix, index);
    auto* ptr = llvm::PointerType::getUnqual(ctx);
    auto* fn = llvm::Function::Create(llvm::FunctionType::get(llvm::Type::getVoidTy(ctx), {ptr}, false),
                                      llvm::GlobalValue::ExternalLinkage, name, m);
    llvm::IRBuilder<> b(llvm::BasicBlock::Create(ctx, "entry", fn));
    b.CreateCall(entry, {desc, fn->getArg(0)});
    b.CreateRetVoid();
    return name;
  }

  /** Internalizes and always-inlines the library, and targets every function at the host CPU. */
  void prepare(llvm::Module& m, const std::vector<std::string>& wrappers) {
    for (llvm::Function& f : m) {
      f.removeFnAttr("target-cpu");
      f.removeFnAttr("target-features");
      f.removeFnAttr("tune-cpu");
      f.addFnAttr("target-cpu", cpu_);
      f.addFnAttr("target-features", features_);
      if (f.isDeclaration()) continue;
      const bool wrapper = std::find(wrappers.begin(), wrappers.end(), f.getName().str()) != wrappers.end();
      if (wrapper) continue;
      f.setComdat(nullptr);
      f.setLinkage(llvm::GlobalValue::InternalLinkage);
      f.removeFnAttr(llvm::Attribute::NoInline);
      f.removeFnAttr(llvm::Attribute::OptimizeNone);
      f.addFnAttr(llvm::Attribute::AlwaysInline);
    }
    for (llvm::GlobalVariable& g : m.globals()) {
      if (g.isDeclaration()) continue;
      g.setComdat(nullptr);
      if (!g.hasPrivateLinkage()) g.setLinkage(llvm::GlobalValue::InternalLinkage);
    }
  }

  void optimize(llvm::Module& m, llvm::TargetMachine& machine) {
    llvm::PipelineTuningOptions tuning;
    tuning.LoopVectorization = true;
    tuning.SLPVectorization = true;
    llvm::LoopAnalysisManager lam;
    llvm::FunctionAnalysisManager fam;
    llvm::CGSCCAnalysisManager cgam;
    llvm::ModuleAnalysisManager mam;
    llvm::PassBuilder pb(&machine, tuning);
    pb.registerModuleAnalyses(mam);
    pb.registerCGSCCAnalyses(cgam);
    pb.registerFunctionAnalyses(fam);
    pb.registerLoopAnalyses(lam);
    pb.crossRegisterProxies(lam, fam, cgam, mam);
    // Each wrapper gets its entry inlined before the pipeline starts, so every pass meets the
    // entry's body only once, with the descriptor constant, and the entries themselves are dead:
    // the default pipeline would first simplify each entry on its own (IPSCCP, early CSE,
    // instcombine over bodies of up to 10,000 instructions) and then again inside its wrapper.
    llvm::ModulePassManager inline_entries;
    inline_entries.addPass(llvm::AlwaysInlinerPass());
    inline_entries.addPass(llvm::GlobalDCEPass());
    inline_entries.run(m, mam);
    llvm::ModulePassManager mpm = pb.buildPerModuleDefaultPipeline(llvm::OptimizationLevel::O2);
    mpm.run(m, mam);
  }

  /** Object code kept loaded while any kernel uses it. */
  struct Loaded {
    llvm::orc::ResourceTrackerSP tracker;
    std::vector<native::Routine> routines;
    int64_t bytes = 0;  // of the loaded code: each object's sections occupy whole pages
    ~Loaded() {
      if (tracker)
        if (llvm::Error err = tracker->remove()) llvm::consumeError(std::move(err));
    }
  };

  /** Loads object files and looks up routines `<prefix>_t0` ... `<prefix>_t<count-1>`; throws
   * InternalError, with nothing left loaded, when that fails. */
  std::shared_ptr<Loaded> load(const std::vector<std::vector<uint8_t>>& objects, size_t count, const std::string& prefix) {
    auto code = std::make_shared<Loaded>();
    code->tracker = jit_->getMainJITDylib().createResourceTracker();
    for (const std::vector<uint8_t>& object : objects) {
      auto buffer = llvm::MemoryBuffer::getMemBufferCopy(
          llvm::StringRef(reinterpret_cast<const char*>(object.data()), object.size()), prefix);
      if (llvm::Error err = jit_->addObjectFile(code->tracker, std::move(buffer)))
        llvm_failure("loading native code", std::move(err));
      // Code, read-only data and data each start a page: an estimate of what loading costs.
      constexpr int64_t kSegmentsPerObject = 3;
      code->bytes += int64_t(object.size()) + kSegmentsPerObject * int64_t(::sysconf(_SC_PAGESIZE));
    }
    for (size_t i = 0; i < count; ++i) {
      llvm::orc::ExecutorAddr addr = check(jit_->lookup(fmt::format("{}_t{}", prefix, i)), "looking up a routine");
      code->routines.push_back(addr.toPtr<native::Routine>());
    }
    return code;
  }

  /** Everything the object code depends on: the templates, the host CPU, the nikki build. */
  CacheKey key_of(const std::vector<NativeTemplate>& templates) const {
    CacheKey key;
    key.str("native").bytes(&build_id(), sizeof(Hash128)).str(cpu_).str(features_);
    for (const NativeTemplate& t : templates) key.bytes(&t.desc, sizeof(t.desc)).str(t.entry);
    return key;
  }

  /**
   * Specializes the library for the templates and compiles it to relocatable objects: the
   * templates are split into groups of about equal cost, one per usable core, each compiled in
   * its own LLVM context with its own target machine (neither is thread-safe), in parallel.
   */
  std::vector<std::vector<uint8_t>> emit_objects(const std::vector<NativeTemplate>& templates, const std::string& prefix) {
    const std::vector<std::vector<size_t>> groups = balanced_groups(templates, compile_threads());
    std::vector<std::unique_ptr<llvm::TargetMachine>> machines(groups.size());
    for (size_t g = 1; g < groups.size(); ++g) machines[g] = check(host_->createTargetMachine(), "creating a target machine");
    std::vector<std::vector<uint8_t>> objects(groups.size());
    std::vector<std::exception_ptr> errors(groups.size());
    auto compile_group = [&](size_t g) {
      try {
        objects[g] = emit_object(templates, groups[g], prefix, g == 0 ? *target_machine_ : *machines[g]);
      } catch (...) {
        errors[g] = std::current_exception();
      }
    };
    std::vector<std::thread> threads;
    threads.reserve(groups.size());
    for (size_t g = 1; g < groups.size(); ++g) {
      try {
        threads.emplace_back(compile_group, g);
      } catch (const std::system_error&) {
        compile_group(g);  // no thread to be had (a process limit): compile the group here
      }
    }
    compile_group(0);
    for (std::thread& t : threads) t.join();
    for (const std::exception_ptr& e : errors)
      if (e) std::rethrow_exception(e);
    return objects;
  }

  /** Compiles the templates `indices` (wrappers keep their index in `templates` in their names). */
  std::vector<uint8_t> emit_object(const std::vector<NativeTemplate>& templates, const std::vector<size_t>& indices,
                                   const std::string& prefix, llvm::TargetMachine& machine) {
    llvm::LLVMContext context;
    // The library asks LLVM to vectorize the loops it declares independent (kernels.cpp); where
    // one cannot be (its body calls libm: erf, sin, ...) LLVM would print a warning and remarks to
    // stderr, which are no concern of nikki's users. Errors are kept and raised after compiling.
    std::string llvm_error;
    context.setDiagnosticHandlerCallBack(
        [](const llvm::DiagnosticInfo* info, void* error) {
          auto& message = *static_cast<std::string*>(error);
          if (info->getSeverity() != llvm::DS_Error || !message.empty()) return;
          llvm::raw_string_ostream os(message);
          llvm::DiagnosticPrinterRawOStream printer(os);
          info->print(printer);
        },
        &llvm_error);
    std::vector<std::string> entries;
    for (size_t i : indices)
      if (std::find(entries.begin(), entries.end(), templates[i].entry) == entries.end()) entries.push_back(templates[i].entry);
    std::unique_ptr<llvm::Module> module = library(context, entries);
    std::vector<std::string> names;
    for (size_t i : indices) names.push_back(add_wrapper(*module, templates[i], prefix, i));
    prepare(*module, names);
    optimize(*module, machine);
    llvm::SmallVector<char, 0> buffer;
    llvm::raw_svector_ostream os(buffer);
    llvm::legacy::PassManager codegen;
    internal_check(!machine.addPassesToEmitFile(codegen, os, nullptr, llvm::CodeGenFileType::ObjectFile),
                   "the host target cannot emit object files");
    codegen.run(*module);
    if (!llvm_error.empty())
      throw InternalError(fmt::format("compiling native code: {}", llvm_error), std::source_location::current());
    return std::vector<uint8_t>(buffer.begin(), buffer.end());
  }

  std::optional<llvm::orc::JITTargetMachineBuilder> host_;  // makes a target machine per compile thread
  std::unique_ptr<llvm::TargetMachine> target_machine_;
  std::unique_ptr<llvm::orc::LLJIT> jit_;
  std::string cpu_, features_;
  std::mutex mutex_;
  std::map<std::string, std::weak_ptr<Loaded>> loaded_;
};

}  // namespace

GeneratedRoutines generate_routines(const std::vector<NativeTemplate>& templates) {
  return NativeJit::instance().compile(templates);
}

std::string native_target_description() { return NativeJit::instance().description(); }

}  // namespace nikki::jit
