// fp8 matrix product with per-row and per-column dequantization scales: the matmul family's
// tiling with the scales applied to the fp32 accumulators as they leave PSUM.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "nikki/kernels/matmul/matmul.hpp"
#include "nikki/kernels/quant/quant_reference.hpp"
#include "nikki/kernels/toolkit/argument_check.hpp"
#include "nikki/kernels/toolkit/fp8.hpp"
#include "nikki/kernels/toolkit/registration.hpp"

namespace nikki::kernels {

inline constexpr const char* fp8_matmul_doc = R"(fp8 matrix product with per-row and per-column dequantization scales.

Dimensions: a [M, K], a_scale [M], b [K, N], b_scale [N], bias [N] -> out [M, N]; any M, K, N.
Args:       a, b: fp8 of one e4m3 format (float8_e4m3fn as rmsnorm_quant gives it, or Neuron's
            float8_e4m3), or both float8_e5m2.
            a_scale, b_scale: float32 dequantization scales of a's rows and b's columns.
            bias: float32 or bfloat16, added after the scaling (zeros for none).
            fp32_out: the output in float32 (default: bfloat16).
Returns:    out = (a @ b) * a_scale[:, None] * b_scale[None, :] + bias, bfloat16 or float32.
Notes:      matmul's tiling (a's row blocks transposed on chip once, b streamed, 4 fp32 PSUM
            accumulators of [128, 512]); fp8 products are exact and accumulate in fp32 PSUM; one
            VectorE pass applies both scales as the accumulators leave PSUM, then the bias, and
            the result is rounded once. trn2's TensorE multiplies float8_e4m3 (Trainium's, max
            240), not OCP float8_e4m3fn: e4m3fn operands are read as e4m3, which has the same
            bits for every value within +-240 (what rmsnorm_quant produces); e4m3fn values of
            256 to 448 would read as inf or NaN, so quantize to +-240. Inference only.
Pseudocode: acc = a.float() @ b.float()                        # fp32 PSUM
            out = acc * a_scale[:, None] * b_scale[None, :] + bias)";

/** @brief out = (a @ b) * a_scale[:, None] * b_scale[None, :] (+ bias); see fp8_matmul_doc. */
inline Tensor fp8_matmul(const Tensor& a, const Tensor& a_scale, const Tensor& b, const Tensor& b_scale,
                         const std::optional<Tensor>& bias = std::nullopt, DType out_dtype = DType::bfloat16,
                         Loc loc = Loc::current()) {
  const ArgumentCheck check("fp8_matmul", a, loc);
  check.require(a.ndim() == 2 && b.ndim() == 2, "a and b must be 2-D, got " + a.shape().str() + " and " + b.shape().str(),
                "reshape to [M, K] and [K, N]");
  const int64_t M = a.shape()[0], K = a.shape()[1], N = b.shape()[1];
  check.require(b.shape()[0] == K, "contraction sizes differ: a is " + a.shape().str() + ", b is " + b.shape().str(),
                "a [M, K] @ b [K, N] needs a.shape[1] == b.shape[0]");
  for (const Tensor* t : {&a, &b})
    check.require(is_fp8(t->dtype()),
                  "'" + t->name() + "' must be fp8 (float8_e4m3fn, float8_e4m3 or float8_e5m2), got " +
                      std::string(dtype_name(t->dtype())),
                  "quantize it first (rmsnorm_quant), or use matmul for 16-bit operands");
  const auto family = [](DType d) { return d == DType::float8_e5m2 ? 0 : 1; };
  check.require(family(a.dtype()) == family(b.dtype()),
                "a is " + std::string(dtype_name(a.dtype())) + " but b is " + std::string(dtype_name(b.dtype())),
                "give both operands the same fp8 format");
  auto check_vector = [&](const Tensor& v, int64_t n, const std::string& of, bool bf16_ok) {
    check.require(v.ndim() == 1 && v.shape()[0] == n && (v.dtype() == DType::float32 || (bf16_ok && v.dtype() == DType::bfloat16)),
                  "'" + v.name() + "' must be a float32" + (bf16_ok ? " or bfloat16" : "") + " tensor of shape [" +
                      std::to_string(n) + "] (" + of + "), got " + std::string(dtype_name(v.dtype())) + v.shape().str(),
                  "pass one value per " + of.substr(0, of.find(' ')));
  };
  check_vector(a_scale, M, "row of a", false);
  check_vector(b_scale, N, "column of b", false);
  if (bias) check_vector(*bias, N, "column of the output", true);
  check.require(out_dtype == DType::bfloat16 || out_dtype == DType::float32, "the output must be bfloat16 or float32");
  return matmul(toolkit::as_tensor_engine_fp8(a), toolkit::as_tensor_engine_fp8(b),
                MatmulOptions{.out_dtype = out_dtype, .bias = bias, .row_scale = a_scale, .col_scale = b_scale}, loc);
}

inline KernelInfo fp8_matmul_info() {
  auto mm = [](int64_t M, int64_t K, int64_t N, DType d, bool fp32_out, std::string label) {
    ExampleCase c{{spec({M, K}, d), spec({M}, DType::float32), spec({K, N}, d), spec({N}, DType::float32),
                   spec({N}, DType::float32)},
                  {},
                  std::move(label)};
    if (fp32_out) c.params.set("fp32_out", 1);
    return c;
  };
  const DType fn = DType::float8_e4m3fn;
  return KernelInfo{
      .name = "fp8_matmul",
      .summary = "fp8 matrix product with per-row and per-column dequantization scales",
      .doc = fp8_matmul_doc,
      .inputs = {"a", "a_scale", "b", "b_scale", "bias"},
      .outputs = {"out"},
      .params = {{"fp32_out", ParamKind::boolean, 0, "the output in float32 instead of bfloat16"}},
      .dtypes = {DType::float8_e4m3fn, DType::float8_e4m3, DType::float8_e5m2, DType::float32, DType::bfloat16},
      .backward = "",
      .gradient = "none: an inference kernel (fp8 weights and activations are not trained through it)",
      .saved_outputs = {},
      .body =
          [](const KernelCall& c) {
            return std::vector<Tensor>{fp8_matmul(c.inputs[0], c.inputs[1], c.inputs[2], c.inputs[3], c.inputs[4],
                                                  c.flag("fp32_out") ? DType::float32 : DType::bfloat16)};
          },
      .reference =
          [](const std::vector<RefTensor>& in, const ParamValues&) {
            return std::vector<RefTensor>{reference::fp8_matmul(in[0], in[1], in[2], in[3], &in[4])};
          },
      // fp8 operands of standard normal values (rounded to the fp8 grid), positive scales.
      .make_inputs =
          [](const ExampleCase& c, CaseRng& r) {
            std::vector<RefTensor> in;
            for (const TensorSpec& s : c.inputs) in.push_back(random_input(s, r));
            for (int i : {1, 3})
              for (double& v : in[size_t(i)].data) v = round_to(DType::float32, 0.01 + 0.1 * std::fabs(v));
            return in;
          },
      .examples = {mm(1, 1, 1, fn, false, "tiny"),
                   mm(130, 200, 520, fn, false, "tails in every dim, two column tiles"),
                   mm(520, 130, 40, DType::float8_e4m3, true, "Neuron's e4m3, two row blocks, fp32 out"),
                   mm(257, 1, 513, DType::float8_e5m2, false, "e5m2, K = 1"),
                   mm(3, 40000, 5, fn, true, "large K: blocks summed through HBM, scaled as they are stored")},
      .draw =
          [mm](CaseRng& r) {
            const DType d = r.pick({DType::float8_e4m3fn, DType::float8_e4m3, DType::float8_e5m2});
            return mm(r.size(1, 700), r.size(1, 900), r.size(1, 1100, 512), d, r.coin(), "drawn");
          },
      // Exact fp8 products summed in fp32 (errors ~ sqrt(K) 2^-24 of the magnitudes), then one
      // rounding to the output dtype.
      .tolerance =
          [](const ExampleCase& c) {
            return c.params.find("fp32_out").value_or(0) != 0 ? Tolerance{2e-5, 2e-5} : Tolerance{1.0 / 128, 1.0 / 128};
          },
      .benchmark = Benchmark{mm(4096, 4096, 4096, fn, false, "4096 x 4096 x 4096 fp8 e4m3, bf16 out"),
                             Bound::tensor_engine, matmul_flops(0, 2), 0.70},
  };
}

}  // namespace nikki::kernels
