// The native executor against the reference interpreter, bit for bit, and the streams against
// program order: every kernel here runs three ways and must produce identical bytes.
#include <cstring>

#include "harness.hpp"
#include "nikki/kernels/softmax.hpp"

namespace {

using namespace nikki;
using test::HostTensor;
using test::Mode;

/** Runs `fn` three ways and checks that every output is bitwise identical. */
template <class Fn, class... T>
void check_all_modes(const char* what, Fn fn, T&... inputs) {
  test::RunCounts counts;
  auto run = [&](Mode mode) {
    Kernel k = trace(what, fn, inputs.spec()...);
    return test::run_kernel(std::move(k), {&inputs...}, mode, {}, &counts);
  };
  std::vector<HostTensor> ref = run(Mode::program_order);
  for (Mode mode : {Mode::streams_interp, Mode::streams_native}) {
    std::vector<HostTensor> got = run(mode);
    REQUIRE(got.size() == ref.size());
    for (size_t i = 0; i < ref.size(); ++i) {
      INFO(what << " output " << i << (mode == Mode::streams_native ? " native" : " streams"));
      CHECK(got[i].bytes == ref[i].bytes);
    }
  }
  // Every instruction of these kernels has a native routine: none may fall back silently.
  CHECK(counts.interpreted == 0);
  CHECK(counts.native > 0);
}

}  // namespace

TEST_CASE("native: tiled matmul with tails matches the interpreter bit for bit") {
  HostTensor a = test::random_tensor(DType::bfloat16, {200, 130}, 1), b = test::random_tensor(DType::bfloat16, {200, 600}, 2);
  check_all_modes("matmul", [](Tensor x, Tensor y) { return kernels::matmul(x, y, nl::float32); }, a, b);
  HostTensor c = test::random_tensor(DType::float32, {128, 64}, 3), d = test::random_tensor(DType::float32, {128, 40}, 4);
  check_all_modes("matmul_f32", [](Tensor x, Tensor y) { return kernels::matmul(x, y); }, c, d);
}

TEST_CASE("native: softmax matches the interpreter bit for bit") {
  HostTensor x = test::random_tensor(DType::float32, {300, 257}, 5, -8, 8);
  check_all_modes("softmax", [](Tensor t) { return kernels::softmax(t); }, x);
  HostTensor y = test::random_tensor(DType::bfloat16, {64, 1000}, 6, -8, 8);
  check_all_modes("softmax_bf16", [](Tensor t) { return kernels::softmax(t); }, y);
}

TEST_CASE("native: element-wise instructions, dtype conversions and views") {
  HostTensor x = test::random_tensor(DType::float32, {128, 96}, 7, -3, 3);
  HostTensor y = test::random_tensor(DType::bfloat16, {128, 96}, 8, -3, 3);
  check_all_modes("elementwise",
                  [](Tensor a, Tensor b) {
                    Tensor ta = nl::ndarray({128, 96}, nl::float32), tb = nl::ndarray({128, 2, 48}, nl::bfloat16);
                    isa::dma_copy(ta, a);
                    isa::dma_copy(tb, b.reshape({128, 2, 48}));
                    Tensor s = nl::ndarray({128, 96}, nl::float16);
                    isa::tensor_tensor(s, ta, tb.reshape({128, 96}), nl::multiply);
                    Tensor col = nl::ndarray({128, 1}, nl::float32);
                    isa::tensor_reduce(col, nl::add, ta, {1});
                    Tensor u = nl::ndarray({128, 96}, nl::float8_e4m3);
                    isa::tensor_scalar(u, s, nl::subtract, col, {.reverse0 = true, .op1 = nl::maximum, .operand1 = -4.0});
                    Tensor v = nl::ndarray({128, 96}, nl::float32);
                    isa::activation(v, nl::gelu_apprx_tanh, u, {.bias = col, .scale = 0.5});
                    Tensor w = nl::ndarray({128, 96}, nl::bfloat16);
                    isa::scalar_tensor_tensor(w, v, nl::multiply, col, nl::add, ta);
                    isa::reciprocal(w, w);
                    Tensor out = nl::ndarray({128, 96}, nl::float32, nl::shared_hbm);
                    isa::dma_copy(out(Slice{}, Slice{0, 96, 2}), w(Slice{}, Slice{0, 48}));
                    isa::dma_copy(out(Slice{}, Slice{1, 96, 2}), v(Slice{}, Slice{48, 96}));
                    return out;
                  },
                  x, y);
}

TEST_CASE("native: reductions over several axes, transposes and integer tiles") {
  HostTensor x = test::random_tensor(DType::float32, {96, 4, 6, 8}, 9);
  check_all_modes("reduce",
                  [](Tensor a) {
                    Tensor t = nl::ndarray({96, 4, 6, 8}, nl::float32);
                    isa::dma_copy(t, a);
                    Tensor r1 = nl::ndarray({96, 4}, nl::float32), r2 = nl::ndarray({96, 4, 6}, nl::float32);
                    isa::tensor_reduce(r1, nl::maximum, t, {2, 3}, true);
                    isa::tensor_reduce(r2, nl::add, t, {3});
                    Tensor tr = nl::ndarray({4, 96}, nl::float32, nl::psum);
                    isa::nc_transpose(tr, r1);
                    Tensor i32 = nl::ndarray({96, 24}, nl::int32);
                    isa::tensor_copy(i32, r2.reshape({96, 24}));
                    Tensor sh = nl::ndarray({96, 24}, nl::int32);
                    isa::tensor_tensor(sh, i32, i32, nl::add);  // GpSimd exact integers
                    isa::tensor_scalar(sh, sh, nl::bitwise_and, 0x7f);
                    Tensor out = nl::ndarray({100, 96}, nl::float32, nl::shared_hbm);
                    Tensor trs = nl::ndarray({4, 96}, nl::float32);
                    isa::tensor_copy(trs, tr);
                    isa::dma_copy(out(Slice{0, 4}, Slice{}), trs);
                    Tensor shf = nl::ndarray({96, 24}, nl::float32);
                    isa::tensor_copy(shf, sh);
                    isa::dma_copy(out(Slice{4, 100}, Slice{0, 24}), shf);
                    // a broadcast (stride-0) source view: each of 18 values repeated 4 times
                    isa::dma_copy(out(Slice{4, 100}, Slice{24, 96}).reshape({96, 18, 4}),
                                  r2(Slice{}, Slice{0, 3}).flatten_dims(1, 2).expand_dim(2).broadcast(2, 4));
                    return out;
                  },
                  x);
}
