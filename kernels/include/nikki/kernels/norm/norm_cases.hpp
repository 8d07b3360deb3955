// Test and benchmark cases of the norm kernels: drawn problems, consistent backward inputs, and
// the shape their estimates are reported at.
#pragma once

#include <string>
#include <vector>

#include "nikki/kernels/norm/norm_reference.hpp"
#include "nikki/kernels/norm/row_norm.hpp"
#include "nikki/kernels/toolkit/registration.hpp"

namespace nikki::kernels::norm_detail {

/** The input specs of a norm kernel for x [R, H] in `x_dtype` and per-column vectors in `v_dtype`. */
inline std::vector<TensorSpec> norm_specs(Kind kind, bool backward, int64_t R, int64_t H, DType x_dtype, DType v_dtype) {
  std::vector<TensorSpec> s{spec({R, H}, x_dtype), spec({H}, v_dtype)};
  if (backward) {
    if (kind == Kind::layer) s.push_back(spec({R}, DType::float32));  // mean
    s.push_back(spec({R}, DType::float32));                           // rstd
    s.push_back(spec({R, H}, x_dtype));                               // grad_out
  } else if (kind == Kind::layer) {
    s.push_back(spec({H}, v_dtype));  // beta
  }
  return s;
}

/** A random problem: mostly rows that fit SBUF, sometimes rows so wide they are streamed. */
inline ExampleCase draw_case(CaseRng& r, Kind kind, bool backward) {
  const bool wide = r.coin(0.15);
  const int64_t R = wide ? r.size(1, 4) : r.size(1, 900);
  const int64_t H = wide ? r.size(15000, 45000, 4096) : r.size(1, 3000);
  const DType x = r.pick({DType::float32, DType::bfloat16, DType::float16});
  const DType v = r.coin(0.3) ? DType::float32 : x;
  ExampleCase c{norm_specs(kind, backward, R, H, x, v), {}, "drawn"};
  if (!backward) c.params.set("eps", r.pick({1e-5, 1e-6, 1e-3}));
  return c;
}

/** Backward inputs: x, gamma, the forward's statistics of x (fp32), grad_out. */
inline std::vector<RefTensor> backward_inputs(const ExampleCase& c, CaseRng& r, Kind kind) {
  const RefTensor x = random_input(c.inputs[0], r), gamma = random_input(c.inputs[1], r);
  std::vector<RefTensor> in{x, gamma};
  if (kind == Kind::layer) {
    const RefTensor beta(gamma.shape);
    std::vector<RefTensor> f = reference::layernorm(x, gamma, beta, 1e-5);
    for (size_t i : {size_t(1), size_t(2)}) {
      for (double& v : f[i].data) v = round_to(DType::float32, v);
      in.push_back(f[i]);
    }
  } else {
    RefTensor rstd = reference::rmsnorm(x, gamma, 1e-6)[1];
    for (double& v : rstd.data) v = round_to(DType::float32, v);
    in.push_back(rstd);
  }
  in.push_back(random_input(c.inputs.back(), r));
  return in;
}

/** The shape the estimates are reported at: [8192, 4096] bf16. */
inline ExampleCase benchmark_case(Kind kind, bool backward) {
  return {norm_specs(kind, backward, 8192, 4096, DType::bfloat16, DType::bfloat16), {}, "[8192, 4096] bf16"};
}

}  // namespace nikki::kernels::norm_detail
