// Views (NkiTensor access patterns): each operation against hand-computed patterns, including the
// examples of NKI's access-pattern guide.
#include <string>
#include <vector>

#include "harness.hpp"

namespace {

using namespace nikki;

std::vector<Dim> P(std::initializer_list<std::pair<int64_t, int64_t>> pairs) {
  std::vector<Dim> out;
  for (auto [s, c] : pairs) out.push_back({s, c});
  return out;
}

/** Runs body(builder) inside a kernel being traced; returns nothing. */
template <class F>
void in_kernel(F&& body) {
  KernelBuilder b("views", TargetId::trn2);
  BuilderScope scope(b);
  body();
}

std::string error_of(const std::function<void()>& f) {
  try {
    in_kernel(f);
  } catch (const KernelError& e) {
    return e.what();
  }
  return {};
}

}  // namespace

TEST_CASE("views: slice matches NKI's access-pattern guide example") {
  in_kernel([] {
    Tensor t = nl::ndarray({128, 64}, nl::float32, nl::sbuf);
    CHECK(t.pattern() == P({{64, 128}, {1, 64}}));
    CHECK(t.offset() == 0);
    Tensor u = t.slice(1, 8, 24);
    CHECK(u.pattern() == P({{64, 128}, {1, 16}}));
    CHECK(u.offset() == 8);
    Tensor same = t.ap(P({{64, 128}, {1, 16}}), ApOptions{.offset = 8});
    CHECK(same.pattern() == u.pattern());
    CHECK(same.offset() == u.offset());
  });
}

TEST_CASE("views: ap() with a stride selects every other element") {
  in_kernel([] {
    Tensor t = nl::ndarray({128, 1024}, nl::bfloat16, nl::sbuf);
    Tensor v = t.ap(P({{1024, 128}, {2, 512}}));
    CHECK(v.shape() == Shape{128, 512});
    CHECK(v.dtype() == nl::bfloat16);
  });
}

TEST_CASE("views: subscripts with slices, steps and negative indices") {
  in_kernel([] {
    Tensor t = nl::ndarray({4, 6, 8}, nl::float32, nl::hbm);
    Tensor a = t(Slice{1, 3}, Slice{}, Slice{0, 8, 2});
    CHECK(a.shape() == Shape{2, 6, 4});
    CHECK(a.pattern() == P({{48, 2}, {8, 6}, {2, 4}}));
    CHECK(a.offset() == 48);
    Tensor b = t(-1);  // HBM: an integer drops its dim
    CHECK(b.shape() == Shape{6, 8});
    CHECK(b.offset() == 3 * 48);
    Tensor c = t(nl::ds(2, 2), 5, Slice{-3, std::nullopt});
    CHECK(c.shape() == Shape{2, 3});
    CHECK(c.offset() == 2 * 48 + 5 * 8 + 5);
    CHECK(c.pattern() == P({{48, 2}, {1, 3}}));
  });
}

TEST_CASE("views: on-chip integer indexing keeps the partition dim and two dims") {
  in_kernel([] {
    Tensor t = nl::ndarray({128, 64, 32}, nl::float32, nl::sbuf);
    Tensor a = t(0);  // partition index keeps its dim (size 1)
    CHECK(a.shape() == Shape{1, 64, 32});
    Tensor b = t(Slice{}, 3);  // free index drops its dim
    CHECK(b.shape() == Shape{128, 32});
    CHECK(b.offset() == 3 * 32);
    Tensor c = t(Slice{}, 3, 7);  // would leave 1 dim: the last free dim stays with size 1
    CHECK(c.shape() == Shape{128, 1});
    CHECK(c.offset() == 3 * 32 + 7);
  });
}

TEST_CASE("views: permute, broadcast, expand_dim, squeeze_dim, select") {
  in_kernel([] {
    Tensor t = nl::ndarray({4, 5, 6}, nl::float32, nl::hbm);
    Tensor p = t.permute({2, 0, 1});
    CHECK(p.shape() == Shape{6, 4, 5});
    CHECK(p.pattern() == P({{1, 6}, {30, 4}, {6, 5}}));
    Tensor e = t.expand_dim(1);
    CHECK(e.shape() == Shape{4, 1, 5, 6});
    Tensor bc = e.broadcast(1, 7);
    CHECK(bc.shape() == Shape{4, 7, 5, 6});
    CHECK(bc.pattern()[1] == Dim{0, 7});
    Tensor sq = e.squeeze_dim(1);
    CHECK(sq.pattern() == t.pattern());
    Tensor s = t.select(1, 2);
    CHECK(s.shape() == Shape{4, 6});
    CHECK(s.offset() == 12);
  });
}

TEST_CASE("views: reshape without a copy, and its refusals") {
  in_kernel([] {
    Tensor t = nl::ndarray({8, 6, 4}, nl::float32, nl::hbm);
    Tensor r = t.reshape({8, 24});
    CHECK(r.pattern() == P({{24, 8}, {1, 24}}));
    Tensor split = t.reshape_dim(1, {2, 3});
    CHECK(split.shape() == Shape{8, 2, 3, 4});
    CHECK(split.pattern() == P({{24, 8}, {12, 2}, {4, 3}, {1, 4}}));
    Tensor flat = t.flatten_dims(0, 1);
    CHECK(flat.shape() == Shape{48, 4});
    // A column slice keeps rows contiguous inside, so splitting its dims still works...
    Tensor cols = t(Slice{}, Slice{0, 3});
    CHECK(cols.reshape({8, 3, 2, 2}).pattern() == P({{24, 8}, {4, 3}, {2, 2}, {1, 2}}));
    // ...but merging non-contiguous dims needs a copy.
    CHECK_THROWS_AS(cols.reshape({24, 4}), KernelError);
  });
  std::string msg = error_of([] { nl::ndarray({8, 6}, nl::float32, nl::hbm).reshape({7, 7}); });
  CHECK(msg.find("preserve the number of elements") != std::string::npos);
  CHECK(msg.find("test_views.cpp") != std::string::npos);
}

TEST_CASE("views: view(dtype) rescales the last dim") {
  in_kernel([] {
    Tensor t = nl::ndarray({128, 64}, nl::float32, nl::sbuf);
    Tensor v = t.view(nl::bfloat16);
    CHECK(v.shape() == Shape{128, 128});
    CHECK(v.pattern() == P({{128, 128}, {1, 128}}));
    Tensor w = t.slice(1, 8, 16).view(nl::uint8);
    CHECK(w.offset() == 32);
    CHECK(w.shape() == Shape{128, 32});
  });
}

TEST_CASE("views: out-of-bound subscripts name the dim, the range and the user's line") {
  int line = 0;
  std::string msg = error_of([&] {
    Tensor t = nl::ndarray({128, 4000}, nl::float32, nl::sbuf, "x");
    line = __LINE__ + 1;
    t(Slice{}, Slice{0, 4096});
  });
  CHECK(msg.find("out-of-bound access on dim 1") != std::string::npos);
  CHECK(msg.find("[0, 4095]") != std::string::npos);
  CHECK(msg.find("4000") != std::string::npos);
  CHECK(msg.find("test_views.cpp:" + std::to_string(line)) != std::string::npos);
  CHECK(error_of([] { nl::ndarray({4, 4}, nl::float32, nl::sbuf)(4); }).find("out of bounds for dim 0") !=
        std::string::npos);
  CHECK(error_of([] { nl::ndarray({4, 4}, nl::float32, nl::sbuf)(1, 2, 3); }).find("too many indices") !=
        std::string::npos);
}

TEST_CASE("views: runtime offsets record their index tensors and multipliers") {
  in_kernel([] {
    Tensor table = nl::ndarray({1000, 64}, nl::float32, nl::hbm, "table");
    Tensor idx = nl::ndarray({128, 1}, nl::int32, nl::sbuf, "idx");
    Tensor rows = table.ap(P({{64, 128}, {1, 64}}), ApOptions{.vector_offset = idx});
    const Indirection* ind = rows.access().indirection.get();
    REQUIRE(ind != nullptr);
    CHECK(ind->has_vector());
    CHECK(ind->vector_multiplier == 64);
    Tensor one = nl::ndarray({1, 1}, nl::int32, nl::sbuf, "k");
    Tensor block = table.ap(P({{64, 16}, {1, 64}}), ApOptions{.scalar_offset_tensor = one});
    CHECK(block.access().indirection->scalar_multiplier == 64);
  });
  CHECK(error_of([] {
          Tensor table = nl::ndarray({10, 4}, nl::float32, nl::hbm);
          Tensor two = nl::ndarray({1, 2}, nl::int32, nl::sbuf);
          table.ap(P({{4, 1}, {1, 4}}), ApOptions{.scalar_offset_tensor = two});
        }).find("scalar_offset must be a 1x1 tensor") != std::string::npos);
}

TEST_CASE("views: nl API outside a kernel is an error naming the call site") {
  std::string msg;
  try {
    nl::ndarray({1, 1}, nl::float32);
  } catch (const KernelError& e) {
    msg = e.what();
  }
  CHECK(msg.find("outside of a kernel") != std::string::npos);
  CHECK(msg.find("test_views.cpp") != std::string::npos);
}
