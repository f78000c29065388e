// T2 for column fusion: a layernorm's parameter gradients (sum over the tokens of dy * xhat and
// of dy) become one column_sums op that absorbs the product, and the fused circuit gives the
// unfused results on the Eigen executor (f64 1e-12, f32 1e-5 norm-relative: sums in another
// order) and in the SIMT simulator (f32 1e-5); legality: a lone sum stays a reduce, a sum that
// reads another (directly or through other ops) is not joined with it.
#include <gtest/gtest.h>

#include <kiln/ad/backward.hpp>
#include <kiln/circuit/exec/executor.hpp>
#include <kiln/circuit/passes/cleanup.hpp>
#include <kiln/circuit/passes/fusion.hpp>
#include <kiln/circuit/prims/composites.hpp>

#include "device_test_util.hpp"
#include "prim_test_util.hpp"

namespace kiln {
namespace {

using testing::Built;

size_t column_reduces(const Circuit& c) {
  size_t n = 0;
  for (const Op& op : c.ops()) n += ReduceParams::is_sum_along(op, 0) ? 1 : 0;
  return n;
}

// The GPU plan's passes up to and including the column fusion, against the pointwise fusion alone.
Circuit expect_fused_matches(const Built& u, DType dt) {
  std::vector<ValueId> plain_outs = u.outs, fused_outs = u.outs;
  Circuit plain = fuse_pointwise(cse(u.c, plain_outs), plain_outs);
  Circuit fused = fuse_columns(fuse_pointwise(cse(u.c, fused_outs), fused_outs), fused_outs);
  auto want = execute(plain, u.fresh_binds(), plain_outs), got = execute(fused, u.fresh_binds(), fused_outs);
  for (size_t o = 0; o < want.size(); ++o)
    EXPECT_LT(testing::relative_error(got[o], want[o]), dt == DType::f64 ? 1e-12 : 1e-5) << "output " << o;
  if (dt == DType::f32) {
    auto sim = cuda::DeviceProgram(fused, fused_outs, testing::fake_runtime()).run(u.fresh_binds());
    for (size_t o = 0; o < want.size(); ++o)
      EXPECT_LT(testing::relative_error(sim[o], want[o]), 1e-5) << "output " << o << " (simulator)";
  }
  return fused;
}

TEST(FuseColumns, LayernormParameterGradientsTakeOnePass) {
  for (DType dt : {DType::f64, DType::f32}) {
    Built u;
    ValueId x = u.input({3, 5, 12}, dt, 1);
    ValueId w = u.input({12}, dt, 2, ValueRole::Persistent), bias = u.input({12}, dt, 3, ValueRole::Persistent);
    ValueId r = u.input({3, 5, 12}, dt, 4);
    Builder b(u.c, "ln");
    ValueId y = composite::layernorm(b, x, w, bias);
    u.c.set_recording_phase(Phase::Backward);
    u.outs = ad::backward(b, b.reduce_all(ReduceKind::Sum, b.mul(y, r)), {x, w, bias});
    u.outs.insert(u.outs.begin(), y);
    Circuit f = expect_fused_matches(u, dt);
    EXPECT_EQ(testing::count_prim(f, PrimId::column_sums), 1u) << f.dump("fused");
    EXPECT_EQ(column_reduces(f), 0u) << f.dump("fused");
  }
}

// A lone sum whose input a matmul reads stays a reduce (the matmul fusion takes it as a bias
// gradient); one no matmul reads (a bias gradient under --precision bf16, whose matmuls read
// dY through a cast) becomes column_sums, whose kernel splits the rows across blocks.
TEST(FuseColumns, ALoneSumStaysAReduceOnlyWhereAMatmulReadsItsInput) {
  for (bool matmul : {true, false}) {
    Built u;
    ValueId x = u.input({6, 4}, DType::f32, 1);
    ValueId w = u.input({6, 3}, DType::f32, 2);
    Builder b(u.c);
    u.outs = {b.reduce(ReduceKind::Sum, x, 0)};
    if (matmul) u.outs.push_back(b.matmul(x, w, true, false));
    Circuit f = expect_fused_matches(u, DType::f32);
    EXPECT_EQ(testing::count_prim(f, PrimId::column_sums), matmul ? 0u : 1u) << f.dump("fused");
  }
}

// s2 sums x * s1 where s1 sums x: they share x, but one op cannot compute s2 from its own s1;
// likewise when s1 reaches s2 through an op outside both.
TEST(FuseColumns, ASumThatReadsAnotherIsNotJoinedWithIt) {
  for (bool through_other_op : {false, true}) {
    Built u;
    ValueId x = u.input({6, 4}, DType::f32, 1);
    Builder b(u.c);
    ValueId s1 = b.reduce(ReduceKind::Sum, b.pointwise(se::in(0) * se::in(0), {x}), 0);
    ValueId k = through_other_op ? b.pointwise(se::exp(se::in(0)), {s1}) : s1;
    ValueId s2 = b.reduce(ReduceKind::Sum, b.mul(x, k), 0);
    u.outs = {s1, s2};
    Circuit f = expect_fused_matches(u, DType::f32);
    EXPECT_EQ(testing::count_prim(f, PrimId::column_sums), 2u) << f.dump("fused");
  }
}

}  // namespace
}  // namespace kiln
