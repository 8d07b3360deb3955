// The list of library kernels. Adding a kernel: include its header and append its `<name>_info()`
// (see docs/adding-a-kernel.md); every front end, test, doc table and benchmark picks it up.
#include "nikki/kernels/registry.hpp"

#include "nikki/kernels/attention/decode_attention.hpp"
#include "nikki/kernels/attention/flash_attention.hpp"
#include "nikki/kernels/attention/flash_attention_bwd.hpp"
#include "nikki/kernels/attention/paged_decode_attention.hpp"
#include "nikki/kernels/attention/qkv.hpp"
#include "nikki/kernels/attention/qkv_bwd.hpp"
#include "nikki/kernels/loss/cross_entropy.hpp"
#include "nikki/kernels/attention/output_projection.hpp"
#include "nikki/kernels/attention/rope.hpp"
#include "nikki/kernels/conv/causal_conv1d.hpp"
#include "nikki/kernels/conv/causal_conv1d_bwd.hpp"
#include "nikki/kernels/conv/conv1d.hpp"
#include "nikki/kernels/conv/conv1d_bwd.hpp"
#include "nikki/kernels/gather/embedding.hpp"
#include "nikki/kernels/gather/rows.hpp"
#include "nikki/kernels/matmul/matmul.hpp"
#include "nikki/kernels/mlp/gated_mlp.hpp"
#include "nikki/kernels/moe/find_nonzero_indices.hpp"
#include "nikki/kernels/moe/moe_decode.hpp"
#include "nikki/kernels/moe/moe_prefill.hpp"
#include "nikki/kernels/moe/router_topk.hpp"
#include "nikki/kernels/moe/topk.hpp"
#include "nikki/kernels/norm/add_rmsnorm.hpp"
#include "nikki/kernels/norm/layernorm.hpp"
#include "nikki/kernels/norm/rmsnorm.hpp"
#include "nikki/kernels/optim/adamw.hpp"
#include "nikki/kernels/pool/avg_pool2d.hpp"
#include "nikki/kernels/pool/max_pool2d.hpp"
#include "nikki/kernels/quant/fp8_matmul.hpp"
#include "nikki/kernels/quant/rmsnorm_quant.hpp"
#include "nikki/kernels/scan/cumsum.hpp"
#include "nikki/kernels/scan/linear_recurrence.hpp"
#include "nikki/kernels/scan/linear_recurrence_bwd.hpp"
#include "nikki/kernels/scan/selective_scan.hpp"
#include "nikki/kernels/scan/selective_scan_bwd.hpp"
#include "nikki/kernels/softmax/softmax.hpp"

namespace nikki::kernels {

const std::vector<KernelInfo>& registry() {
  static const std::vector<KernelInfo> kernels{
      matmul_info(),
      softmax_info(),
      softmax_bwd_info(),
      flash_attention_info(),
      flash_attention_bwd_info(),
      layernorm_info(),
      layernorm_bwd_info(),
      rmsnorm_info(),
      rmsnorm_bwd_info(),
      adamw_info(),
      topk_info(),
      gated_mlp_info(),
      gated_mlp_fp8_info(),
      router_topk_info(),
      cumsum_info(),
      cumsum_bwd_info(),
      cross_entropy_info(),
      cross_entropy_bwd_info(),
      add_rmsnorm_info(),
      add_rmsnorm_bwd_info(),
      rope_info(),
      rope_bwd_info(),
      output_projection_info(),
      output_projection_bwd_info(),
      causal_conv1d_info(),
      causal_conv1d_bwd_info(),
      conv1d_info(),
      conv1d_bwd_info(),
      embedding_info(),
      embedding_bwd_info(),
      gather_rows_info(),
      gather_rows_bwd_info(),
      scatter_add_rows_info(),
      scatter_add_rows_bwd_info(),
      decode_attention_info(),
      max_pool2d_info(),
      max_pool2d_bwd_info(),
      avg_pool2d_info(),
      avg_pool2d_bwd_info(),
      linear_recurrence_info(),
      linear_recurrence_bwd_info(),
      selective_scan_info(),
      selective_scan_bwd_info(),
      paged_decode_attention_info(),
      rmsnorm_quant_info(),
      rmsnorm_quant_dynamic_info(),
      fp8_matmul_info(),
      qkv_info(),
      qkv_bwd_info(),
      add_qkv_info(),
      add_qkv_bwd_info(),
      find_nonzero_indices_info(),
      moe_prefill_info(),
      moe_decode_info(),
      moe_decode_fp8_info(),
  };
  return kernels;
}

const KernelInfo& find_kernel(const std::string& name) {
  std::string names;
  for (const KernelInfo& k : registry()) {
    if (k.name == name) return k;
    names += (names.empty() ? "" : ", ") + k.name;
  }
  throw KernelError("no library kernel named '" + name + "'", SourceLocation{}, {}, {},
                    "available kernels: " + names);
}

}  // namespace nikki::kernels
