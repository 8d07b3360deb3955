// One AdamW optimizer step over a flat parameter buffer (torch.optim.AdamW's update).
//
// The kernel is memory-bound: it reads the parameters, the gradient and both moments and writes
// the parameters and both moments, 28 bytes per fp32 parameter, while its nine element-wise
// instructions spread over three engines. The buffer is viewed as [128, N / 128] (each partition
// a contiguous run) in column chunks, plus a tail of N % 128 elements; chunks go through rings
// of tiles and the task scheduler overlaps the loads of the next chunks with the maths and stores
// of the current one. It is also the worked example of docs/adding-a-kernel.md.
#pragma once

#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "nikki/kernels/optim/adamw_reference.hpp"
#include "nikki/kernels/toolkit/argument_check.hpp"
#include "nikki/kernels/toolkit/buffers.hpp"
#include "nikki/kernels/toolkit/registration.hpp"
#include "nikki/kernels/toolkit/task_scheduler.hpp"
#include "nikki/kernels/toolkit/tiling.hpp"

namespace nikki::kernels {

inline constexpr const char* adamw_doc = R"(One AdamW step (torch.optim.AdamW's update) over a flat parameter buffer.

Dimensions: param [N], grad [N], exp_avg [N], exp_avg_sq [N] -> param_out, exp_avg_out,
            exp_avg_sq_out [N]; any N >= 1.
Args:       param, exp_avg, exp_avg_sq: float32; grad: float32 or bfloat16 (widened exactly).
            lr, beta1, beta2, eps, weight_decay: the optimizer's hyperparameters.
            step: the step's number, counting from 1 (for the bias corrections).
Returns:    the updated param, exp_avg and exp_avg_sq, float32.
Notes:      The operations and their order are torch's single-tensor AdamW in float32, each
            rounded to float32, with the host constants (1 - lr * weight_decay, 1 - beta1, the
            bias corrections) computed in double as torch does. Differences of rounding remain
            where torch's CPU kernels fuse a multiply-add (its lerp of exp_avg and, on hosts with
            FMA, its addcmul of exp_avg_sq: one rounding where nikki rounds twice, so within one
            unit in the last place), and the engines have no divide, so torch's two divisions
            become multiplies by reciprocals (param within a few units in the last place).
Pseudocode: param = param * (1 - lr * weight_decay)
            exp_avg = exp_avg + (1 - beta1) * (grad - exp_avg)
            exp_avg_sq = beta2 * exp_avg_sq + (1 - beta2) * grad * grad
            denom = sqrt(exp_avg_sq) / sqrt(1 - beta2^step) + eps
            param = param - lr / (1 - beta1^step) * exp_avg / denom)";

namespace optim {

/** The step's maths on one tile, an instruction per call (each is a task of the schedule). */
struct AdamWMath {
  reference::AdamWStep h;

  /** decayed = param * (1 - lr * weight_decay), on `engine` (Scalar or Vector). */
  void decay(const Tensor& decayed, const Tensor& param, Engine engine) const {
    isa::tensor_scalar(decayed, param, nl::multiply, 1 - h.lr * h.weight_decay, {.engine = engine});
  }
  /** exp_avg += (1 - beta1) * (grad - exp_avg), through `diff`. */
  static void grad_minus_avg(const Tensor& diff, const Tensor& grad, const Tensor& exp_avg, Engine engine) {
    isa::tensor_tensor(diff, grad, exp_avg, nl::subtract, engine);
  }
  void first_moment(const Tensor& exp_avg, const Tensor& diff) const {
    isa::scalar_tensor_tensor(exp_avg, diff, nl::multiply, 1 - h.beta1, nl::add, exp_avg);
  }
  /** exp_avg_sq = beta2 * exp_avg_sq + (1 - beta2) * grad * grad, through `sq`. */
  void scaled_square(const Tensor& sq, const Tensor& grad) const {
    isa::scalar_tensor_tensor(sq, grad, nl::multiply, 1 - h.beta2, nl::multiply, grad);
  }
  void second_moment(const Tensor& exp_avg_sq, const Tensor& sq) const {
    isa::scalar_tensor_tensor(exp_avg_sq, exp_avg_sq, nl::multiply, h.beta2, nl::add, sq);
  }
  /** denom = sqrt(exp_avg_sq) * (1 / sqrt(1 - beta2^step)) + eps: the root on the Scalar engine.
   *  The engines have no divide: torch's division by the bias correction becomes a multiply by
   *  its reciprocal (computed in double), which can round differently by one ulp. */
  static void root(const Tensor& denom, const Tensor& exp_avg_sq) { isa::activation(denom, nl::sqrt, exp_avg_sq); }
  void denominator(const Tensor& denom, Engine engine) const {
    isa::tensor_scalar(denom, denom, nl::multiply, 1 / std::sqrt(1 - std::pow(h.beta2, double(h.step))),
                       {.op1 = nl::add, .operand1 = h.eps, .engine = engine});
  }
  /** ratio = exp_avg / denom, as exp_avg times the reciprocal of denom (in place in `denom`). */
  static void reciprocal(const Tensor& denom, Engine engine) {
    if (engine == Engine::scalar) isa::activation(denom, nl::reciprocal, denom);
    else isa::reciprocal(denom, denom);
  }
  static void ratio(const Tensor& ratio, const Tensor& exp_avg, const Tensor& recip, Engine engine) {
    isa::tensor_tensor(ratio, exp_avg, recip, nl::multiply, engine);
  }
  void update(const Tensor& param, const Tensor& ratio, const Tensor& decayed) const {
    isa::scalar_tensor_tensor(param, ratio, nl::multiply, -(h.lr / (1 - std::pow(h.beta1, double(h.step)))), nl::add,
                              decayed);
  }
};

inline void check_adamw(const ArgumentCheck& check, const Tensor& param, const Tensor& grad, const Tensor& exp_avg,
                        const Tensor& exp_avg_sq, const reference::AdamWStep& h) {
  for (const Tensor* t : {&param, &grad, &exp_avg, &exp_avg_sq})
    check.require(t->ndim() == 1 && t->shape() == param.shape(),
                  "'" + t->name() + "' must be 1-D with param's shape " + param.shape().str() + ", got " +
                      t->shape().str(),
                  "flatten the buffers (nikki.torch.adamw_step does)");
  for (const Tensor* t : {&param, &exp_avg, &exp_avg_sq})
    check.require(t->dtype() == DType::float32,
                  "'" + t->name() + "' must be float32, got " + std::string(dtype_name(t->dtype())));
  check.require(grad.dtype() == DType::float32 || grad.dtype() == DType::bfloat16,
                "grad must be float32 or bfloat16, got " + std::string(dtype_name(grad.dtype())));
  check.require(h.step >= 1, "step counts from 1, got " + std::to_string(h.step));
  check.require(h.beta1 >= 0 && h.beta1 < 1 && h.beta2 >= 0 && h.beta2 < 1,
                "beta1 and beta2 must be in [0, 1), got " + std::to_string(h.beta1) + " and " + std::to_string(h.beta2));
  check.require(h.lr >= 0 && h.eps >= 0 && h.weight_decay >= 0, "lr, eps and weight_decay must be non-negative");
}

}  // namespace optim

/** @brief (param, exp_avg, exp_avg_sq) after one AdamW step; see adamw_doc. */
inline std::vector<Tensor> adamw(const Tensor& param, const Tensor& grad, const Tensor& exp_avg,
                                 const Tensor& exp_avg_sq, const reference::AdamWStep& h, Loc loc = Loc::current()) {
  namespace nl = nikki::nl;
  namespace isa = nikki::isa;
  using toolkit::first;
  const ArgumentCheck check("adamw", param, loc);
  optim::check_adamw(check, param, grad, exp_avg, exp_avg_sq, h);
  const optim::AdamWMath math{h};
  const int64_t N = param.shape()[0], P = nl::tile_size().pmax;
  const int64_t cols = N / P, tail = N % P;
  std::vector<Tensor> outs;
  for (const char* name : {"param_out", "exp_avg_out", "exp_avg_sq_out"})
    outs.push_back(nl::ndarray({N}, nl::float32, nl::shared_hbm, name));

  // Three tiles of each input in flight (loading, computing, storing) and two of each temporary.
  constexpr int64_t kDepth = 3, kTemps = 2;
  toolkit::Budget budget(check);
  const int64_t per_column = kDepth * (3 * 4 + dtype_size(grad.dtype())) + 2 * kTemps * 4;
  const int64_t W = std::min<int64_t>(std::max<int64_t>(cols, 1), *budget.largest({4096, 2048, 1024, 512, 256}, [&](int64_t w) {
    return w * per_column;
  }));
  auto ring = [&](DType dt, int64_t depth, const char* name) { return budget.sbuf_ring({P, W}, dt, depth, name); };
  toolkit::Ring p_ring = ring(nl::float32, kDepth, "param"), g_ring = ring(grad.dtype(), kDepth, "grad");
  toolkit::Ring m_ring = ring(nl::float32, kDepth, "exp_avg"), v_ring = ring(nl::float32, kDepth, "exp_avg_sq");
  toolkit::Ring a_ring = ring(nl::float32, kTemps, "decayed"), b_ring = ring(nl::float32, kTemps, "scratch");

  // The buffer as [P, cols] (partition q holds elements q * cols ...), then [tail, 1].
  struct Piece {
    int64_t p, c0, w;
  };
  std::vector<Piece> pieces;
  for (const toolkit::ColumnChunk& c : cols > 0 ? toolkit::column_chunks(cols, W) : std::vector<toolkit::ColumnChunk>{})
    pieces.push_back({P, c.c0, c.width});
  if (tail > 0) pieces.push_back({tail, 0, 1});
  auto hbm = [&](const Tensor& t, const Piece& pc) {
    if (pc.p == P) return t(nl::ds(0, P * cols)).reshape({P, cols})(nl::all, nl::ds(pc.c0, pc.w));
    return t(nl::ds(P * cols, tail)).reshape({tail, 1});
  };

  toolkit::TaskScheduler sch;
  const Engine vector = Engine::vector, scalar = Engine::scalar, gpsimd = Engine::gpsimd;
  for (const Piece& pc : pieces) {
    auto tile = [&](toolkit::Ring& r) { return r.next()(first(pc.p), nl::ds(0, pc.w)); };
    const Tensor p = tile(p_ring), g = tile(g_ring), m = tile(m_ring), v = tile(v_ring), a = tile(a_ring), b = tile(b_ring);
    sch.add([&] { isa::dma_copy(p, hbm(param, pc)); });
    sch.add([&] { isa::dma_copy(g, hbm(grad, pc)); });
    sch.add([&] { isa::dma_copy(m, hbm(exp_avg, pc)); });
    sch.add([&] { isa::dma_copy(v, hbm(exp_avg_sq, pc)); });
    sch.add_any({[&] { math.decay(a, p, scalar); }, [&] { math.decay(a, p, vector); }});
    sch.add_any({[&] { math.grad_minus_avg(b, g, m, gpsimd); }, [&] { math.grad_minus_avg(b, g, m, vector); }});
    sch.add([&] { math.first_moment(m, b); });
    sch.add([&] { isa::dma_copy(hbm(outs[1], pc), m); });
    sch.add([&] { math.scaled_square(b, g); });
    sch.add([&] { math.second_moment(v, b); });
    sch.add([&] { isa::dma_copy(hbm(outs[2], pc), v); });
    sch.add([&] { math.root(b, v); });
    sch.add_any({[&] { math.denominator(b, scalar); }, [&] { math.denominator(b, vector); }});
    sch.add_any({[&] { math.reciprocal(b, scalar); }, [&] { math.reciprocal(b, vector); }});
    sch.add_any({[&] { math.ratio(b, m, b, gpsimd); }, [&] { math.ratio(b, m, b, vector); }});
    sch.add([&] { math.update(p, b, a); });
    sch.add([&] { isa::dma_copy(hbm(outs[0], pc), p); });
  }
  sch.run();
  return outs;
}

namespace optim {

inline reference::AdamWStep adamw_step(const ParamValues& p) {
  return {p.real("lr"), p.real("beta1"), p.real("beta2"), p.real("eps"), p.real("weight_decay"), p.integer("step")};
}

inline ExampleCase adamw_case(int64_t N, DType grad, std::string label, Params params = {}) {
  return ExampleCase{{spec({N}, DType::float32), spec({N}, grad), spec({N}, DType::float32), spec({N}, DType::float32)},
                     std::move(params), std::move(label)};
}

/** Inputs as an optimizer holds them: exp_avg_sq is a running mean of squares (non-negative). */
inline std::vector<RefTensor> adamw_inputs(const ExampleCase& c, CaseRng& r) {
  std::vector<RefTensor> in;
  for (const TensorSpec& s : c.inputs) in.push_back(random_input(s, r));
  for (double& x : in[3].data) x = round_to(DType::float32, x * x);
  return in;
}

}  // namespace optim

inline KernelInfo adamw_info() {
  using optim::adamw_case;
  return KernelInfo{
      .name = "adamw",
      .summary = "one AdamW optimizer step over a flat float32 parameter buffer",
      .doc = adamw_doc,
      .inputs = {"param", "grad", "exp_avg", "exp_avg_sq"},
      .outputs = {"param_out", "exp_avg_out", "exp_avg_sq_out"},
      .params = {{"lr", ParamKind::real, 1e-3, "learning rate"},
                 {"beta1", ParamKind::real, 0.9, "decay of the first moment"},
                 {"beta2", ParamKind::real, 0.999, "decay of the second moment"},
                 {"eps", ParamKind::real, 1e-8, "added to the denominator"},
                 {"weight_decay", ParamKind::real, 1e-2, "decoupled weight decay"},
                 {"step", ParamKind::integer, 1, "the step's number, from 1"}},
      .dtypes = {DType::float32, DType::bfloat16},
      .backward = "",
      .gradient = "not differentiable (an optimizer step)",
      .saved_outputs = {},
      .body =
          [](const KernelCall& c) {
            return adamw(c.inputs[0], c.inputs[1], c.inputs[2], c.inputs[3], optim::adamw_step(c));
          },
      .reference =
          [](const std::vector<RefTensor>& in, const ParamValues& p) {
            return reference::adamw(in[0], in[1], in[2], in[3], optim::adamw_step(p));
          },
      .make_inputs = optim::adamw_inputs,
      .examples = {adamw_case(1, DType::float32, "one parameter"),
                   adamw_case(128 * 300 + 77, DType::float32, "columns and a tail", {{"step", 7}, {"lr", 3e-4}}),
                   adamw_case(100, DType::bfloat16, "tail only, bf16 gradient", {{"weight_decay", 0.0}}),
                   adamw_case(128 * 9000, DType::bfloat16, "several column chunks", {{"step", 1000}})},
      .draw =
          [](CaseRng& r) {
            const int64_t N = r.coin(0.3) ? r.size(1, 300) : r.size(1, 2000000, 128 * 512);
            Params p{{"lr", r.pick({1e-3, 3e-4, 1e-2})},    {"beta1", r.pick({0.9, 0.8, 0.0})},
                     {"beta2", r.pick({0.999, 0.95})},      {"eps", r.pick({1e-8, 1e-6})},
                     {"weight_decay", r.pick({0.0, 0.01, 0.1})}, {"step", double(r.uniform(1, 5000))}};
            return adamw_case(N, r.pick({DType::float32, DType::bfloat16}), "drawn", p);
          },
      .tolerance = {},
      .benchmark = Benchmark{adamw_case(128 * 8192 * 8, DType::bfloat16, "8M parameters, bf16 gradient"), Bound::hbm,
                             {}, 0.70},
  };
}

}  // namespace nikki::kernels
