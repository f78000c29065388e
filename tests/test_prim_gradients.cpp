// T1: a finite-difference gradient check in f64 for every registered Prim (and the composites),
// over the gradient cases of each family's case list (tests/prims/<family>.cpp: broadcasting,
// sizes that are not multiples of 32); a check that every Prim has a case; and proof that
// deliberately wrong VJP rules are caught.
#include <gtest/gtest.h>

#include <set>

#include <kiln/ad/backward.hpp>
#include <kiln/ad/gradcheck.hpp>
#include <kiln/circuit/ir/error.hpp>
#include <kiln/circuit/prims/composites.hpp>
#include <kiln/circuit/prims/fused_matmul.hpp>
#include <kiln/circuit/prims/fused_rows.hpp>
#include <kiln/circuit/prims/multi_tensor.hpp>

#include "prim_cases.hpp"
#include "prim_test_util.hpp"

namespace kiln {
namespace {

using testing::BuildFn;
using testing::F;
using testing::GradCase;
using testing::Harness;
using testing::I;
using testing::InputSpec;
using testing::unary;

const DType f64 = DType::f64;

std::vector<GradCase> cases() { return testing::all_prim_cases().gradient; }

ad::GradCheckResult run_case(const GradCase& gc) {
  Harness h(gc.inputs, gc.build);
  std::vector<ValueId> wrt;
  for (size_t i = 0; i < gc.inputs.size(); ++i)
    if (gc.inputs[i].check) wrt.push_back(h.inputs[i]);
  ad::GradCheckOptions opts;
  if (gc.step > 0) opts.step = gc.step;
  opts.tolerance = gc.tolerance;
  return ad::check_gradients(h.circuit, h.output, wrt, h.bindings, opts);
}

class PrimGradient : public ::testing::TestWithParam<GradCase> {};

TEST_P(PrimGradient, MatchesCentralDifferencesInF64) {
  ad::GradCheckResult r = run_case(GetParam());
  EXPECT_TRUE(r.ok) << r.report;
  EXPECT_FALSE(r.rel_error.empty());
}

INSTANTIATE_TEST_SUITE_P(AllPrims, PrimGradient, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return info.param.name; });

// Coverage from the registry: every Prim with a VJP rule has a case whose `prims` names it
// (a case names only the Prims whose rules it exercises). A Prim without one has no gradient
// to check: a non-differentiable one (fill, iota, random, one_hot, stop_gradient) is a constant
// to the sweep, which the cases that multiply x by one check (their gradient is the constant);
// any other (assign, the fused Prims built after backward) makes the sweep throw, tested below.
TEST(PrimGradientTable, EveryPrimWithAVjpRuleHasACase) {
  std::set<std::string> covered;
  for (const GradCase& c : cases()) covered.insert(c.prims.begin(), c.prims.end());
  size_t with_rules = 0;
  for (const PrimDef* p : PrimRegistry::instance().all()) {
    if (p->id == PrimId::user) continue;  // registered by tests of user Prims (test_user_prims.cpp)
    if (!p->vjp) {
      EXPECT_EQ(covered.count(p->name), 0u) << "a case claims Prim '" << p->name << "', which has no VJP rule";
      continue;
    }
    ++with_rules;
    EXPECT_TRUE(covered.count(p->name)) << "Prim '" << p->name << "' has a VJP rule and no gradient-check case";
  }
  EXPECT_GE(with_rules, 15u);  // the registry's differentiable Prims, not an empty loop
}

// Differentiating loss with respect to x goes through `prim`, which has no VJP rule: the
// reverse sweep throws an error naming it.
void expect_backward_refuses(Builder& b, ValueId loss, ValueId x, const std::string& prim) {
  try {
    ad::backward(b, loss, {x});
    FAIL() << "differentiating through " << prim << " must throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no VJP rule for Prim '" + prim + "'"), std::string::npos) << e.what();
  }
}

TEST(PrimGradientTable, AssignHasNoVjpAndSaysSo) {
  Circuit c;
  ValueId p = c.add_external({Shape{3}, f64}, ValueRole::Persistent, "p");
  ValueId x = c.add_external({Shape{3}, f64}, ValueRole::Input, "x");
  Builder b(c);
  ValueId y = b.assign(p, x);
  ValueId loss = b.reduce_all(ReduceKind::Sum, y);
  expect_backward_refuses(b, loss, x, "assign");
}

TEST(PrimGradientTable, FusedRowsHasNoVjpAndSaysSo) {
  Circuit c;
  ValueId x = c.add_external({Shape{2, 3}, f64}, ValueRole::Input, "x");
  Builder b(c);
  RowProgram rp;
  rp.inputs = 1;
  rp.domain = Shape{2, 3};
  rp.reduction_kinds = {ReduceKind::Sum};
  rp.reduction_bodies = {se::in(0)};
  rp.output_per_row = {true};
  rp.output_bodies = {se::in(1)};
  ValueId y = c.add_op("fused_rows", rp.to_params(f64), {x})[0];
  ValueId loss = b.reduce_all(ReduceKind::Sum, y);
  expect_backward_refuses(b, loss, x, "fused_rows");
}

TEST(PrimGradientTable, MultiTensorHasNoVjpAndSaysSo) {
  Circuit c;
  ValueId x = c.add_external({Shape{2, 3}, f64}, ValueRole::Input, "x");
  ValueId y = c.add_external({Shape{4}, f64}, ValueRole::Input, "y");
  Builder b(c);
  MultiTensorProgram mp;
  mp.groups = 2;
  mp.group_inputs = 1;
  mp.bodies = {se::in(0) * se::in(0)};
  std::vector<ValueId> out = c.add_op("multi_tensor", mp.to_params(f64), {x, y});
  ValueId loss = b.reduce_all(ReduceKind::Sum, out[0]);
  expect_backward_refuses(b, loss, x, "multi_tensor");
}

TEST(PrimGradientTable, FusedMatmulHasNoVjpAndSaysSo) {
  Circuit c;
  ValueId x = c.add_external({Shape{2, 3}, f64}, ValueRole::Input, "x");
  ValueId w = c.add_external({Shape{3, 4}, f64}, ValueRole::Input, "w");
  Builder b(c);
  FusedMatmul f = FusedMatmul::plain(Shape{2, 3}, Shape{3, 4}, false, false);
  ValueId y = c.add_op("fused_matmul", f.to_params(f64), {x, w})[0];
  expect_backward_refuses(b, b.reduce_all(ReduceKind::Sum, y), x, "fused_matmul");
}

TEST(PrimGradientTable, ColumnSumsHasNoVjpAndSaysSo) {
  Circuit c;
  ValueId x = c.add_external({Shape{2, 3}, f64}, ValueRole::Input, "x");
  Builder b(c);
  const ColumnSumsParams p{Shape{2, 3}, {se::in(0)}, f64};
  ValueId y = c.add_op(PrimId::column_sums, p.to_params(), {x})[0];
  expect_backward_refuses(b, b.reduce_all(ReduceKind::Sum, y), x, "column_sums");
}

TEST(PrimGradientTable, StopGradientGivesNoGradient) {
  Harness h({F({3}), F({3})}, [](Builder& b, const auto& x) { return b.mul(x[0], b.stop_gradient(x[1])); });
  Builder b(h.circuit);
  auto g = ad::backward(b, b.reduce_all(ReduceKind::Sum, h.output), {h.inputs[0], h.inputs[1]});
  EXPECT_NE(g[0], kNoValue);
  EXPECT_EQ(g[1], kNoValue);
}

// --- deliberately wrong rules must fail the checker -------------------------------------

GradCase square_matmul() {
  return {"square_matmul", {"matmul"}, {F({4, 4}), F({4, 4})}, [](Builder& b, const auto& x) {
            return b.matmul(x[0], x[1]);
          }};
}

TEST(WrongVjpRule, CorrectRulePasses) { EXPECT_TRUE(run_case(square_matmul()).ok); }

TEST(WrongVjpRule, ZeroedIsCaught) {
  ScopedVjpOverride guard("matmul", [](Builder& b, const Op& op, const std::vector<ValueId>&) {
    return std::vector<ValueId>{b.fill(b.info(op.inputs[0]).shape, f64, 0.0),
                                b.fill(b.info(op.inputs[1]).shape, f64, 0.0)};
  });
  EXPECT_FALSE(run_case(square_matmul()).ok);
}

TEST(WrongVjpRule, NegatedIsCaught) {
  ScopedVjpOverride* self = nullptr;
  ScopedVjpOverride guard("matmul", [&self](Builder& b, const Op& op, const std::vector<ValueId>& g) {
    std::vector<ValueId> r = self->original()(b, op, g);
    for (ValueId& v : r) v = b.scale(v, -1.0);
    return r;
  });
  self = &guard;
  EXPECT_FALSE(run_case(square_matmul()).ok);
}

TEST(WrongVjpRule, TransposedIsCaught) {
  ScopedVjpOverride* self = nullptr;
  ScopedVjpOverride guard("matmul", [&self](Builder& b, const Op& op, const std::vector<ValueId>& g) {
    std::vector<ValueId> r = self->original()(b, op, g);
    for (ValueId& v : r) v = b.transpose(v, 0, 1);
    return r;
  });
  self = &guard;
  EXPECT_FALSE(run_case(square_matmul()).ok);
}

// The rounding floor (a gradient at rounding level is compared absolutely) must not let small
// errors through: a rule off by one part in 10^4 still fails.
TEST(WrongVjpRule, SlightlyScaledIsCaught) {
  ScopedVjpOverride* self = nullptr;
  ScopedVjpOverride guard("matmul", [&self](Builder& b, const Op& op, const std::vector<ValueId>& g) {
    std::vector<ValueId> r = self->original()(b, op, g);
    for (ValueId& v : r) v = b.scale(v, 1.0 + 1e-4);
    return r;
  });
  self = &guard;
  EXPECT_FALSE(run_case(square_matmul()).ok);
}

TEST(WrongVjpRule, WrongPointwiseRuleIsCaught) {
  // A rule that passes g through unchanged, ignoring the body's derivative.
  ScopedVjpOverride guard("pointwise", [](Builder&, const Op& op, const std::vector<ValueId>& g) {
    return std::vector<ValueId>(op.inputs.size(), g[0]);
  });
  GradCase c{"exp", {"pointwise"}, {F({7})}, unary(se::exp)};
  EXPECT_FALSE(run_case(c).ok);
}

TEST(WrongVjpRule, OverrideIsRestored) {
  { ScopedVjpOverride guard("matmul", {}); }
  EXPECT_TRUE(run_case(square_matmul()).ok);
}

}  // namespace
}  // namespace kiln
