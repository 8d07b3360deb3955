// The native routines' overlap test (jit/native/operand_overlap.hpp): whether an element loop may
// run in any order. Hand-made descriptors of two [128, F] tiles in the same partitions.
#include <doctest/doctest.h>

#include <cstring>

#include "nikki/dtype.hpp"
#include "operand_overlap.hpp"

namespace {

using namespace nikki;
using namespace nikki::native;

constexpr int64_t kPartitionBytes = 4096;  // dim-0 stride of both tiles

/** dst (slot 0) and src (slot 1): 128 partitions of `n` elements, contiguous in each partition. */
OpDesc tiles(DType dst, DType src, int64_t n) {
  OpDesc d;
  std::memset(&d, 0, sizeof d);
  for (int k = 0; k < kIterDims; ++k) d.count[k] = 1;
  d.count[0] = 128;
  d.count[4] = n;
  for (int s : {0, 1}) {
    d.slot_kind[s] = kSlotTensor;
    d.view[s].dtype = int32_t(s == 0 ? dst : src);
    d.view[s].stride[0] = kPartitionBytes;
    d.view[s].stride[4] = int64_t(dtype_size(s == 0 ? dst : src));
  }
  return d;
}

uint32_t hazards(const OpDesc& d, intptr_t dst, intptr_t src) {
  const intptr_t base[kSlots] = {dst, src, 0, 0, 0};
  return overlap_hazards(&d, 0, base);
}

}  // namespace

TEST_CASE("native overlap: tiles at different byte offsets of the same partitions are independent") {
  // fp32 [128, 512] at bytes [0, 2048) of each partition; bf16 [128, 512] at [2048, 3072)
  const OpDesc d = tiles(DType::bfloat16, DType::float32, 512);
  CHECK(hazards(d, 2048, 0) == 0);
  CHECK(hazards(d, 0, 2048) == 0);  // the other way round: bf16 [0, 1024), fp32 [2048, 4096)
}

TEST_CASE("native overlap: tiles sharing bytes of some partition are ordered") {
  const OpDesc d = tiles(DType::float32, DType::float32, 512);
  CHECK(hazards(d, 1024, 0) == 0b10);                     // [1024, 3072) meets [0, 2048) in each partition
  CHECK(hazards(d, kPartitionBytes, 0) == 0b10);          // dst row i is src row i + 1
  CHECK(hazards(d, 127 * kPartitionBytes + 2044, 0) == 0b10);  // one element of src's last row
  CHECK(hazards(d, 0, 0) == 0);                           // in place, same order: safe
  CHECK(hazards(d, 128 * kPartitionBytes, 0) == 0);       // past the last partition
  CHECK(hazards(d, 2048, 0) == 0);                        // the next 2 KiB of each partition
  CHECK(hazards(d, 2047, 0) == 0b10);                     // one byte short of it
}

TEST_CASE("native overlap: the partition axis may be any iteration dim (copies iterate without a partition dim)") {
  // A converting copy: count[0] = 1, partitions along dim 3, elements along dim 4.
  OpDesc d = tiles(DType::bfloat16, DType::float32, 512);
  for (int s : {0, 1}) {
    d.view[s].stride[3] = d.view[s].stride[0];
    d.view[s].stride[0] = 0;
  }
  d.count[3] = d.count[0];
  d.count[0] = 1;
  CHECK(hazards(d, 2048, 0) == 0);     // bf16 at [2048, 3072) of each partition, fp32 at [0, 2048)
  CHECK(hazards(d, 1024, 0) == 0b10);  // bf16 at [1024, 2048): inside the fp32 rows
}
