// The sanitizer's static pass: dependencies between iterations of nl.affine_range loops.
//
// NKI lets the compiler reorder and overlap the iterations of an affine_range loop, so a kernel
// whose iterations depend on one another may compute something else on hardware than in program
// order, as nikki runs it. Tracing for the sanitizer records which instructions each iteration
// emitted (Kernel::parallel_loops); this pass looks for memory one iteration writes and another
// reads or writes. The run-time half (reads of uninitialized memory) is the reference
// interpreter's (runtime/interpreter.hpp).
#pragma once

#include <string>

#include "nikki/ir.hpp"

namespace nikki::jit {

/** @brief NIKKI_SANITIZE: "1" turns the sanitizer on, "0" or unset leaves it off; anything else
 * is a KernelError. */
bool sanitize_from_env();

/**
 * @brief Checks that no iteration of a recorded nl.affine_range loop depends on another.
 *
 * A dependency is memory that one iteration writes and another iteration reads or writes
 * (overlapping views of one tensor). NKI allows associative accumulations across iterations:
 * nc_matmul accumulating into one PSUM tile, and `+=`-style updates (tensor_tensor / tensor_scalar
 * add, multiply, max, min, bitwise and/or/xor of a tile with itself); reading such an accumulator
 * inside the loop, while it holds a partial result, is a dependency. Accesses through runtime
 * offsets are not checked (their addresses are unknown before running).
 *
 * Throws a KernelError for the first dependency, located at the later instruction and naming the
 * loop's line, the other instruction's line, the tensor and both iterations. Works before or
 * after allocation (tensors are told apart by storage, not address).
 */
void check_parallel_loops(const Kernel& kernel);

/** @brief What check_parallel_loops looked at (loops, iterations, instructions), for NIKKI_DUMP. */
std::string parallel_loops_summary(const Kernel& kernel);

}  // namespace nikki::jit
