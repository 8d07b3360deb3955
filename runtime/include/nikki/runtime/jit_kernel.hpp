// JitKernel: a C++ kernel function with @nki.jit's behaviour. Each specialization (input shapes
// and dtypes, target, SPMD instance, and a caller-chosen key for compile-time constants) is traced
// and compiled once — through the disk cache when enabled — and then served from memory: a hit
// hashes a few integers and does one hash-map lookup, never touching the IR or building strings.
#pragma once

#include <functional>
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
 * runs one call at a time.
 */
class JitKernel {
 public:
  using Body = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;

  /** `options.native` defaults to the executor chosen by NIKKI_EXECUTOR (native unless interp). */
  JitKernel(std::string name, Body body, jit::CompileOptions options = default_options());

  /** @brief The compiled form of a specialization: traced and compiled on first use. */
  CompiledKernel& compiled(const Specialization& s);
  const jit::Program& program(const Specialization& s) { return compiled(s).program; }

  /** @brief Compiles if needed and runs on the caller's dense row-major buffers (inputs in
   * parameter order, outputs in return order). */
  void run(const Specialization& s, std::span<void* const> inputs, std::span<void* const> outputs);

  /** @brief How many specializations are compiled. */
  size_t size() const;
  const std::string& name() const { return name_; }

  static jit::CompileOptions default_options();

 private:
  struct Entry {
    std::mutex running;
    CompiledKernel kernel;
  };
  Entry& entry(const Specialization& s);

  std::string name_;
  Body body_;
  jit::CompileOptions options_;
  ExecutorKind kind_;
  mutable std::mutex mutex_;
  std::unordered_map<Specialization, std::unique_ptr<Entry>, SpecializationHash> cache_;
};

}  // namespace nikki::runtime
