// Tiled matrix multiplication with PSUM accumulation.
//
// Dimensions: lhsT [K, M] (the left operand, transposed so K sits on partitions), rhs [K, N],
//             out [M, N]. Any M, K, N; tails are handled by smaller edge tiles.
// Args:       lhsT, rhs: HBM tensors of one float dtype accepted by nc_matmul.
// Returns:    out in shared_hbm, dtype `out_dtype` (default: lhsT's dtype).
// Notes:      each output tile [<=128, <=512] accumulates over K in one fp32 PSUM bank, then is
//             copied to SBUF (rounding to out_dtype) and stored.
// Pseudocode: for m, n tiles: psum = 0; for k tiles: psum += lhsT[k, m].T @ rhs[k, n]; out[m, n] = psum
#pragma once

#include <algorithm>
#include <optional>

#include "nikki/kernels/library.hpp"

namespace nikki::kernels {

inline Tensor matmul(const Tensor& lhsT, const Tensor& rhs, std::optional<DType> out_dtype = std::nullopt) {
  namespace nl = nikki::nl;
  namespace isa = nikki::isa;
  const int64_t K = lhsT.shape()[0], M = lhsT.shape()[1], N = rhs.shape()[1];
  const nl::TileSize ts = nl::tile_size();
  const int64_t tile_k = ts.pmax, tile_m = ts.gemm_stationary_fmax, tile_n = ts.gemm_moving_fmax;
  Tensor out = nl::ndarray({M, N}, out_dtype.value_or(lhsT.dtype()), nl::shared_hbm, "out");
  for (int64_t m0 = 0; m0 < M; m0 += tile_m) {
    const int64_t mt = std::min(tile_m, M - m0);
    for (int64_t n0 = 0; n0 < N; n0 += tile_n) {
      const int64_t nt = std::min(tile_n, N - n0);
      Tensor acc = nl::ndarray({mt, nt}, nl::float32, nl::psum, "acc");
      for (int64_t k0 = 0; k0 < K; k0 += tile_k) {
        const int64_t kt = std::min(tile_k, K - k0);
        Tensor a = nl::ndarray({kt, mt}, lhsT.dtype(), nl::sbuf, "lhsT_tile");
        Tensor b = nl::ndarray({kt, nt}, rhs.dtype(), nl::sbuf, "rhs_tile");
        isa::dma_copy(a, lhsT(nl::ds(k0, kt), nl::ds(m0, mt)));
        isa::dma_copy(b, rhs(nl::ds(k0, kt), nl::ds(n0, nt)));
        isa::nc_matmul(acc, a, b);
      }
      Tensor res = nl::ndarray({mt, nt}, out.dtype(), nl::sbuf, "out_tile");
      isa::tensor_copy(res, acc);
      isa::dma_copy(out(nl::ds(m0, mt), nl::ds(n0, nt)), res);
    }
  }
  return out;
}

inline KernelInfo matmul_info() {
  return KernelInfo{
      .name = "matmul",
      .summary = "matrix product of lhsT.T and rhs",
      .doc = "out[M, N] = lhsT[K, M].T @ rhs[K, N], fp32 accumulation in PSUM; any M, K, N.",
      .inputs = {"lhsT", "rhs"},
      .outputs = {"out"},
      .params = {},
      .backward = "",
      .saved_outputs = {},
      .body = [](const KernelCall& c) { return std::vector<Tensor>{matmul(c.inputs[0], c.inputs[1])}; },
      .examples = {{{spec({384, 200}, DType::bfloat16), spec({384, 700}, DType::bfloat16)}, {}, "tails"}},
  };
}

}  // namespace nikki::kernels
