// T1: a finite-difference gradient check in f64 for every registered Prim (and the composites),
// table-driven, with broadcasting cases and sizes that are not multiples of 32; a check that
// every Prim has a case; and proof that deliberately wrong VJP rules are caught.
#include <gtest/gtest.h>

#include <set>

#include "ad/backward.hpp"
#include "ad/gradcheck.hpp"
#include "circuit/ir/error.hpp"
#include "circuit/prims/composites.hpp"
#include "circuit/prims/fused_matmul.hpp"
#include "circuit/prims/fused_rows.hpp"
#include "circuit/prims/multi_tensor.hpp"
#include "prim_test_util.hpp"

namespace kiln {
namespace {

using testing::BuildFn;
using testing::Harness;
using testing::InputSpec;

struct GradCase {
  std::string name;
  std::vector<std::string> prims;  // Prims this case differentiates through
  std::vector<InputSpec> inputs;
  BuildFn build;
  double step = 1e-6, tolerance = 1e-6;
};

const DType f64 = DType::f64;
InputSpec F(Shape s, double lo = -1, double hi = 1) { return InputSpec{std::move(s), f64, lo, hi, true}; }
InputSpec I(Shape s, int64_t hi) { return InputSpec{std::move(s), DType::i32, 0.0, static_cast<double>(hi), false}; }
InputSpec Fixed(Shape s, double lo = -1, double hi = 1) { return InputSpec{std::move(s), f64, lo, hi, false}; }

BuildFn body(ScalarExp e) {
  return [e](Builder& b, const std::vector<ValueId>& x) { return b.pointwise(e, x); };
}
BuildFn unary(ScalarExp (*f)(const ScalarExp&)) { return body(f(se::in(0))); }

std::vector<GradCase> cases() {
  using se::in;
  std::vector<GradCase> t;
  auto pw = [&](std::string name, std::vector<InputSpec> in, BuildFn f) {
    t.push_back({std::move(name), {"pointwise"}, std::move(in), std::move(f)});
  };
  // pointwise: every value op, with broadcasting
  pw("add_broadcast", {F({3, 5}), F({5})}, body(in(0) + in(1)));
  pw("sub_broadcast_both", {F({4, 1, 3}), F({2, 3})}, body(in(0) - in(1)));
  pw("mul_scalar_input", {F({33}), F({})}, body(in(0) * in(1)));
  pw("div", {F({3, 7}), F({3, 7}, 0.5, 2.0)}, body(in(0) / in(1)));
  pw("neg", {F({5, 3})}, body(-in(0)));
  pw("exp", {F({37})}, unary(se::exp));
  pw("log", {F({37}, 0.2, 3.0)}, unary(se::log));
  pw("sqrt", {F({37}, 0.2, 3.0)}, unary(se::sqrt));
  pw("rsqrt", {F({37}, 0.2, 3.0)}, unary(se::rsqrt));
  pw("tanh", {F({37}, -2, 2)}, unary(se::tanh));
  pw("sigmoid", {F({37}, -3, 3)}, unary(se::sigmoid));
  pw("gelu", {F({37}, -3, 3)}, unary(se::gelu));
  pw("gelu_grad", {F({37}, -3, 3)}, unary(se::gelu_grad));  // gelu's second derivative
  pw("silu", {F({37}, -3, 3)}, unary(se::silu));
  pw("sin", {F({37}, -3, 3)}, unary(se::sin));
  pw("cos", {F({37}, -3, 3)}, unary(se::cos));
  pw("abs", {F({37}, 0.1, 1.0)}, body(se::abs(in(0) * se::c(-1.0))));
  pw("pow", {F({6, 5}, 0.5, 2.0), F({5}, -1.5, 2.0)}, body(se::pow(in(0), in(1))));
  pw("max_min", {F({4, 9}), F({9})}, body(se::max(in(0), in(1)) + se::min(in(0), in(1)) * se::c(0.5)));
  pw("select_compare", {F({3, 11}), F({3, 11})},
     body(se::select(se::gt(in(0), in(1)), in(0) * in(1), in(0) - in(1)) + se::lt(in(0), in(1)) + se::ge(in(0), in(1)) +
          se::le(in(0), in(1)) + se::eq(in(0), in(1)) + se::ne(in(0), in(1))));
  pw("three_inputs_fanout", {F({2, 3, 5}), F({3, 1}), F({5})},
     body(in(0) * se::exp(in(1)) + se::tanh(in(0) * in(2)) / (se::c(2.0) + in(1) * in(1))));

  auto add = [&](std::string name, std::vector<std::string> prims, std::vector<InputSpec> in, BuildFn f,
                 double step = 1e-6, double tol = 1e-6) {
    t.push_back({std::move(name), std::move(prims), std::move(in), std::move(f), step, tol});
  };
  // reductions
  for (int axis : {0, 1, 2})
    add("reduce_sum_axis" + std::to_string(axis), {"reduce"}, {F({3, 37, 5})},
        [axis](Builder& b, const auto& x) { return b.reduce(ReduceKind::Sum, x[0], axis); });
  add("reduce_mean_last", {"reduce"}, {F({4, 33})},
      [](Builder& b, const auto& x) { return b.reduce(ReduceKind::Mean, x[0], -1); });
  add("reduce_max_middle", {"reduce"}, {F({3, 7, 5})},
      [](Builder& b, const auto& x) { return b.reduce(ReduceKind::Max, x[0], 1); });
  add("reduce_all_sum", {"reduce_all"}, {F({5, 7})},
      [](Builder& b, const auto& x) { return b.reduce_all(ReduceKind::Sum, x[0]); });
  add("reduce_all_mean", {"reduce_all"}, {F({5, 7})},
      [](Builder& b, const auto& x) { return b.reduce_all(ReduceKind::Mean, x[0]); });
  // matmul: flags, batches, broadcast batches
  for (int flags = 0; flags < 4; ++flags) {
    bool ta = flags & 1, tb = flags & 2;
    add("matmul_ta" + std::to_string(ta) + "_tb" + std::to_string(tb), {"matmul"},
        {F(ta ? Shape{7, 5} : Shape{5, 7}), F(tb ? Shape{3, 7} : Shape{7, 3})},
        [ta, tb](Builder& b, const auto& x) { return b.matmul(x[0], x[1], ta, tb); });
  }
  add("matmul_batched_shared_b", {"matmul"}, {F({2, 5, 7}), F({7, 3})},
      [](Builder& b, const auto& x) { return b.matmul(x[0], x[1]); });
  add("matmul_batched_shared_b_tb", {"matmul"}, {F({2, 5, 7}), F({3, 7})},
      [](Builder& b, const auto& x) { return b.matmul(x[0], x[1], false, true); });
  add("matmul_batched_ta_shared_b", {"matmul"}, {F({2, 7, 5}), F({7, 3})},
      [](Builder& b, const auto& x) { return b.matmul(x[0], x[1], true, false); });
  add("matmul_batch_broadcast", {"matmul"}, {F({1, 3, 4}), F({2, 4, 5})},
      [](Builder& b, const auto& x) { return b.matmul(x[0], x[1]); });
  add("matmul_4d_tb", {"matmul"}, {F({2, 2, 3, 4}), F({2, 2, 5, 4})},
      [](Builder& b, const auto& x) { return b.matmul(x[0], x[1], false, true); });
  // gathers
  add("gather_rows_repeated", {"gather_rows"}, {F({11, 5}), I({2, 9}, 11)},
      [](Builder& b, const auto& x) { return b.gather_rows(x[0], x[1]); });
  add("scatter_add_rows", {"scatter_add_rows"}, {I({7}, 5), F({7, 3})},
      [](Builder& b, const auto& x) { return b.scatter_add_rows(x[0], x[1], 5); });
  add("gather_last", {"gather_last", "cast"}, {F({3, 4, 6}), I({3, 4}, 6)},
      [](Builder& b, const auto& x) { return b.gather_last(x[0], x[1]); });
  add("one_hot_weighting", {"pointwise"}, {F({4, 6}), I({4}, 6)},
      [](Builder& b, const auto& x) { return b.mul(x[0], b.one_hot(x[1], 6, DType::f64)); });
  // layout
  add("reshape", {"reshape"}, {F({6, 5})}, [](Builder& b, const auto& x) { return b.reshape(x[0], Shape{3, -1, 5}); });
  add("permute", {"permute"}, {F({2, 3, 4})}, [](Builder& b, const auto& x) { return b.permute(x[0], {2, 0, 1}); });
  add("transpose", {"permute"}, {F({5, 3})}, [](Builder& b, const auto& x) { return b.transpose(x[0], 0, 1); });
  add("broadcast", {"broadcast"}, {F({3, 1})}, [](Builder& b, const auto& x) {
    return b.broadcast(x[0], Shape{2, 3, 4});
  });
  add("slice_middle", {"slice"}, {F({4, 9})}, [](Builder& b, const auto& x) { return b.slice(x[0], 1, 2, 7); });
  add("slice_head", {"slice"}, {F({5, 3})}, [](Builder& b, const auto& x) { return b.slice(x[0], 0, 0, 2); });
  add("concat_three", {"concat"}, {F({2, 3}), F({2, 1}), F({2, 4})}, [](Builder& b, const auto& x) {
    return b.concat({x[0], x[1], x[2]}, 1);
  });
  add("split_three_one_unused", {"split"}, {F({2, 7, 3})}, [](Builder& b, const auto& x) {
    std::vector<ValueId> p = b.split(x[0], 1, {2, 4, 1});
    return b.concat({p[2], p[0]}, 1);  // the middle piece gets no gradient
  });
  add("where_broadcast", {"where"}, {I({3, 4}, 2), F({3, 4}), F({4})},
      [](Builder& b, const auto& x) { return b.where(x[0], x[1], x[2]); });
  add("cast_int_weights", {"cast", "pointwise"}, {F({3, 4}), I({3, 4}, 5)},
      [](Builder& b, const auto& x) { return b.mul(x[0], b.cast(x[1], DType::f64)); });
  // Through f32 and back: rounding limits what differences can resolve, so a larger step and a
  // tolerance of 1e-4 (f32 resolution over h = 1e-2 on a linear function).
  add(
      "cast_f64_f32_roundtrip", {"cast"}, {F({3, 4})},
      [](Builder& b, const auto& x) { return b.cast(b.cast(x[0], DType::f32), DType::f64); }, 1e-2, 1e-4);
  add("stop_gradient", {"pointwise"}, {F({3, 4}), Fixed({3, 4})},
      [](Builder& b, const auto& x) { return b.mul(x[0], b.stop_gradient(x[1])); });
  add("fill", {"pointwise"}, {F({3, 4})},
      [](Builder& b, const auto& x) { return b.mul(x[0], b.fill(Shape{4}, DType::f64, 2.5)); });
  add("iota", {"pointwise"}, {F({3, 4})}, [](Builder& b, const auto& x) {
    return b.mul(x[0], b.iota(Shape{3, 4}, DType::f64, ix::coord(1)));
  });
  add("random_uniform", {"pointwise"}, {F({5, 7}), I({2}, 1000), I({}, 10)}, [](Builder& b, const auto& x) {
    return b.mul(x[0], b.random(RandomKind::Uniform, Shape{5, 7}, DType::f64, x[1], x[2]));
  });
  // composites
  add("softmax", {"reduce", "pointwise"}, {F({3, 7}, -2, 2)},
      [](Builder& b, const auto& x) { return composite::softmax(b, x[0]); });
  add("log_softmax", {"reduce", "pointwise"}, {F({3, 7}, -2, 2)},
      [](Builder& b, const auto& x) { return composite::log_softmax(b, x[0]); });
  add("layernorm", {"reduce", "pointwise"}, {F({2, 3, 6}), F({6}), F({6})},
      [](Builder& b, const auto& x) { return composite::layernorm(b, x[0], x[1], x[2]); });
  add("cross_entropy", {"gather_last", "reduce_all"}, {F({4, 9}, -2, 2), I({4}, 9)},
      [](Builder& b, const auto& x) { return composite::cross_entropy(b, x[0], x[1]); });
  add("causal_softmax", {"where"}, {F({2, 5, 5})},
      [](Builder& b, const auto& x) { return composite::softmax(b, composite::apply_causal_mask(b, x[0])); });
  add("dropout", {"pointwise"}, {F({4, 6}), I({2}, 1000), I({}, 10)},
      [](Builder& b, const auto& x) { return composite::dropout(b, x[0], 0.25, x[1], x[2]); });
  return t;
}

ad::GradCheckResult run_case(const GradCase& gc) {
  Harness h(gc.inputs, gc.build);
  std::vector<ValueId> wrt;
  for (size_t i = 0; i < gc.inputs.size(); ++i)
    if (gc.inputs[i].check) wrt.push_back(h.inputs[i]);
  ad::GradCheckOptions opts;
  opts.step = gc.step;
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
