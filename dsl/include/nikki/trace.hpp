// nikki::trace — runs a C++ kernel function once to record its IR (tracing is specialization:
// C++ loops and conditionals run at trace time, exactly as Python ones do under @nki.jit).
#pragma once

#include <algorithm>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "nikki/nl_init.hpp"

namespace nikki {

/** @brief Shape and dtype of one kernel input (an HBM tensor). */
struct TensorSpec {
  Shape shape;
  DType dtype = DType::float32;
  std::string name;
  bool writable = false;  // the kernel may write this input (nt.mutable_tensor)
};

/** @brief Convenience constructor: spec({128, 512}, nl::float32, "x"). */
inline TensorSpec spec(Shape shape, DType dtype, std::string name = {}) {
  return TensorSpec{shape, dtype, std::move(name), false};
}

/** @brief How to trace: target and, for SPMD launches, the grid and this instance's ids. */
struct TraceOptions {
  TargetId target = default_target();
  ProgramGrid grid;
  bool sanitize = false;  // record nl::affine_range loops for the sanitizer (jit/sanitize.hpp)
};

namespace detail {

inline void add_output(KernelBuilder& b, const Tensor& t, const Loc& loc) {
  const Storage& s = t.storage();
  const bool whole = t.access().offset == 0 && t.shape() == s.shape && t.is_contiguous() && !t.access().is_dynamic();
  const bool returnable = s.role == StorageRole::output || (s.role == StorageRole::input && s.writable_input);
  if (!returnable || !whole)
    throw KernelError(fmt::format("kernel returns {}tensor '{}' in {}", whole ? "" : "a view of ", s.name,
                                  buffer_name(s.buffer)),
                      b.source(s.loc), "return", "kernel outputs are whole tensors allocated in shared_hbm",
                      "allocate the output with nl.ndarray(shape, dtype, buffer=nl.shared_hbm), write it, "
                      "and return it");
  b.add_output(t.access().storage);
}

template <class R>
void add_outputs(KernelBuilder& b, const R& result, const Loc& loc) {
  if constexpr (std::is_same_v<R, Tensor>) {
    add_output(b, result, loc);
  } else if constexpr (std::is_same_v<R, std::vector<Tensor>>) {
    for (const Tensor& t : result) add_output(b, t, loc);
  } else {
    std::apply([&](const auto&... ts) { (add_output(b, ts, loc), ...); }, result);
  }
  // shared_hbm tensors the kernel does not return are its HBM scratch space.
  const std::vector<StorageId>& outputs = b.kernel().outputs;
  for (StorageId id = 0; id < b.kernel().storages.size(); ++id)
    if (b.storage(id).role == StorageRole::output && std::find(outputs.begin(), outputs.end(), id) == outputs.end())
      b.storage(id).role = StorageRole::scratch;
}

/** @brief Creates the HBM input tensor of one spec in the kernel being built. */
inline Tensor make_input(KernelBuilder& builder, const TensorSpec& s) {
  StorageId id = builder.add_storage(s.name.empty() ? "in" : s.name, Buffer::hbm, s.dtype, s.shape,
                                     StorageRole::input, 0);
  builder.storage(id).writable_input = s.writable;
  return Tensor(&builder, full_view(id, s.dtype, s.shape));
}

}  // namespace detail

/**
 * @brief Traces `fn(Tensor...)` into a Kernel. `fn` receives one HBM tensor per spec and returns
 * its outputs: a Tensor, a std::tuple/std::pair of Tensors, or a std::vector<Tensor>.
 */
template <class Fn, class... Specs>
Kernel trace(const TraceOptions& options, std::string name, Fn&& fn, const Specs&... specs) {
  static_assert((std::is_convertible_v<Specs, TensorSpec> && ...), "kernel inputs are given as TensorSpec");
  KernelBuilder builder(std::move(name), options.target, options.grid);
  builder.record_parallel_loops(options.sanitize);
  BuilderScope scope(builder);
  // Inputs are created left to right so storage ids follow parameter order.
  std::vector<Tensor> inputs;
  (inputs.push_back(detail::make_input(builder, specs)), ...);
  auto call = [&]<size_t... I>(std::index_sequence<I...>) { return fn(inputs[I]...); };
  using Result = decltype(call(std::index_sequence_for<Specs...>{}));
  static_assert(!std::is_void_v<Result>, "a kernel returns its outputs");
  Result result = call(std::index_sequence_for<Specs...>{});
  detail::add_outputs(builder, result, Loc::current());
  return builder.finish();
}

/**
 * @brief Traces a kernel whose inputs are known only at run time (the library registry, the
 * Python bindings): `fn` receives one HBM tensor per spec, in order, and returns its outputs.
 */
template <class Fn>
Kernel trace_specs(const TraceOptions& options, std::string name, const std::vector<TensorSpec>& specs, Fn&& fn) {
  KernelBuilder builder(std::move(name), options.target, options.grid);
  builder.record_parallel_loops(options.sanitize);
  BuilderScope scope(builder);
  std::vector<Tensor> inputs;
  inputs.reserve(specs.size());
  for (const TensorSpec& s : specs) inputs.push_back(detail::make_input(builder, s));
  detail::add_outputs(builder, fn(std::as_const(inputs)), Loc::current());
  return builder.finish();
}

/** @brief trace() for the default target without a grid. */
template <class Fn, class... Specs>
Kernel trace(std::string name, Fn&& fn, const Specs&... specs) {
  return trace(TraceOptions{}, std::move(name), std::forward<Fn>(fn), specs...);
}

}  // namespace nikki
