// Test harness: host tensors, and tracing + compiling + running a kernel in one call.
#pragma once

#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include <doctest/doctest.h>

#include "nikki/jit/compile.hpp"
#include "nikki/nikki.hpp"
#include "nikki/numerics.hpp"
#include "nikki/runtime/executor.hpp"
#include "nikki/runtime/interpreter.hpp"

namespace nikki::test {

/** @brief A dense row-major host tensor of any dtype. */
struct HostTensor {
  DType dtype = DType::float32;
  Shape shape;
  std::vector<uint8_t> bytes;

  HostTensor() = default;
  HostTensor(DType d, Shape s) : dtype(d), shape(s), bytes(s.num_elements() * dtype_size(d)) {}

  int64_t size() const { return shape.num_elements(); }
  void* data() { return bytes.data(); }
  float get(int64_t i) const { return numerics::load_float(dtype, bytes.data() + i * dtype_size(dtype)); }
  void set(int64_t i, float v) { numerics::store_float(dtype, bytes.data() + i * dtype_size(dtype), v); }
  int64_t get_int(int64_t i) const { return numerics::load_int(dtype, bytes.data() + i * dtype_size(dtype)); }
  void set_int(int64_t i, int64_t v) { numerics::store_int(dtype, bytes.data() + i * dtype_size(dtype), v); }
  TensorSpec spec(std::string name = {}) const { return TensorSpec{shape, dtype, std::move(name), false}; }
};

/** @brief Uniform random values in [lo, hi), rounded to the tensor's dtype. */
inline HostTensor random_tensor(DType dtype, Shape shape, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  HostTensor t(dtype, shape);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  for (int64_t i = 0; i < t.size(); ++i) t.set(i, dist(rng));
  return t;
}

/** @brief Compiles a traced kernel and runs it on the interpreter; returns its outputs. */
inline std::vector<HostTensor> run_kernel(Kernel kernel, std::vector<HostTensor*> inputs) {
  jit::Program program = jit::compile(std::move(kernel));
  const Kernel& k = program.kernel();
  std::vector<HostTensor> outputs;
  for (StorageId id : k.outputs) outputs.emplace_back(k.storage(id).dtype, k.storage(id).shape);
  std::vector<void*> in_ptrs, out_ptrs;
  for (HostTensor* t : inputs) in_ptrs.push_back(t->data());
  for (HostTensor& t : outputs) out_ptrs.push_back(t.data());
  runtime::Interpreter interpreter(k);
  interpreter.run(in_ptrs, out_ptrs);
  return outputs;
}

/** @brief How a test runs a compiled kernel. */
enum class Mode {
  program_order,   // the reference interpreter in program order
  streams_interp,  // the streams, latest-first, with the reference semantics
  streams_native,  // the streams, latest-first, with native routines
};

/** @brief Compiles and runs a kernel in the given mode; returns its outputs. */
/** @brief How many instructions the last stream run executed natively and interpreted. */
struct RunCounts {
  int64_t native = 0;
  int64_t interpreted = 0;
};

inline std::vector<HostTensor> run_kernel(Kernel kernel, std::vector<HostTensor*> inputs, Mode mode,
                                          jit::CompileOptions options = {}, RunCounts* counts = nullptr) {
  options.native = mode == Mode::streams_native;
  jit::Program program = jit::compile(std::move(kernel), options);
  const Kernel& k = program.kernel();
  std::vector<HostTensor> outputs;
  for (StorageId id : k.outputs) outputs.emplace_back(k.storage(id).dtype, k.storage(id).shape);
  std::vector<void*> in_ptrs, out_ptrs;
  for (HostTensor* t : inputs) in_ptrs.push_back(t->data());
  for (HostTensor& t : outputs) out_ptrs.push_back(t.data());
  if (mode == Mode::program_order) {
    runtime::Interpreter(k).run(in_ptrs, out_ptrs);
  } else {
    runtime::StreamExecutor exec(program.device,
                                 mode == Mode::streams_native ? runtime::ExecutorKind::native : runtime::ExecutorKind::interp,
                                 program.native);
    exec.run(in_ptrs, out_ptrs);
    if (counts) *counts = {exec.native_count(), exec.interpreted_count()};
  }
  return outputs;
}

/** @brief Traces fn on the inputs' specs, compiles and runs it; returns the single output. */
template <class Fn, class... T>
HostTensor run1(Fn&& fn, T&... inputs) {
  Kernel k = trace("test", std::forward<Fn>(fn), inputs.spec()...);
  return run_kernel(std::move(k), {&inputs...}).at(0);
}

/** @brief The KernelError message thrown while tracing+compiling fn, or "" if none. */
template <class Fn, class... Specs>
std::string compile_error(Fn&& fn, const Specs&... specs) {
  try {
    Kernel k = trace("test", std::forward<Fn>(fn), specs...);
    jit::compile(std::move(k));
  } catch (const KernelError& e) {
    return e.what();
  }
  return {};
}

}  // namespace nikki::test
