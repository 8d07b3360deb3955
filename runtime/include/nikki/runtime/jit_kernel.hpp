// JitKernel: a C++ kernel function with @nki.jit's behaviour. Each specialization (input shapes
// and dtypes, target, SPMD instance, and a caller-chosen key for compile-time constants) is traced
// and compiled once — through the disk cache when enabled — and then served from memory: a hit
// hashes a few integers and does one hash-map lookup, never touching the IR or building strings.
#pragma once

#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "nikki/jit/compile.hpp"
#include "nikki/runtime/executor.hpp"
#include "nikki/trace.hpp"

namespace nikki::runtime {

/** @brief What a kernel is compiled for; equal specializations share one program. */
struct Specialization {
  std::vector<TensorSpec> inputs;  // shapes, dtypes, writability (names are not part of the key)
  TraceOptions trace;              // target and SPMD grid / instance
  uint64_t constants = 0;          // the caller's encoding of any compile-time constants

  friend bool operator==(const Specialization& a, const Specialization& b);
};

/** @brief A hash of a Specialization: integers only. */
struct SpecializationHash {
  size_t operator()(const Specialization& s) const noexcept;
};

/** @brief One compiled specialization, ready to run. */
struct CompiledKernel {
  jit::Program program;
  std::unique_ptr<StreamExecutor> executor;
};

/**
 * @brief A kernel body plus its compiled specializations.
 *
 * `program()` and `run()` may be called from several threads; one specialization's executor
 * runs one call at a time. The specializations kept in memory hold at most memory_limit() bytes
 * together: past it the least recently used are dropped, and compiled again (from the disk cache)
 * when met again.
 */
class JitKernel {
 public:
  using Body = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;

  /** @brief The default memory_limit(), the same as Python kernels' default budget. */
  static constexpr size_t kDefaultMemoryLimit = size_t(512) << 20;

  /** `options.native` defaults to the executor chosen by NIKKI_EXECUTOR (native unless interp). */
  JitKernel(std::string name, Body body, jit::CompileOptions options = default_options());

  /** @brief The compiled form of a specialization: traced and compiled on first use. The
   * reference stays valid until the specialization is dropped (a later compile past the limit). */
  CompiledKernel& compiled(const Specialization& s);
  const jit::Program& program(const Specialization& s) { return compiled(s).program; }

  /** @brief Compiles if needed and runs on the caller's dense row-major buffers (inputs in
   * parameter order, outputs in return order). */
  void run(const Specialization& s, std::span<void* const> inputs, std::span<void* const> outputs);

  /** @brief How many specializations are compiled and kept. */
  size_t size() const;
  const std::string& name() const { return name_; }

  /** @brief The approximate bytes the kept specializations hold (programs and executors). */
  size_t memory_bytes() const;
  size_t memory_limit() const;
  /** @brief Drops least recently used specializations until they hold at most `bytes` (the most
   * recently used one is always kept). */
  void set_memory_limit(size_t bytes);

  static jit::CompileOptions default_options();

 private:
  struct Entry {
    std::mutex running;
    CompiledKernel kernel;
    size_t bytes = 0;
    std::list<const Specialization*>::iterator use;  // its place in uses_
  };
  std::shared_ptr<Entry> entry(const Specialization& s);
  void shrink_locked();

  std::string name_;
  Body body_;
  jit::CompileOptions options_;
  ExecutorKind kind_;
  mutable std::mutex mutex_;
  std::unordered_map<Specialization, std::shared_ptr<Entry>, SpecializationHash> cache_;
  std::list<const Specialization*> uses_;  // keys of cache_, least recently used first
  size_t bytes_ = 0;
  size_t limit_ = kDefaultMemoryLimit;
};

}  // namespace nikki::runtime
