// Read-only introspection of a kernel's IR for Python tooling (executors, analyzers, visualizers).
#pragma once

#include <pybind11/pybind11.h>

#include "nikki/ir.hpp"

namespace nikki::bindings {

/** @brief A shape as a Python tuple of ints. */
pybind11::tuple shape_tuple(const Shape& s);

/**
 * @brief Adds storages(), instructions(), instruction(i), inputs, outputs and target to the
 * already registered `Kernel` class, and the TensorView / RegisterRef operand types to the module.
 * Must run after `Kernel` is registered.
 */
void bind_introspection(pybind11::module_& m);

}  // namespace nikki::bindings
