// fp8 operands of the Tensor engine, shared by the kernels that take fp8 weights or activations.
#pragma once

#include <cmath>

#include "nikki/tensor.hpp"

namespace nikki::kernels::toolkit {

/** @brief The dtype trn2's TensorE reads an fp8 operand as: OCP e4m3fn as Trainium's e4m3 (max
 *  240), which has the same bits for every value within +-240. */
inline DType tensor_engine_fp8_dtype(DType d) { return d == DType::float8_e4m3fn ? DType::float8_e4m3 : d; }

/** @brief `t` as TensorE reads it (an e4m3fn tensor viewed as e4m3). */
inline Tensor as_tensor_engine_fp8(const Tensor& t) {
  const DType d = tensor_engine_fp8_dtype(t.dtype());
  return d == t.dtype() ? t : t.view(d);
}

/** @brief A drawn per-column dequantization scale for fp8 test weights of magnitude ~32 (inside
 *  e4m3's +-240): positive, from a standard normal draw `n`, restoring N(0, 1 / fan_in) weights. */
inline double drawn_fp8_scale(double n, double fan_in) { return (0.5 + 0.5 * std::fabs(n)) / (32 * std::sqrt(fan_in)); }

}  // namespace nikki::kernels::toolkit
