// T2 for the multi-tensor merge: an optimizer's per-parameter update (with gradient-norm
// clipping) becomes multi_tensor ops that give the unmerged results bit for bit on the Eigen
// executor and within 1e-5 in the SIMT simulator (f32 sums in another order); forward work
// and work that depends on other work of its kind is never merged; many groups split into
// launches that fit the kernel parameter space.
#include <gtest/gtest.h>

#include <kiln/circuit/exec/executor.hpp>
#include <kiln/circuit/passes/cleanup.hpp>
#include <kiln/circuit/passes/fusion.hpp>
#include <kiln/circuit/prims/multi_tensor.hpp>
#include <kiln/cuda/lower/lower.hpp>

#include "device_test_util.hpp"
#include "prim_test_util.hpp"

namespace kiln {
namespace {

const std::vector<Shape> kShapes = {Shape{5, 7}, Shape{7}, Shape{3, 4, 2}, Shape{1}, Shape{300}};

struct Step {
  Circuit c;
  std::vector<HostTensor> binds;  // gradients, then parameters and moments (persistent), then lr
  std::vector<ValueId> outs;
};

// A momentum step with clipping by the global gradient norm, recorded per parameter as an
// optimizer does: total = sum_i sum(g_i^2), scale = min(1, 1 / (sqrt(total) + 1e-6)),
// m_i = 0.9 m_i + g_i * scale, p_i -= lr * m_i. The [1] parameter has a one-element domain,
// which is no candidate.
Step momentum_step(DType dt, Phase phase, const std::vector<Shape>& shapes = kShapes) {
  Step s;
  std::vector<ValueId> g, p, m;
  for (size_t i = 0; i < shapes.size(); ++i) {
    g.push_back(s.c.add_external({shapes[i], dt}, ValueRole::Input, "g" + std::to_string(i)));
    s.binds.push_back(testing::random_tensor({shapes[i], dt}, 10 + i));
  }
  for (size_t i = 0; i < shapes.size(); ++i) {
    p.push_back(s.c.add_external({shapes[i], dt}, ValueRole::Persistent, "p" + std::to_string(i)));
    m.push_back(s.c.add_external({shapes[i], dt}, ValueRole::Persistent, "m" + std::to_string(i)));
    s.binds.push_back(testing::random_tensor({shapes[i], dt}, 20 + i));
    s.binds.push_back(testing::random_tensor({shapes[i], dt}, 30 + i));
  }
  ValueId lr = s.c.add_external({Shape{}, dt}, ValueRole::Input, "lr");
  s.binds.push_back(testing::random_tensor({Shape{}, dt, 0.01, 0.1}, 40));
  s.c.set_recording_phase(phase);
  Builder b(s.c, "opt");
  ValueId total = kNoValue;
  for (ValueId gi : g) {
    ValueId sq = b.reduce_all(ReduceKind::Sum, b.mul(gi, gi));
    total = total == kNoValue ? sq : b.add(total, sq);
  }
  ValueId scale = b.pointwise(se::min(se::c(1.0), se::c(1.0) / (se::sqrt(se::in(0)) + se::c(1e-6))), {total});
  for (size_t i = 0; i < shapes.size(); ++i) {
    ValueId mi = b.assign(m[i], b.pointwise(se::in(0) * se::c(0.9) + se::in(1) * se::in(2), {m[i], g[i], scale}));
    b.assign(p[i], b.pointwise(se::in(0) - se::in(1) * se::in(2), {p[i], lr, mi}));
  }
  s.outs = {total};
  return s;
}

// The plan a GPU run gets (`with_rows`: fuse_rows included) or one with fuse_rows disabled, so
// that the merge also meets an update of plain pointwise ops.
Circuit optimize(const Circuit& c, std::vector<ValueId>& outs, bool with_rows) {
  Circuit f = forward_assigned_values(cse(c, outs));
  f = fuse_pointwise(f, outs);
  if (with_rows) f = fuse_rows(f, outs);
  return merge_multi_tensor(f, outs);
}

std::vector<HostTensor> clone_all(const std::vector<HostTensor>& v) {
  std::vector<HostTensor> out;
  for (const HostTensor& t : v) out.push_back(t.clone());
  return out;
}

// The merged circuit `f` (outputs `outs`) gives the recorded step's total and buffers: the same
// bits on the Eigen executor, and within 1e-5 in the simulator (f32).
void expect_same_results(const Step& s, const Circuit& f, const std::vector<ValueId>& outs, DType dt) {
  std::vector<HostTensor> want_buf = clone_all(s.binds), got_buf = clone_all(s.binds);
  HostTensor want = execute(s.c, want_buf, s.outs)[0], got = execute(f, got_buf, outs)[0];
  EXPECT_EQ(testing::relative_error(got, want), 0.0);
  for (size_t k = 0; k < want_buf.size(); ++k)
    EXPECT_EQ(testing::relative_error(got_buf[k], want_buf[k]), 0.0) << "binding " << k;
  if (dt != DType::f32) return;
  std::vector<HostTensor> sim_buf = clone_all(s.binds);
  HostTensor sim = cuda::DeviceProgram(f, outs, testing::fake_runtime()).run(sim_buf)[0];
  EXPECT_LT(testing::relative_error(sim, want), 1e-5);
  for (size_t k = 0; k < want_buf.size(); ++k)
    EXPECT_LT(testing::relative_error(sim_buf[k], want_buf[k]), 1e-5) << "binding " << k << " (simulator)";
}

TEST(MergeMultiTensor, TheClippedUpdateOfEveryParameterMergesAndGivesTheSameResults) {
  for (bool with_rows : {false, true})
    for (DType dt : {DType::f64, DType::f32}) {
      Step s = momentum_step(dt, Phase::Update);
      std::vector<ValueId> outs = s.outs;
      Circuit f = optimize(s.c, outs, with_rows);
      f.verify();
      // The norm's squares and sums (one program) and the update (one, or from plain pointwise
      // ops two: moments, then parameters).
      EXPECT_EQ(testing::count_prim(f, PrimId::multi_tensor), with_rows ? 2u : 3u) << f.dump();
      EXPECT_EQ(testing::count_prim(f, PrimId::reduce_all), 1u) << f.dump();  // the [1] parameter's
      for (const Op& op : f.ops()) {
        if (op.is(PrimId::multi_tensor)) {
          EXPECT_EQ(MultiTensorProgram::from_params(op.params).groups, 4) << f.dump();
        }
      }
      expect_same_results(s, f, outs, dt);
    }
}

// Without the one-element parameter every sum of squares is in the merged sum, and the add-up
// of the group sums (the requested total) becomes that op's total: the norm is one launch.
TEST(MergeMultiTensor, TheGlobalNormIsTheTotalOfTheMergedSums) {
  for (DType dt : {DType::f64, DType::f32}) {
    Step s = momentum_step(dt, Phase::Update, {Shape{3, 4}, Shape{5}, Shape{2, 3, 7}, Shape{9}});
    std::vector<ValueId> outs = s.outs;
    Circuit f = optimize(s.c, outs, true);
    f.verify();
    size_t totals = 0;
    for (const Op& op : f.ops())
      if (op.is(PrimId::multi_tensor)) totals += MultiTensorProgram::from_params(op.params).has_total ? 1 : 0;
    EXPECT_EQ(totals, 1u) << f.dump();
    EXPECT_EQ(testing::count_prim(f, PrimId::reduce_all), 0u) << f.dump();
    expect_same_results(s, f, outs, dt);
  }
}

TEST(MergeMultiTensor, ForwardAndBackwardWorkIsNeverMerged) {
  for (Phase phase : {Phase::Forward, Phase::Backward}) {
    Step s = momentum_step(DType::f32, phase);
    std::vector<ValueId> outs = s.outs;
    EXPECT_EQ(testing::count_prim(optimize(s.c, outs, true), PrimId::multi_tensor), 0u);
  }
}

// a2 = f(a) and a = f(x) have one program, but a2 needs a: they stay apart; f(y) joins a. And
// two works of another program both read y.
TEST(MergeMultiTensor, WorkThatDependsOnItsKindStaysApart) {
  Circuit c;
  ValueId x = c.add_external({Shape{6}, DType::f64}, ValueRole::Input, "x");
  ValueId y = c.add_external({Shape{2, 3}, DType::f64}, ValueRole::Input, "y");
  c.set_recording_phase(Phase::Update);
  Builder b(c);
  const ScalarExp f = se::exp(se::in(0)) * se::c(0.5);
  ValueId a = b.pointwise(f, {x});
  ValueId a2 = b.pointwise(f, {a});
  ValueId y2 = b.pointwise(f, {y});
  // Two works reading one tensor (not a scalar): it stays a per-group input of both.
  const ScalarExp h = se::in(0) * se::in(1);
  ValueId hy = b.pointwise(h, {y, y2}), hy2 = b.pointwise(h, {y, b.pointwise(se::c(0.0) - se::in(0), {y})});
  std::vector<ValueId> outs{a2, y2, hy, hy2}, merged_outs = outs;
  Circuit m = merge_multi_tensor(c, merged_outs);
  m.verify();
  ASSERT_EQ(testing::count_prim(m, PrimId::multi_tensor), 2u) << m.dump();
  EXPECT_EQ(testing::count_prim(m, PrimId::pointwise), 2u) << m.dump();  // a2, and the negation
  std::vector<HostTensor> binds = {testing::random_tensor({Shape{6}, DType::f64}, 1),
                                   testing::random_tensor({Shape{2, 3}, DType::f64}, 2)};
  auto want = execute(c, binds, outs), got = execute(m, binds, merged_outs);
  for (size_t o = 0; o < outs.size(); ++o) EXPECT_EQ(testing::relative_error(got[o], want[o]), 0.0) << o;
}

// 170 groups of two inputs and one output need 510 addresses: two launches of at most 480.
TEST(MergeMultiTensor, ManyGroupsSplitIntoLaunchesThatFitTheParameterSpace) {
  Circuit c;
  std::vector<ValueId> in;
  for (int k = 0; k < 340; ++k) in.push_back(c.add_external({Shape{5}, DType::f32}, ValueRole::Input));
  MultiTensorProgram mp;
  mp.groups = 170;
  mp.group_inputs = 2;
  mp.bodies = {se::in(0) + se::in(1)};
  c.add_op("multi_tensor", mp.to_params(DType::f32), in);
  cuda::LoweredOp l = cuda::lower(c, 0, cuda::device_target(testing::fake_runtime()));
  ASSERT_EQ(l.launches.size(), 2u);
  size_t params = 0;
  for (const cuda::Launch& launch : l.launches) {
    EXPECT_LE(launch.args.size(), 480u);
    params += launch.args.size();
  }
  EXPECT_EQ(params, 510u);
}

}  // namespace
}  // namespace kiln
