// Registers the library kernel functions of nikki._core.
#pragma once

#include <pybind11/pybind11.h>

namespace nikki::bindings {

/** @brief Adds library_kernels, trace_library and inline_library to the module. */
void bind_library(pybind11::module_& m);

}  // namespace nikki::bindings
