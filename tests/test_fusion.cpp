// T2 for pointwise fusion: legality (what may and may not be absorbed), equivalence of fused and
// unfused circuits on random graphs (Eigen executor in f64 and f32, and the SIMT simulator),
// the pipeline's switches (PipelineOptions::disabled) (kernel counts of GPT steps: test_kernel_counts.cpp).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>

#include <kiln/circuit/exec/executor.hpp>
#include <kiln/circuit/passes/cleanup.hpp>
#include <kiln/circuit/passes/fusion.hpp>

#include "device_test_util.hpp"
#include "prim_test_util.hpp"

namespace kiln {
namespace {

TEST(FusePointwise, AChainBecomesOneOpThatRecordsWhatItAbsorbed) {
  Circuit c;
  ValueId x = c.add_external({Shape{4, 5}, DType::f64}, ValueRole::Input, "x");
  ValueId y = c.add_external({Shape{1, 5}, DType::f64}, ValueRole::Input, "y");
  Builder b(c);
  ValueId e = b.pointwise(se::exp(se::in(0)), {x});
  ValueId s = b.add(e, y);  // y broadcasts: stays addressing inside the fused op
  ValueId t = b.pointwise(se::tanh(se::in(0)) * se::in(0), {s});
  std::vector<ValueId> outs{t};
  Circuit f = fuse_pointwise(c, outs);
  ASSERT_EQ(f.ops().size(), 1u) << f.dump();
  EXPECT_EQ(f.ops()[0].absorbed, 2);
  EXPECT_NE(f.dump().find("absorbed 2 ops"), std::string::npos);
  std::vector<HostTensor> binds = {testing::random_tensor({Shape{4, 5}, DType::f64}, 1),
                                   testing::random_tensor({Shape{1, 5}, DType::f64}, 2)};
  HostTensor want = execute(c, binds, {t})[0], got = execute(f, binds, outs)[0];
  for (int64_t i = 0; i < want.numel(); ++i) EXPECT_EQ(got.get(i), want.get(i)) << i;
}

// A loss gradient's seed: fill(1) * -1 * (1 / n) is a scalar no consumer of another shape can
// absorb; it folds into one fill (no launch of its own), and what reads it is unchanged.
TEST(FusePointwise, PointwiseOverFillsFoldsIntoAFill) {
  Circuit c;
  ValueId x = c.add_external({Shape{4}, DType::f32}, ValueRole::Input, "x");
  Builder b(c);
  ValueId k = b.scale(b.scale(b.fill(Shape{}, DType::f32, 1.0), -1.0), 1.0 / 3.0);
  ValueId y = b.mul(x, k);
  std::vector<ValueId> outs{y};
  Circuit f = fuse_pointwise(c, outs);
  EXPECT_EQ(testing::count_prim(f, PrimId::pointwise), 1u) << f.dump();
  ASSERT_EQ(testing::count_prim(f, PrimId::fill), 1u) << f.dump();
  for (const Op& op : f.ops()) {
    if (op.is(PrimId::fill)) {
      EXPECT_EQ(op.params.reals[0], static_cast<double>(static_cast<float>(-1.0 / 3.0)));
    }
  }
  std::vector<HostTensor> binds = {testing::random_tensor({Shape{4}, DType::f32}, 1)};
  HostTensor want = execute(c, binds, {y})[0], got = execute(f, binds, outs)[0];
  for (int64_t i = 0; i < want.numel(); ++i) EXPECT_NEAR(got.get(i), want.get(i), 1e-7 * std::fabs(want.get(i)));
}

TEST(FusePointwise, ProtectedSharedBroadcastAndAssignCrossingProducersStay) {
  Circuit c;
  ValueId x = c.add_external({Shape{4, 5}, DType::f32}, ValueRole::Input, "x");
  ValueId small = c.add_external({Shape{5}, DType::f32}, ValueRole::Input, "small");
  ValueId w = c.add_external({Shape{4, 5}, DType::f32}, ValueRole::Persistent, "w");
  Builder b(c);
  ValueId shared = b.pointwise(se::exp(se::in(0)), {x});  // two consumers
  ValueId u1 = b.add(shared, x), u2 = b.mul(shared, x);
  ValueId out = b.pointwise(se::sqrt(se::in(0)), {x});  // requested output
  ValueId out_user = b.add(out, x);
  ValueId narrow = b.pointwise(-se::in(0), {small});  // [5] read by a [4, 5] consumer
  ValueId wide = b.add(narrow, x);
  ValueId old_w = b.scale(w, 2.0);  // reads w's old contents...
  b.assign(w, x);                   // ...which this assign overwrites...
  ValueId after = b.add(old_w, x);  // ...before the consumer
  std::vector<ValueId> outs{u1, u2, out, out_user, wide, after};
  const size_t before = testing::count_prim(c, PrimId::pointwise);
  Circuit f = fuse_pointwise(c, outs);
  EXPECT_EQ(testing::count_prim(f, PrimId::pointwise), before) << f.dump();
  f.verify();
}

TEST(FusePointwise, RandomGraphsGiveTheUnfusedResults) {
  const std::vector<ScalarExp> unary = {se::exp(se::in(0)) * se::c(0.5), se::tanh(se::in(0)), -se::in(0),
                                        se::sigmoid(se::in(0)), se::abs(se::in(0)) + se::c(1.0)};
  const std::vector<ScalarExp> binary = {se::in(0) + se::in(1), se::in(0) * se::in(1), se::in(0) - se::in(1),
                                         se::max(se::in(0), se::in(1)), se::in(0) / (se::abs(se::in(1)) + se::c(1.0))};
  int absorbed = 0;
  for (uint64_t seed = 1; seed <= 12; ++seed) {
    for (DType dt : {DType::f64, DType::f32}) {
      Circuit c;
      std::vector<ValueId> vals = {c.add_external({Shape{6, 7}, dt}, ValueRole::Input, "a"),
                                   c.add_external({Shape{1, 7}, dt}, ValueRole::Input, "b"),
                                   c.add_external({Shape{6, 1}, dt}, ValueRole::Input, "c")};
      std::vector<HostTensor> binds;
      for (size_t i = 0; i < vals.size(); ++i)
        binds.push_back(testing::random_tensor({c.info(vals[i]).shape, dt}, seed * 10 + i));
      Builder b(c);
      auto pick = [&](uint64_t k) { return vals[philox_bits(seed, 7, k) % vals.size()]; };
      for (uint64_t k = 0; k < 14; ++k) {
        uint32_t r = philox_bits(seed, 3, k);
        vals.push_back(r % 2 ? b.pointwise(unary[r / 2 % unary.size()], {pick(2 * k)})
                             : b.pointwise(binary[r / 2 % binary.size()], {pick(2 * k), pick(2 * k + 1)}));
      }
      std::vector<ValueId> outs = {vals.back(), vals[vals.size() - 4]};
      std::vector<ValueId> fused_outs = outs;
      Circuit f = fuse_pointwise(c, fused_outs);
      std::vector<ValueId> dce_outs = fused_outs;
      f = dce(f, dce_outs);
      for (const Op& op : f.ops()) absorbed += op.absorbed;
      auto want = execute(c, binds, outs), got = execute(f, binds, dce_outs);
      for (size_t o = 0; o < outs.size(); ++o)
        EXPECT_LT(testing::relative_error(got[o], want[o]), dt == DType::f64 ? 1e-14 : 1e-6)
            << "seed " << seed << "\n"
            << c.dump("unfused") << f.dump("fused");
      if (dt == DType::f32) {  // fused and unfused in the simulator (f32: ex2/lg2 within 2 ulp)
        auto sim_fused = cuda::DeviceProgram(f, dce_outs, testing::fake_runtime()).run(binds);
        auto sim_plain = cuda::DeviceProgram(c, outs, testing::fake_runtime()).run(binds);
        for (size_t o = 0; o < outs.size(); ++o)
          EXPECT_LT(testing::relative_error(sim_fused[o], sim_plain[o]), 1e-5) << "seed " << seed;
      }
    }
  }
  EXPECT_GT(absorbed, 20);  // the graphs do exercise fusion
}

}  // namespace
}  // namespace kiln
