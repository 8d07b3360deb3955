// Float64 reference of matmul: out[M, N] = a[M, K] @ b[K, N].
#pragma once

#include "nikki/kernels/toolkit/registration.hpp"

namespace nikki::kernels::reference {

inline RefTensor matmul(const RefTensor& a, const RefTensor& b) {
  const int64_t M = a.shape[0], K = a.shape[1], N = b.shape[1];
  RefTensor out(Shape{M, N});
  for (int64_t m = 0; m < M; ++m)
    for (int64_t k = 0; k < K; ++k) {
      const double x = a[m * K + k];
      for (int64_t n = 0; n < N; ++n) out[m * N + n] += x * b[k * N + n];
    }
  return out;
}

}  // namespace nikki::kernels::reference
