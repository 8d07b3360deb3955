// Rows of a tile turned into columns on the Tensor engine: what the MLP and router kernels do to
// put the contraction dim (hidden or intermediate) on partitions.
#pragma once

#include <algorithm>
#include <cstdint>

#include "nikki/kernels/toolkit/buffers.hpp"
#include "nikki/kernels/toolkit/registration.hpp"
#include "nikki/kernels/toolkit/task_scheduler.hpp"
#include "nikki/kernels/toolkit/tiling.hpp"

namespace nikki::kernels::mlp {

/** @brief A PSUM -> SBUF copy on VectorE, or on ScalarE (as an activation). */
inline void copy_from_psum(const Tensor& dst, const Tensor& src, Engine engine) {
  if (engine == Engine::scalar) isa::activation(dst, nl::copy, src);
  else isa::tensor_copy(dst, src, isa::vector_engine);
}

/**
 * @brief Transposes `rows` ([p, C] in SBUF, p <= 128) into `dst` ([128, ceil(C / 128), p]:
 * column block k of the rows on partitions), a PSUM bank of 128-wide TensorE transposes at a
 * time (`psum` hands out [128, blocks per bank, 128] tiles of the rows' dtype), each bank copied
 * out on whichever of VectorE and ScalarE is free. A last partial block fills only its partitions.
 */
inline void transpose_rows(toolkit::TaskScheduler& sch, toolkit::Ring& psum, const Tensor& dst, const Tensor& rows) {
  using toolkit::first;
  const auto all = nl::all;
  const int64_t P = dst.shape()[0], p = rows.shape()[0], C = rows.shape()[1];
  const int64_t nblocks = ceil_div(C, P);
  for (int64_t k0 = 0; k0 < nblocks; k0 += psum.slot(0).shape()[1]) {
    const Tensor tr = psum.next();
    const int64_t n = std::min(tr.shape()[1], nblocks - k0), last = std::min(P, C - (k0 + n - 1) * P);
    sch.add([&] {
      for (int64_t k = k0; k < k0 + n; ++k) {
        const int64_t pk = std::min(P, C - k * P);
        isa::nc_transpose(tr(first(pk), k - k0, first(p)), rows(all, nl::ds(k * P, pk)));
      }
    });
    const int64_t full = last == P ? n : n - 1;
    for (const auto& [lo, count, parts] : {std::tuple<int64_t, int64_t, int64_t>{0, full, P}, {full, n - full, last}}) {
      if (count == 0) continue;
      const Tensor d = dst(first(parts), nl::ds(k0 + lo, count), all), s = tr(first(parts), nl::ds(lo, count), first(p));
      sch.add_any({[&] { copy_from_psum(d, s, Engine::vector); }, [&] { copy_from_psum(d, s, Engine::scalar); }});
    }
  }
}

}  // namespace nikki::kernels::mlp
