// Read-only introspection of a kernel's IR for Python tooling (executors, analyzers, visualizers).
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <string_view>

#include "nikki/ir.hpp"

namespace nikki::bindings {

/** @brief A shape as a Python tuple of ints. */
pybind11::tuple shape_tuple(const Shape& s);

/**
 * @brief A Python integer (or object with __index__) as int64_t. Python integers are unbounded:
 * one outside int64 throws ViewError naming `what` and the limit, instead of pybind11's
 * "incompatible function arguments".
 */
int64_t int64_from_python(const pybind11::handle& value, std::string_view what);

/** @brief A sequence of Python integers as a Shape; ViewError naming the shape when an extent
 * does not fit in int64 or the rank exceeds kMaxRank. */
Shape shape_from_python(const pybind11::handle& dims);

/**
 * @brief Adds storages(), instructions(), instruction(i), inputs, outputs and target to the
 * already registered `Kernel` class, and the TensorView / RegisterRef operand types to the module.
 * Must run after `Kernel` is registered.
 */
void bind_introspection(pybind11::module_& m);

}  // namespace nikki::bindings
