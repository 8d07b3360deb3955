// The IR text form against golden files. Regenerate with NIKKI_UPDATE_GOLDEN=1 after an intended
// change of the format, and review the diff.
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "harness.hpp"
#include "nikki/kernels/matmul/matmul.hpp"
#include "nikki/ir_printer.hpp"
#include "nikki/kernels/softmax/softmax.hpp"

namespace {

using namespace nikki;

void check_golden(const std::string& text, const std::string& name) {
  const std::string path = std::string(NIKKI_TEST_DATA_DIR) + "/" + name;
  if (const char* update = std::getenv("NIKKI_UPDATE_GOLDEN"); update && std::string(update) == "1") {
    std::ofstream(path) << text;
    return;
  }
  std::ifstream in(path);
  REQUIRE_MESSAGE(in.good(), "missing golden file " << path << " (run with NIKKI_UPDATE_GOLDEN=1)");
  std::stringstream want;
  want << in.rdbuf();
  CHECK(text == want.str());
}

}  // namespace

TEST_CASE("printer: tiled matmul before and after allocation") {
  Kernel k = trace(TraceOptions{.target = TargetId::trn2}, "matmul",
                   [](Tensor a, Tensor b) { return kernels::matmul(a, b, nl::bfloat16); },
                   spec({128, 256}, nl::bfloat16, "a"), spec({256, 640}, nl::bfloat16, "b"));
  check_golden(to_string(k), "matmul.traced.ir");
  jit::Program p = jit::compile(std::move(k));
  check_golden(to_string(p.kernel()), "matmul.allocated.ir");
}

TEST_CASE("printer: softmax shows attributes, per-partition operands and reductions") {
  Kernel k = trace(TraceOptions{.target = TargetId::trn1}, "softmax", [](Tensor x) { return kernels::softmax(x); },
                   spec({130, 64}, nl::float32, "x"));
  check_golden(to_string(k), "softmax.traced.ir");
}

TEST_CASE("printer: views, reinterpretation, runtime offsets and immediates") {
  Kernel k = trace(TraceOptions{.target = TargetId::trn2}, "views",
                   [](Tensor table, Tensor idx_in) {
                     Tensor idx = nl::ndarray({4, 1}, nl::int32, nl::sbuf, "idx");
                     isa::dma_copy(idx, idx_in);
                     Tensor rows = nl::ndarray({4, 8}, nl::float32, nl::sbuf, "rows");
                     isa::dma_copy(rows, table.ap({{8, 4}, {1, 8}}, ApOptions{.vector_offset = idx}));
                     Tensor half = nl::ndarray({4, 8}, nl::bfloat16, nl::sbuf, "half");
                     isa::tensor_scalar(half, rows, nl::multiply, 0.5, {.op1 = nl::add, .operand1 = 1.0});
                     isa::iota(idx, {{1, 1}}, 3, 2);
                     Tensor out = nl::ndarray({4, 8}, nl::bfloat16, nl::shared_hbm, "out");
                     isa::dma_copy(out(Slice{}, Slice{0, 8, 2}), half(Slice{}, Slice{0, 4}));
                     isa::dma_copy(out(Slice{}, Slice{1, 8, 2}), half(Slice{}, Slice{4, 8}).view(nl::int16).view(nl::bfloat16));
                     return out;
                   },
                   spec({100, 8}, nl::float32, "table"), spec({4, 1}, nl::int32, "idx_in"));
  check_golden(to_string(k, PrintOptions{.locations = false}), "views.traced.ir");
}
