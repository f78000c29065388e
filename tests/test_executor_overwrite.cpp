// Outputs the CPU executor stores over its inputs (Program, PrimDef::may_overwrite): which
// fused_rows and pointwise outputs may take an input's memory, plans that do give the same bits
// as plans that keep every value in a buffer of its own and hold less, and an update's new
// contents written straight into its persistent buffer only where no op that can fail follows.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include <kiln/circuit/exec/executor.hpp>
#include <kiln/circuit/ir/error.hpp>
#include <kiln/circuit/prims/builder.hpp>
#include <kiln/circuit/prims/fused_rows.hpp>

#include "prim_test_util.hpp"

namespace kiln {
namespace {

using se::in;

Target overwriting(bool on) {
  Target t = cpu_target();
  t.cpu_overwrite_inputs = on;
  return t;
}

HostTensor rnd(DType dt, const Shape& s, uint64_t seed) { return testing::random_tensor({s, dt, -1.0, 1.0}, seed); }

bool same_bits(const HostTensor& a, const HostTensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

// Rows of length n over inputs in0 and in1 (the domain's shape), reduction r = sum(in0):
// out0 = in0 * 2 + in1 is written first and out1 = in0 - r reads in0 after it, so out0 may not
// take in0's memory; out1, the last to read it, may; nothing reads in1 after out0.
RowProgram two_outputs(int64_t rows, int64_t n) {
  RowProgram rp;
  rp.inputs = 2;
  rp.domain = Shape{rows, n};
  rp.reduction_kinds = {ReduceKind::Sum};
  rp.reduction_bodies = {in(0)};
  rp.output_per_row = {false, false};
  rp.output_bodies = {in(0) * se::c(2.0) + in(1), in(0) - in(2)};
  return rp;
}

bool may_overwrite(const RowProgram& rp, size_t output, size_t input) {
  Op op;
  op.prim = &PrimRegistry::instance().get(PrimId::fused_rows);
  op.params = rp.to_params(DType::f32);
  const std::vector<ValueInfo> inputs(static_cast<size_t>(rp.inputs), ValueInfo{rp.domain, DType::f32});
  return op.prim->may_overwrite(op, inputs, output, input);
}

// Short rows (the chunked reference) and rows longer than a block (row by row).
const std::vector<std::pair<int64_t, int64_t>> kRowShapes{{300, 7}, {3, 5000}};

TEST(ExecutorOverwrite, RowOutputsTakeOnlyInputsNothingReadsAfterThem) {
  for (const auto& [rows, n] : kRowShapes) {
    const RowProgram rp = two_outputs(rows, n);
    EXPECT_FALSE(may_overwrite(rp, 0, 0)) << n;  // out1 reads in0 after out0 is written
    EXPECT_TRUE(may_overwrite(rp, 1, 0)) << n;
    EXPECT_TRUE(may_overwrite(rp, 0, 1)) << n;
    // GELU's gradient writes its destination before it has read all of its argument.
    RowProgram gelu = rp;
    gelu.output_bodies = {se::gelu_grad(in(0)) + in(1), se::gelu_grad(in(0))};
    EXPECT_FALSE(may_overwrite(gelu, 1, 0)) << n;
    EXPECT_TRUE(may_overwrite(gelu, 0, 1)) << n;  // its root is an add
    // A per-row output is smaller than the row input.
    RowProgram per_row = rp;
    per_row.output_per_row = {false, true};
    per_row.output_bodies[1] = in(2);
    EXPECT_FALSE(may_overwrite(per_row, 1, 0)) << n;
  }
}

// x, y -> a = x * 1.5, b = y + 0.25 (planned, dying at the row op) -> the row op -> copies of its
// outputs returned. Returns the results and the workspace's live peak.
std::pair<std::vector<HostTensor>, size_t> run_rows(const RowProgram& rp, DType dt, bool overwrite) {
  Circuit c;
  const ValueId x = c.add_external({rp.domain, dt}, ValueRole::Input);
  const ValueId y = c.add_external({rp.domain, dt}, ValueRole::Input);
  Builder b(c);
  const ValueId a = b.pointwise(in(0) * se::c(1.5), {x});
  const ValueId bb = b.pointwise(in(0) + se::c(0.25), {y});
  const std::vector<ValueId> outs = c.add_op("fused_rows", rp.to_params(dt), {a, bb});
  const std::vector<ValueId> results{b.pointwise(in(0) * se::c(1.0), {outs[0]}),
                                     b.pointwise(in(0) * se::c(1.0), {outs[1]})};
  Program p(c, results, overwriting(overwrite));
  const std::vector<HostTensor> got = p.run({rnd(dt, rp.domain, 7), rnd(dt, rp.domain, 8)});
  return {got, p.peak_live_bytes()};
}

TEST(ExecutorOverwrite, RowOpsGiveTheSameBitsInLessMemory) {
  for (DType dt : {DType::f32, DType::f64})
    for (const auto& [rows, n] : kRowShapes) {
      const RowProgram rp = two_outputs(rows, n);
      const auto [kept, kept_peak] = run_rows(rp, dt, false);
      const auto [over, over_peak] = run_rows(rp, dt, true);
      for (size_t o = 0; o < kept.size(); ++o) EXPECT_TRUE(same_bits(over[o], kept[o])) << "output " << o << " n " << n;
      // Both outputs are stored over the inputs (out0 over in1, out1 over in0): at the row op
      // two domain-sized buffers are live instead of four.
      const size_t domain_bytes = static_cast<size_t>(rp.domain.numel()) * dtype_size(dt);
      EXPECT_EQ(kept_peak - over_peak, 2 * domain_bytes) << n;
    }
}

// p (persistent) <- p - 0.5 * g with g = x * x: the new contents are computed over p's old ones.
// Then, where asked, a gather whose index the run checks.
struct Update {
  Circuit c;
  ValueId p = kNoValue, x = kNoValue, idx = kNoValue;
  std::vector<ValueId> results;
  explicit Update(bool fallible_op_after, bool old_contents_read_after = false) {
    p = c.add_external({Shape{4, 8}, DType::f32}, ValueRole::Persistent);
    x = c.add_external({Shape{4, 8}, DType::f32}, ValueRole::Input);
    Builder b(c);
    const ValueId g = b.pointwise(in(0) * in(0), {x});
    results.push_back(b.reduce_all(ReduceKind::Sum, g));
    const ValueId next = b.pointwise(in(0) - se::c(0.5) * in(1), {p, g});
    // Reads of the old contents come before the assign (Circuit::verify).
    if (old_contents_read_after) results.push_back(b.pointwise(in(0) * se::c(2.0), {p}));
    b.assign(p, next);
    if (fallible_op_after) {
      idx = c.add_external({Shape{1}, DType::i32}, ValueRole::Input);
      results.push_back(b.gather_rows(x, idx));
    }
  }
};

TEST(ExecutorOverwrite, AnUpdateIsWrittenIntoItsBufferWhereNoOpThatCanFailFollows) {
  const HostTensor x = rnd(DType::f32, Shape{4, 8}, 3), start = rnd(DType::f32, Shape{4, 8}, 4);
  std::vector<HostTensor> updated;
  for (bool overwrite : {false, true}) {
    Update u(false);
    HostTensor p = start.clone();
    Program prog(u.c, u.results, overwriting(overwrite));
    prog.run({p, x});
    updated.push_back(p);
    // Written over the old contents, the new ones need no workspace: only g is planned.
    EXPECT_EQ(prog.peak_live_bytes(), (overwrite ? 1u : 2u) * 32 * sizeof(float)) << overwrite;
  }
  EXPECT_TRUE(same_bits(updated[0], updated[1]));
  for (int64_t i = 0; i < start.numel(); ++i)
    EXPECT_NEAR(updated[1].get(i), start.get(i) - 0.5 * x.get(i) * x.get(i), 1e-6) << i;
  // An op after the update reads the old contents: they stay until the run's end.
  {
    Update u(false, true);
    HostTensor p = start.clone();
    Program prog(u.c, u.results, overwriting(true));
    const HostTensor twice = prog.run({p, x})[1];
    EXPECT_TRUE(same_bits(p, updated[0]));
    for (int64_t i = 0; i < start.numel(); ++i) EXPECT_EQ(twice.get(i), 2 * start.get(i)) << i;
  }
  // A buffer written in place, bound to memory another binding reads: an error, not a wrong result.
  {
    Update u(false);
    HostTensor shared = start.clone();
    Program prog(u.c, u.results, overwriting(true));
    EXPECT_THROW(prog.run({shared, shared}), kiln::Error);
    EXPECT_TRUE(same_bits(shared, start));
  }
  // An index error after the update: the failed run leaves the buffer as it was.
  Update u(true);
  HostTensor p = start.clone();
  HostTensor bad = HostTensor::zeros(DType::i32, Shape{1});
  bad.set(0, 9);
  Program prog(u.c, u.results, overwriting(true));
  EXPECT_THROW(prog.run({p, x, bad}), kiln::Error);
  EXPECT_TRUE(same_bits(p, start));
}

}  // namespace
}  // namespace kiln
