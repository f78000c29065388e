// T2 for row-epilogue fusion: the row patterns of a transformer (softmax, masked softmax,
// layernorm forward and backward, cross-entropy with its gradient) each become row kernels
// with no reduction along the last axis left, and fused and unfused circuits agree on the
// Eigen executor (f64 1e-12, f32 1e-5 norm-relative: sums in another order) and in the SIMT
// simulator (1e-5: ex2/lg2 within 2 ulp, warp-order sums); random graphs of reductions and
// pointwise ops; legality (no cycles through other ops, buffer order); the disable switch.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <limits>

#include <kiln/ad/backward.hpp>
#include <kiln/circuit/exec/executor.hpp>
#include <kiln/circuit/passes/cleanup.hpp>
#include <kiln/circuit/passes/fusion.hpp>
#include <kiln/circuit/prims/composites.hpp>
#include <kiln/circuit/prims/fused_rows.hpp>

#include "device_test_util.hpp"
#include "prim_test_util.hpp"

namespace kiln {
namespace {

size_t row_reductions(const Circuit& c) {
  size_t n = 0;
  for (const Op& op : c.ops())
    n += op.is(PrimId::reduce) && ReduceParams::of(op).axis == c.info(op.inputs[0]).shape.rank() - 1;
  return n;
}

Circuit optimize(const Circuit& c, std::vector<ValueId>& outs) {
  Circuit f = cse(c, outs);
  f = fuse_pointwise(f, outs);
  return fuse_rows(f, outs);
}

struct Pattern {
  std::string name;
  std::vector<testing::InputSpec> inputs;  // dtypes set per run
  // Returns the values to compare (forward outputs and, for backward patterns, gradients).
  std::function<std::vector<ValueId>(Builder&, const std::vector<ValueId>&)> build;
  size_t max_fused;  // fused_rows ops expected at most
};

// loss = sum(y * r) for a fixed random r, so that the gradient reaching y is not uniform.
ValueId weighted_sum(Builder& b, ValueId y, ValueId r) { return b.reduce_all(ReduceKind::Sum, b.mul(y, r)); }

std::vector<Pattern> patterns() {
  using testing::InputSpec;
  const Shape x{3, 5, 37};
  std::vector<Pattern> p;
  p.push_back({"softmax",
               {{x, DType::f64, -3, 3}},
               [](Builder& b, const auto& in) { return std::vector<ValueId>{composite::softmax(b, in[0])}; },
               1});
  p.push_back({"masked_softmax",
               {{Shape{2, 3, 19, 19}, DType::f64, -3, 3}},
               [](Builder& b, const auto& in) {
                 return std::vector<ValueId>{composite::softmax(b, composite::apply_causal_mask(b, in[0]))};
               },
               1});
  p.push_back(
      {"layernorm_forward",
       {{x, DType::f64, -2, 2}, {Shape{37}, DType::f64, 0.5, 1.5}, {Shape{37}, DType::f64}},
       [](Builder& b, const auto& in) { return std::vector<ValueId>{composite::layernorm(b, in[0], in[1], in[2])}; },
       1});
  p.push_back({"masked_softmax_backward",
               {{Shape{2, 19, 19}, DType::f64, -3, 3}, {Shape{2, 19, 19}, DType::f64}},
               [](Builder& b, const auto& in) {
                 ValueId y = composite::softmax(b, composite::apply_causal_mask(b, in[0]));
                 std::vector<ValueId> g = ad::backward(b, weighted_sum(b, y, in[1]), {in[0]});
                 return std::vector<ValueId>{y, g[0]};
               },
               2});
  p.push_back({"layernorm_forward_backward",
               {{x, DType::f64, -2, 2}, {Shape{37}, DType::f64, 0.5, 1.5}, {Shape{37}, DType::f64}, {x, DType::f64}},
               [](Builder& b, const auto& in) {
                 ValueId y = composite::layernorm(b, in[0], in[1], in[2]);
                 std::vector<ValueId> g = ad::backward(b, weighted_sum(b, y, in[3]), {in[0], in[1], in[2]});
                 return std::vector<ValueId>{y, g[0], g[1], g[2]};
               },
               2});
  // Rows longer than the CPU reference's block (2048): visited block by block, a phase per body.
  p.push_back({"layernorm_forward_backward_long_rows",
               {{Shape{3, 2500}, DType::f64, -2, 2},
                {Shape{2500}, DType::f64, 0.5, 1.5},
                {Shape{2500}, DType::f64},
                {Shape{3, 2500}, DType::f64}},
               [](Builder& b, const auto& in) {
                 ValueId y = composite::layernorm(b, in[0], in[1], in[2]);
                 std::vector<ValueId> g = ad::backward(b, weighted_sum(b, y, in[3]), {in[0], in[1], in[2]});
                 return std::vector<ValueId>{y, g[0], g[1], g[2]};
               },
               2});
  p.push_back({"cross_entropy_and_gradient",
               {{Shape{4, 6, 113}, DType::f64, -4, 4}, {Shape{4, 6}, DType::i32, 0, 113}},
               [](Builder& b, const auto& in) {
                 ValueId loss = composite::cross_entropy(b, in[0], in[1]);
                 std::vector<ValueId> g = ad::backward(b, loss, {in[0]});
                 return std::vector<ValueId>{loss, g[0]};
               },
               1});
  return p;
}

// Builds pattern p in dtype dt; returns the circuit, its outputs and random bindings.
struct Built {
  Circuit c;
  std::vector<ValueId> outs;
  std::vector<HostTensor> binds;
};
Built build(const Pattern& p, DType dt, uint64_t seed = 100) {
  Built r;
  std::vector<ValueId> in;
  for (size_t i = 0; i < p.inputs.size(); ++i) {
    testing::InputSpec s = p.inputs[i];
    if (s.dtype != DType::i32) s.dtype = dt;
    in.push_back(r.c.add_external({s.shape, s.dtype}, ValueRole::Input, "x" + std::to_string(i)));
    r.binds.push_back(testing::random_tensor(s, seed + i));
  }
  Builder b(r.c, "pattern");
  r.outs = p.build(b, in);
  return r;
}

// gtest prints a failing case by its name, not its bytes.
void PrintTo(const Pattern& p, std::ostream* os) { *os << p.name; }

class RowPatterns : public ::testing::TestWithParam<Pattern> {};

TEST_P(RowPatterns, BecomeRowKernelsThatGiveTheUnfusedResults) {
  const Pattern& p = GetParam();
  for (DType dt : {DType::f64, DType::f32}) {
    Built u = build(p, dt);
    std::vector<ValueId> fused_outs = u.outs;
    Circuit f = optimize(u.c, fused_outs);
    EXPECT_EQ(row_reductions(f), 0u) << f.dump("fused");
    EXPECT_GE(testing::count_prim(f, PrimId::fused_rows), 1u);
    EXPECT_LE(testing::count_prim(f, PrimId::fused_rows), p.max_fused) << f.dump("fused");
    auto want = execute(u.c, u.binds, u.outs), got = execute(f, u.binds, fused_outs);
    for (size_t o = 0; o < want.size(); ++o)
      EXPECT_LT(testing::relative_error(got[o], want[o]), dt == DType::f64 ? 1e-12 : 1e-5)
          << p.name << " output " << o << "\n"
          << f.dump("fused");
    if (dt == DType::f32) {
      auto sim = cuda::DeviceProgram(f, fused_outs, testing::fake_runtime()).run(u.binds);
      for (size_t o = 0; o < want.size(); ++o)
        EXPECT_LT(testing::relative_error(sim[o], want[o]), 1e-5) << p.name << " output " << o << " (simulator)";
    }
  }
}

// A Program compiles each fused_rows op on its first run and keeps that for later runs: a
// second run, on other inputs in other buffers, must read those.
TEST_P(RowPatterns, AProgramRunAgainOnOtherInputsGivesTheirResults) {
  const Pattern& p = GetParam();
  Built first = build(p, DType::f64), second = build(p, DType::f64, 300);
  std::vector<ValueId> fused_outs = first.outs;
  const Circuit f = optimize(first.c, fused_outs);
  const Program program(f, fused_outs);
  program.run(first.binds);
  const auto got = program.run(second.binds);
  const auto want = execute(second.c, second.binds, second.outs);
  for (size_t o = 0; o < want.size(); ++o)
    EXPECT_LT(testing::relative_error(got[o], want[o]), 1e-12) << p.name << " output " << o;
}

INSTANTIATE_TEST_SUITE_P(Transformer, RowPatterns, ::testing::ValuesIn(patterns()),
                         [](const auto& info) { return info.param.name; });

TEST(FuseRows, CrossEntropyNeverWritesTheProbabilities) {
  Pattern p = patterns().back();  // cross_entropy_and_gradient
  Built u = build(p, DType::f32);
  std::vector<ValueId> outs = u.outs;
  Circuit f = optimize(u.c, outs);
  const Shape logits = u.c.info(u.outs[1]).shape;
  size_t row_sized = 0;  // float values of the logits' shape anything writes but the one-hot mask
  for (const Op& op : f.ops())
    for (ValueId v : op.outputs) row_sized += f.info(v).shape == logits && !op.is(PrimId::one_hot);
  EXPECT_EQ(row_sized, 1u) << "only the gradient of the logits is written\n" << f.dump();
}

// Values the same along a row, inside a row group: reduced along the row (sum, max, mean of a
// per-row value), read by a varying op, and written both per row and along the row (one body,
// two outputs), next to a scalar and a constant the reductions also meet.
TEST(FuseRows, PerRowValuesReducedAndWrittenBothWaysGiveTheUnfusedResults) {
  for (DType dt : {DType::f64, DType::f32}) {
    Circuit c;
    ValueId x = c.add_external({Shape{5, 37}, dt}, ValueRole::Input, "x");
    ValueId s = c.add_external({Shape{5, 1}, dt}, ValueRole::Input, "s");
    ValueId k = c.add_external({Shape{}, dt}, ValueRole::Input, "k");
    Builder b(c);
    const ScalarExp per_row = se::exp(se::in(0) * se::c(0.5)) + se::in(1);  // of s and k
    ValueId along = b.pointwise(per_row, {s, k, x});                        // [5, 37]: x only widens it
    ValueId row_sum = b.reduce(ReduceKind::Sum, along, -1), row_max = b.reduce(ReduceKind::Max, along, -1),
            row_mean = b.reduce(ReduceKind::Mean, along, -1);
    ValueId scalar_sum =
        b.reduce(ReduceKind::Sum, b.pointwise(se::in(0) * se::c(1.0) + se::in(1) * se::c(0.0), {k, x}), -1);
    ValueId mixed = b.pointwise(se::in(0) * se::in(1) + se::in(2), {x, row_sum, row_max});
    std::vector<ValueId> outs = {row_sum, row_max, row_mean, scalar_sum, mixed, along, b.pointwise(per_row, {s, k})};
    std::vector<HostTensor> binds = {testing::random_tensor({Shape{5, 37}, dt}, 11),
                                     testing::random_tensor({Shape{5, 1}, dt}, 12),
                                     testing::random_tensor({Shape{}, dt}, 13)};
    std::vector<ValueId> fused_outs = outs;
    Circuit f = optimize(c, fused_outs);
    EXPECT_EQ(row_reductions(f), 0u) << f.dump("fused");
    auto want = execute(c, binds, outs), got = execute(f, binds, fused_outs);
    for (size_t o = 0; o < outs.size(); ++o)
      EXPECT_LT(testing::relative_error(got[o], want[o]), dt == DType::f64 ? 1e-12 : 1e-5)
          << "output " << o << "\n"
          << c.dump("unfused") << f.dump("fused");
  }
}

// Rows of length 0 still have their reductions (sum 0, max -inf, mean 0 / 0) and per-row outputs,
// on the CPU and in the simulator (rows() once divided the domain by n and made them 0 rows).
TEST(FusedRows, RowsOfLengthZeroGetTheirReductions) {
  RowProgram rp;
  rp.inputs = 1;
  rp.domain = Shape{4, 0};
  rp.reduction_kinds = {ReduceKind::Sum, ReduceKind::Max, ReduceKind::Mean};
  rp.reduction_bodies = {se::in(0), se::in(0), se::in(0)};
  rp.output_per_row = {true, true, true, false};
  rp.output_bodies = {se::in(1), se::in(2), se::in(3), se::in(0)};
  set_poison_buffers(true);  // as in the whole suite (tests/test_environment.cpp)
  // The CPU reference in f64, the GPU kernel in the simulator in f32.
  for (DType dt : {DType::f64, DType::f32}) {
    const char* where = dt == DType::f64 ? "CPU" : "simulator";
    Circuit c;
    ValueId x = c.add_external({rp.domain, dt}, ValueRole::Input, "x");
    Builder b(c);
    std::vector<ValueId> outs = c.add_op("fused_rows", rp.to_params(dt), {x}, b.scope());
    const std::vector<HostTensor> binds = {HostTensor::zeros(dt, rp.domain)};
    std::vector<HostTensor> got =
        dt == DType::f64 ? execute(c, binds, outs) : cuda::DeviceProgram(c, outs, testing::fake_runtime()).run(binds);
    for (int64_t r = 0; r < 4; ++r) {
      EXPECT_EQ(got[0].get(r), 0.0) << where;
      EXPECT_EQ(got[1].get(r), -std::numeric_limits<double>::infinity()) << where;
      EXPECT_TRUE(std::isnan(got[2].get(r))) << where;
    }
    EXPECT_EQ(got[3].numel(), 0) << where;
  }
}

TEST(FuseRows, RandomGraphsGiveTheUnfusedResults) {
  const std::vector<ScalarExp> unary = {se::exp(se::in(0) * se::c(0.3)), se::tanh(se::in(0)), -se::in(0),
                                        se::abs(se::in(0)) + se::c(1.0)};
  const std::vector<ScalarExp> binary = {se::in(0) + se::in(1), se::in(0) * se::in(1), se::in(0) - se::in(1),
                                         se::max(se::in(0), se::in(1))};
  size_t fused_ops = 0;
  for (uint64_t seed = 1; seed <= 12; ++seed) {
    for (DType dt : {DType::f64, DType::f32}) {
      Circuit c;
      std::vector<ValueId> wide = {c.add_external({Shape{6, 37}, dt}, ValueRole::Input, "a"),
                                   c.add_external({Shape{37}, dt}, ValueRole::Input, "w")};
      // and a scalar, which the CPU reference fills once per op run like a constant
      std::vector<ValueId> narrow = {c.add_external({Shape{6, 1}, dt}, ValueRole::Input, "s"),
                                     c.add_external({Shape{}, dt}, ValueRole::Input, "k")};
      std::vector<HostTensor> binds;
      for (ValueId v : {wide[0], wide[1], narrow[0], narrow[1]})
        binds.push_back(testing::random_tensor({c.info(v).shape, dt}, seed * 10 + static_cast<uint64_t>(v)));
      Builder b(c);
      auto pick = [&](const std::vector<ValueId>& from, uint64_t k) {
        return from[philox_bits(seed, 7, k) % from.size()];
      };
      for (uint64_t k = 0; k < 16; ++k) {
        const uint32_t r = philox_bits(seed, 3, k);
        switch (r % 4) {
          case 0: wide.push_back(b.pointwise(unary[r / 4 % unary.size()], {pick(wide, 2 * k)})); break;
          case 1:  // a wide value with a per-row one (broadcast along the row)
            wide.push_back(b.pointwise(binary[r / 4 % binary.size()], {pick(wide, 2 * k), pick(narrow, 2 * k + 1)}));
            break;
          case 2: {
            const auto kind = static_cast<ReduceKind>(r / 4 % 3);
            narrow.push_back(b.reduce(kind, pick(wide, 2 * k), -1));
            break;
          }
          default: narrow.push_back(b.pointwise(unary[r / 4 % unary.size()], {pick(narrow, 2 * k)})); break;
        }
      }
      std::vector<ValueId> outs = {wide.back(), narrow.back(), wide[wide.size() / 2]};
      std::vector<ValueId> fused_outs = outs;
      Circuit f = fuse_rows(fuse_pointwise(c, fused_outs), fused_outs);
      fused_ops += testing::count_prim(f, PrimId::fused_rows);
      auto want = execute(c, binds, outs), got = execute(f, binds, fused_outs);
      for (size_t o = 0; o < outs.size(); ++o)
        EXPECT_LT(testing::relative_error(got[o], want[o]), dt == DType::f64 ? 1e-12 : 1e-5)
            << "seed " << seed << "\n"
            << c.dump("unfused") << f.dump("fused");
      if (dt == DType::f32) {
        auto sim = cuda::DeviceProgram(f, fused_outs, testing::fake_runtime()).run(binds);
        for (size_t o = 0; o < outs.size(); ++o)
          EXPECT_LT(testing::relative_error(sim[o], want[o]), 1e-5) << "seed " << seed << " (simulator)";
      }
    }
  }
  EXPECT_GT(fused_ops, 12u);  // the graphs do exercise the pass
}

// r = reduce(x); y = permute(permute(r)) (not a row op); z = x * y; s = reduce(z). Joining
// r's group with z's would put the permutes both before and after the fused op: refused.
TEST(FuseRows, AJoinThatWouldCycleThroughAnotherOpIsRefused) {
  Circuit c;
  ValueId x = c.add_external({Shape{4, 9}, DType::f64}, ValueRole::Input, "x");
  Builder b(c);
  ValueId r = b.reduce(ReduceKind::Max, b.pointwise(se::exp(se::in(0)), {x}), -1);
  ValueId y = b.permute(b.permute(b.reshape(r, Shape{4, 1}), {1, 0}), {1, 0});
  ValueId s = b.reduce(ReduceKind::Sum, b.mul(x, y), -1);
  std::vector<ValueId> outs{s}, fused_outs{s};
  Circuit f = fuse_rows(c, fused_outs);
  f.verify();
  EXPECT_EQ(testing::count_prim(f, PrimId::fused_rows), 2u) << f.dump();
  std::vector<HostTensor> binds = {testing::random_tensor({Shape{4, 9}, DType::f64}, 3)};
  EXPECT_LT(testing::relative_error(execute(f, binds, fused_outs)[0], execute(c, binds, outs)[0]), 1e-14);
}

// A row group reads a buffer's old contents; an assign overwrites the buffer before the
// consumer of the group's output: the fused op stays before the assign.
TEST(FuseRows, ReadsOfABufferStayBeforeItsAssign) {
  Circuit c;
  ValueId x = c.add_external({Shape{3, 8}, DType::f64}, ValueRole::Input, "x");
  ValueId w = c.add_external({Shape{8}, DType::f64}, ValueRole::Persistent, "w");
  Builder b(c);
  ValueId s = b.reduce(ReduceKind::Sum, b.mul(x, w), -1);
  ValueId assigned = b.assign(w, b.scale(w, 0.5));
  ValueId z = b.add(b.pointwise(se::exp(se::in(0)), {b.sub(x, s)}), assigned);
  ValueId t = b.reduce(ReduceKind::Mean, z, -1);
  std::vector<ValueId> outs{t}, fused_outs{t};
  Circuit f = fuse_rows(fuse_pointwise(c, fused_outs), fused_outs);
  f.verify();  // throws if a read of w's old contents moved past the assign
  HostTensor xv = testing::random_tensor({Shape{3, 8}, DType::f64}, 4);
  HostTensor w1 = testing::random_tensor({Shape{8}, DType::f64}, 5), w2 = w1.clone();
  HostTensor want = execute(c, {xv, w1}, outs)[0], got = execute(f, {xv, w2}, fused_outs)[0];
  EXPECT_LT(testing::relative_error(got, want), 1e-14);
  EXPECT_LT(testing::relative_error(w2, w1), 1e-15);
}

// Element groups: a value two ops of its shape read, and siblings reading one value, run as
// one multi-output kernel (no reductions: a thread per element on the GPU).
TEST(FuseRows, SiblingsSharingAValueBecomeOneMultiOutputOp) {
  for (DType dt : {DType::f64, DType::f32}) {
    Circuit c;
    ValueId x = c.add_external({Shape{5, 37}, dt}, ValueRole::Input, "x");
    ValueId w = c.add_external({Shape{37}, dt}, ValueRole::Input, "w");
    Builder b(c);
    ValueId a = b.pointwise(se::exp(se::in(0) * se::c(0.5)), {x});  // read by u and v
    ValueId u = b.mul(a, w), v = b.add(a, x);
    ValueId p = b.scale(x, 3.0), q = b.pointwise(se::tanh(se::in(0)), {x});  // siblings reading x
    std::vector<ValueId> outs{u, v, p, q}, fused_outs = outs;
    Circuit f = fuse_rows(fuse_pointwise(c, fused_outs), fused_outs);
    ASSERT_EQ(f.ops().size(), 1u) << f.dump();
    EXPECT_EQ(f.ops()[0].outputs.size(), 4u);
    std::vector<HostTensor> binds = {testing::random_tensor({Shape{5, 37}, dt}, 1),
                                     testing::random_tensor({Shape{37}, dt}, 2)};
    auto want = execute(c, binds, outs), got = execute(f, binds, fused_outs);
    for (size_t o = 0; o < outs.size(); ++o) EXPECT_EQ(testing::relative_error(got[o], want[o]), 0.0) << o;
    if (dt == DType::f32) {
      auto sim = cuda::DeviceProgram(f, fused_outs, testing::fake_runtime()).run(binds);
      for (size_t o = 0; o < outs.size(); ++o) EXPECT_LT(testing::relative_error(sim[o], want[o]), 1e-6) << o;
    }
  }
}

// An AdamW-like update: readers of assign results read the assigned values instead, so the
// moments and the parameter update become one kernel; an assign's target is never renamed.
TEST(ForwardAssigns, ReadersOfAnAssignReadTheValueAndFusionSeesThrough) {
  Circuit c;
  ValueId g = c.add_external({Shape{6, 5}, DType::f64}, ValueRole::Input, "g");
  ValueId p = c.add_external({Shape{6, 5}, DType::f64}, ValueRole::Persistent, "p");
  ValueId m = c.add_external({Shape{6, 5}, DType::f64}, ValueRole::Persistent, "m");
  Builder b(c);
  ValueId m_new = b.assign(m, b.pointwise(se::in(0) * se::c(0.9) + se::in(1) * se::c(0.1), {m, g}));
  ValueId p_new = b.assign(p, b.pointwise(se::in(0) - se::in(1) * se::c(0.01), {p, m_new}));
  ValueId again = b.assign(m_new, b.scale(m_new, 0.5));  // a second version of m
  std::vector<ValueId> outs{p_new, again};
  Circuit fw = forward_assigned_values(c);
  fw.verify();
  for (size_t i = 0; i < c.ops().size(); ++i)
    if (c.ops()[i].is(PrimId::assign)) {
      EXPECT_EQ(fw.ops()[i].inputs[0], c.ops()[i].inputs[0]) << "op " << i;  // the target stays
      EXPECT_EQ(fw.ops()[i].inputs[1], c.ops()[i].inputs[1]) << "op " << i;
    }
  EXPECT_EQ(fw.ops()[2].inputs[1], c.ops()[0].outputs[0]);  // p's update reads m's new value itself
  std::vector<ValueId> fused_outs = outs;
  Circuit f = fuse_rows(fuse_pointwise(fw, fused_outs), fused_outs);
  EXPECT_EQ(testing::count_prim(f, PrimId::fused_rows), 1u) << f.dump();
  EXPECT_EQ(testing::count_prim(f, PrimId::pointwise), 0u) << f.dump();
  auto run = [&](const Circuit& circuit, const std::vector<ValueId>& o, std::vector<HostTensor>& buffers) {
    std::vector<HostTensor> binds = {testing::random_tensor({Shape{6, 5}, DType::f64}, 1)};
    binds.insert(binds.end(), buffers.begin(), buffers.end());
    return execute(circuit, binds, o);
  };
  std::vector<HostTensor> b1 = {testing::random_tensor({Shape{6, 5}, DType::f64}, 2),
                                testing::random_tensor({Shape{6, 5}, DType::f64}, 3)};
  std::vector<HostTensor> b2 = {b1[0].clone(), b1[1].clone()};
  auto want = run(c, outs, b1), got = run(f, fused_outs, b2);
  for (size_t o = 0; o < outs.size(); ++o) EXPECT_EQ(testing::relative_error(got[o], want[o]), 0.0) << o;
  for (size_t k = 0; k < 2; ++k) EXPECT_EQ(testing::relative_error(b2[k], b1[k]), 0.0) << "buffer " << k;
}

}  // namespace
}  // namespace kiln
