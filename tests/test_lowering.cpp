// T3/T4 for the lowering of every Prim: each case builds a one-op circuit on random f32 inputs
// (sizes that are not multiples of 32, 128 or the matmul tile), runs it on the Eigen executor
// and, lowered, in the SIMT simulator behind the fake driver, and compares. Every kernel the
// cases generate then passes ptxas for sm_80 and sm_90.
//
// Tolerances (norm-relative, f32): pointwise 1e-5 (exact IEEE ops, ex2/lg2 within 2 ulp); sums
// 1e-5 (rows of <= 1000 terms summed in another order); matmul 1e-5 (K <= 91, FFMA); moves,
// gathers, casts, masks and Philox bits exactly.
#include <gtest/gtest.h>

#include <map>

#include "circuit/exec/executor.hpp"
#include "circuit/ir/error.hpp"
#include "circuit/ir/prim.hpp"
#include "circuit/prims/fused_matmul.hpp"
#include "circuit/prims/fused_rows.hpp"
#include "circuit/prims/multi_tensor.hpp"
#include "cuda/lower/util.hpp"
#include "device_test_util.hpp"
#include "prim_test_util.hpp"
#include "ptxas_skip.hpp"

namespace kiln {
namespace {

using testing::BuildFn;
using testing::InputSpec;

struct LoweringCase {
  std::string name;
  std::vector<InputSpec> inputs;
  BuildFn build;
  double tolerance;  // norm-relative; 0: bit-exact
};

// gtest prints a failing case by its name, not its bytes.
void PrintTo(const LoweringCase& c, std::ostream* os) { *os << c.name; }

InputSpec f32(Shape s, double lo = -2, double hi = 2) { return {std::move(s), DType::f32, lo, hi}; }
InputSpec i32(Shape s, double lo, double hi) { return {std::move(s), DType::i32, lo, hi}; }

ValueId unary(Builder& b, const std::vector<ValueId>& x, const ScalarExp& body) { return b.pointwise(body, {x[0]}); }

std::vector<LoweringCase> cases() {
  using se::in;
  std::vector<LoweringCase> c;
  auto pw1 = [&](const std::string& name, ScalarExp body, double lo = -3, double hi = 3) {
    c.push_back({"pointwise_" + name,
                 {f32({37, 45}, lo, hi)},
                 [body](Builder& b, const std::vector<ValueId>& x) { return unary(b, x, body); },
                 1e-5});
  };
  pw1("exp", se::exp(in(0)));
  pw1("exp_wide", se::exp(in(0)), -80, 85);  // large |x log2 e|: the product's rounding matters
  pw1("log", se::log(in(0)), 0.01, 50);
  pw1("log_near_one", se::log(in(0)), 0.995, 1.005);  // lg2.approx's absolute error is large here
  pw1("sqrt", se::sqrt(in(0)), 0, 50);
  pw1("rsqrt", se::rsqrt(in(0)), 0.01, 50);
  pw1("tanh", se::tanh(in(0)));
  pw1("tanh_small", se::tanh(in(0)), -0.2, 0.2);  // mostly the polynomial branch
  pw1("sigmoid", se::sigmoid(in(0)), -20, 20);
  pw1("gelu", se::gelu(in(0)));
  pw1("gelu_grad", se::gelu_grad(in(0)));
  pw1("silu", se::silu(in(0)));
  pw1("sin", se::sin(in(0)), -20, 20);
  pw1("cos", se::cos(in(0)), -20, 20);
  pw1("abs_neg", -se::abs(in(0)));
  pw1("pow_positive_base", se::pow(in(0), se::c(1.7)), 0.01, 4);
  pw1("pow_negative_base_integer", se::pow(in(0), se::c(3.0)));
  pw1("compare_select", se::select(se::gt(in(0), se::c(0.5)), se::max(in(0), se::c(1.0)), se::min(in(0), se::c(-1.0))));
  c.push_back({"pointwise_binary_broadcast",
               {f32({37, 1}), f32({1, 45}, 0.5, 2)},
               [](Builder& b, const std::vector<ValueId>& x) {
                 return b.pointwise(se::in(0) / se::in(1) - se::in(0) * se::in(1), {x[0], x[1]});
               },
               1e-5});
  c.push_back({"pointwise_scalar_and_3d",
               {f32({3, 5, 7}), f32({})},
               [](Builder& b, const std::vector<ValueId>& x) { return b.add(x[0], x[1]); },
               1e-6});
  for (auto kind : {ReduceKind::Sum, ReduceKind::Max, ReduceKind::Mean}) {
    const std::string k = kind == ReduceKind::Sum ? "sum" : kind == ReduceKind::Max ? "max" : "mean";
    c.push_back({"reduce_rows_" + k,
                 {f32({7, 1000})},
                 [kind](Builder& b, const std::vector<ValueId>& x) { return b.reduce(kind, x[0], 1); },
                 1e-5});
    c.push_back({"reduce_short_rows_" + k,
                 {f32({45, 33})},
                 [kind](Builder& b, const std::vector<ValueId>& x) { return b.reduce(kind, x[0], 1); },
                 1e-5});
    c.push_back({"reduce_axis0_" + k,
                 {f32({300, 37})},
                 [kind](Builder& b, const std::vector<ValueId>& x) { return b.reduce(kind, x[0], 0); },
                 1e-5});
    c.push_back({"reduce_middle_" + k,
                 {f32({5, 77, 3})},
                 [kind](Builder& b, const std::vector<ValueId>& x) { return b.reduce(kind, x[0], 1); },
                 1e-5});
  }
  for (auto kind : {ReduceKind::Sum, ReduceKind::Mean}) {
    const std::string k = kind == ReduceKind::Sum ? "sum" : "mean";
    c.push_back({"reduce_all_many_blocks_" + k,
                 {f32({5000}, 0, 1)},
                 [kind](Builder& b, const std::vector<ValueId>& x) { return b.reduce_all(kind, x[0]); },
                 1e-5});
    c.push_back({"reduce_all_small_" + k,
                 {f32({3, 3})},
                 [kind](Builder& b, const std::vector<ValueId>& x) { return b.reduce_all(kind, x[0]); },
                 1e-5});
  }
  struct Mm {
    std::string name;
    Shape a, b;
    bool ta, tb;
  };
  for (const Mm& m : std::vector<Mm>{{"plain", {67, 45}, {45, 91}, false, false},
                                     {"ta", {45, 67}, {45, 91}, true, false},
                                     {"tb", {67, 45}, {91, 45}, false, true},
                                     {"ta_tb", {45, 67}, {91, 45}, true, true},
                                     {"batched_shared_b", {3, 2, 33, 17}, {17, 70}, false, false},
                                     {"batch_broadcast", {2, 1, 5, 19}, {3, 7, 19}, false, true},
                                     {"k_larger_than_tile", {9, 130}, {130, 11}, false, false}}) {
    c.push_back({"matmul_" + m.name,
                 {f32(m.a), f32(m.b)},
                 [m](Builder& b, const std::vector<ValueId>& x) { return b.matmul(x[0], x[1], m.ta, m.tb); },
                 1e-5});
  }
  // fused_matmul: attention-like views (a is (b, t, h, d) read as (b, h) x t x d with a
  // prologue; b broadcasts over the first batch dim and is read along its rows), two epilogues
  // with a broadcast bias and a residual, stored permuted, and the row sums of a; and a
  // split-like offset view over several tiles in both directions, with row sums (only the first
  // tile column writes them). The outputs are flattened and concatenated to compare at once.
  c.push_back({"fused_matmul_views_epilogues",
               {f32({2, 9, 3, 70}), f32({3, 70, 11}), f32({11}), f32({2, 3, 9, 11})},
               [](Builder& b, const std::vector<ValueId>& x) {
                 FusedMatmul f;
                 f.batch = {2, 3};
                 f.m = 9, f.n = 11, f.k = 70;
                 // Prologues that are not 0 at 0: K = 70 is no multiple of the tile, so the zero
                 // fill past K matters.
                 f.a = {0, {9 * 3 * 70, 70}, 3 * 70, 1, se::in(0) * se::c(0.5) + se::c(0.125)};
                 f.b = {0, {0, 70 * 11}, 1, 11, se::tanh(se::in(0)) + se::c(0.25)};
                 f.extras = 2;
                 f.epilogues = {se::gelu(se::in(0) + se::in(1)), (se::in(0) + se::in(1)) * se::in(2)};
                 f.out_shape = Shape{2, 9, 3, 11};
                 f.out_batch = {9 * 3 * 11, 11};
                 f.out_row = 3 * 11, f.out_col = 1;
                 f.a_row_sums = true;
                 f.row_sums_shape = Shape{2, 3, 9};
                 std::vector<ValueId> outs = b.circuit().add_op("fused_matmul", f.to_params(DType::f32), x, b.scope());
                 return b.concat(
                     {b.reshape(outs[0], Shape{594}), b.reshape(outs[1], Shape{594}), b.reshape(outs[2], Shape{54})},
                     0);
               },
               1e-5});
  c.push_back({"fused_matmul_offset_view",
               {f32({70, 3 * 45}), f32({45, 91})},
               [](Builder& b, const std::vector<ValueId>& x) {
                 FusedMatmul f = FusedMatmul::plain(Shape{70, 45}, Shape{45, 91}, false, false);
                 f.a.offset = 45;
                 f.a.row_stride = 3 * 45;
                 f.epilogues = {se::in(0) * se::c(2.0)};
                 f.a_row_sums = true;
                 f.row_sums_shape = Shape{1, 70};
                 std::vector<ValueId> outs = b.circuit().add_op("fused_matmul", f.to_params(DType::f32), x, b.scope());
                 return b.concat({b.reshape(outs[0], Shape{70 * 91}), b.reshape(outs[1], Shape{70})}, 0);
               },
               1e-5});
  // column_sums: three bodies over a (3, 37, 70) domain, inputs broadcast per row and per column.
  c.push_back({"column_sums",
               {f32({3, 37, 70}), f32({3, 37, 1}), f32({70})},
               [](Builder& b, const std::vector<ValueId>& x) {
                 const ColumnSumsParams p{
                     Shape{3, 37, 70},
                     {se::in(0) * se::in(1), se::in(0), se::tanh(se::in(0)) + se::in(2) * se::in(1)},
                     DType::f32};
                 std::vector<ValueId> outs = b.circuit().add_op(PrimId::column_sums, p.to_params(), x, b.scope());
                 return b.concat(outs, 1);
               },
               1e-5});
  // Enough rows to split into chunks across blocks (303 rows: 5 chunks of 61, the last short),
  // and two column tiles, the second partial.
  c.push_back(
      {"column_sums_row_split",
       {f32({3, 101, 300}), f32({3, 101, 1}), f32({300})},
       [](Builder& b, const std::vector<ValueId>& x) {
         const ColumnSumsParams p{Shape{3, 101, 300}, {se::in(0) * se::in(1), se::in(0) + se::in(2)}, DType::f32};
         std::vector<ValueId> outs = b.circuit().add_op(PrimId::column_sums, p.to_params(), x, b.scope());
         return b.concat(outs, 1);
       },
       1e-5});
  c.push_back({"gather_rows",
               {f32({50, 37}), i32({3, 7}, 0, 50)},
               [](Builder& b, const std::vector<ValueId>& x) { return b.gather_rows(x[0], x[1]); },
               0});
  // Few rows, many repeats: atomics add several contributions to one element.
  c.push_back({"scatter_add_rows",
               {i32({3, 7}, 0, 5), f32({3, 7, 37})},
               [](Builder& b, const std::vector<ValueId>& x) { return b.scatter_add_rows(x[0], x[1], 5); },
               1e-6});
  // The deterministic mode's ordered sums: the reference's order, so the reference's bits. Many
  // collisions, values of mixed magnitudes (order-dependent rounding), more columns than a block.
  c.push_back({"scatter_add_rows_ordered",
               {i32({9, 31}, 0, 4), f32({9, 31, 300}, -1000, 1000)},
               [](Builder& b, const std::vector<ValueId>& x) {
                 const ScatterAddRowsParams p{4, true};
                 return b.circuit().add_op(PrimId::scatter_add_rows, p.to_params(), {x[0], x[1]}, b.scope())[0];
               },
               0});
  c.push_back({"gather_last",
               {f32({5, 9, 13}), i32({5, 9}, 0, 13)},
               [](Builder& b, const std::vector<ValueId>& x) { return b.gather_last(x[0], x[1]); },
               0});
  c.push_back({"one_hot",
               {i32({5, 9}, 0, 13)},
               [](Builder& b, const std::vector<ValueId>& x) { return b.one_hot(x[0], 13, DType::f32); },
               0});
  c.push_back({"reshape",
               {f32({6, 35})},
               [](Builder& b, const std::vector<ValueId>& x) {
                 return b.reshape(x[0], Shape{5, 42});
               },
               0});
  c.push_back({"permute",
               {f32({3, 5, 7})},
               [](Builder& b, const std::vector<ValueId>& x) {
                 return b.permute(x[0], {2, 0, 1});
               },
               0});
  c.push_back({"broadcast",
               {f32({5, 1})},
               [](Builder& b, const std::vector<ValueId>& x) {
                 return b.broadcast(x[0], Shape{3, 5, 33});
               },
               0});
  c.push_back({"slice",
               {f32({4, 37, 3})},
               [](Builder& b, const std::vector<ValueId>& x) { return b.slice(x[0], 1, 5, 29); },
               0});
  c.push_back({"concat",
               {f32({2, 3, 5}), f32({2, 7, 5}), f32({2, 1, 5})},
               [](Builder& b, const std::vector<ValueId>& x) {
                 return b.concat({x[0], x[1], x[2]}, 1);
               },
               0});
  c.push_back({"split",
               {f32({2, 11, 5})},
               [](Builder& b, const std::vector<ValueId>& x) {
                 auto parts = b.split(x[0], 1, {4, 7});
                 return b.concat({parts[1], parts[0]}, 1);  // both pieces reach the output
               },
               0});
  c.push_back({"where_int_cond",
               {i32({37, 1}, 0, 2), f32({37, 45}), f32({45})},
               [](Builder& b, const std::vector<ValueId>& x) { return b.where(x[0], x[1], x[2]); },
               0});
  c.push_back({"where_float_cond",
               {f32({37, 45}, -1, 1), f32({37, 45}), f32({37, 45})},
               [](Builder& b, const std::vector<ValueId>& x) { return b.where(x[0], x[1], x[2]); },
               0});
  c.push_back({"cast_f32_to_i32",
               {f32({37, 45}, -100, 100)},
               [](Builder& b, const std::vector<ValueId>& x) { return b.cast(x[0], DType::i32); },
               0});
  c.push_back({"cast_i32_to_f32",
               {i32({37, 45}, -1000, 1000)},
               [](Builder& b, const std::vector<ValueId>& x) { return b.cast(x[0], DType::f32); },
               0});
  c.push_back({"stop_gradient",
               {f32({37})},
               [](Builder& b, const std::vector<ValueId>& x) { return b.add(b.stop_gradient(x[0]), x[0]); },
               0});
  c.push_back({"fill",
               {},
               [](Builder& b, const std::vector<ValueId>&) {
                 return b.fill(Shape{3, 77}, DType::f32, -1.25);
               },
               0});
  c.push_back(
      {"fill_i32", {}, [](Builder& b, const std::vector<ValueId>&) { return b.fill(Shape{77}, DType::i32, 7); }, 0});
  c.push_back({"iota_causal_mask",
               {},
               [](Builder& b, const std::vector<ValueId>&) {
                 return b.iota(Shape{37, 37}, DType::f32, ix::ge(ix::coord(0), ix::coord(1)));
               },
               0});
  c.push_back({"iota_floor_div_mod_negative",
               {},
               [](Builder& b, const std::vector<ValueId>&) {
                 IndexExp shifted = ix::sub(ix::coord(0), ix::c(20));
                 return b.iota(
                     Shape{41, 3}, DType::i32,
                     ix::add(ix::mul(ix::floordiv(shifted, ix::c(3)), ix::c(10)), ix::mod(shifted, ix::c(-4))));
               },
               0});
  for (auto kind : {RandomKind::Uniform, RandomKind::Bernoulli, RandomKind::Normal}) {
    const std::string k = kind == RandomKind::Uniform     ? "uniform"
                          : kind == RandomKind::Bernoulli ? "bernoulli"
                                                          : "normal";
    c.push_back({"random_" + k,
                 {i32({2}, -2000000000.0, 2000000000.0), i32({}, 0, 1000)},
                 [kind](Builder& b, const std::vector<ValueId>& x) {
                   return b.random(kind, Shape{1001}, DType::f32, x[0], x[1], 0.3);
                 },
                 // Uniform and Bernoulli are the reference's bits exactly; normal goes through
                 // lg2.approx and cos.approx (absolute error ~1e-6 per element).
                 kind == RandomKind::Normal ? 1e-5 : 0});
  }
  // fused_rows: an i32 mask and inputs broadcast along rows and columns; max, sum and mean
  // reductions (the later ones reading the earlier); rows (37) not a multiple of the 8 rows a
  // block takes, row length (45) not a multiple of the warp. Output 0 is per element, 1 per row.
  for (int which : {0, 1}) {
    c.push_back({which == 0 ? "fused_rows_row_output" : "fused_rows_per_row_output",
                 {f32({37, 45}), i32({1, 45}, 0, 2), f32({45}, 0.5, 1.5), f32({37, 1})},
                 [which](Builder& b, const std::vector<ValueId>& x) {
                   using se::in;
                   const ScalarExp masked = se::select(in(1), in(0), se::c(-3.0));
                   RowProgram rp;
                   rp.inputs = 4;
                   rp.domain = Shape{37, 45};
                   rp.reduction_kinds = {ReduceKind::Max, ReduceKind::Sum, ReduceKind::Mean};
                   rp.reduction_bodies = {masked, se::exp(masked - in(4)), in(0) * in(2) + in(3)};
                   rp.output_per_row = {false, true};
                   rp.output_bodies = {se::exp(masked - in(4)) / in(5) * in(2), se::log(in(5)) + in(6) * in(3)};
                   return b.circuit().add_op("fused_rows", rp.to_params(DType::f32), x, b.scope())[which];
                 },
                 1e-5});
  }
  // multi_tensor: groups of different sizes (one not a multiple of the block, one of a single
  // element), a group input that is a scalar in some groups and a tensor in others, a shared
  // scalar; two bodies. The outputs are flattened and concatenated to compare at once.
  c.push_back({"multi_tensor_map",
               {f32({37, 45}), f32({}), f32({257}), f32({257}), f32({1}), f32({1}), f32({})},
               [](Builder& b, const std::vector<ValueId>& x) {
                 MultiTensorProgram mp;
                 mp.groups = 3;
                 mp.group_inputs = 2;
                 mp.shared_inputs = 1;
                 mp.bodies = {se::in(0) * se::in(1) + se::in(2), se::exp(se::in(0) * se::c(0.5)) - se::in(1)};
                 std::vector<ValueId> outs = b.circuit().add_op("multi_tensor", mp.to_params(DType::f32), x, b.scope());
                 std::vector<ValueId> flat;
                 for (ValueId o : outs) flat.push_back(b.reshape(o, Shape{b.circuit().info(o).shape.numel()}));
                 return b.concat(flat, 0);
               },
               1e-6});
  // Sums: groups spanning many blocks and few; 170 groups of 3 addresses overflow one launch's
  // parameter space (480 addresses), so the map case below runs in two chunks.
  c.push_back({"multi_tensor_sum",
               {f32({37, 45}), f32({}), f32({5000}), f32({}), f32({7}), f32({})},
               [](Builder& b, const std::vector<ValueId>& x) {
                 MultiTensorProgram mp;
                 mp.groups = 3;
                 mp.group_inputs = 2;
                 mp.sum = true;
                 mp.bodies = {se::in(0) * se::in(0) + se::in(1)};
                 std::vector<ValueId> outs = b.circuit().add_op("multi_tensor", mp.to_params(DType::f32), x, b.scope());
                 std::vector<ValueId> flat;
                 for (ValueId o : outs) flat.push_back(b.reshape(o, Shape{1}));
                 return b.concat(flat, 0);
               },
               1e-5});
  // A total over the group sums, in 2 chunks of launches sharing one arrival counter.
  c.push_back({"multi_tensor_total", std::vector<InputSpec>(500, f32({300})),
               [](Builder& b, const std::vector<ValueId>& x) {
                 MultiTensorProgram mp;
                 mp.groups = 500;
                 mp.group_inputs = 1;
                 mp.sum = true;
                 mp.bodies = {se::in(0) * se::in(0)};
                 mp.has_total = true;
                 ScalarExp sum = se::in(0);
                 for (int g = 1; g < 500; ++g) sum = sum + se::in(g)*se::c(g % 3 == 0 ? 2.0 : 1.0);
                 mp.total = se::sqrt(sum);
                 return b.circuit().add_op("multi_tensor", mp.to_params(DType::f32), x, b.scope())[0];
               },
               1e-5});
  c.push_back({"multi_tensor_chunked", std::vector<InputSpec>(340, f32({5})),
               [](Builder& b, const std::vector<ValueId>& x) {
                 MultiTensorProgram mp;
                 mp.groups = 170;
                 mp.group_inputs = 2;
                 mp.bodies = {se::in(0) - se::in(1) * se::c(0.25)};
                 std::vector<ValueId> outs = b.circuit().add_op("multi_tensor", mp.to_params(DType::f32), x, b.scope());
                 return b.concat(outs, 0);
               },
               0});
  return c;
}

// Runs every case; returns the kernels they generated (for ptxas).
class LoweringTest : public ::testing::TestWithParam<LoweringCase> {};

void check_case(const LoweringCase& lc, cuda::Runtime& rt) {
  testing::Harness h(lc.inputs, lc.build, 7);
  HostTensor want = execute(h.circuit, h.bindings, {h.output})[0];
  cuda::DeviceProgram dp(h.circuit, {h.output}, rt);
  HostTensor got = dp.run(h.bindings)[0];
  ASSERT_EQ(got.shape(), want.shape());
  ASSERT_EQ(got.dtype(), want.dtype());
  if (lc.tolerance == 0) {
    for (int64_t i = 0; i < want.numel(); ++i) ASSERT_EQ(got.get(i), want.get(i)) << lc.name << " element " << i;
  } else {
    EXPECT_LT(testing::relative_error(got, want), lc.tolerance) << lc.name << "\n" << dp.dump();
  }
}

TEST_P(LoweringTest, SimulatorMatchesEigen) { check_case(GetParam(), testing::fake_runtime()); }

// The same with every lowering on its 64-bit index path (taken on a GPU by tensors of 2^31
// elements and more, which no test can afford).
TEST_P(LoweringTest, SimulatorMatchesEigenWithWideIndices) {
  cuda::ForceWideIndices wide;
  check_case(GetParam(), testing::fake_runtime());
}

// T5: the same kernels on a real GPU.
TEST_P(LoweringTest, GpuMatchesEigen) {
  KILN_GPU_OR_SKIP(rt);
  check_case(GetParam(), *rt);
}

INSTANTIATE_TEST_SUITE_P(EveryPrim, LoweringTest, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<LoweringCase>& i) { return i.param.name; });

TEST(Lowering, EveryRegisteredPrimHasALoweringAndACase) {
  std::set<std::string> covered;
  for (const LoweringCase& lc : cases()) {
    testing::Harness h(lc.inputs, lc.build, 7);
    for (const Op& op : h.circuit.ops()) covered.insert(op.prim->name);
  }
  covered.insert("assign");  // exercised by the engine and GPT step tests (persistent buffers)
  for (const PrimDef* p : PrimRegistry::instance().all()) {
    EXPECT_FALSE(cuda::lowering_summary(p->id).empty()) << p->name << " has no lowering";
    EXPECT_TRUE(covered.count(p->name)) << p->name << " has no lowering case";
  }
}

// Every kernel of every case passes ptxas (sm_80 and sm_90).
void expect_every_case_passes_ptxas() {
  std::vector<std::unique_ptr<cuda::DeviceProgram>> programs;
  std::vector<const kir::Kernel*> kernels;
  for (const LoweringCase& lc : cases()) {
    testing::Harness h(lc.inputs, lc.build, 7);
    programs.push_back(
        std::make_unique<cuda::DeviceProgram>(h.circuit, std::vector<ValueId>{h.output}, testing::fake_runtime()));
    for (const auto& k : programs.back()->kernels()) kernels.push_back(k.launch->kernel.get());
  }
  testing::expect_ptxas_accepts(kernels);
}

TEST(Lowering, EveryCaseKernelPassesPtxas) {
  KILN_REQUIRE_PTXAS_OR_SKIP();
  expect_every_case_passes_ptxas();
}

TEST(Lowering, EveryCaseKernelPassesPtxasWithWideIndices) {
  KILN_REQUIRE_PTXAS_OR_SKIP();
  cuda::ForceWideIndices wide;
  expect_every_case_passes_ptxas();
}

TEST(Lowering, BadIndexOnTheDeviceIsAnErrorNamingTheOp) {
  std::vector<InputSpec> specs = {f32({5, 3}), i32({4}, 0, 5)};
  testing::Harness h(specs, [](Builder& b, const std::vector<ValueId>& x) { return b.gather_rows(x[0], x[1]); });
  h.bindings[1].set(2, 9);
  cuda::DeviceProgram dp(h.circuit, {h.output}, testing::fake_runtime());
  try {
    dp.run(h.bindings);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("gather_rows"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("9"), std::string::npos) << e.what();
  }
}

TEST(Lowering, F64IsAClearError) {
  std::vector<InputSpec> specs = {{Shape{3}, DType::f64}};
  testing::Harness h(specs, [](Builder& b, const std::vector<ValueId>& x) { return b.add(x[0], x[0]); });
  try {
    cuda::DeviceProgram dp(h.circuit, {h.output}, testing::fake_runtime());
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("f64"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("pointwise"), std::string::npos) << e.what();
  }
}

TEST(Lowering, KernelsAreNamedByTheirStructureAndPrintIdentically) {
  auto build = [](Builder& b, const std::vector<ValueId>& x) { return b.matmul(x[0], x[1]); };
  testing::Harness h1({f32({9, 10}), f32({10, 11})}, build), h2({f32({9, 10}), f32({10, 11})}, build),
      h3({f32({9, 10}), f32({10, 12})}, build);
  auto name = [](const testing::Harness& h) { return cuda::lower(h.circuit, 0).launches[0].kernel->name; };
  EXPECT_EQ(name(h1), name(h2));
  EXPECT_NE(name(h1), name(h3));
  auto k1 = cuda::lower(h1.circuit, 0).launches[0].kernel, k2 = cuda::lower(h2.circuit, 0).launches[0].kernel;
  EXPECT_EQ(kir::print_ptx(*k1, 90), kir::print_ptx(*k2, 90));
}

}  // namespace
}  // namespace kiln

namespace kiln {
namespace {

// The matmul kernel's shared memory, counted in the simulator: tile stores and the 16-byte
// fragment loads take no more wavefronts than their request phases, whichever operand is
// contiguous along k (A row-major, B transposed: both are; ta/tb flip them).
TEST(Lowering, MatmulSharedMemoryHasNoBankConflicts) {
  for (auto [ta_, tb_] : {std::pair{false, false}, {false, true}, {true, false}, {true, true}}) {
    const bool ta = ta_, tb = tb_;  // plain variables: the lambda below captures them (clang 14)
    const Shape a = ta ? Shape{80, 96} : Shape{96, 80}, b = tb ? Shape{72, 80} : Shape{80, 72};
    testing::Harness h({f32(a), f32(b)},
                       [&](Builder& bl, const std::vector<ValueId>& x) { return bl.matmul(x[0], x[1], ta, tb); });
    cuda::DeviceProgram dp(h.circuit, {h.output}, testing::fake_runtime());
    cuda::fake_driver_count_bank_conflicts(true);
    dp.run(h.bindings);
    const auto stats = cuda::fake_driver_kernel_stats();
    cuda::fake_driver_count_bank_conflicts(false);
    ASSERT_EQ(stats.size(), 1u);
    const auto& [name, s] = *stats.begin();
    EXPECT_GT(s.shared_requests, 0) << name;
    EXPECT_EQ(s.bank_conflicts, 0) << name << " ta " << ta << " tb " << tb << ": " << s.shared_wavefronts
                                   << " wavefronts for " << s.shared_requests << " requests";
  }
}

}  // namespace
}  // namespace kiln
