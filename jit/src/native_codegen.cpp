// LLVM ORC code generation for native templates. This is the only translation unit that includes
// LLVM headers (they are slow to compile and LLVM is built without exceptions: every llvm::Error is
// converted to nikki's InternalError here, never thrown through LLVM frames).
//
// For each template a kernel needs and no earlier compile left behind: read the entry of the
// embedded kernel library it specializes (each entry already has its helpers inlined and
// simplified at build time, see jit/CMakeLists.txt), add the constant descriptor and a wrapper,
// inline the entry into the wrapper so the descriptor folds into it, run LLVM's O2 pipeline (with
// loop and SLP vectorization) for the host CPU, and hand the object to an LLJIT under a resource
// tracker that lives as long as any kernel's NativeCode uses the template.
#include <llvm/Bitcode/BitcodeReader.h>
#include <llvm/Config/llvm-config.h>
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
#include <mutex>
#include <string_view>
#include <system_error>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include <fmt/format.h>

#include "native_templates.hpp"
#include "nikki/jit/cache.hpp"

extern const unsigned char nikki_native_bitcode[];
extern const std::size_t nikki_native_bitcode_size;
extern const char nikki_native_codegen_sha256[];

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

/** Positions into `indices` (templates to compile) in at most `count` groups of about equal cost
 * (largest first, each to the cheapest group so far). */
std::vector<std::vector<size_t>> balanced_groups(const std::vector<NativeTemplate>& templates,
                                                 const std::vector<size_t>& indices, size_t count) {
  const auto cost = [&](size_t position) { return compile_cost(templates[indices[position]].entry); };
  std::vector<size_t> order(indices.size());
  for (size_t p = 0; p < order.size(); ++p) order[p] = p;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return cost(a) > cost(b); });
  std::vector<std::vector<size_t>> groups(std::max<size_t>(1, std::min(count, indices.size())));
  std::vector<int> load(groups.size(), 0);
  for (size_t p : order) {
    const size_t g = size_t(std::min_element(load.begin(), load.end()) - load.begin());
    groups[g].push_back(p);
    load[g] += cost(p);
  }
  return groups;
}

/** What decides a template's object code besides the template and the host: the library's
 * bitcode, how this file specializes and optimizes it (its source's hash), and the LLVM doing it.
 * Not the build's identity: every binary of a build, and later builds that leave code generation
 * alone, share native code in the disk cache. */
const Hash128& codegen_id() {
  static const Hash128 id = Hasher()
                                .str(LLVM_VERSION_STRING)
                                .str(nikki_native_codegen_sha256)
                                .bytes(nikki_native_bitcode, nikki_native_bitcode_size)
                                .finish();
  return id;
}

/** The process-wide JIT: one LLJIT, the host target, the routines loaded by name. */
class NativeJit {
 public:
  static NativeJit& instance() {
    static NativeJit jit;
    return jit;
  }

  /**
   * Routines for a set of distinct templates. Object code is content-addressed per template: a
   * template loaded in this process is shared, one compiled by an earlier process is loaded from
   * the disk cache, and only the others go through LLVM, so kernels that share most templates
   * (another shape of a kernel, a kernel after a small edit) compile only what differs.
   */
  GeneratedRoutines compile(const std::vector<NativeTemplate>& templates) {
    if (templates.empty()) return {};
    std::lock_guard<std::mutex> lock(mutex_);
    std::erase_if(loaded_, [](const auto& entry) { return entry.second.expired(); });
    // The names of unloaded routines stay interned until dropped explicitly.
    jit_->getExecutionSession().getSymbolStringPool()->clearDeadEntries();
    const DiskCache cache;
    auto set = std::make_shared<std::vector<std::shared_ptr<Loaded>>>(templates.size());
    std::vector<CacheKey> keys;
    std::vector<std::string> names;
    std::vector<size_t> missing;
    std::unordered_set<std::string> distinct;
    bool read_disk = false;
    for (size_t i = 0; i < templates.size(); ++i) {
      keys.push_back(key_of(templates[i]));
      names.push_back("nikki_" + keys[i].hash().hex());
      internal_check(distinct.insert(names[i]).second, "a native template set holds one template twice");
      std::shared_ptr<Loaded>& code = (*set)[i];
      if (auto it = loaded_.find(names[i]); it != loaded_.end()) code = it->second.lock();
      if (!code && (code = load_cached(cache, keys[i], names[i]))) read_disk = true;
      if (code)
        loaded_[names[i]] = code;
      else
        missing.push_back(i);
    }
    std::vector<std::vector<uint8_t>> objects = emit_objects(templates, missing, names);
    for (size_t p = 0; p < missing.size(); ++p) {
      const size_t i = missing[p];
      (*set)[i] = load(objects[p], names[i]);
      loaded_[names[i]] = (*set)[i];
      cache.store("native", keys[i], objects[p]);
    }
    GeneratedRoutines out;
    for (const std::shared_ptr<Loaded>& code : *set) {
      out.routines.push_back(code->routine);
      out.code_bytes += code->bytes;
    }
    out.keep_alive = std::move(set);
    out.compiled = int64_t(missing.size());
    out.origin = !missing.empty() ? CodeOrigin::compiled : read_disk ? CodeOrigin::disk_cache : CodeOrigin::in_memory;
    return out;
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
   * The routine library, holding only what `entry` reaches: the bitcode is read lazily and the
   * linker materializes the functions the entry needs (reading all of it cost about 15 ms per
   * compile, for a library most of which a template does not use).
   */
  std::unique_ptr<llvm::Module> library(llvm::LLVMContext& context, const char* entry) {
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
    llvm::Function* f = lazy->getFunction(entry);
    internal_check(f != nullptr, "native template names a missing library entry");
    m->getOrInsertFunction(entry, f->getFunctionType());
    internal_check(!llvm::Linker::linkModules(*m, std::move(lazy), llvm::Linker::Flags::LinkOnlyNeeded),
                   "linking the kernel library");
    return m;
  }

  /** Adds routine `name`: the template's entry called with its constant descriptor. */
  static void add_wrapper(llvm::Module& m, const NativeTemplate& t, const std::string& name) {
    llvm::LLVMContext& ctx = m.getContext();
    llvm::Function* entry = m.getFunction(t.entry);
    internal_check(entry != nullptr, "native template names a missing library entry");
    const auto* bytes = reinterpret_cast<const uint8_t*>(&t.desc);
    auto* init = llvm::ConstantDataArray::get(ctx, llvm::ArrayRef<uint8_t>(bytes, sizeof(native::OpDesc)));
    auto* desc = new llvm::GlobalVariable(m, init->getType(), /*isConstant=*/true, llvm::GlobalValue::PrivateLinkage,
                                          init, "nikki_desc");
    desc->setAlignment(llvm::Align(8));
    auto* ptr = llvm::PointerType::getUnqual(ctx);
    auto* fn = llvm::Function::Create(llvm::FunctionType::get(llvm::Type::getVoidTy(ctx), {ptr}, false),
                                      llvm::GlobalValue::ExternalLinkage, name, m);
    llvm::IRBuilder<> b(llvm::BasicBlock::Create(ctx, "entry", fn));
    b.CreateCall(entry, {desc, fn->getArg(0)});
    b.CreateRetVoid();
  }

  /** Internalizes and always-inlines the library, and targets every function at the host CPU. */
  void prepare(llvm::Module& m, const std::string& wrapper) {
    for (llvm::Function& f : m) {
      f.removeFnAttr("target-cpu");
      f.removeFnAttr("target-features");
      f.removeFnAttr("tune-cpu");
      f.addFnAttr("target-cpu", cpu_);
      f.addFnAttr("target-features", features_);
      if (f.isDeclaration()) continue;
      if (f.getName() == wrapper) continue;
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

  /** A template's object code, kept loaded while any kernel uses it. */
  struct Loaded {
    llvm::orc::ResourceTrackerSP tracker;
    native::Routine routine = nullptr;
    int64_t bytes = 0;  // of the loaded code: each object's sections occupy whole pages
    ~Loaded() {
      if (tracker)
        if (llvm::Error err = tracker->remove()) llvm::consumeError(std::move(err));
    }
  };

  /** Loads an object file and looks up its routine `name`; throws InternalError, with nothing left
   * loaded, when that fails. */
  std::shared_ptr<Loaded> load(const std::vector<uint8_t>& object, const std::string& name) {
    auto code = std::make_shared<Loaded>();
    code->tracker = jit_->getMainJITDylib().createResourceTracker();
    auto buffer = llvm::MemoryBuffer::getMemBufferCopy(
        llvm::StringRef(reinterpret_cast<const char*>(object.data()), object.size()), name);
    if (llvm::Error err = jit_->addObjectFile(code->tracker, std::move(buffer)))
      llvm_failure("loading native code", std::move(err));
    // Code, read-only data and data each start a page: an estimate of what loading costs.
    constexpr int64_t kSegmentsPerObject = 3;
    code->bytes = int64_t(object.size()) + kSegmentsPerObject * int64_t(::sysconf(_SC_PAGESIZE));
    code->routine = check(jit_->lookup(name), "looking up a routine").toPtr<native::Routine>();
    return code;
  }

  /** The code of routine `name` from its disk-cache entry, or null when there is none it can use
   * (an entry that passes the cache's checks can still fail to load, written by a build with a
   * colliding id or edited by hand: it is compiled again and rewritten, never trusted). */
  std::shared_ptr<Loaded> load_cached(const DiskCache& cache, const CacheKey& key, const std::string& name) {
    std::optional<std::vector<uint8_t>> object = cache.load("native", key);
    if (!object) return nullptr;
    try {
      return load(*object, name);
    } catch (const InternalError& e) {
      log_rejected_entry(cache.path("native", key), fmt::format("not loadable ({})", e.what()));
      return nullptr;
    }
  }

  /** Everything a template's object code depends on: the template, the host CPU, the code generator. */
  CacheKey key_of(const NativeTemplate& t) const {
    CacheKey key;
    key.str("native").bytes(&codegen_id(), sizeof(Hash128)).str(cpu_).str(features_);
    key.bytes(&t.desc, sizeof(t.desc)).str(t.entry);
    return key;
  }

  /**
   * Specializes the library for the templates `indices` and compiles each to a relocatable object
   * (in `indices` order): the templates are split into groups of about equal cost, one per usable
   * core, each compiled with its own target machine (not thread-safe), in parallel.
   */
  std::vector<std::vector<uint8_t>> emit_objects(const std::vector<NativeTemplate>& templates,
                                                 const std::vector<size_t>& indices, const std::vector<std::string>& names) {
    if (indices.empty()) return {};
    const std::vector<std::vector<size_t>> groups = balanced_groups(templates, indices, compile_threads());
    std::vector<std::unique_ptr<llvm::TargetMachine>> machines(groups.size());
    for (size_t g = 1; g < groups.size(); ++g) machines[g] = check(host_->createTargetMachine(), "creating a target machine");
    std::vector<std::vector<uint8_t>> objects(indices.size());
    std::vector<std::exception_ptr> errors(groups.size());
    auto compile_group = [&](size_t g) {
      try {
        for (size_t p : groups[g])
          objects[p] = emit_object(templates[indices[p]], names[indices[p]], g == 0 ? *target_machine_ : *machines[g]);
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

  /** Compiles template `t` to an object file defining routine `name`. Each compile has its own
   * LLVM context (contexts are not thread-safe). */
  std::vector<uint8_t> emit_object(const NativeTemplate& t, const std::string& name, llvm::TargetMachine& machine) {
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
    std::unique_ptr<llvm::Module> module = library(context, t.entry);
    add_wrapper(*module, t, name);
    prepare(*module, name);
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
  std::unordered_map<std::string, std::weak_ptr<Loaded>> loaded_;  // by routine name
};

}  // namespace

GeneratedRoutines generate_routines(const std::vector<NativeTemplate>& templates) {
  return NativeJit::instance().compile(templates);
}

std::string native_target_description() { return NativeJit::instance().description(); }

}  // namespace nikki::jit
