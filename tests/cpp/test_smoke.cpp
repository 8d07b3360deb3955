#include "harness.hpp"
#include "nikki/kernels/matmul/matmul.hpp"

TEST_CASE("harness: matmul with tails in every dim runs on the interpreter") {
  using namespace nikki;
  test::HostTensor a = test::random_tensor(DType::float32, {130, 256}, 1);
  test::HostTensor b = test::random_tensor(DType::float32, {256, 600}, 2);
  test::HostTensor c = test::run1([](Tensor x, Tensor y) { return kernels::matmul(x, y); }, a, b);
  double max_err = 0;
  for (int m = 0; m < 130; ++m)
    for (int n = 0; n < 600; ++n) {
      double ref = 0;
      for (int k = 0; k < 256; ++k) ref += double(a.get(m * 256 + k)) * b.get(k * 600 + n);
      max_err = std::max(max_err, std::abs(ref - c.get(m * 600 + n)));
    }
  // 256 fp32 products of magnitude < 1 accumulated in fp32.
  CHECK(max_err < 1e-4);
}
