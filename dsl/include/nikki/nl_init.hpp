// Initialized tensor creation (nl.zeros, nl.ones, nl.full): an allocation plus a memset.
#pragma once

#include "nikki/isa.hpp"

namespace nikki::nl {

/** @brief A tensor filled with `fill_value` (on-chip buffers only, as in NKI). */
inline Tensor full(const Shape& shape, double fill_value, DType dtype, Buffer buffer = sbuf,
                   std::string_view name = {}, Loc loc = Loc::current()) {
  if (!is_on_chip(buffer)) {
    KernelBuilder& b = KernelBuilder::current(loc);
    throw KernelError(fmt::format("creating an HBM tensor ({}) with an initial value is not supported",
                                  buffer_name(buffer)),
                      b.source(b.location(loc)), "full", {},
                      "create it in sbuf, or allocate it with nl.ndarray and write it with dma_copy");
  }
  Tensor t = ndarray(shape, dtype, buffer, name, std::nullopt, loc);
  isa::memset(t, fill_value, Engine::unknown, loc);
  return t;
}

/** @brief A tensor of zeros. */
inline Tensor zeros(const Shape& shape, DType dtype, Buffer buffer = sbuf, std::string_view name = {},
                    Loc loc = Loc::current()) {
  return full(shape, 0.0, dtype, buffer, name, loc);
}

/** @brief A tensor of ones. */
inline Tensor ones(const Shape& shape, DType dtype, Buffer buffer = sbuf, std::string_view name = {},
                   Loc loc = Loc::current()) {
  return full(shape, 1.0, dtype, buffer, name, loc);
}

}  // namespace nikki::nl
